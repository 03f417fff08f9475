//! A lease: units of a key's allowance this instance spends locally, and
//! how the next one is sized.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Decision, Key, LimitStatus, Outcome, Policy, Timestamp};

use super::super::refunds::Refunds;

/// Units of a key's allowance that the store has counted as used and this
/// instance spends locally.
pub(crate) struct Lease {
    pub(crate) granted: u64,
    pub(crate) left: u64,
    /// Local time (µs) the grant was asked for.
    pub(crate) sent: u64,
    /// Local time (µs) from which the lease is no longer spent.
    pub(crate) expires: u64,
    /// Local time (µs) of the first spend from the lease, and its cost:
    /// the key's rate is measured from there, not from the ask (a lease
    /// asked for ahead waits for the one before it).
    pub(crate) began: u64,
    pub(crate) first: u64,
    /// Held to the limit's share: shorter than a lease's span at the
    /// key's rate, so the next one is asked for sooner.
    pub(crate) capped: bool,
    /// The store's answer to the grant.
    pub(crate) base: Decision,
    pub(crate) identity: [u8; 16],
    pub(crate) key: Key,
    pub(crate) policy: Policy,
    /// The key's refunds sent by this instance, and how many of their
    /// units were known done when the grant was asked for (see
    /// [`Lease::unused`]); none for a lease whose return does not drain.
    pub(crate) refunds: Option<(Arc<Refunds>, u64)>,
}

impl Lease {
    /// The decision of a request of `cost` spent from this lease at local
    /// time `now`: what the store said at the grant, plus the units this
    /// lease still holds, with reset times counted down since.
    pub(crate) fn spend(&mut self, cost: u64, now: u64) -> Decision {
        self.take(cost, now);
        self.status(now).with_cost(cost)
    }

    /// Takes `units` of the lease at local time `now`, as spent.
    fn take(&mut self, units: u64, now: u64) {
        if self.left == self.granted {
            (self.began, self.first) = (now, units);
        }
        self.left -= units;
    }

    /// What the lease tells of the key at local time `now`: what the store
    /// said at the grant, plus the units the lease still holds, with reset
    /// times counted down since.
    fn status(&self, now: u64) -> Decision {
        let elapsed = now.saturating_sub(self.sent);
        let statuses = self.base.limits().iter().map(|s| {
            LimitStatus::new(
                s.index(),
                s.limit(),
                s.capacity(),
                s.remaining().saturating_add(self.left),
                s.reset().saturating_sub(Duration::from_micros(elapsed)),
                None,
            )
        });
        let store_now = Timestamp::from_micros(self.base.now().as_micros() + elapsed);
        Decision::new(
            &self.policy,
            Outcome::Allowed,
            store_now,
            Duration::ZERO,
            statuses,
        )
        // The store counted these units at the grant: a settlement is
        // reserved then, and a reset or block since fences its refund.
        .with_reserved_at(self.base.now())
        // Spent from the units of whoever granted them: a lease a local
        // fallback granted is settled there, not in the store behind it.
        .with_decided_by(self.base.decided_by())
    }

    /// Takes up to `units` of the lease at local time `now`, for a
    /// settlement's charge, if it is still spent: how many it took, and
    /// what it tells of the key then.
    pub(crate) fn charge(&mut self, units: u64, now: u64) -> Option<(u64, Decision)> {
        if self.expires <= now || self.left == 0 {
            return None;
        }
        let taken = units.min(self.left);
        self.take(taken, now);
        Some((taken, self.status(now)))
    }

    /// The size of the lease after this one at `now`, when a request of
    /// `arriving` units (0 if none) comes then: the units this one saw
    /// spent after its first spend, and the arriving ones, scaled to one
    /// lease's span of `interval` ([`covering`]), at most twice its size
    /// and at most `cap`.
    ///
    /// The arriving request counts: its wait since the last spend is part
    /// of the time measured, and without its units the rate would be
    /// measured low, by a fifth over a lease of five. A lease of fewer
    /// than [`SMALL_LEASE`] units measures the rate over so few requests
    /// that it wavers widely, so the next size is the mean of what it
    /// measured and this lease's own size: a key of steady rate near the
    /// least that is worth a lease keeps its leases, instead of falling
    /// back to the store for an interval whenever its requests come
    /// spaced out.
    pub(crate) fn next_size(&self, now: u64, arriving: u64, interval: Duration, cap: u64) -> u64 {
        let used = self.granted - self.left;
        let (units, since) = if used > self.first {
            (used - self.first, self.began)
        } else {
            (used, self.sent)
        };
        let measured = covering(
            units.saturating_add(arriving),
            now.saturating_sub(since),
            interval,
        );
        let measured = if self.granted < SMALL_LEASE {
            measured.saturating_add(self.granted).div_ceil(2)
        } else {
            measured
        };
        measured.min(self.granted.saturating_mul(2)).min(cap)
    }

    /// What to give back to the store at local time `now` (µs): the
    /// unused part, as a settlement. Of a single rate-based limit, no more
    /// than can still be in the key's backlog: the grant's units drain
    /// from it from the grant on, its unused ones last (after the spent
    /// ones), and what drained is gone. Given back whole after that, they
    /// were handed out again, at once, to whoever had filled the backlog
    /// since. (A settlement gives the same units back to every limit of a
    /// policy, and its limits drain at different rates: bounded by the
    /// fastest, a return would keep back what the slower ones still hold,
    /// so a policy of several limits gives its unused part back whole.)
    ///
    /// A refund of the key's that the store took after the grant (of a
    /// request spent from this lease or reserved before it, or another
    /// lease's return) shortened that backlog, and the unused units with
    /// it: they drained sooner, by as many units as were refunded. So the
    /// refunds this instance sent for the key that were not known done
    /// when the grant was asked for (the store may have taken them after
    /// the grant) come off what can still be in the backlog.
    pub(crate) fn unused(&self, now: u64) -> Option<tollgate_core::Settlement> {
        let mut left = self.left;
        if drains(&self.policy) {
            let refunded = self
                .refunds
                .as_ref()
                .map_or(0, |(refunds, done_before)| refunds.since(*done_before));
            let elapsed = Duration::from_micros(now.saturating_sub(self.sent));
            for status in self.base.limits() {
                // The emission interval, rounded up: never more units than
                // the backlog's time holds.
                let limit = status.limit();
                let interval = limit.period_micros().div_ceil(limit.count().max(1)).max(1);
                let draining = status.reset().saturating_sub(elapsed).as_micros();
                let still = draining / u128::from(interval);
                let still = u64::try_from(still).unwrap_or(u64::MAX);
                left = left.min(still.saturating_sub(refunded));
            }
        }
        (left > 0).then(|| {
            // Given back where the grant was made (`Settlement::of` keeps
            // who decided it), at the store's time of the grant.
            tollgate_core::Settlement::of(&self.base, self.granted, self.granted - left)
        })
    }
}

/// The units a lease should hold for a key that spent `cost` in `elapsed`
/// µs: what it spends in one and a half `interval`s at that rate.
///
/// A lease's life is two intervals from its ask, and the next one is
/// asked for when seven eighths of the current one are spent, so it
/// waits unspent for an eighth of the current one's span: at the key's
/// rate, a lease of `x` intervals is used up by `x + x / 8` intervals
/// after its ask, within its life up to `x = 16 / 9`. One and a half
/// leaves a margin for a rate that wavers, and takes a third fewer grants
/// than a lease of one interval. The eighth left when the next one is
/// asked for lasts nearly a fifth of an interval at the key's rate (less
/// for a lease held to its share of the limit): far longer than a round
/// trip, so a hot key does not wait for its next lease.
pub(super) fn covering(cost: u64, elapsed: u64, interval: Duration) -> u64 {
    let span = interval.as_micros().saturating_mul(3) / 2;
    let units = u128::from(cost).saturating_mul(span) / u128::from(elapsed.max(1));
    u64::try_from(units).unwrap_or(u64::MAX)
}

/// The fewest units a lease holds beyond the request that asks for it. A
/// lease costs a grant, which only its first request waits for (the next
/// one is asked for when this one is used up, or ahead of that), and
/// perhaps a return: two spare units spare two requests their round trip
/// to the store, for one call more at most.
pub(crate) const LEASE_MIN_SPARE: u64 = 2;

/// Leases smaller than this ask for the next one when used up (seven
/// eighths of them is all of them) or late in their life, and size it
/// from the mean of the rate they measured and their own size
/// ([`Lease::next_size`]).
pub(crate) const SMALL_LEASE: u64 = 8;

/// Whether the unused part of a lease of `policy` is bounded by what
/// drains from the key's backlog, and so by the key's refunds
/// ([`Lease::unused`]): one limit of a rate-based algorithm.
pub(crate) fn drains(policy: &Policy) -> bool {
    policy.algorithm().has_burst() && policy.params().len() == 1
}
