//! The replay's report: totals per policy file, the clients refused most,
//! side by side, and a CSV of every client.

use std::fmt::Write as _;
use std::io::{self, Write};

use tollgate::Timestamp;

use crate::Replay;

/// The clients most refused by any policy file (most first, then by
/// name), at most `top` of them.
fn most_refused(replay: &Replay, top: usize) -> Vec<(&str, &crate::ClientTally)> {
    let lanes = replay.lanes().count();
    let worst = |t: &crate::ClientTally| (0..lanes).map(|l| t.refused(l)).max().unwrap_or(0);
    let mut clients: Vec<_> = replay.clients().filter(|(_, t)| worst(t) > 0).collect();
    clients.sort_by(|a, b| worst(b.1).cmp(&worst(a.1)).then(a.0.cmp(b.0)));
    clients.truncate(top);
    clients
}

/// The report as text: the requests replayed, those that could not be
/// and a warning if lines were [out of order](Replay::out_of_order), each
/// policy file's refusals, by the policy that fired, and the requests it
/// answered neither by their route nor with a refusal, by status
/// ([`LaneTally::answered_otherwise`](crate::LaneTally::answered_otherwise)), then the `top` clients refused most with, per file, how many
/// and between which times.
///
/// ```
/// let replay = log_replay::Replay::new(vec![(
///     "demo".to_owned(),
///     axum_app::AppConfig::parse(include_str!("../../axum-app/policies.toml"))?,
/// )])?;
/// assert!(log_replay::report::text(&replay, 10).starts_with("replayed 0 requests"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn text(replay: &Replay, top: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "replayed {} requests of {} clients ({} not replayable, {} out of order)",
        replay.replayed(),
        replay.clients().count(),
        replay.unreplayable(),
        replay.out_of_order()
    );
    if let Some((logged, clock)) = replay.furthest_behind() {
        let _ = writeln!(
            out,
            "warning: {} lines logged more than {} s before the replay clock were not replayed; \
             the furthest behind was logged at {}, when the clock was at {} \
             (a line dated ahead of the log moves the clock forward for good)",
            replay.out_of_order(),
            Replay::OUT_OF_ORDER_TOLERANCE.as_secs(),
            time(logged),
            time(clock)
        );
    }
    for (i, lane) in replay.lanes().enumerate() {
        let refused_clients = replay.clients().filter(|(_, t)| t.refused(i) > 0).count();
        let otherwise: u64 = lane.answered_otherwise().values().sum();
        let _ = writeln!(
            out,
            "\n{}: refused {} requests of {refused_clients} clients; \
             answered {otherwise} neither by their route nor with 429",
            lane.name(),
            lane.refused()
        );
        for (policy, n) in lane.by_policy() {
            let _ = writeln!(out, "  {policy:<24} {n:>10}");
        }
        for (status, n) in lane.answered_otherwise() {
            let label = format!("(answered {status})");
            let _ = writeln!(out, "  {label:<24} {n:>10}");
        }
    }
    let lanes: Vec<_> = replay.lanes().map(|l| l.name().to_owned()).collect();
    let _ = write!(
        out,
        "\nmost refused clients\n  {:<20} {:>9}",
        "client", "requests"
    );
    for name in &lanes {
        let _ = write!(
            out,
            "  {:>10} {:<41}",
            trim(name, 10),
            "first and last refusal (UTC)"
        );
    }
    out.push('\n');
    for (client, tally) in most_refused(replay, top) {
        let _ = write!(out, "  {:<20} {:>9}", trim(client, 20), tally.requests());
        for lane in 0..lanes.len() {
            let when = tally
                .refused_between(lane)
                .map(|(a, b)| format!("{} .. {}", time(a), time(b)))
                .unwrap_or_default();
            let _ = write!(out, "  {:>10} {when:<41}", tally.refused(lane));
        }
        out.push('\n');
    }
    out
}

/// Writes every client as CSV: `client,requests`, then per policy file
/// its refusals and the first and last refusal (RFC 3339), sorted by
/// client.
///
/// # Errors
///
/// When writing fails.
pub fn csv(replay: &Replay, out: &mut impl Write) -> io::Result<()> {
    let lanes: Vec<String> = replay.lanes().map(|l| l.name().replace(',', " ")).collect();
    write!(out, "client,requests")?;
    for name in &lanes {
        write!(out, ",{name} refused,{name} first,{name} last")?;
    }
    writeln!(out)?;
    let mut clients: Vec<_> = replay.clients().collect();
    clients.sort_by(|a, b| a.0.cmp(b.0));
    for (client, tally) in clients {
        write!(
            out,
            "{},{}",
            client.replace([',', '"', '\n'], "_"),
            tally.requests()
        )?;
        for lane in 0..lanes.len() {
            let (first, last) = tally
                .refused_between(lane)
                .map(|(a, b)| (rfc3339(a), rfc3339(b)))
                .unwrap_or_default();
            write!(out, ",{},{first},{last}", tally.refused(lane))?;
        }
        writeln!(out)?;
    }
    Ok(())
}

fn trim(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

fn jiff_time(t: Timestamp) -> Option<jiff::Timestamp> {
    jiff::Timestamp::from_microsecond(i64::try_from(t.as_micros()).ok()?).ok()
}

fn time(t: Timestamp) -> String {
    jiff_time(t)
        .map(|t| t.strftime("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_default()
}

fn rfc3339(t: Timestamp) -> String {
    jiff_time(t).map(|t| t.to_string()).unwrap_or_default()
}
