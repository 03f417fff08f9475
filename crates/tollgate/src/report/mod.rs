//! Telemetry of one layer or limiter: a debug event per decision, throttled
//! warnings for store failures, and counters through the `metrics` facade.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

// tokio's clock: the same as std's, but for tests that pause it, so that
// what a throttle lets through does not depend on how busy the machine is.
use tokio::time::Instant;

use tollgate_core::{Decision, Policy, StoreError};

use crate::extract::MissingCause;
use crate::fallback::{FailureMode, FailureReport, Handled};
use crate::trace;

mod throttle;

pub use throttle::LogThrottle;

/// Why a request had no key, or that it was let through without asking:
/// the `outcome` of [`KEYLESS`](tollgate_core::telemetry::KEYLESS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "metrics", derive(enum_map::Enum))]
pub(crate) enum Keyless {
    Client,
    Unauthenticated,
    Server,
    LetThrough,
}

impl Keyless {
    fn of(cause: &MissingCause) -> Self {
        match cause {
            MissingCause::Client(_) => Keyless::Client,
            MissingCause::Unauthenticated => Keyless::Unauthenticated,
            MissingCause::Server(_) => Keyless::Server,
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Keyless::Client => "client",
            Keyless::Unauthenticated => "unauthenticated",
            Keyless::Server => "server",
            Keyless::LetThrough => "let_through",
        }
    }
}

/// What became of a decided request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allowed,
    Limited,
    /// Denied by the policy, let through by shadow mode.
    ShadowLimited,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Limited => "limited",
            Verdict::ShadowLimited => "shadow_limited",
        }
    }
}

/// Reports what one policy's layer or limiter does. Raw keys are never
/// logged or used as labels: only the policy name and the outcome.
#[derive(Debug)]
pub(crate) struct Telemetry {
    policy: Box<str>,
    throttles: Throttles,
    #[cfg(feature = "metrics")]
    counters: Counters,
}

#[cfg(feature = "metrics")]
#[derive(Debug)]
struct Counters {
    allowed: metrics::Counter,
    limited: metrics::Counter,
    shadow_limited: metrics::Counter,
    /// By [`StoreError::KINDS`].
    errors: [metrics::Counter; StoreError::KINDS.len()],
    fallbacks: enum_map::EnumMap<Handled, metrics::Counter>,
    /// [`NEAR_LIMIT`](tollgate_core::telemetry::NEAR_LIMIT), one per limit
    /// of the policy, in its order.
    near: Box<[(tollgate_core::Limit, metrics::Counter)]>,
    /// [`NEAR_LIMIT`](tollgate_core::telemetry::NEAR_LIMIT) of a key's own
    /// limits (an override).
    near_override: metrics::Counter,
    waits_admitted: metrics::Counter,
    waits_gave_up: metrics::Counter,
    /// Registered on first use, as most policies never see one: requests
    /// an operator's override denied, and requests without a key by
    /// [`Keyless`].
    denied: std::sync::OnceLock<metrics::Counter>,
    keyless: enum_map::EnumMap<Keyless, std::sync::OnceLock<metrics::Counter>>,
}

#[cfg(feature = "metrics")]
impl Counters {
    /// The counters of `policy`; those of decisions only with its
    /// `limits` (`None`: a layer that decides nothing).
    fn new(policy: &str, limits: Option<&[tollgate_core::Limit]>) -> Self {
        use tollgate_core::telemetry::{DECISIONS, FALLBACKS, NEAR_LIMIT, STORE_ERRORS, WAITS};
        tollgate_core::telemetry::describe();
        let counter = |name: &'static str, outcome: &'static str| metrics::counter!(name, "policy" => policy.to_owned(), "outcome" => outcome);
        let decisions = |name: &'static str, outcome: &'static str| match limits {
            Some(_) => counter(name, outcome),
            None => metrics::Counter::noop(),
        };
        // No near-limit counts for a layer that decides nothing, nor for
        // the chosen policies past the bound (no limits of their own: their
        // near-limit counts would read as a key's own limits').
        let near = |limit: String| match limits {
            Some(limits) if !limits.is_empty() => {
                metrics::counter!(NEAR_LIMIT, "policy" => policy.to_owned(), "limit" => limit)
            }
            Some(_) | None => metrics::Counter::noop(),
        };
        Self {
            near: limits
                .unwrap_or_default()
                .iter()
                .map(|limit| (*limit, near(limit.to_string())))
                .collect(),
            near_override: near("override".to_owned()),
            waits_admitted: decisions(WAITS, "admitted"),
            waits_gave_up: decisions(WAITS, "gave_up"),
            allowed: decisions(DECISIONS, "allowed"),
            limited: decisions(DECISIONS, "limited"),
            shadow_limited: decisions(DECISIONS, "shadow_limited"),
            errors: StoreError::KINDS.map(|kind| counter(STORE_ERRORS, kind)),
            fallbacks: enum_map::EnumMap::from_fn(|outcome: Handled| {
                counter(FALLBACKS, outcome.label())
            }),
            denied: std::sync::OnceLock::new(),
            keyless: enum_map::EnumMap::default(),
        }
    }
}

impl Telemetry {
    /// Registers, with the installed recorder, the counters of a layer
    /// named `policy` that makes no rate-limit decisions (an in-flight or
    /// adaptive limit): its store failures and what the failure policy
    /// made of them. Its decisions, near-limit counts and waits are not
    /// registered, so that no series of decisions stays at 0 forever.
    pub(crate) fn new(policy: &str) -> Self {
        Self::with_limits(policy, None)
    }

    /// Registers the counters of `policy`, its near-limit counts included.
    pub(crate) fn of(policy: &Policy) -> Self {
        Self::with_limits(policy.name(), Some(policy.limits()))
    }

    fn with_limits(policy: &str, _limits: Option<&[tollgate_core::Limit]>) -> Self {
        Self {
            policy: policy.into(),
            throttles: Throttles::default(),
            #[cfg(feature = "metrics")]
            counters: Counters::new(policy, _limits),
        }
    }

    /// Records a decision of the store named `store` (see
    /// [`Store::name`](tollgate_core::Store::name)) and what became of the
    /// request: in the metrics, on the current span (the fields of
    /// [`trace`](crate::trace)) and in a debug event.
    #[inline]
    pub(crate) fn decided(&self, decision: &Decision, verdict: Verdict, store: &'static str) {
        self.record_decision(decision, verdict, store);
        #[cfg(feature = "metrics")]
        match verdict {
            Verdict::Allowed => {
                self.counters.allowed.increment(1);
                self.near_limit(decision);
            }
            Verdict::Limited => self.counters.limited.increment(1),
            Verdict::ShadowLimited => self.counters.shadow_limited.increment(1),
        }
        match verdict {
            Verdict::Allowed => tracing::debug!(
                policy = &*self.policy,
                outcome = verdict.as_str(),
                remaining = decision.remaining(),
                "rate-limit decision"
            ),
            // A refusal names the limit that fired.
            Verdict::Limited | Verdict::ShadowLimited => tracing::debug!(
                policy = &*self.policy,
                outcome = verdict.as_str(),
                limit = %Fired::of(decision),
                limit_index = (!decision.is_blocked()).then(|| decision.binding().index()),
                remaining = decision.remaining(),
                retry_after_ms = decision.retry_after().map(|d| d.as_millis()),
                "rate-limit decision"
            ),
        }
    }

    /// Records `decision` on the current span: the one place tollgate
    /// writes the fields of [`trace`](crate::trace) for a decision. Kept
    /// out of line, so that the code every request runs stays small.
    #[inline(never)]
    fn record_decision(&self, decision: &Decision, verdict: Verdict, store: &'static str) {
        if !current_span_has_fields() {
            return;
        }
        let span = tracing::Span::current();
        span.record(trace::POLICY, &*self.policy);
        span.record(trace::OUTCOME, verdict.as_str());
        match verdict {
            Verdict::Limited => {
                span.record(trace::LIMIT, tracing::field::display(Fired::of(decision)));
            }
            Verdict::Allowed | Verdict::ShadowLimited => {}
        }
        span.record(trace::STORE, store);
    }

    /// Counts each limit an admitted `decision` left at least
    /// [`NEAR_LIMIT_PERCENT`](tollgate_core::telemetry::NEAR_LIMIT_PERCENT)
    /// % used.
    #[cfg(feature = "metrics")]
    fn near_limit(&self, decision: &Decision) {
        use tollgate_core::telemetry::NEAR_LIMIT_PERCENT;
        for status in decision.limits() {
            // Both are 32-bit counts: neither product saturates.
            let capacity = status.capacity();
            if capacity == 0
                || status.used().saturating_mul(100) < capacity.saturating_mul(NEAR_LIMIT_PERCENT)
            {
                continue;
            }
            match self.counters.near.get(status.index()) {
                Some((limit, counter)) if *limit == status.limit() => counter.increment(1),
                _ => self.counters.near_override.increment(1),
            }
        }
    }

    /// Records how an `until_ready` that waited ended.
    pub(crate) fn waited(&self, _admitted: bool) {
        #[cfg(feature = "metrics")]
        if _admitted {
            self.counters.waits_admitted.increment(1);
        } else {
            self.counters.waits_gave_up.increment(1);
        }
    }

    /// Records a store failure handled by `mode` (`None`: returned to the
    /// caller), and logs a warning at most once a second.
    pub(crate) fn store_failed(&self, mode: Option<FailureMode>, error: &StoreError) {
        let policy = &*self.policy;
        let mode = mode.map_or("returned", FailureMode::as_str);
        self.count_store_error(error);
        let Some(suppressed) = self.throttles.failure.may_log(Instant::now()) else {
            return;
        };
        if error.is_own_load() {
            // No failure mode applies: the app's own load is refused.
            tracing::warn!(
                error = error as &dyn std::error::Error,
                policy,
                suppressed,
                "rate-limit store overloaded by this app; refused"
            );
        } else {
            tracing::warn!(
                error = error as &dyn std::error::Error,
                policy,
                failure_mode = mode,
                suppressed,
                "rate-limit store failed; applying the failure policy"
            );
        }
    }

    /// Counts a store failure by its kind.
    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(crate) fn count_store_error(&self, _error: &StoreError) {
        #[cfg(feature = "metrics")]
        {
            let kind = StoreError::KINDS.iter().position(|k| *k == _error.kind());
            debug_assert!(kind.is_some(), "StoreError::KINDS lacks {}", _error.kind());
            if let Some(counter) = kind.and_then(|i| self.counters.errors.get(i)) {
                counter.increment(1);
            }
        }
    }

    /// Counts a request refused by an operator's deny override, which no
    /// store decided, and logs it at debug level.
    pub(crate) fn denied_by_operator(&self) {
        #[cfg(feature = "metrics")]
        self.counters
            .denied
            .get_or_init(|| self.counter(tollgate_core::telemetry::DECISIONS, "denied"))
            .increment(1);
        tracing::debug!(
            policy = &*self.policy,
            outcome = "denied",
            "rate-limit decision"
        );
    }

    /// Counts a request without a key that was let through unasked.
    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(crate) fn keyless_let_through(&self) {
        self.count_keyless(Keyless::LetThrough);
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    fn count_keyless(&self, _keyless: Keyless) {
        #[cfg(feature = "metrics")]
        self.counters.keyless[_keyless]
            .get_or_init(|| self.counter(tollgate_core::telemetry::KEYLESS, _keyless.label()))
            .increment(1);
    }

    /// A counter of this telemetry's policy, registered now.
    #[cfg(feature = "metrics")]
    fn counter(&self, name: &'static str, outcome: &'static str) -> metrics::Counter {
        metrics::counter!(name, "policy" => self.policy.to_string(), "outcome" => outcome)
    }

    /// Counts a request without a key, and logs it at most once a second:
    /// a client's mistake at debug level, a server's wiring at error level.
    pub(crate) fn key_missing(&self, cause: &MissingCause) {
        self.count_keyless(Keyless::of(cause));
        let Some(suppressed) = self.throttles.missing.may_log(Instant::now()) else {
            return;
        };
        let policy = &*self.policy;
        match cause {
            MissingCause::Server(reason) => tracing::error!(
                policy,
                reason = &**reason,
                suppressed,
                "no rate-limit key could be extracted from the request; answering 500"
            ),
            MissingCause::Client(what) => tracing::debug!(
                policy,
                what = &**what,
                suppressed,
                "request without its rate-limit key; answering 400"
            ),
            MissingCause::Unauthenticated => tracing::debug!(
                policy,
                suppressed,
                "unauthenticated request on a route keyed by user; answering 401"
            ),
        }
    }

    /// Records what became of a request whose store, named `store`,
    /// failed: in the metrics and on the current span (the fields of
    /// [`trace`](crate::trace)).
    pub(crate) fn handled(&self, outcome: Handled, store: &'static str) {
        self.count_handled(outcome);
        if !current_span_has_fields() {
            return;
        }
        let span = tracing::Span::current();
        span.record(trace::POLICY, &*self.policy);
        span.record(trace::FALLBACK, outcome.label());
        span.record(trace::STORE, store);
    }

    /// Counts what became of a request whose store failed, in the
    /// metrics only (an in-flight limit's: its span is the rate limit's).
    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(crate) fn count_handled(&self, _outcome: Handled) {
        #[cfg(feature = "metrics")]
        self.counters.fallbacks[_outcome].increment(1);
    }

    /// What reports the failures of the store named `store` to this
    /// telemetry.
    pub(crate) fn reporter(&self, store: &'static str) -> Reporter<'_> {
        Reporter {
            telemetry: self,
            store,
        }
    }
}

/// Whether the current span declared any of the fields of
/// [`trace`](crate::trace), whose names all start with `tollgate.`: only
/// then is a decision recorded on it, since a span records only the fields
/// it declared. Asked without making a [`tracing::Span`] of it, which a
/// subscriber would count and then close again; and not at all while no
/// subscriber was ever set (then there is no current span).
fn current_span_has_fields() -> bool {
    tracing::dispatcher::has_been_set()
        && tracing::dispatcher::get_default(|dispatch| {
            dispatch.current_span().metadata().is_some_and(|span| {
                span.fields()
                    .iter()
                    .any(|field| field.name().starts_with(trace::PREFIX))
            })
        })
}

/// The throttles of one policy's warnings.
#[derive(Debug)]
struct Throttles {
    /// Store failures.
    failure: LogThrottle,
    /// Requests without a key: a flood of them must not hold back the
    /// store-failure warnings, nor flood the log itself.
    missing: LogThrottle,
}

impl Default for Throttles {
    fn default() -> Self {
        Self {
            failure: LogThrottle::new(Duration::from_secs(1)),
            missing: LogThrottle::new(Duration::from_secs(1)),
        }
    }
}

/// The telemetry of the policies a layer's chooser picks, by name, shared
/// by every service the layer makes: axum makes one per connection, and
/// one per request for a router called as a service, and the warnings of
/// each policy are throttled across them all. The policies past the first
/// [`MAX_CHOSEN`] names (a chooser that makes one per tenant, say) share
/// one telemetry, named [`OTHER_POLICIES`]: their metrics count under that
/// one `policy` label (their series stay bounded; no near-limit counts),
/// and their logs name them so, under one throttle.
#[derive(Debug, Default)]
pub(crate) struct Chosen {
    known: RwLock<HashMap<Box<str>, Arc<Telemetry>>>,
    overflow: std::sync::OnceLock<Arc<Telemetry>>,
}

pub(crate) use tollgate_core::telemetry::OTHER_POLICIES;

/// The most chosen policies with throttles of their own, per layer.
const MAX_CHOSEN: usize = tollgate_core::telemetry::MAX_POLICY_LABELS;

impl Chosen {
    /// The telemetry of `policy`: made on first use, and counting its
    /// near-limit use per limit.
    pub(crate) fn of(&self, policy: &Policy) -> Arc<Telemetry> {
        let name = policy.name();
        let limits = Some(policy.limits());
        // Made once: registering a policy's metrics on every request cost
        // a lookup of each of them.
        let overflow = || {
            // Decisions counted; no near-limit count per limit, whose
            // limits differ from one policy to the next.
            let made = || Arc::new(Telemetry::with_limits(OTHER_POLICIES, Some(&[])));
            Arc::clone(self.overflow.get_or_init(made))
        };
        let known = self.known.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(telemetry) = known.get(name) {
            return telemetry.clone();
        }
        // Full: no write lock for the policies past the bound.
        if known.len() >= MAX_CHOSEN {
            return overflow();
        }
        drop(known);
        let mut known = self.known.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(telemetry) = known.get(name) {
            return telemetry.clone();
        }
        if known.len() >= MAX_CHOSEN {
            return overflow();
        }
        let made = Arc::new(Telemetry::with_limits(name, limits));
        known.insert(name.into(), made.clone());
        made
    }
}

/// The telemetry of a layer or limiter, with the name of its store: what
/// the failure policy reports to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reporter<'a> {
    telemetry: &'a Telemetry,
    store: &'static str,
}

impl FailureReport for Reporter<'_> {
    fn store_failed(&self, mode: FailureMode, error: &StoreError) {
        self.telemetry.store_failed(Some(mode), error);
    }

    fn handled(&self, outcome: Handled) {
        self.telemetry.handled(outcome, self.store);
    }
}

/// What a refusal names as the limit that fired, in logs and traces: the
/// binding limit, or `blocked` for a key an operator blocked, which fired
/// none (as the refusal's `tollgate-exceeded` says).
struct Fired(Option<tollgate_core::Limit>);

impl Fired {
    fn of(decision: &Decision) -> Self {
        Self((!decision.is_blocked()).then(|| decision.binding().limit()))
    }
}

impl fmt::Display for Fired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(limit) => limit.fmt(f),
            None => f.write_str("blocked"),
        }
    }
}
