//! Where the client is among the forwarded hops: the walk from the right,
//! bounded, and the parsing of each hop.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};

use super::forwarded::{ClientIp, ForwardedHeader};
use super::ip::canonical;

/// The longest forwarded entry read: an address with a port and brackets
/// takes under 50 bytes, a `Forwarded` element with `by`, `proto` and
/// `host` rather more.
const MAX_ENTRY_BYTES: usize = 256;

impl ClientIp {
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
    pub(super) fn client(&self, peer: IpAddr, headers: &HeaderMap) -> Option<IpAddr> {
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
