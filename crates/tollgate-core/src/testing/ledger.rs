//! The ledger's part of the suite: [`check_ledger`].

use std::collections::BTreeMap;
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::error::StoreError;
use crate::ledger::{Granularity, Ledger, LedgerSettings, MeteredStore, UsageQuery};
use crate::policy::Policy;
use crate::settle::Settlement;
use crate::store::Store;
use crate::time::{FakeClock, Timestamp};

use super::{Mismatch, Random, fresh_key};

/// What a passing ledger run checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LedgerReport {
    /// Requests admitted, each recorded.
    pub admitted: usize,
    /// Requests denied, none recorded.
    pub denied: usize,
    /// Settlements recorded.
    pub settlements: usize,
    /// Buckets compared with the expected usage.
    pub buckets: usize,
}

/// The second of 2026-01-31 22:00 UTC: the suite starts two hours before a
/// month ends.
const START: u64 = 1_769_896_800;

/// Requests per run.
const REQUESTS: usize = 400;

/// Runs the ledger's part of the suite against `store`, whose clock is
/// `clock`, and whose ledger has the default [`LedgerSettings`] (UTC): about
/// 400 requests of costs from 0 (a peek) to above the limit, at gaps up to
/// two hours across a day's and a month's end, with settlements (refunds
/// and charges, one of `u64::MAX`), a reset, a block and a status; then,
/// after a [`Ledger::flush`], each hour, day and month bucket and the total
/// must be exactly the admitted cost after settling.
///
/// # Errors
///
/// A [`Mismatch`]: a bucket that holds other than expected, or a store
/// that failed.
pub async fn check_ledger<S: Store, L: Ledger>(
    store: &MeteredStore<S, L>,
    clock: &FakeClock,
) -> Result<LedgerReport, Mismatch> {
    let settings = LedgerSettings::new();
    let policy = Policy::new("ledger-conformance", Algorithm::TokenBucket, "1000/h")?;
    let key = fresh_key();
    let mut random = Random(0x5eed_1ed6_e700_0001);
    let mut report = LedgerReport {
        admitted: 0,
        denied: 0,
        settlements: 0,
        buckets: 0,
    };
    let mut expected: BTreeMap<(Granularity, u64), i128> = BTreeMap::new();
    let mut add = |at: Timestamp, units: i128| {
        for g in Granularity::ALL {
            let start = settings.bucket_start(g, at).as_micros() / 1_000_000;
            *expected.entry((g, start)).or_default() += units;
        }
    };
    let failed = |request: usize| {
        move |error: StoreError| Mismatch::Failed {
            case: "ledger".to_owned(),
            request,
            error,
        }
    };
    let mut huge_done = false;
    clock.set(Timestamp::from_secs(START));
    for request in 0..REQUESTS {
        clock.advance(Duration::from_secs(random.below(2 * 3_600 / 8)));
        if request == REQUESTS / 2 {
            store.reset(&key, &policy).await.map_err(failed(request))?;
        }
        if request == REQUESTS * 3 / 4 {
            let block = Duration::from_secs(600);
            store
                .block(&key, &policy, block)
                .await
                .map_err(failed(request))?;
        }
        if request % 50 == 7 {
            store.status(&key, &policy).await.map_err(failed(request))?;
        }
        let cost = match random.below(20) {
            0 => 0,
            1 => 5_000,
            _ => 1 + random.below(60),
        };
        let decision = store
            .check(&key, &policy, cost)
            .await
            .map_err(failed(request))?;
        if !decision.is_allowed() || cost == 0 {
            report.denied += usize::from(!decision.is_allowed());
            continue;
        }
        report.admitted += 1;
        add(decision.reserved_at(), i128::from(cost));
        // Near the end, once, a request that cost u64::MAX: the key is in
        // debt for decades, and its bucket saturates nowhere near.
        let huge = request >= REQUESTS - 20 && !huge_done;
        if huge || random.below(3) == 0 {
            clock.advance(Duration::from_secs(random.below(1_800)));
            let actual = if huge {
                huge_done = true;
                u64::MAX
            } else {
                random.below(2 * cost + 1)
            };
            let settlement = Settlement::of(&decision, cost, actual);
            store
                .settle(&key, &policy, settlement)
                .await
                .map_err(failed(request))?;
            let change = i128::from(settlement.charge()) - i128::from(settlement.refund());
            add(decision.reserved_at(), change);
            report.settlements += 1;
        }
    }
    store.ledger().flush().await.map_err(failed(REQUESTS))?;
    let end = Timestamp::from_secs(crate::time::Clock::now(clock).as_micros() / 1_000_000 + 3_600);
    for g in Granularity::ALL {
        let query = UsageQuery::new(g, Timestamp::from_secs(START), end)?;
        let usage = store
            .ledger()
            .usage(&key, policy.name(), query)
            .await
            .map_err(failed(REQUESTS))?;
        let want: Vec<(u64, u64)> = expected
            .iter()
            .filter(|((eg, _), units)| *eg == g && **units > 0)
            .map(|(&(_, start), &units)| (start, u64::try_from(units).unwrap_or(u64::MAX)))
            .collect();
        let got: Vec<(u64, u64)> = usage
            .buckets()
            .iter()
            .map(|b| (b.start().as_micros() / 1_000_000, b.units()))
            .collect();
        let total: u64 = want.iter().map(|w| w.1).sum();
        if got != want || usage.total() != total {
            return Err(Mismatch::Decision {
                case: format!("ledger, {g} buckets"),
                request: REQUESTS,
                cost: 0,
                store: format!("{got:?}, total {}", usage.total()),
                reference: format!("{want:?}, total {total}"),
            });
        }
        report.buckets += got.len();
    }
    Ok(report)
}
