//! [`ClientIp`]: the client behind trusted reverse proxies, read from
//! `X-Forwarded-For` or RFC 7239 `Forwarded`: its settings; the walk
//! through the hops is in `hops.rs`.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use http::Request;
use ipnet::IpNet;
use tollgate_core::{ConfigError, Key};

use super::ip::{DEFAULT_IPV6_PREFIX, check_prefix, no_connect_info, normalize_ip, peer_addr};
use super::{KeyExtractor, MissingCause};

/// Which header trusted proxies record the client in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
}

/// The client's IP address behind trusted reverse proxies.
///
/// Forwarded headers are only believed when the socket peer is a trusted
/// proxy. Then the list of hops is walked from right to left (the right
/// end was written by the proxy nearest to us), trusted proxies are
/// skipped, and the first untrusted address is the client. A client can
/// write anything at the left end of the header, but cannot get past the
/// entries your own proxies appended.
///
/// Parsing is bounded: only the rightmost [`max_hops`](ClientIp::max_hops)
/// entries (16 by default) are read, however long the header, so padding
/// the left end changes nothing. A hop that does not parse, or more trusted
/// hops than that, leaves the request without a key, which the layer
/// answers 400 ([`MissingCause::Client`]): never the proxy's own bucket.
/// Grouping and normalisation are as for [`PeerIp`](crate::PeerIp).
///
/// ```
/// use std::net::SocketAddr;
/// use axum::extract::ConnectInfo;
/// use http::Request;
/// use tollgate::{ClientIp, Key, KeyExtractor};
///
/// let client_ip = ClientIp::new().trusted_proxies(["10.0.0.0/8"])?;
/// let mut req = Request::get("/")
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.1.1.1")
///     .body(())
///     .unwrap();
/// req.extensions_mut().insert(ConnectInfo("10.0.0.2:3456".parse::<SocketAddr>().unwrap()));
/// // 10.1.1.1 is a trusted hop; 203.0.113.7 is the client; 6.6.6.6 was
/// // written by the client and is ignored.
/// assert_eq!(client_ip.extract(&req), Some(Key::ip("203.0.113.7".parse().unwrap())));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClientIp {
    pub(super) trusted: Arc<[IpNet]>,
    pub(super) header: ForwardedHeader,
    pub(super) max_hops: usize,
    ipv6_prefix: u8,
}

impl ClientIp {
    /// The client IP with no trusted proxy yet: the peer address, like
    /// [`PeerIp`](crate::PeerIp), until [`trusted_proxies`](ClientIp::trusted_proxies) is set.
    pub fn new() -> Self {
        Self {
            trusted: Arc::from([]),
            header: ForwardedHeader::default(),
            max_hops: 16,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Trusts proxies in these networks (CIDRs such as `"10.0.0.0/8"`, or
    /// single addresses).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidValue`] naming the first entry that is neither
    /// a CIDR nor an address.
    pub fn trusted_proxies<I, S>(mut self, cidrs: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut nets = Vec::new();
        for cidr in cidrs {
            let cidr = cidr.as_ref().trim();
            let net = cidr
                .parse::<IpNet>()
                .or_else(|_| cidr.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| ConfigError::InvalidValue {
                    setting: "trusted_proxies",
                    value: cidr.to_owned(),
                    reason: "expected a CIDR such as 10.0.0.0/8 or an IP address",
                })?;
            nets.push(match net {
                IpNet::V6(v6) => v6
                    .addr()
                    .to_ipv4_mapped()
                    .and_then(|v4| ipnet::Ipv4Net::new(v4, v6.prefix_len().saturating_sub(96)).ok())
                    .map_or(net, IpNet::V4),
                v4 => v4,
            });
        }
        self.trusted = nets.into();
        Ok(self)
    }

    /// Reads the client from `header` (default `X-Forwarded-For`).
    pub fn forwarded_header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Examines at most `hops` forwarded entries (default 16).
    pub fn max_hops(mut self, hops: usize) -> Self {
        self.max_hops = hops;
        self
    }

    /// Groups IPv6 addresses by a prefix of `bits` (32 to 128).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidValue`] when `bits` is outside 32..=128.
    pub fn ipv6_prefix(mut self, bits: u8) -> Result<Self, ConfigError> {
        self.ipv6_prefix = check_prefix(bits)?;
        Ok(self)
    }
}

impl Default for ClientIp {
    fn default() -> Self {
        Self::new()
    }
}

impl<B> KeyExtractor<B> for ClientIp {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let peer = peer_addr(request)?.ip();
        let client = self.client(peer, request.headers())?;
        Some(Key::ip(normalize_ip(client, self.ipv6_prefix)))
    }

    /// Without connect info, [`MissingCause::Server`]; otherwise a trusted
    /// proxy forwarded a hop that does not parse, or too many:
    /// [`MissingCause::Client`].
    fn missing(&self, request: &Request<B>) -> MissingCause {
        if peer_addr(request).is_none() {
            return no_connect_info();
        }
        let header = match self.header {
            ForwardedHeader::XForwardedFor => "X-Forwarded-For",
            ForwardedHeader::Forwarded => "Forwarded",
        };
        MissingCause::Client(Cow::Owned(format!(
            "the {header} header must list client addresses, at most {} of them after the client",
            self.max_hops
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PeerIp;

    #[test]
    fn prefixes_and_cidrs_are_validated() {
        assert!(PeerIp::new().ipv6_prefix(31).is_err());
        assert!(PeerIp::new().ipv6_prefix(129).is_err());
        assert!(ClientIp::new().ipv6_prefix(64).is_ok());
        let err = ClientIp::new()
            .trusted_proxies(["10.0.0.0/8", "nonsense"])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid trusted_proxies \"nonsense\": expected a CIDR such as 10.0.0.0/8 or an IP address"
        );
    }
}
