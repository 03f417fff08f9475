//! Client IP keys: the socket peer, or the client behind trusted proxies.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::header::{FORWARDED, HeaderName};
use http::{HeaderMap, Request};
use ipnet::IpNet;
use tollgate_core::{ConfigError, Key};

use crate::extract::{KeyExtractor, MissingCause};

/// The default IPv6 prefix length keys are grouped by.
pub(crate) const DEFAULT_IPV6_PREFIX: u8 = 56;

/// The socket peer's address, from axum's `ConnectInfo<SocketAddr>` (or its
/// `MockConnectInfo` test double) or Tonic's `TcpConnectInfo`.
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

fn check_prefix(bits: u8) -> Result<u8, ConfigError> {
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
fn canonical(ip: IpAddr) -> IpAddr {
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
/// Behind a reverse proxy the peer is the proxy: use [`ClientIp`] with the
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
/// Grouping and normalisation are as for [`PeerIp`].
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
    trusted: Arc<[IpNet]>,
    header: ForwardedHeader,
    max_hops: usize,
    ipv6_prefix: u8,
}

/// The longest forwarded entry read: an address with a port and brackets
/// takes under 50 bytes, a `Forwarded` element with `by`, `proto` and
/// `host` rather more.
const MAX_ENTRY_BYTES: usize = 256;

impl ClientIp {
    /// The client IP with no trusted proxy yet: the peer address, like
    /// [`PeerIp`], until [`trusted_proxies`](ClientIp::trusted_proxies) is set.
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

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client address for a request from `peer`, or `None` when a
    /// trusted proxy forwarded a hop that does not parse, or more trusted
    /// hops than [`max_hops`](ClientIp::max_hops).
    ///
    /// Only the rightmost entries are read, however long the header: a
    /// client can pad the left end at will, but its own address, appended
    /// by the nearest proxy, stays at the right.
    fn client(&self, peer: IpAddr, headers: &HeaderMap) -> Option<IpAddr> {
        let peer = canonical(peer);
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        let name: HeaderName = match self.header {
            ForwardedHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ForwardedHeader::Forwarded => FORWARDED,
        };
        let mut nearest = peer;
        let mut examined = 0;
        // Later header lines were appended by nearer proxies.
        for value in headers.get_all(&name).iter().rev() {
            for entry in value.as_bytes().rsplit(|&b| b == b',') {
                examined += 1;
                if examined > self.max_hops || entry.len() > MAX_ENTRY_BYTES {
                    return None;
                }
                let entry = std::str::from_utf8(entry).ok()?;
                let parsed = match self.header {
                    ForwardedHeader::XForwardedFor => parse_hop(entry),
                    ForwardedHeader::Forwarded => parse_forwarded_for(entry),
                }?;
                let ip = canonical(parsed);
                if !self.is_trusted(ip) {
                    return Some(ip);
                }
                nearest = ip;
            }
        }
        // Every hop is trusted: the farthest one is the client.
        Some(nearest)
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

fn no_connect_info() -> MissingCause {
    MissingCause::Server(Cow::Borrowed(
        "no peer address: serve with connect info, e.g. axum's \
         into_make_service_with_connect_info::<SocketAddr>()",
    ))
}

/// An address as written in `X-Forwarded-For`: `1.2.3.4`, `1.2.3.4:80`,
/// `2001:db8::1` or `[2001:db8::1]:80`.
fn parse_hop(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|a| a.ip()))
        .or_else(|| entry.strip_prefix('[')?.strip_suffix(']')?.parse().ok())
}

/// The `for=` address of one `Forwarded` element.
fn parse_forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("for") {
            return None;
        }
        parse_hop(value.trim().trim_matches('"'))
    })
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

    fn headers(name: &str, values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn walks_right_to_left_skipping_trusted_hops() {
        let c = ClientIp::new()
            .trusted_proxies(["10.0.0.0/8", "192.168.1.1"])
            .unwrap();
        let xff = |v: &[&str]| headers("x-forwarded-for", v);
        let proxy = ip("10.0.0.1");
        assert_eq!(
            c.client(proxy, &xff(&["1.1.1.1, 2.2.2.2, 10.9.9.9"])),
            Some(ip("2.2.2.2"))
        );
        // Several header lines: the last is nearest.
        assert_eq!(
            c.client(proxy, &xff(&["1.1.1.1", "2.2.2.2, 192.168.1.1"])),
            Some(ip("2.2.2.2"))
        );
        // An untrusted peer's headers are ignored.
        assert_eq!(
            c.client(ip("3.3.3.3"), &xff(&["1.1.1.1"])),
            Some(ip("3.3.3.3"))
        );
        // No header: the peer.
        assert_eq!(c.client(proxy, &HeaderMap::new()), Some(proxy));
        // All trusted: the farthest.
        assert_eq!(
            c.client(proxy, &xff(&["10.1.1.1, 10.2.2.2"])),
            Some(ip("10.1.1.1"))
        );
        // Ports, brackets, mapped addresses.
        assert_eq!(
            c.client(proxy, &xff(&["[2001:db8::7]:443"])),
            Some(ip("2001:db8::7"))
        );
        assert_eq!(
            c.client(proxy, &xff(&["5.5.5.5:8080"])),
            Some(ip("5.5.5.5"))
        );
        assert_eq!(
            c.client(proxy, &xff(&["::ffff:6.6.6.6"])),
            Some(ip("6.6.6.6"))
        );
        // A mapped peer counts as its IPv4 address for trust.
        assert_eq!(
            c.client(ip("::ffff:10.0.0.1"), &xff(&["7.7.7.7"])),
            Some(ip("7.7.7.7"))
        );
    }

    #[test]
    fn garbage_and_deep_headers_leave_no_key_and_padding_changes_nothing() {
        let c = ClientIp::new().trusted_proxies(["10.0.0.0/8"]).unwrap();
        let proxy = ip("10.0.0.1");
        let xff = |v: &str| headers("x-forwarded-for", &[v]);
        for garbage in [
            "",
            "not-an-ip",
            "1.2.3.4, ,",
            "unknown",
            "[::1",
            "999.1.1.1",
        ] {
            assert_eq!(c.client(proxy, &xff(garbage)), None, "{garbage:?}");
        }
        // Garbage left of the client is never reached.
        assert_eq!(
            c.client(proxy, &xff("garbage, 8.8.8.8")),
            Some(ip("8.8.8.8"))
        );
        // Padding of any length before the client's address is never read.
        let padded = format!("{}203.0.113.7", "1.1.1.1,".repeat(20_000));
        assert!(padded.len() > 100_000);
        assert_eq!(c.client(proxy, &xff(&padded)), Some(ip("203.0.113.7")));
        let trusted_padding = format!("{}203.0.113.7, 10.0.0.9", "10.0.0.9,".repeat(20_000));
        assert_eq!(
            c.client(proxy, &xff(&trusted_padding)),
            Some(ip("203.0.113.7"))
        );
        // More trusted hops than max_hops: no key, never the proxy's bucket.
        let deep = vec!["10.0.0.9"; 17].join(",");
        assert_eq!(c.client(proxy, &xff(&deep)), None, "past the hop limit");
        let sixteen = vec!["10.0.0.9"; 16].join(",");
        assert_eq!(c.client(proxy, &xff(&sixteen)), Some(ip("10.0.0.9")));
        // One huge entry without commas.
        assert_eq!(c.client(proxy, &xff(&"9".repeat(10_000))), None);
    }

    #[test]
    fn reads_rfc_7239_forwarded() {
        let c = ClientIp::new()
            .trusted_proxies(["10.0.0.0/8"])
            .unwrap()
            .forwarded_header(ForwardedHeader::Forwarded);
        let fwd = headers(
            "forwarded",
            &[
                "for=192.0.2.60;proto=http, for=\"[2001:db8:cafe::17]:4711\";by=10.0.0.1, For=10.2.3.4",
            ],
        );
        assert_eq!(
            c.client(ip("10.0.0.1"), &fwd),
            Some(ip("2001:db8:cafe::17"))
        );
        let hidden = headers("forwarded", &["for=_hidden"]);
        assert_eq!(c.client(ip("10.0.0.1"), &hidden), None);
    }
}
