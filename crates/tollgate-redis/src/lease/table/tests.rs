//! The lease table's units: refunds counted against leases, and what a
//! store's answer does to a key's entry.

use super::*;
use crate::lease::refunds::{LATE_REFUND, Refunding};
use tollgate_core::state::PolicyState;
use tollgate_core::{Algorithm, Timestamp};

/// A GCRA lease of 100 units at 1,000 a second, granted from an empty
/// key at local time 0, with 50 left, whose key's refunds are
/// `refunds` as they stood when the grant was asked for.
fn lease(refunds: &Arc<Refunds>) -> Lease {
    let policy = Policy::new("refunds", Algorithm::Gcra, "1000/s").unwrap();
    let now = Timestamp::from_secs(1_700_000_000);
    let base = PolicyState::new(&policy, now).decide(&policy, now, 100);
    Lease {
        granted: 100,
        left: 50,
        sent: 0,
        expires: u64::MAX,
        began: 0,
        first: 0,
        capped: false,
        base,
        identity: [0; 16],
        key: Key::user("ada"),
        policy,
        refunds: Some((Arc::clone(refunds), refunds.done())),
    }
}

/// What `lease` gives back at local time `now` (µs).
fn given_back(lease: &Lease, now: u64) -> u64 {
    lease
        .unused(now)
        .map_or(0, |settlement| settlement.refund())
}

#[test]
fn refunds_not_known_done_at_the_grant_come_off_what_a_lease_gives_back() {
    let refunds = Arc::new(Refunds::default());
    // Done before the grant was asked for: the store took it before.
    Refunding::start(&refunds, 7).done();
    // On its way when the grant was asked for: it may land after it.
    let on_its_way = Refunding::start(&refunds, 5);
    let lease = lease(&refunds);
    // Early, the lease's 50 are all still in the 100 ms backlog.
    assert_eq!(given_back(&lease, 0), 50);
    // 90 ms on, 10 units of the backlog remain, 5 of them refunded.
    assert_eq!(given_back(&lease, 90_000), 5);
    on_its_way.done();
    assert_eq!(given_back(&lease, 90_000), 5, "done after the grant");
    // A refund after the grant that failed, or was dropped, without a
    // runtime to count it done later: never done.
    drop(Refunding::start(&refunds, 3));
    assert_eq!(given_back(&lease, 90_000), 2);
    // A lease asked for after it still counts it: it may yet run.
    assert_eq!(given_back(&self::lease(&refunds), 90_000), 7);
    // Counts past `u64::MAX` saturate, and leave nothing to give back.
    Refunding::start(&refunds, u64::MAX).done();
    assert_eq!(given_back(&lease, 0), 0);
}

#[tokio::test(start_paused = true)]
async fn a_refund_that_may_still_land_is_done_after_its_grace() {
    let refunds = Arc::new(Refunds::default());
    let lease = lease(&refunds);
    // Failed in a way that may have reached the store, or dropped.
    drop(Refunding::start(&refunds, 4));
    tokio::time::sleep(LATE_REFUND - Duration::from_millis(1)).await;
    assert_eq!(given_back(&lease, 90_000), 6, "it may still land");
    tokio::time::sleep(Duration::from_millis(1)).await;
    tokio::task::yield_now().await;
    // Done, it still counts against the lease asked for before it...
    assert_eq!(given_back(&lease, 90_000), 6);
    // ...and no longer against one asked for after.
    assert_eq!(given_back(&self::lease(&refunds), 90_000), 10);
}

/// A store's blocked answer drops the key's leases, and a grant the store
/// decided before that answer (answered after it, on another connection)
/// is not kept; one decided since (the block lifted, or over) is.
#[test]
fn a_blocked_answer_drops_the_leases_and_the_grants_decided_before_it() {
    let refunds = Arc::new(Refunds::default());
    let policy = Policy::new("blocked", Algorithm::Gcra, "1000/s").unwrap();
    let at = Timestamp::from_secs(1_700_000_000);
    let until = Timestamp::from_secs(1_700_000_060);
    let mut entry = Entry::new(policy.fingerprint(), 0);
    entry.lease = Some(Box::new(lease(&refunds)));
    entry.next = Some(Box::new(lease(&refunds)));
    assert!(entry.keeps_grant(at));
    entry.store_answered(&tollgate_core::state::blocked(&policy, at, until), 0);
    assert!(entry.lease.is_none() && entry.next.is_none());
    assert!(!entry.keeps_grant(at - std::time::Duration::from_micros(1)));
    assert!(entry.keeps_grant(at));
    assert!(entry.keeps_grant(until));
}

#[test]
fn a_lease_asks_for_the_next_one_late_in_a_whole_life_not_in_one_its_window_cut_short() {
    let interval = Duration::from_secs(1);
    let refunds = Arc::new(Refunds::default());
    // Half spent, far from the seven eighths that would ask.
    let half_spent = |expires| Lease {
        expires,
        first: 1,
        ..lease(&refunds)
    };
    let mut entry = Entry::new(0, 0);
    entry.lease = Some(Box::new(half_spent(2_000_000)));
    assert_eq!(entry.ahead(1_499_999, interval, || 1_000), None);
    assert_eq!(
        entry.ahead(1_500_000, interval, || 1_000),
        Some(49),
        "in the last quarter of its life of two intervals"
    );
    // A window lease whose window ends first: the next lease would be
    // granted in the same window, and end unspent with it.
    entry.lease = Some(Box::new(half_spent(1_900_000)));
    assert_eq!(entry.ahead(1_800_000, interval, || 1_000), None);
}

#[test]
fn a_table_slot_without_its_leases_fits_in_128_bytes() {
    // With its two leases inline a slot (the key's hash and its entry)
    // was 608 bytes: 6 MB for 10,000 keys, far beyond a core's cache. The
    // leases are boxed; this fails if a slot grows past 128 bytes.
    let size = std::mem::size_of::<(u64, Entry)>();
    assert!(size <= 128, "a table slot is {size} bytes");
}

/// A table of one key a shard, and two hashes of one shard (its top
/// bits).
fn one_key_a_shard() -> (Table, u64, u64) {
    (Table::new(64), 5 << 58 | 1, 5 << 58 | 2)
}

/// Asks `table` for the entry of `hash` at `now`, of keys idle after
/// 2,000 µs; whether it got one.
fn entry_at(table: &Table, shard: &mut Map, hash: u64, now: u64) -> bool {
    let idle_before = now.saturating_sub(2_000);
    let mut ended = Vec::new();
    table
        .entry(shard, hash, 7, now, idle_before, &mut ended)
        .is_some()
}

#[test]
fn a_full_shard_turns_new_keys_away_without_a_scan_until_its_first_key_can_be_idle() {
    let (table, first, new) = one_key_a_shard();
    let mut shard = table.shard(first);
    assert!(entry_at(&table, &mut shard, first, 1_000));
    // Full: the scan finds nothing idle. The first key can be idle after
    // 3,000, sooner than a quarter of the idle span from now (3,400).
    assert!(!entry_at(&table, &mut shard, new, 2_900));
    // Set back by hand, the first key looks idle to a scan: none is made.
    shard.get_mut(&first).unwrap().last_seen = 0;
    assert!(!entry_at(&table, &mut shard, new, 3_000));
    assert!(entry_at(&table, &mut shard, new, 3_001));
    assert!(!shard.contains_key(&first));
}

#[test]
fn a_full_shard_is_scanned_again_within_a_quarter_of_the_idle_span() {
    let (table, first, new) = one_key_a_shard();
    let mut shard = table.shard(first);
    assert!(entry_at(&table, &mut shard, first, 1_000));
    // Full: the scan finds nothing idle. The first key can be idle only
    // after 3,000, but the shard is scanned again within a quarter of the
    // idle span (500) all the same.
    assert!(!entry_at(&table, &mut shard, new, 2_000));
    // Set back by hand, the first key looks idle to a scan: none is made.
    shard.get_mut(&first).unwrap().last_seen = 0;
    assert!(!entry_at(&table, &mut shard, new, 2_499));
    // From then on the shard is scanned again, and the idle key goes.
    assert!(entry_at(&table, &mut shard, new, 2_500));
    assert!(!shard.contains_key(&first));
}

#[test]
fn a_shard_full_of_keys_kept_for_a_grant_on_its_way_is_scanned_once_a_quarter_span() {
    let (table, first, new) = one_key_a_shard();
    let mut shard = table.shard(first);
    assert!(entry_at(&table, &mut shard, first, 1_000));
    let refill = shard.get_mut(&first).unwrap().begin_grant();
    // Idle, but kept for its grant: no key of the shard can be idle
    // later, yet the next scan waits a quarter of the idle span.
    assert!(!entry_at(&table, &mut shard, new, 5_000));
    drop(refill);
    shard.get_mut(&first).unwrap().refilling = None;
    assert!(!entry_at(&table, &mut shard, new, 5_499));
    assert!(entry_at(&table, &mut shard, new, 5_500));
}

/// A charge is paid from the key's leases granted by the store that
/// decided the request: not from a lease a local fallback granted (its
/// units are counted there) for a request the shared store decided, and
/// from the next lease once the current one is used up.
#[test]
fn a_charge_is_paid_from_the_leases_of_the_store_that_decided_its_request() {
    let refunds = Arc::new(Refunds::default());
    let mut entry = Entry::new(0, 0);
    let mut local = lease(&refunds);
    local.base = local.base.with_decided_by(DecidedBy::LocalFallback);
    entry.lease = Some(Box::new(local));
    entry.next = Some(Box::new(lease(&refunds)));
    let (taken, told) = entry.charge(60, 10, DecidedBy::Store);
    assert_eq!(taken, 50, "the next lease's 50");
    assert_eq!(told.map(|d| d.decided_by()), Some(DecidedBy::Store));
    let left = |l: &Option<Box<Lease>>| l.as_ref().map(|l| l.left);
    assert_eq!((left(&entry.lease), left(&entry.next)), (Some(50), Some(0)));
    let (taken, _) = entry.charge(20, 10, DecidedBy::LocalFallback);
    assert_eq!(taken, 20);
    assert_eq!(left(&entry.lease), Some(30));
}
