//! A conformance suite any [`Store`] can run (feature `testing`): does the
//! store give exactly the reference decisions of
//! [`PolicyState`]?
//!
//! The memory store and the Redis store both run it in their tests; a
//! third-party store should too. Build the store on a [`FakeClock`] (the
//! memory store's [`clock`](crate::MemoryStoreBuilder::clock), the Redis
//! store's `test_clock`) and pass both to [`check_store`]. The suite sets
//! and advances that clock, and compares every decision with the
//! reference's at the same time:
//!
//! - every algorithm, with one limit and with two, with and without a
//!   burst, over a few hundred requests of costs from 0 (a peek) to above
//!   capacity, at gaps from none to more than a period;
//! - the same with two configurations of one policy name served in turn,
//!   as during a rolling deploy that changes a limit: what a key has used
//!   carries over (see
//!   [`PolicyState::carry_to`]);
//! - in every case, [`Store::status`] now and then (it must equal a peek
//!   and change nothing), and a [`Store::reset`] halfway, after which the
//!   key starts afresh;
//! - after about one admitted request in four, a [`Store::settle`] of an
//!   actual cost from nothing to twice the capacity (a refund, or a charge
//!   into debt), some time later, perhaps in another window;
//! - a [`Store::block`] three quarters in, for up to two periods: every
//!   request, status and settlement until it ends is denied with the rest
//!   of the block as `Retry-After`, and the key then starts afresh;
//! - the fixed window on [calendar periods](crate::Calendar): the same
//!   random cases started just before month ends (of 28, 29, 30 and 31
//!   days, the leap day of 2028), the daylight-saving changes of
//!   Europe/Berlin in 2027 and a zone whose midnight falls in the gap
//!   (America/Santiago), with offsets, a limit raised mid-month (the
//!   month's usage carries over) and calendars changed in turn (a month
//!   from midnight and from 06:00, Berlin's days and plain ones, Berlin's
//!   days and UTC's); and at each
//!   such boundary, exact
//!   numbers: a key that spent its period 1 s before the boundary is told
//!   to come back in 1 s, and 1 s later has a whole new period, whose
//!   reset is its exact length (23 h for Berlin's spring day, 25 h for its
//!   autumn one, 29 days for February 2028).
//!
//! Every case uses keys of its own, so a shared store may run the suite
//! again, and alongside other tests.
//!
//! A usage ledger ([`crate::ledger`]) runs [`check_ledger`] the same way,
//! through a [`MeteredStore`](crate::ledger::MeteredStore) on a fake clock:
//! its buckets must hold exactly the admitted cost after settling.
//!
//! ```
//! use tollgate_core::{FakeClock, MemoryStore};
//! use tollgate_core::testing::check_store;
//!
//! let clock = FakeClock::default();
//! let store = MemoryStore::builder().clock(clock.clone()).build()?;
//! # let run = async {
//! let report = check_store(&store, &clock).await?;
//! assert!(report.decisions > 1_000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # };
//! # let mut run = std::pin::pin!(run);
//! # let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
//! # loop {
//! #     if let std::task::Poll::Ready(result) = run.as_mut().poll(&mut cx) { break result?; }
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod ledger;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::calendar::cases::{BOUNDARIES, at, calendar_cases, calendar_changes};
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::policy::Policy;
use crate::settle::Settlement;
use crate::state::{PolicyState, blocked};
use crate::store::Store;
use crate::time::{FakeClock, Timestamp};

pub use ledger::{LedgerReport, check_ledger};

/// What a passing run checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Cases run.
    pub cases: usize,
    /// Decisions compared with the reference.
    pub decisions: usize,
    /// Statuses compared with the reference.
    pub statuses: usize,
    /// Resets made, each followed by decisions of a fresh key.
    pub resets: usize,
    /// Settlements compared with the reference.
    pub settlements: usize,
    /// Blocks made, each followed by denials until it ended.
    pub blocks: usize,
    /// Calendar boundaries whose exact reset and new period were checked.
    pub boundaries: usize,
}

/// Where a store departed from the reference.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Mismatch {
    /// The store decided otherwise.
    #[error(
        "{case}, request {request} (cost {cost}): the store decided {store}, the reference {reference}"
    )]
    Decision {
        /// The case: policy or policies, as configured.
        case: String,
        /// The request's place in the case, from 0.
        request: usize,
        /// The request's cost.
        cost: u64,
        /// The store's decision, debug-formatted.
        store: String,
        /// The reference's decision, debug-formatted.
        reference: String,
    },
    /// A configuration of the suite was refused: a change of the
    /// validation rules that the suite has not followed.
    #[error("the suite's configuration was refused: {0}")]
    Setup(#[from] ConfigError),
    /// The store failed.
    #[error("{case}, request {request}: the store failed: {error}")]
    Failed {
        /// The case.
        case: String,
        /// The request's place in the case, from 0.
        request: usize,
        /// What failed.
        #[source]
        error: StoreError,
    },
}

/// Requests per case.
const REQUESTS: usize = 240;

/// Runs the suite against `store`, whose clock is `clock` (see the module
/// docs).
///
/// # Errors
///
/// The first [`Mismatch`].
pub async fn check_store<S: Store>(store: &S, clock: &FakeClock) -> Result<Report, Mismatch> {
    let mut report = Report {
        cases: 0,
        decisions: 0,
        statuses: 0,
        resets: 0,
        settlements: 0,
        blocks: 0,
        boundaries: 0,
    };
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    for algorithm in Algorithm::ALL {
        for configs in cases(algorithm) {
            let configs = configs
                .iter()
                .map(|limits| policy(algorithm, limits))
                .collect::<Result<Vec<_>, _>>()?;
            // Somewhere inside a day, so windows start anywhere.
            let start = (Timestamp::from_secs(1_700_000_000), 86_400);
            run(store, clock, &configs, start, &mut random, &mut report).await?;
            report.cases += 1;
        }
    }
    // The calendar cases, each configuration under the case's calendar,
    // then the changes, each under its own.
    let cases = calendar_cases()
        .into_iter()
        .map(|(zone, offset, configs, start)| {
            let configs = configs.into_iter().map(|limits| (zone, offset, limits));
            (configs.collect::<Vec<_>>(), start)
        });
    for (configs, start) in cases.chain(calendar_changes()) {
        let configs = configs
            .into_iter()
            .map(|(zone, offset, limits)| {
                let mut builder =
                    Policy::builder("conformance-calendar").algorithm(Algorithm::FixedWindow);
                if !zone.is_empty() {
                    let offset = Duration::from_secs(offset * 3600);
                    builder = builder.calendar(crate::Calendar::new(zone)?.with_offset(offset));
                }
                for &limit in limits {
                    builder = builder.limit(limit);
                }
                builder.build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Within the hour before the boundary.
        run(
            store,
            clock,
            &configs,
            (at(start), 3_600),
            &mut random,
            &mut report,
        )
        .await?;
        report.cases += 1;
    }
    for &(zone, offset, limit, boundary, next_hours) in BOUNDARIES {
        let calendar = crate::Calendar::new(zone)?.with_offset(Duration::from_secs(offset * 3600));
        let policy = Policy::builder("conformance-boundary")
            .algorithm(Algorithm::FixedWindow)
            .limit(limit)
            .calendar(calendar)
            .build()?;
        let next = Duration::from_secs(next_hours * 3600);
        boundary_case(store, clock, &policy, at(boundary), next).await?;
        report.boundaries += 1;
    }
    Ok(report)
}

/// A fresh key spends `policy`'s one limit 1 s before `boundary`: told to
/// come back in 1 s; at the boundary it has the whole next period, which
/// resets `next` later.
async fn boundary_case<S: Store>(
    store: &S,
    clock: &FakeClock,
    policy: &Policy,
    boundary: Timestamp,
    next: Duration,
) -> Result<(), Mismatch> {
    let key = fresh_key();
    let case = format!("{policy} at the boundary {}", boundary.as_micros());
    let second = Duration::from_secs(1);
    let count = policy.limits().first().map_or(1, |l| l.count());
    let failed = |request, error| Mismatch::Failed {
        case: case.clone(),
        request,
        error,
    };
    let wrong = |request, cost, store: &crate::Decision, expected: String| Mismatch::Decision {
        case: case.clone(),
        request,
        cost,
        store: format!("{store:?}"),
        reference: expected,
    };
    clock.set(boundary - second);
    let spent = store
        .check(&key, policy, count)
        .await
        .map_err(|e| failed(0, e))?;
    let status = spent.binding();
    if !spent.is_allowed() || status.remaining() != 0 || status.reset() != second {
        return Err(wrong(
            0,
            count,
            &spent,
            "allowed, 0 remaining, reset in 1 s".into(),
        ));
    }
    let denied = store
        .check(&key, policy, 1)
        .await
        .map_err(|e| failed(1, e))?;
    if denied.retry_after() != Some(second) {
        return Err(wrong(1, 1, &denied, "limited, retry after 1 s".into()));
    }
    clock.set(boundary);
    let fresh = store
        .check(&key, policy, 1)
        .await
        .map_err(|e| failed(2, e))?;
    let status = fresh.binding();
    if !fresh.is_allowed() || status.remaining() != count - 1 || status.reset() != next {
        let expected = format!("allowed, {} remaining, reset in {next:?}", count - 1);
        return Err(wrong(2, 1, &fresh, expected));
    }
    Ok(())
}

/// The configurations of each case: a list of limits and an optional burst
/// per configuration; two configurations are served in turn.
fn cases(algorithm: Algorithm) -> Vec<Vec<(&'static [&'static str], Option<u64>)>> {
    let burst = |b| algorithm.has_burst().then_some(b);
    vec![
        vec![(&["5/s"], None)],
        vec![(&["12/min"], burst(20))],
        vec![(&["3/s", "20/min"], None)],
        vec![(&["20/min"], None), (&["25/min"], burst(30))],
        vec![(&["6/s"], None), (&["6/s", "30/min"], None)],
    ]
}

fn policy(
    algorithm: Algorithm,
    &(limits, burst): &(&[&str], Option<u64>),
) -> Result<Policy, ConfigError> {
    let mut builder = Policy::builder("conformance").algorithm(algorithm);
    for &limit in limits {
        builder = builder.limit(limit);
    }
    if let Some(burst) = burst {
        builder = builder.burst(burst);
    }
    builder.build()
}

/// A key no other run uses.
fn fresh_key() -> Key {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let wall = crate::time::Clock::now(&crate::time::SystemClock).as_micros();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Key::custom(format!("conformance-{}-{wall}-{n}", std::process::id()))
}

/// One case: requests at random gaps and costs, served by the
/// configurations in turn, with a status now and then and a reset halfway;
/// counts what it compared into `report`.
async fn run<S: Store>(
    store: &S,
    clock: &FakeClock,
    configs: &[Policy],
    (start, spread_secs): (Timestamp, u64),
    random: &mut Random,
    report: &mut Report,
) -> Result<(), Mismatch> {
    let key = fresh_key();
    let name = configs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" then ");
    clock.set(start + Duration::from_micros(random.below(spread_secs * 1_000_000)));
    let shortest = configs
        .iter()
        .flat_map(|p| p.params().iter().map(|p| p.period_us))
        .min()
        .unwrap_or(1_000_000);
    let capacity = configs
        .iter()
        .flat_map(|p| p.params().iter().map(|p| p.capacity))
        .max()
        .unwrap_or(1);
    let mut reference: Option<PolicyState> = None;
    let mut blocked_until: Option<Timestamp> = None;
    let mismatch = |request, cost, store: String, reference: String| Mismatch::Decision {
        case: name.clone(),
        request,
        cost,
        store,
        reference,
    };
    for request in 0..REQUESTS {
        let gap = match random.below(10) {
            0..=3 => 0,
            4..=8 => random.below(shortest / 4 + 1),
            _ => random.below(2 * shortest),
        };
        clock.advance(Duration::from_micros(gap));
        let cost = match random.below(20) {
            0 => 0,
            1 => capacity + 1,
            2..=4 => 1 + random.below(capacity),
            _ => 1,
        };
        let policy = &configs[request % configs.len()];
        let now = crate::time::Clock::now(clock);
        let failed = |error| Mismatch::Failed {
            case: name.clone(),
            request,
            error,
        };
        if request == REQUESTS / 2 {
            store.reset(&key, policy).await.map_err(failed)?;
            reference = None;
            report.resets += 1;
        }
        if request == REQUESTS * 3 / 4 {
            let duration = Duration::from_micros(1 + random.below(2 * shortest));
            store.block(&key, policy, duration).await.map_err(failed)?;
            blocked_until = Some(now + duration);
            reference = None;
            report.blocks += 1;
        }
        // The requests after a reset or a block come after it: one reserved
        // in its very microsecond is fenced in tollgate's stores (see
        // `Settlement::fence`), which the reference, and a store without
        // fences, do not model.
        let now = match request == REQUESTS / 2 || request == REQUESTS * 3 / 4 {
            true => {
                clock.advance(Duration::from_micros(1));
                crate::time::Clock::now(clock)
            }
            false => now,
        };
        // The reference's decision at `now` of a request of `cost` (which
        // every decision reports), or the block's.
        let mut expect = |cost: u64| {
            if let Some(until) = blocked_until.filter(|&until| until > now) {
                return blocked(policy, now, until).with_cost(cost);
            }
            let state = reference.get_or_insert_with(|| PolicyState::new(policy, now));
            state.decide(policy, now, cost)
        };
        if request % 40 == 39 {
            let expected = expect(0);
            let status = store.status(&key, policy).await.map_err(failed)?;
            if status != expected {
                let (status, expected) = (format!("{status:?} (status)"), format!("{expected:?}"));
                return Err(mismatch(request, 0, status, expected));
            }
            report.statuses += 1;
        }
        let expected = expect(cost);
        let decided = store.check(&key, policy, cost).await.map_err(failed)?;
        if decided != expected {
            let (decided, expected) = (format!("{decided:?}"), format!("{expected:?}"));
            return Err(mismatch(request, cost, decided, expected));
        }
        report.decisions += 1;
        if decided.is_allowed() && cost > 0 && random.below(4) == 0 {
            clock.advance(Duration::from_micros(random.below(shortest)));
            let now = crate::time::Clock::now(clock);
            let settlement = Settlement::of(&decided, cost, random.below(2 * capacity + 1));
            let expected = match blocked_until.filter(|&until| until > now) {
                Some(until) => blocked(policy, now, until),
                None => reference
                    .get_or_insert_with(|| PolicyState::new(policy, now))
                    .settle(policy, now, &settlement),
            };
            let settled = store
                .settle(&key, policy, settlement)
                .await
                .map_err(failed)?;
            if settled != expected {
                let (settled, expected) = (
                    format!("{settled:?} (settling {settlement:?})"),
                    format!("{expected:?}"),
                );
                return Err(mismatch(request, cost, settled, expected));
            }
            report.settlements += 1;
        }
    }
    Ok(())
}

/// SplitMix64: a fixed sequence, so a failing run fails again.
struct Random(u64);

impl Random {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n.max(1)
    }
}
