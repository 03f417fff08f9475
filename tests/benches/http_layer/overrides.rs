//! The overrides of the `+ 1,000 overrides of other keys` variants.

use tollgate::{Key, MemoryOverrides, Override, OverrideStore};

use crate::common::per_key;

/// A source of overrides holding 1,000 overrides, none of a key the bench
/// sends: every request pays the lookup, none is overridden.
pub(crate) async fn other_keys_overridden() -> MemoryOverrides {
    let overrides = MemoryOverrides::new();
    let rule = Override::limit("1000000/min").unwrap();
    for i in 0..1_000 {
        let key = Key::header(format!("overridden-{i}"));
        overrides
            .set(&key, &per_key(), rule.clone(), None)
            .await
            .unwrap();
    }
    overrides
}
