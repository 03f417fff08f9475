//! Keys: whose limit a request counts against.

use std::fmt;
use std::net::IpAddr;

use smallvec::SmallVec;

/// Where a key came from. Part of the key's identity, so that the same
/// bytes from a header and from a user id never share a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum KeyKind {
    /// One bucket for everyone.
    Global,
    /// A client IP address (or IPv6 prefix).
    Ip,
    /// The value of a request header.
    Header,
    /// An authenticated user or API client.
    User,
    /// Anything else, chosen by the application.
    Custom,
    /// Several keys combined, such as a route and a user.
    Composite,
}

impl KeyKind {
    /// A short stable name, used when keys are encoded for a store.
    pub const fn as_str(self) -> &'static str {
        match self {
            KeyKind::Global => "global",
            KeyKind::Ip => "ip",
            KeyKind::Header => "header",
            KeyKind::User => "user",
            KeyKind::Custom => "custom",
            KeyKind::Composite => "composite",
        }
    }

    /// The kind of that [`as_str`](Self::as_str) name, if there is one.
    ///
    /// ```
    /// use tollgate_core::KeyKind;
    ///
    /// assert_eq!(KeyKind::from_name("user"), Some(KeyKind::User));
    /// assert_eq!(KeyKind::from_name(KeyKind::Composite.as_str()), Some(KeyKind::Composite));
    /// assert_eq!(KeyKind::from_name("User"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Self> {
        [
            KeyKind::Global,
            KeyKind::Ip,
            KeyKind::Header,
            KeyKind::User,
            KeyKind::Custom,
            KeyKind::Composite,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == name)
    }
}

/// The type of a value made into a [`Key`] with [`Key::typed`]: the first
/// byte of the key, so that values of different types never collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum TypeTag {
    /// Text (`str`, `String`), as its UTF-8 bytes.
    Str = b's',
    /// An unsigned integer of any width, as 8 big-endian bytes: `7u32` and
    /// `7u64` are the same number and the same key.
    Unsigned = b'u',
    /// A signed integer of any width, as 8 big-endian two's-complement bytes.
    Signed = b'i',
}

/// The identity a request is limited by: a kind plus opaque bytes.
///
/// Keys of up to 32 bytes (IP addresses, numeric ids, UUIDs) are stored
/// inline without allocating. Stores never keep the raw bytes: the memory
/// store keeps a keyed hash, the Redis store a fixed-length digest.
///
/// ```
/// use std::net::{IpAddr, Ipv4Addr};
/// use tollgate_core::{Key, KeyKind};
///
/// let user = Key::user("alice");
/// assert_eq!(user.kind(), KeyKind::User);
/// assert_eq!(user.as_bytes(), b"alice");
/// assert_ne!(Key::user("alice"), Key::custom("alice"));
///
/// let ip = Key::ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
/// assert_eq!(ip.as_bytes(), &[192, 0, 2, 1]);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key {
    kind: KeyKind,
    bytes: SmallVec<[u8; 32]>,
}

impl Key {
    /// A key of `kind` with `bytes`.
    pub fn new(kind: KeyKind, bytes: impl AsRef<[u8]>) -> Self {
        Self {
            kind,
            bytes: SmallVec::from_slice(bytes.as_ref()),
        }
    }

    /// The single key shared by every request.
    pub fn global() -> Self {
        Self {
            kind: KeyKind::Global,
            bytes: SmallVec::new(),
        }
    }

    /// A key for an IP address. IPv4 addresses are 4 bytes, IPv6 16;
    /// callers normalise IPv4-mapped IPv6 and group IPv6 by prefix first.
    pub fn ip(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::new(KeyKind::Ip, v4.octets()),
            IpAddr::V6(v6) => Self::new(KeyKind::Ip, v6.octets()),
        }
    }

    /// A key for an authenticated user or client id.
    ///
    /// Not the key the `tollgate` crate's `ExtensionKey` makes of the same
    /// id: that one also records the id's type ([`Key::typed`], through
    /// its `ToKey` trait), so that a user id `7` and a name `"7"` are two
    /// keys. To read, reset or bill what such a layer counted, make the key
    /// as it does (`"ada".to_key()`).
    ///
    /// ```
    /// use tollgate_core::{Key, KeyKind, TypeTag};
    ///
    /// assert_ne!(Key::user("ada"), Key::typed(KeyKind::User, TypeTag::Str, "ada"));
    /// ```
    pub fn user(id: impl AsRef<[u8]>) -> Self {
        Self::new(KeyKind::User, id)
    }

    /// The longest header value [`Key::header`] keeps whole.
    pub const MAX_HEADER_BYTES: usize = 64;

    /// A key for a header value, or any value a client chooses. A value
    /// longer than [`MAX_HEADER_BYTES`](Self::MAX_HEADER_BYTES), or one
    /// that starts with a NUL byte (no HTTP header value holds one), is
    /// keyed by its digest: a NUL byte, then the first 31 bytes of its
    /// SHA-256. A client's header is the client's choice: whole, one of
    /// hundreds of kilobytes would be kept as long by every table keyed by
    /// it (caches of override lookups, the usage ledger) however few keys
    /// they hold. The digest is 32 bytes, held inline. Only this
    /// constructor bounds a key's size: [`Key::custom`], [`Key::user`] and
    /// the others keep whatever bytes they are given.
    ///
    /// ```
    /// use tollgate_core::Key;
    ///
    /// let short = Key::header("k-123");
    /// assert_eq!(short.as_bytes(), b"k-123");
    /// let long = Key::header("k".repeat(100_000));
    /// assert_eq!(long.as_bytes().len(), 32);
    /// assert_eq!(long.as_bytes()[0], 0);
    /// assert_eq!(long, Key::header("k".repeat(100_000)));
    /// assert_ne!(long, Key::header("k".repeat(100_001)));
    /// assert_eq!(Key::header("k".repeat(64)).as_bytes().len(), 64);
    /// // A digest is never the bytes of another value.
    /// assert_ne!(Key::header(long.as_bytes()).as_bytes(), long.as_bytes());
    /// ```
    pub fn header(value: impl AsRef<[u8]>) -> Self {
        let value = value.as_ref();
        if value.len() <= Self::MAX_HEADER_BYTES && value.first() != Some(&0) {
            return Self::new(KeyKind::Header, value);
        }
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(value);
        let mut bytes = SmallVec::new();
        bytes.push(0);
        bytes.extend_from_slice(&digest[..31]);
        Self {
            kind: KeyKind::Header,
            bytes,
        }
    }

    /// A key of the application's own making.
    pub fn custom(value: impl AsRef<[u8]>) -> Self {
        Self::new(KeyKind::Custom, value)
    }

    /// Several keys combined into one, such as a route and a user. Each
    /// part is encoded with its kind and length, so no two different lists
    /// of parts give the same key.
    ///
    /// ```
    /// use tollgate_core::Key;
    ///
    /// let a = Key::composite([&Key::custom("a"), &Key::custom("b:c")]);
    /// let b = Key::composite([&Key::custom("a:b"), &Key::custom("c")]);
    /// assert_ne!(a, b);
    /// ```
    pub fn composite<'a>(parts: impl IntoIterator<Item = &'a Key>) -> Self {
        let mut bytes = SmallVec::new();
        for part in parts {
            bytes.push(part.kind as u8);
            bytes.extend_from_slice(&(part.bytes.len() as u64).to_be_bytes());
            bytes.extend_from_slice(&part.bytes);
        }
        Self {
            kind: KeyKind::Composite,
            bytes,
        }
    }

    /// A key of `kind` for a value of a Rust type: `bytes` behind a one-byte
    /// tag naming the type, so that values of different types never share
    /// a key even when their bytes agree (the string `"admin___"` and the
    /// `u64` with the same eight bytes, or `-1i64` and `u64::MAX`). The
    /// [`From`] conversions below and the layer's `ToKey` use it.
    ///
    /// ```
    /// use tollgate_core::{Key, KeyKind, TypeTag};
    ///
    /// let text = Key::typed(KeyKind::User, TypeTag::Str, b"admin___");
    /// let number = Key::typed(KeyKind::User, TypeTag::Unsigned, 0x61646d696e5f5f5f_u64.to_be_bytes());
    /// assert_ne!(text, number);
    /// assert_ne!(Key::from(-1_i64), Key::from(u64::MAX));
    /// ```
    pub fn typed(kind: KeyKind, tag: TypeTag, bytes: impl AsRef<[u8]>) -> Self {
        let bytes = bytes.as_ref();
        let mut tagged = SmallVec::with_capacity(bytes.len() + 1);
        tagged.push(tag as u8);
        tagged.extend_from_slice(bytes);
        Self {
            kind,
            bytes: tagged,
        }
    }

    /// Where the key came from.
    pub fn kind(&self) -> KeyKind {
        self.kind
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl fmt::Debug for Key {
    /// Shows the kind and the length only: keys may be secrets (API keys)
    /// or personal data (IP addresses), and debug output ends up in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({}, {} bytes)", self.kind.as_str(), self.bytes.len())
    }
}

impl From<&str> for Key {
    /// A [`KeyKind::Custom`] key, tagged as text (see [`Key::typed`]).
    fn from(value: &str) -> Self {
        Key::typed(KeyKind::Custom, TypeTag::Str, value)
    }
}

impl From<String> for Key {
    /// A [`KeyKind::Custom`] key, tagged as text (see [`Key::typed`]).
    fn from(value: String) -> Self {
        Key::typed(KeyKind::Custom, TypeTag::Str, value)
    }
}

impl From<u64> for Key {
    /// A [`KeyKind::Custom`] key from the number's big-endian bytes, tagged
    /// as unsigned (see [`Key::typed`]).
    fn from(value: u64) -> Self {
        Key::typed(KeyKind::Custom, TypeTag::Unsigned, value.to_be_bytes())
    }
}

impl From<i64> for Key {
    /// A [`KeyKind::Custom`] key from the number's big-endian bytes, tagged
    /// as signed (see [`Key::typed`]).
    fn from(value: i64) -> Self {
        Key::typed(KeyKind::Custom, TypeTag::Signed, value.to_be_bytes())
    }
}

impl From<IpAddr> for Key {
    /// A [`KeyKind::Ip`] key.
    fn from(value: IpAddr) -> Self {
        Key::ip(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_of_different_types_never_share_a_key() {
        let text = Key::from("admin___");
        let number = Key::from(0x6164_6d69_6e5f_5f5f_u64);
        assert_eq!(&text.as_bytes()[1..], &number.as_bytes()[1..], "same bytes");
        assert_ne!(text, number);
        assert_ne!(Key::from(-1_i64), Key::from(u64::MAX));
        assert_eq!(Key::from("a"), Key::from(String::from("a")));
        assert_eq!(Key::from("a").as_bytes(), b"sa");
    }
}
