//! Redis key names.
//!
//! A key is `<prefix>:<policy>:{<hash>}`. The hash is 32 hex digits of
//! SHA-256 over the length-prefixed parts (an optional secret, the policy
//! name, the key kind and the key bytes), so no raw identifier reaches Redis,
//! hostile bytes cannot forge another key, and all keys of one decision
//! share one cluster slot while different identities spread over all slots.

use sha2::{Digest, Sha256};
use tollgate_core::{ConfigError, Key, Policy};

/// Builds key names for one store.
#[derive(Clone)]
pub(crate) struct KeyNamer {
    prefix: String,
    secret: Option<Vec<u8>>,
}

impl std::fmt::Debug for KeyNamer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyNamer")
            .field("prefix", &self.prefix)
            .field("secret", &self.secret.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

impl KeyNamer {
    pub(crate) fn new(prefix: &str, secret: Option<Vec<u8>>) -> Result<Self, ConfigError> {
        let ok = !prefix.is_empty()
            && prefix.len() <= 64
            && prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}');
        if !ok {
            return Err(ConfigError::InvalidSetting {
                setting: "prefix",
                reason: "use 1 to 64 visible ASCII characters without '{' or '}'",
            });
        }
        Ok(Self {
            prefix: prefix.to_owned(),
            secret,
        })
    }

    /// The state key of `key` under `policy`: one per policy name and key,
    /// whatever the policy's limits or layout, so that a changed
    /// configuration finds the state written under the old one (which the
    /// scripts carry over, see `carry.lua`).
    pub(crate) fn state_key(&self, policy: &Policy, key: &Key) -> String {
        self.named(policy.name(), key)
    }

    /// The sorted set of `key`'s slots under the in-flight limit `name`.
    pub(crate) fn slots_key(&self, name: &str, key: &Key) -> String {
        self.named(&format!("inflight/{name}"), key)
    }

    /// The usage buckets of `key` under the policy named `policy` share
    /// this stem (and so a cluster slot): `<stem>:<h|d|m><start in s>`.
    pub(crate) fn usage_stem(&self, policy: &str, key: &Key) -> String {
        self.named(&format!("usage/{policy}"), key)
    }

    fn named(&self, policy: &str, key: &Key) -> String {
        let mut h = Sha256::new();
        let mut part = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_be_bytes());
            h.update(bytes);
        };
        part(self.secret.as_deref().unwrap_or_default());
        part(policy.as_bytes());
        part(key.kind().as_str().as_bytes());
        part(key.as_bytes());
        let digest = h.finalize();
        // `<prefix>:<policy>:{<32 hex digits>}`, in one allocation.
        let mut name = String::with_capacity(self.prefix.len() + policy.len() + 36);
        name.push_str(&self.prefix);
        name.push(':');
        name.push_str(policy);
        name.push_str(":{");
        for b in &digest[..16] {
            name.push(char::from(HEX[usize::from(b >> 4)]));
            name.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        name.push('}');
        name
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }
}

/// The sorted sets of a sliding-log policy's state, one per limit, named
/// after its period so that a changed configuration finds the log of that
/// period: `<state key>:<period in µs>`. Empty for other algorithms.
pub(crate) fn log_keys<'a>(
    state_key: &'a str,
    policy: &'a Policy,
) -> impl Iterator<Item = String> + 'a {
    let logs = if crate::algorithm::unit(policy.algorithm()).logs {
        policy.params()
    } else {
        &[]
    };
    logs.iter()
        .map(move |p| format!("{state_key}:{}", p.period_us))
}

/// The key of the fence that a reset or a block of the key of
/// `state_key` leaves (see `lua/lib/fence.lua`): `<state key>:fence`, in
/// the state key's cluster slot. The scripts tell it from the state keys
/// by its full name (see `lua/lib/fence.lua`).
pub(crate) fn fence_key(state_key: &str) -> String {
    format!("{state_key}:fence")
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag,
/// or of the whole key if it has none, modulo 16384.
pub(crate) fn hash_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = key
        .find('{')
        .and_then(|open| {
            let close = key[open + 1..].find('}')?;
            (close > 0).then(|| &bytes[open + 1..open + 1 + close])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{Algorithm, KeyKind};

    fn namer() -> KeyNamer {
        KeyNamer::new("tg", None).unwrap()
    }

    #[test]
    fn hostile_values_give_distinct_fixed_length_keys() {
        let megabyte = vec![b'x'; 1 << 20];
        let values: Vec<&[u8]> = vec![
            b"{", b"}", b"{tag}", b":", b"a:b", b"\n", b"\0", b"", &megabyte, b"x",
        ];
        let names: Vec<String> = values
            .iter()
            .map(|v| namer().named("api", &Key::custom(v)))
            .collect();
        for name in &names {
            assert_eq!(name.len(), "tg:api:{}".len() + 32, "{name}");
            assert!(name.starts_with("tg:api:{") && name.ends_with('}'));
            assert_eq!(name.matches('{').count(), 1);
        }
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
    }

    #[test]
    fn parts_are_unambiguous() {
        let n = namer();
        // ("a", "b:c") and ("a:b", "c") as (policy, value)...
        assert_ne!(
            n.named("a", &Key::custom("b:c")),
            n.named("a:b", &Key::custom("c"))
        );
        // ...and the kind is part of the identity.
        assert_ne!(
            n.named("a", &Key::new(KeyKind::User, "1")),
            n.named("a", &Key::new(KeyKind::Header, "1"))
        );
        // A secret changes every name.
        let secret = KeyNamer::new("tg", Some(b"s3cret".to_vec())).unwrap();
        assert_ne!(
            n.named("a", &Key::custom("1")),
            secret.named("a", &Key::custom("1"))
        );
        // Every configuration and layout of a policy shares one key.
        let key = Key::custom("1");
        let policy = |algorithm, rate| Policy::new("a", algorithm, rate).unwrap();
        let one = n.state_key(&policy(Algorithm::Gcra, "1/s"), &key);
        for (algorithm, rate) in [
            (Algorithm::Gcra, "2/s"),
            (Algorithm::FixedWindow, "1/s"),
            (Algorithm::SlidingWindow, "2/s"),
        ] {
            assert_eq!(n.state_key(&policy(algorithm, rate), &key), one);
        }
    }

    #[test]
    fn hash_slots_match_redis() {
        // Values from the Redis Cluster specification and CLUSTER KEYSLOT.
        assert_eq!(hash_slot("123456789"), 12_739);
        assert_eq!(hash_slot("foo"), 12_182);
        assert_eq!(hash_slot("{user1000}.following"), hash_slot("user1000"));
        assert_eq!(hash_slot("foo{}{bar}"), hash_slot("foo{}{bar}"));
        assert_ne!(hash_slot("foo{}{bar}"), hash_slot("bar"));
    }

    #[test]
    fn prefixes_are_validated() {
        for bad in ["", "a{b", "a}b", "has space", &"p".repeat(65)] {
            assert!(KeyNamer::new(bad, None).is_err(), "{bad:?}");
        }
    }
}
