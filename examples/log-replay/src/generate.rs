//! A seeded generator of combined-format access logs against the demo's
//! routes: the same seed gives the same log.

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The routes a generated client calls, with their weights: mostly reads,
/// a few exports and completions, some unauthenticated calls and 404s.
const ROUTES: &[(u32, &str, &str)] = &[
    (40, "GET", "/api/items"),
    (20, "GET", "/api/search?q=pear"),
    (10, "POST", "/api/items"),
    (8, "GET", "/api/reports"),
    (5, "POST", "/api/complete?tokens=150"),
    (3, "GET", "/api/export?rows=1"),
    (7, "GET", "/health"),
    (3, "POST", "/login"),
    (4, "GET", "/nowhere"),
];

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generator {
    /// The seed of every choice.
    pub seed: u64,
    /// How many lines.
    pub lines: u64,
    /// How many clients: client `i` has the address `10.a.b.c` of `i / 2`
    /// (two clients per address, as behind a NAT); one in ten is
    /// anonymous, one in seven of the others is on the pro plan (user
    /// `pro-u<i>`), the rest are user `u<i>`.
    pub clients: u32,
    /// The first line's time, in seconds since the epoch.
    pub start_secs: u64,
    /// The seconds the log spans; times never go back.
    pub span_secs: u64,
}

impl Default for Generator {
    /// The acceptance's log: 1,000,000 lines over 5,000 clients in two
    /// hours from 2026-11-20 00:00 UTC, seed 34.
    fn default() -> Self {
        Generator {
            seed: 34,
            lines: 1_000_000,
            clients: 5_000,
            start_secs: 1_795_132_800,
            span_secs: 7_200,
        }
    }
}

/// One generated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// Its time, in seconds since the epoch.
    pub secs: u64,
    /// The client's address.
    pub ip: IpAddr,
    /// The client's user, if it is not anonymous.
    pub user: Option<String>,
    /// The method.
    pub method: &'static str,
    /// The path and query.
    pub target: &'static str,
    /// The status logged, the demo's answer to it unlimited: 401 for a
    /// login (no body is sent, so it fails) and for an anonymous call of
    /// `/api/*`, 404 for a path without a route, 201 for a created item,
    /// 200 otherwise.
    pub status: u16,
}

impl Generator {
    /// The requests, in order.
    pub fn requests(&self) -> impl Iterator<Item = Generated> + use<> {
        let this = *self;
        let mut rng = StdRng::seed_from_u64(this.seed);
        let total: u32 = ROUTES.iter().map(|r| r.0).sum();
        let clients = this.clients.max(1);
        (0..this.lines).map(move |n| {
            // Skewed: client 0 sends about an eighth of all requests.
            let u: f64 = rng.random();
            let client = ((f64::from(clients) * u.powi(4)) as u32).min(clients - 1);
            let mut pick = rng.random_range(0..total);
            let mut route = ROUTES[0];
            for r in ROUTES {
                if pick < r.0 {
                    route = *r;
                    break;
                }
                pick -= r.0;
            }
            let host = client / 2;
            let ip = IpAddr::V4(Ipv4Addr::new(
                10,
                (host >> 16) as u8,
                (host >> 8) as u8,
                host as u8,
            ));
            let user = match client {
                c if c % 10 == 9 => None,
                c if c % 7 == 0 => Some(format!("pro-u{c}")),
                c => Some(format!("u{c}")),
            };
            let status = match (route.1, route.2, &user) {
                ("POST", "/login", _) => 401,
                (_, "/nowhere", _) => 404,
                (_, target, None) if target.starts_with("/api/") => 401,
                ("POST", "/api/items", Some(_)) => 201,
                _ => 200,
            };
            Generated {
                secs: this
                    .start_secs
                    .saturating_add(spread(n, this.span_secs, this.lines)),
                ip,
                user,
                method: route.1,
                target: route.2,
                status,
            }
        })
    }

    /// Writes the log in the combined format.
    ///
    /// # Errors
    ///
    /// When writing fails.
    pub fn write_combined(&self, out: &mut impl Write) -> io::Result<()> {
        let mut stamp = (u64::MAX, String::new());
        for r in self.requests() {
            if stamp.0 != r.secs {
                let secs = i64::try_from(r.secs).unwrap_or(i64::MAX);
                let time = jiff::Timestamp::from_second(secs).unwrap_or(jiff::Timestamp::MAX);
                stamp = (r.secs, time.strftime("%d/%b/%Y:%H:%M:%S +0000").to_string());
            }
            writeln!(
                out,
                "{} - {} [{}] \"{} {} HTTP/1.1\" {} 512 \"-\" \"loadgen/1.0\"",
                r.ip,
                r.user.as_deref().unwrap_or("-"),
                stamp.1,
                r.method,
                r.target,
                r.status
            )?;
        }
        Ok(())
    }
}

/// Line `n`'s offset into a log of `lines` lines over `span` seconds, at
/// most `span`, with no overflow for any input.
fn spread(n: u64, span: u64, lines: u64) -> u64 {
    let offset = u128::from(n) * u128::from(span) / u128::from(lines.max(1));
    u64::try_from(offset).unwrap_or(span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_span_gives_times_that_never_go_back_and_never_overflow() {
        let generator = Generator {
            lines: 4,
            span_secs: u64::MAX,
            start_secs: u64::MAX - 10,
            ..Generator::default()
        };
        let secs: Vec<u64> = generator.requests().map(|r| r.secs).collect();
        assert_eq!(secs, [u64::MAX - 10, u64::MAX, u64::MAX, u64::MAX]);
        let mut out = Vec::new();
        generator.write_combined(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap().lines().count(), 4);
        // Within range, line n is n/lines of the way through the span.
        let even = Generator {
            lines: 4,
            span_secs: 8,
            start_secs: 100,
            ..Generator::default()
        };
        let secs: Vec<u64> = even.requests().map(|r| r.secs).collect();
        assert_eq!(secs, [100, 102, 104, 106]);
    }
}
