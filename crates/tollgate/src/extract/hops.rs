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
            let entries: &mut dyn Iterator<Item = Option<&[u8]>> = match self.header {
                ForwardedHeader::XForwardedFor => {
                    &mut value.as_bytes().rsplit(|&b| b == b',').map(Some)
                }
                // A comma inside a quoted string (a `host` the client
                // wrote, say) does not end an element.
                ForwardedHeader::Forwarded => &mut Elements {
                    rest: Some(value.as_bytes()),
                },
            };
            for entry in entries {
                examined += 1;
                let entry = entry.filter(|entry| entry.len() <= MAX_ENTRY_BYTES);
                if examined > self.max_hops {
                    return None;
                }
                let entry = std::str::from_utf8(entry?).ok()?;
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

/// The elements of one `Forwarded` value, the rightmost first (RFC 7239:
/// elements separated by commas, each a list of `name=value` pairs, a
/// value a token or a quoted string with `\` escapes). A comma or `"`
/// inside a quoted string is the string's: a client that writes its own
/// `host` can end no element early, so it cannot name its own address as
/// a hop. `None` for an element whose quotes do not close, or that is
/// longer than [`MAX_ENTRY_BYTES`]: the scan stops there.
struct Elements<'a> {
    rest: Option<&'a [u8]>,
}

impl<'a> Iterator for Elements<'a> {
    type Item = Option<&'a [u8]>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.rest.take()?;
        let mut quoted = false;
        let floor = rest.len().saturating_sub(MAX_ENTRY_BYTES + 1);
        for i in (floor..rest.len()).rev() {
            match rest[i] {
                // Preceded by an odd number of `\`, a `"` is escaped
                // (which only a quoted string allows).
                b'"' if rest[floor..i]
                    .iter()
                    .rev()
                    .take_while(|&&b| b == b'\\')
                    .count()
                    % 2
                    == 0 =>
                {
                    quoted = !quoted;
                }
                b',' if !quoted => {
                    self.rest = Some(&rest[..i]);
                    return Some(Some(&rest[i + 1..]));
                }
                _ => {}
            }
        }
        // The left end of the value, unless the element is longer than
        // any read.
        Some((floor == 0 && !quoted).then_some(rest))
    }
}

/// The `for=` address of one `Forwarded` element, parsed whole: `None`
/// for a pair without `=`, an unclosed or stray quote, or `for` given
/// twice (each parameter occurs once in an element).
fn parse_forwarded_for(element: &str) -> Option<IpAddr> {
    let mut found = None;
    for pair in outside_quotes(element, ';') {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let (name, value) = pair.split_once('=')?;
        let value = unquoted(value.trim())?;
        if name.trim().eq_ignore_ascii_case("for") && found.replace(value).is_some() {
            return None;
        }
    }
    parse_hop(&found?)
}

/// `text` split at each `separator` outside a quoted string.
fn outside_quotes(text: &str, separator: char) -> impl Iterator<Item = &str> {
    let (mut quoted, mut escaped) = (false, false);
    text.split(move |c: char| {
        if escaped {
            escaped = false;
            return false;
        }
        match c {
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c => return !quoted && c == separator,
        }
        false
    })
}

/// A parameter's value: a token as it is, a quoted string without its
/// quotes and escapes; `None` for a stray quote in a token or a quoted
/// string that does not end at the value's end.
fn unquoted(value: &str) -> Option<std::borrow::Cow<'_, str>> {
    let Some(inner) = value.strip_prefix('"') else {
        return (!value.contains('"')).then_some(std::borrow::Cow::Borrowed(value));
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => {
                return chars
                    .as_str()
                    .is_empty()
                    .then_some(std::borrow::Cow::Owned(out));
            }
            c => out.push(c),
        }
    }
    None
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

    /// A comma, `;` or escaped quote inside a quoted string belongs to
    /// the string: a client that writes its own `Host`, which a proxy
    /// quotes into its element, named its own address as the nearest hop
    /// (6.6.6.6 for each of these, found by an audit).
    #[test]
    fn a_quoted_string_in_forwarded_ends_no_element_and_no_pair() {
        let c = ClientIp::new()
            .trusted_proxies(["10.0.0.0/8"])
            .unwrap()
            .forwarded_header(ForwardedHeader::Forwarded);
        let client = |value: &str| c.client(ip("10.0.0.1"), &headers("forwarded", &[value]));
        for value in [
            r#"for=203.0.113.7;host="example.com, for=6.6.6.6""#,
            r#"host="example.com, for=6.6.6.6";for=203.0.113.7"#,
            r#"host="x;for=6.6.6.6";for=203.0.113.7"#,
            r#"for=203.0.113.7;host="a\", for=6.6.6.6""#,
            r#"for=1.1.1.1, for=203.0.113.7;host="b,c""#,
        ] {
            assert_eq!(client(value), Some(ip("203.0.113.7")), "{value}");
        }
        // The hop left of a trusted one's element, past its quoted comma.
        assert_eq!(
            client(r#"for=203.0.113.7, for=10.0.0.2;host="a, for=6.6.6.6""#),
            Some(ip("203.0.113.7"))
        );
        // Malformed: no key, never an address the client chose.
        for value in [
            r#"for=203.0.113.7;host="open"#,
            r#"for=6.6.6.6;for=203.0.113.7"#,
            r#"for=203.0.113.7;host=a"b"#,
            r#"for="203.0.113.7"x"#,
        ] {
            assert_eq!(client(value), None, "{value}");
        }
        // A quoted element longer than any read.
        let long = format!(r#"for=203.0.113.7;host="{}""#, "a".repeat(300));
        assert_eq!(client(&long), None);
    }
}
