//! Client IP keys: the socket peer ([`PeerIp`]), and what every IP key
//! shares: where the peer's address is read, and how addresses are grouped.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::Request;
use tollgate_core::{ConfigError, Key};

use super::{KeyExtractor, MissingCause};

/// The default IPv6 prefix length keys are grouped by.
pub(crate) const DEFAULT_IPV6_PREFIX: u8 = 56;

/// The socket peer's address, from axum's `ConnectInfo<SocketAddr>` (or its
/// `MockConnectInfo` test double) or Tonic's `TcpConnectInfo`. Not Tonic's
/// `TlsConnectInfo`: a Tonic server that terminates TLS itself leaves no
/// address here, and an IP key of its calls is missing (the server's
/// doing, `INTERNAL`). Behind TLS, key its calls by what the proxy in
/// front sets, or by an extractor of your own that reads
/// `TlsConnectInfo<TcpConnectInfo>`.
pub fn peer_addr<B>(request: &Request<B>) -> Option<SocketAddr> {
    let extensions = request.extensions();
    #[cfg(feature = "axum")]
    {
        use axum::extract::ConnectInfo;
        use axum::extract::connect_info::MockConnectInfo;
        if let Some(ConnectInfo(addr)) = extensions.get::<ConnectInfo<SocketAddr>>() {
            return Some(*addr);
        }
        if let Some(MockConnectInfo(addr)) = extensions.get::<MockConnectInfo<SocketAddr>>() {
            return Some(*addr);
        }
    }
    #[cfg(feature = "tonic")]
    {
        use tonic::transport::server::TcpConnectInfo;
        if let Some(addr) = extensions
            .get::<TcpConnectInfo>()
            .and_then(|i| i.remote_addr())
        {
            return Some(addr);
        }
    }
    let _ = extensions;
    None
}

pub(super) fn check_prefix(bits: u8) -> Result<u8, ConfigError> {
    if (32..=128).contains(&bits) {
        Ok(bits)
    } else {
        Err(ConfigError::InvalidValue {
            setting: "ipv6_prefix",
            value: bits.to_string(),
            reason: "must be between 32 and 128",
        })
    }
}

/// Maps IPv4-mapped IPv6 to IPv4.
pub(super) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Maps IPv4-mapped IPv6 to IPv4 and masks IPv6 to `prefix` bits.
pub(crate) fn normalize_ip(ip: IpAddr, prefix: u8) -> IpAddr {
    match canonical(ip) {
        IpAddr::V6(v6) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
        v4 => v4,
    }
}

/// The socket peer's IP address; see [`peer_addr`] for where it is read.
///
/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) count as the IPv4
/// address. IPv6 addresses are grouped by prefix (/56 by default), because
/// one subscriber typically owns a whole /64 or more and could otherwise
/// rotate through buckets. Serve an axum app with
/// `into_make_service_with_connect_info::<SocketAddr>()`, or the extractor
/// finds no address and the request counts as having no key.
///
/// Behind a reverse proxy the peer is the proxy: use [`ClientIp`](crate::ClientIp) with the
/// proxy's addresses instead.
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
#[derive(Debug, Clone, Copy)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl PeerIp {
    /// The default IPv6 prefix length.
    pub const DEFAULT_IPV6_PREFIX: u8 = DEFAULT_IPV6_PREFIX;

    /// Keys requests by peer IP, grouping IPv6 by /56.
    pub fn new() -> Self {
        Self {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Groups IPv6 addresses by a prefix of `bits` (32 to 128).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidValue`] when `bits` is outside 32..=128.
    pub fn ipv6_prefix(self, bits: u8) -> Result<Self, ConfigError> {
        Ok(Self {
            ipv6_prefix: check_prefix(bits)?,
        })
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl<B> KeyExtractor<B> for PeerIp {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let addr = peer_addr(request)?;
        Some(Key::ip(normalize_ip(addr.ip(), self.ipv6_prefix)))
    }

    /// No connect info: [`MissingCause::Server`].
    fn missing(&self, _: &Request<B>) -> MissingCause {
        no_connect_info()
    }
}

pub(super) fn no_connect_info() -> MissingCause {
    MissingCause::Server(Cow::Borrowed(
        "no peer address: serve with connect info, e.g. axum's \
         into_make_service_with_connect_info::<SocketAddr>()",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn normalizes_mapped_and_masks_v6() {
        assert_eq!(normalize_ip(ip("::ffff:192.0.2.7"), 56), ip("192.0.2.7"));
        let v6 = ip("2001:db8:aaaa:bbbb:cccc::1");
        assert_eq!(normalize_ip(v6, 128), v6);
        assert_eq!(normalize_ip(v6, 64), ip("2001:db8:aaaa:bbbb::"));
        assert_eq!(normalize_ip(v6, 56), ip("2001:db8:aaaa:bb00::"));
        assert_eq!(normalize_ip(v6, 32), ip("2001:db8::"));
    }
}
