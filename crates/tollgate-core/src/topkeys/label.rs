//! [`KeyLabel`]: how a key is named in the top keys.

use sha2::{Digest, Sha256};

use crate::key::Key;

/// How a key is shown in the top keys: the name the application chooses
/// for it. The label is asked once when a key takes a counter, never for
/// a key already counted, and only the label is kept: the key's bytes are
/// not.
///
/// The default, [`HashedLabel`], shows no identifier: the key's kind and
/// a hash. [`RawLabel`] shows the key's bytes, for keys that are no
/// personal data (tenant ids, routes); a closure names keys as the
/// application does:
///
/// ```
/// use tollgate_core::topkeys::{KeyLabel, TopKeys};
/// use tollgate_core::Key;
///
/// let tenants = |key: &Key| format!("tenant {}", String::from_utf8_lossy(key.as_bytes()));
/// assert_eq!(tenants.label(&Key::custom("acme")), "tenant acme");
/// let top = TopKeys::builder().label(tenants).build()?;
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
///
/// Instances that merge their top keys must label alike (the same
/// labeller, and the same secret for [`HashedLabel::with_secret`]).
pub trait KeyLabel: Send + Sync + 'static {
    /// The label of `key`.
    fn label(&self, key: &Key) -> String;
}

impl<F> KeyLabel for F
where
    F: Fn(&Key) -> String + Send + Sync + 'static,
{
    fn label(&self, key: &Key) -> String {
        self(key)
    }
}

/// The default label: `<kind>:<16 hex digits>`, the first 8 bytes of
/// SHA-256 over the key's kind and bytes (and a secret, if given), the
/// same on every instance and every version. Without a secret, a key of
/// few possible values (an IPv4 address) can be found from its hash by
/// trying them all; give a secret, the same on every instance, to stop
/// that.
///
/// ```
/// use tollgate_core::topkeys::{HashedLabel, KeyLabel};
/// use tollgate_core::Key;
///
/// let label = HashedLabel::new().label(&Key::user("ada"));
/// assert!(label.starts_with("user:"));
/// assert_eq!(label.len(), "user:".len() + 16);
/// assert!(!label.contains("ada"));
/// assert_ne!(HashedLabel::with_secret(b"s3cret").label(&Key::user("ada")), label);
/// ```
#[derive(Clone, Default)]
pub struct HashedLabel {
    secret: Option<Box<[u8]>>,
}

impl std::fmt::Debug for HashedLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashedLabel")
            .field("secret", &self.secret.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

impl HashedLabel {
    /// Hashes without a secret.
    pub fn new() -> Self {
        Self::default()
    }

    /// Hashes with `secret` first.
    pub fn with_secret(secret: impl AsRef<[u8]>) -> Self {
        Self {
            secret: Some(secret.as_ref().into()),
        }
    }
}

impl KeyLabel for HashedLabel {
    fn label(&self, key: &Key) -> String {
        let mut h = Sha256::new();
        let mut part = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_be_bytes());
            h.update(bytes);
        };
        part(self.secret.as_deref().unwrap_or_default());
        part(key.kind().as_str().as_bytes());
        part(key.as_bytes());
        let digest = h.finalize();
        let mut label = String::with_capacity(key.kind().as_str().len() + 17);
        label.push_str(key.kind().as_str());
        label.push(':');
        push_hex(&mut label, &digest[..8]);
        label
    }
}

/// The key itself, for applications whose keys are no personal data:
/// `<kind>:<bytes>`, the bytes as text when they are printable UTF-8 and
/// in hex otherwise.
///
/// ```
/// use tollgate_core::topkeys::{KeyLabel, RawLabel};
/// use tollgate_core::Key;
///
/// assert_eq!(RawLabel.label(&Key::custom("acme")), "custom:acme");
/// assert_eq!(RawLabel.label(&Key::custom([0, 255])), "custom:0x00ff");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RawLabel;

impl KeyLabel for RawLabel {
    fn label(&self, key: &Key) -> String {
        let mut label = format!("{}:", key.kind().as_str());
        match std::str::from_utf8(key.as_bytes()) {
            Ok(text) if !text.chars().any(char::is_control) => label.push_str(text),
            _ => {
                label.push_str("0x");
                push_hex(&mut label, key.as_bytes());
            }
        }
        label
    }
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
}
