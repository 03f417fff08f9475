//! Settling what a limiter's reservation really cost:
//! [`RateLimiter::settle`].

use tollgate_core::{Decision, Key, Limit, Policy, Settlement, Store, StoreError};

use super::RateLimiter;
use crate::fallback::Reserved;
use crate::overrides::own_limits;

impl<St: Store> RateLimiter<St> {
    /// Settles what a piece of work admitted earlier really cost: checked
    /// (reserved) at `reservation`'s cost `reserved`, it cost `actual`.
    /// Refunds the unused part or charges the rest (past the allowance,
    /// as debt: see [`Settlement`]), and returns the state after it.
    ///
    /// ```
    /// use tollgate::{Algorithm, Key, Policy, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let tokens = RateLimiter::new(Policy::new("llm-tokens", Algorithm::TokenBucket, "1000/min")?);
    /// let tenant = Key::user("acme");
    /// let reservation = tokens.check_n(&tenant, 300).await?;
    /// assert!(reservation.is_allowed());
    /// let used = 120; // what the model call really took
    /// let after = tokens.settle(&tenant, &reservation, 300, used).await?;
    /// assert_eq!(after.remaining(), 880);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::check`], except that no failure mode turns a
    /// failed settlement into a decision: the caller decides whether to
    /// retry it. A failed settlement is counted in
    /// [`telemetry::STORE_ERRORS`](crate::telemetry::STORE_ERRORS), and
    /// logged as a warning at most once a second.
    ///
    /// The settlement goes where the reservation was made, as
    /// [`Decision::decided_by`] tells: to the store alone, or to the local
    /// fallback alone for a reservation it made while the store failed
    /// (refunded in the store, it would be quota the store never charged).
    /// A reservation no one counted (let through under
    /// [`FailureMode::Open`](crate::FailureMode::Open), or a key exempt
    /// by an override) settles nowhere: the reservation is returned. A
    /// denied reservation reserved nothing, whatever `reserved` says: only
    /// a charge of `actual` (work that ran anyway) is settled, and with
    /// `actual` of 0 the store is not asked and the reservation is
    /// returned. A `reserved` above the reservation's own
    /// [cost](Decision::cost) counts as that cost: no settlement refunds
    /// more than its reservation took. A reservation of cost 0 (a peek, or
    /// a decision of a store that reports no cost) refunds nothing, and is
    /// charged only what `actual` exceeds `reserved` by. A settlement
    /// goes under the key's own limits now: where they have a limit of a
    /// period the reservation was not counted in (an override set or
    /// changed since), a refund would give that limit units it never took,
    /// and nothing is refunded: the reservation is returned. Settle each
    /// reservation once: a second settlement of it refunds (or charges)
    /// again.
    pub async fn settle(
        &self,
        key: &Key,
        reservation: &Decision,
        reserved: u64,
        actual: u64,
    ) -> Result<Decision, StoreError> {
        let Some(reserved_in) = Reserved::by(reservation.decided_by()) else {
            return Ok(reservation.clone());
        };
        // A refund of a denial would be quota no one reserved: a client
        // could mint it by being denied. With nothing to charge either, the
        // store is not asked.
        // Nor can a caller's figure refund more than the reservation's own
        // cost: settled as a larger reservation, a small one would mint
        // the difference. A cost of 0 is a peek's (which reserved nothing)
        // or a store's that reports none (built with `Decision::new`
        // alone): neither refunds, and what was used past the caller's
        // figure is charged.
        let reserved = match (reservation.is_allowed(), reservation.cost()) {
            (true, 0) if actual <= reserved => return Ok(reservation.clone()),
            (true, 0) => reserved,
            (true, cost) => reserved.min(cost),
            (false, _) if actual == 0 => return Ok(reservation.clone()),
            (false, _) => 0,
        };
        let settlement = Settlement::of(reservation, reserved, actual);
        let own = own_limits(self.overrides.as_deref(), key, &self.policy).await;
        let policy = own.as_ref().unwrap_or(&self.policy);
        // The key's own limits now may not be those the reservation was
        // decided under (an override set, changed or lifted since), and a
        // limit of a period the reservation's lacks never counted it: a
        // refund there would give it units it never took. Such a refund
        // changes nothing, as a store's of a configuration the key has
        // moved on from.
        if settlement.refund() > 0 && !counted_in_each(reservation, policy) {
            return Ok(reservation.clone());
        }
        let settled = (self.store)
            .settle_reserved(reserved_in, key, policy, settlement)
            .await;
        // Counted in the store errors and logged (throttled), as the
        // layer's failed settlements are; the caller gets the error.
        if let Err(error) = &settled {
            self.telemetry.store_failed(None, error);
        }
        settled
    }
}

/// Whether `reservation` was counted in a limit of each of `policy`'s
/// periods (a decision reports every limit of the policy it was made
/// under).
fn counted_in_each(reservation: &Decision, policy: &Policy) -> bool {
    let counted = reservation.limits();
    (policy.limits().iter())
        .all(|limit| (counted.iter()).any(|status| same_period(&status.limit(), limit)))
}

fn same_period(a: &Limit, b: &Limit) -> bool {
    a.period_micros() == b.period_micros() && a.is_monthly() == b.is_monthly()
}
