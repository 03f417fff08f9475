//! Key extractors: which bucket a request counts against.

use std::fmt;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv6Addr};

use http::{HeaderName, Request};
use tollgate_core::{ConfigError, Key};

/// Picks the [`Key`] a request is limited by, or `None` when the request
/// carries no usable identity.
///
/// `None` is never turned into a shared bucket: the layer answers it as
/// configured with [`MissingKey`](crate::MissingKey) (a 500 by default).
///
/// Implemented for closures `Fn(&Request<B>) -> Option<Key>` and for the
/// extractors in this module.
///
/// ```
/// use http::Request;
/// use tollgate::{Key, KeyExtractor};
///
/// // Limit by API key, taken from the path `/tenants/{id}/...`.
/// let by_tenant = |req: &Request<()>| {
///     let mut parts = req.uri().path().split('/');
///     (parts.nth(1) == Some("tenants")).then(|| parts.next().map(Key::custom))?
/// };
/// let req = Request::get("/tenants/acme/items").body(()).unwrap();
/// assert_eq!(by_tenant.extract(&req), Some(Key::custom("acme")));
/// ```
pub trait KeyExtractor<B>: Send + Sync + 'static {
    /// The key for `request`, if it has one.
    fn extract(&self, request: &Request<B>) -> Option<Key>;
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<Key> + Send + Sync + 'static,
{
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        self(request)
    }
}

/// One bucket for all requests: a global limit.
///
/// ```
/// use http::Request;
/// use tollgate::{GlobalKey, Key, KeyExtractor};
///
/// let req = Request::new(());
/// assert_eq!(GlobalKey.extract(&req), Some(Key::global()));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalKey;

impl<B> KeyExtractor<B> for GlobalKey {
    fn extract(&self, _: &Request<B>) -> Option<Key> {
        Some(Key::global())
    }
}

/// The value of a request header, such as an API key. A missing or empty
/// header yields no key.
///
/// Only use a header the client cannot choose freely (an API key that your
/// auth layer has validated, or a header set by your own proxy), or every
/// client can pick its own bucket.
///
/// ```
/// use http::Request;
/// use tollgate::{HeaderKey, Key, KeyExtractor};
///
/// let by_api_key = HeaderKey::new(http::HeaderName::from_static("x-api-key"));
/// let req = Request::get("/").header("x-api-key", "k-123").body(()).unwrap();
/// assert_eq!(by_api_key.extract(&req), Some(Key::header("k-123")));
/// assert_eq!(by_api_key.extract(&Request::new(())), None);
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys requests by header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let value = request.headers().get(&self.name)?;
        (!value.is_empty()).then(|| Key::header(value.as_bytes()))
    }
}

/// A value that identifies a user or client, put into request extensions by
/// an authentication layer and read by [`ExtensionKey`].
///
/// ```
/// use tollgate::{Key, ToKey};
///
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// impl ToKey for UserId {
///     fn to_key(&self) -> Key {
///         self.0.to_key()
///     }
/// }
/// assert_eq!(UserId(7).to_key(), Key::user(7u64.to_be_bytes()));
/// ```
pub trait ToKey {
    /// The [`Key`] (normally of [`KeyKind::User`](tollgate_core::KeyKind::User)).
    fn to_key(&self) -> Key;
}

impl ToKey for String {
    fn to_key(&self) -> Key {
        Key::user(self)
    }
}

impl ToKey for str {
    fn to_key(&self) -> Key {
        Key::user(self)
    }
}

impl ToKey for u64 {
    fn to_key(&self) -> Key {
        Key::user(self.to_be_bytes())
    }
}

impl ToKey for u32 {
    fn to_key(&self) -> Key {
        Key::user(u64::from(*self).to_be_bytes())
    }
}

impl ToKey for i64 {
    fn to_key(&self) -> Key {
        Key::user(self.to_be_bytes())
    }
}

impl ToKey for Key {
    fn to_key(&self) -> Key {
        self.clone()
    }
}

/// The authenticated identity of type `T` that an auth layer put into the
/// request's extensions. Requests without it (unauthenticated) yield no
/// key; this extractor never reads anything the client sent.
///
/// ```
/// use http::Request;
/// use tollgate::{ExtensionKey, Key, KeyExtractor};
///
/// let by_user = ExtensionKey::<String>::new();
/// let mut req = Request::new(());
/// assert_eq!(by_user.extract(&req), None);
/// req.extensions_mut().insert("ada".to_string());
/// assert_eq!(by_user.extract(&req), Some(Key::user("ada")));
/// ```
pub struct ExtensionKey<T> {
    _marker: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T> {
    /// Keys requests by their `T` extension.
    pub fn new() -> Self {
        Self {
            _marker: PhantomData,
        }
    }
}

impl<T> Default for ExtensionKey<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtensionKey<{}>", std::any::type_name::<T>())
    }
}

impl<B, T> KeyExtractor<B> for ExtensionKey<T>
where
    T: ToKey + Send + Sync + 'static,
{
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        request.extensions().get::<T>().map(ToKey::to_key)
    }
}

/// The socket peer's IP address, from axum's
/// [`ConnectInfo<SocketAddr>`](axum::extract::ConnectInfo).
///
/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) count as the IPv4 address.
/// IPv6 addresses are grouped by prefix (/56 by default), because one
/// subscriber typically owns a whole /64 or more and could otherwise rotate
/// through buckets. Serve the app with
/// `into_make_service_with_connect_info::<SocketAddr>()`, or the extractor
/// finds no address and the request counts as having no key. In tests,
/// axum's `MockConnectInfo<SocketAddr>` layer works too.
///
/// Behind a reverse proxy the peer is the proxy; a trusted-proxy extractor
/// that reads `X-Forwarded-For` safely is a separate piece.
///
/// ```
/// use std::net::SocketAddr;
/// use axum::extract::ConnectInfo;
/// use http::Request;
/// use tollgate::{Key, KeyExtractor, PeerIp};
///
/// let peer = PeerIp::new();
/// let mut req = Request::new(());
/// req.extensions_mut()
///     .insert(ConnectInfo("[2001:db8:1:2ff:aaaa::1]:443".parse::<SocketAddr>().unwrap()));
/// // Grouped by /56: the last 72 bits are dropped.
/// assert_eq!(peer.extract(&req), Some(Key::ip("2001:db8:1:200::".parse().unwrap())));
/// ```
#[cfg(feature = "axum")]
#[derive(Debug, Clone, Copy)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

#[cfg(feature = "axum")]
impl PeerIp {
    /// The default IPv6 prefix length.
    pub const DEFAULT_IPV6_PREFIX: u8 = 56;

    /// Keys requests by peer IP, grouping IPv6 by /56.
    pub fn new() -> Self {
        Self {
            ipv6_prefix: Self::DEFAULT_IPV6_PREFIX,
        }
    }

    /// Groups IPv6 addresses by a prefix of `bits` (32 to 128).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] when `bits` is outside 32..=128.
    pub fn ipv6_prefix(self, bits: u8) -> Result<Self, ConfigError> {
        if !(32..=128).contains(&bits) {
            return Err(ConfigError::InvalidSetting {
                setting: "ipv6_prefix",
                reason: "must be between 32 and 128",
            });
        }
        Ok(Self { ipv6_prefix: bits })
    }
}

#[cfg(feature = "axum")]
impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "axum")]
impl<B> KeyExtractor<B> for PeerIp {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        use axum::extract::ConnectInfo;
        use axum::extract::connect_info::MockConnectInfo;
        let extensions = request.extensions();
        // Like axum's own `ConnectInfo` extractor, fall back to the test double.
        let addr = match extensions.get::<ConnectInfo<std::net::SocketAddr>>() {
            Some(ConnectInfo(addr)) => addr,
            None => &extensions.get::<MockConnectInfo<std::net::SocketAddr>>()?.0,
        };
        Some(Key::ip(normalize_ip(addr.ip(), self.ipv6_prefix)))
    }
}

/// Maps IPv4-mapped IPv6 to IPv4 and masks IPv6 to `prefix` bits.
pub(crate) fn normalize_ip(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let bits = u128::from(v6);
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(prefix.min(128)))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(bits & mask))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_mapped_and_masks_v6() {
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(
            normalize_ip(mapped, 56),
            "192.0.2.7".parse::<IpAddr>().unwrap()
        );
        let v6: IpAddr = "2001:db8:aaaa:bbbb:cccc::1".parse().unwrap();
        assert_eq!(normalize_ip(v6, 128), v6);
        assert_eq!(
            normalize_ip(v6, 64),
            "2001:db8:aaaa:bbbb::".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            normalize_ip(v6, 56),
            "2001:db8:aaaa:bb00::".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            normalize_ip(v6, 32),
            "2001:db8::".parse::<IpAddr>().unwrap()
        );
    }

    #[cfg(feature = "axum")]
    #[test]
    fn prefix_is_validated() {
        assert!(PeerIp::new().ipv6_prefix(31).is_err());
        assert!(PeerIp::new().ipv6_prefix(129).is_err());
        assert!(PeerIp::new().ipv6_prefix(64).is_ok());
    }
}
