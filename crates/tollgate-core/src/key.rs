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
    pub fn user(id: impl AsRef<[u8]>) -> Self {
        Self::new(KeyKind::User, id)
    }

    /// A key for a header value.
    pub fn header(value: impl AsRef<[u8]>) -> Self {
        Self::new(KeyKind::Header, value)
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
    /// A [`KeyKind::Custom`] key.
    fn from(value: &str) -> Self {
        Key::custom(value)
    }
}

impl From<String> for Key {
    /// A [`KeyKind::Custom`] key.
    fn from(value: String) -> Self {
        Key::custom(value)
    }
}

impl From<u64> for Key {
    /// A [`KeyKind::Custom`] key from the number's big-endian bytes.
    fn from(value: u64) -> Self {
        Key::custom(value.to_be_bytes())
    }
}

impl From<IpAddr> for Key {
    /// A [`KeyKind::Ip`] key.
    fn from(value: IpAddr) -> Self {
        Key::ip(value)
    }
}
