//! The rate-limit service.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tollgate_core::{Key, OverrideSource, Policy, Settlement, Store};
use tower_service::Service;

use crate::answer::MissingKey;
use crate::extract::KeyExtractor;
use crate::fallback::FallbackStore;
use crate::response::Responder;

use super::body::{BodyKind, WrapBody};
use super::call::{Check, Deferred, Inner, Waiter};
use super::deadline;
use super::future::ResponseFuture;
use super::overridden::{Overridden, overridden};
use super::responders::Responders;
use super::settle::{Settle, SettleCall};
use super::state::{Finish, State, next_state};

/// A layer's settings, kept once: cloned into each layer made from it, and
/// shared by every service of one.
pub(crate) struct Config<K> {
    pub(crate) policy: Policy,
    pub(crate) extractor: Arc<K>,
    pub(crate) cost: u64,
    pub(crate) wait: Option<Duration>,
    pub(crate) settle: Option<Settle>,
    pub(crate) responder: Arc<Responder>,
    /// Where each key's overrides are found, if anywhere.
    pub(crate) overrides: Option<Arc<dyn OverrideSource>>,
}

impl<K> fmt::Debug for Config<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("policy", &self.policy)
            .field("cost", &self.cost)
            .field("wait", &self.wait)
            .field("settle", &self.settle)
            .field("overrides", &self.overrides.is_some())
            .finish_non_exhaustive()
    }
}

impl<K> Clone for Config<K> {
    fn clone(&self) -> Self {
        Self {
            policy: self.policy.clone(),
            extractor: self.extractor.clone(),
            cost: self.cost,
            wait: self.wait,
            settle: self.settle.clone(),
            responder: self.responder.clone(),
            overrides: self.overrides.clone(),
        }
    }
}

/// What a layer's services and their clones share: the store behind its
/// failure handling, the settings, and the responders of chosen policies.
pub(crate) struct Shared<K, St> {
    pub(crate) store: FallbackStore<St>,
    pub(crate) config: Config<K>,
    pub(crate) responders: Responders,
}

/// A service that rate-limits requests before passing them to `S`.
/// Made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// The decision is made in `call`, not in `poll_ready`, which only asks the
/// inner service: the service is always ready as far as limiting goes, as
/// axum expects. Clones share all state. `M` types the response body (see
/// [`BodyKind`]).
pub struct RateLimit<S, K, St, M = WrapBody> {
    inner: S,
    shared: Arc<Shared<K, St>>,
    body: PhantomData<fn() -> M>,
}

impl<S, K, St, M> RateLimit<S, K, St, M> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<K, St>>) -> Self {
        Self {
            inner,
            shared,
            body: PhantomData,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.shared.config.policy
    }
}

impl<S: Clone, K, St, M> Clone for RateLimit<S, K, St, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            body: PhantomData,
        }
    }
}

impl<S: fmt::Debug, K, St, M> fmt::Debug for RateLimit<S, K, St, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("policy", &self.shared.config.policy)
            .finish_non_exhaustive()
    }
}

impl<S, K, St, M, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K, St, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    K: KeyExtractor<ReqBody>,
    St: Store,
    M: BodyKind<ResBody>,
    ReqBody: Send + 'static,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        let config = &shared.config;
        // The service that `poll_ready` drove to readiness. A request the
        // store decides at once calls it in place; a request that waits for
        // the store takes it along and leaves a clone here.
        let inner = Inner(&mut self.inner);

        let Some(key) = config.extractor.extract(&request) else {
            return missing_key(config, inner, request);
        };
        // In waiting mode, no longer than the request's own deadline.
        let max_wait = (config.wait).map(|max| deadline::max_wait(request.headers(), max));

        // The chooser's policy, if it picked one, and the responder that
        // names it; otherwise the layer's own. A request the store decides
        // at once takes no reference to the responder along.
        let chosen = config.extractor.choose(&request);
        let chosen_responder;
        let (policy, cost, responder) = match &chosen {
            None => (&config.policy, config.cost, &config.responder),
            Some(choice) => {
                chosen_responder = shared.responders.of(&choice.policy);
                let cost = choice.cost.unwrap_or(config.cost);
                (&choice.policy, cost, &chosen_responder)
            }
        };
        // A key's own limits, if an override of its is in force: a local
        // lookup, skipped while the source knows none.
        let own;
        let (policy, responder) = match config.overrides.as_deref() {
            Some(source) if !source.is_empty() => {
                match overridden(&shared.responders, source, &key, policy, responder) {
                    None => (policy, responder),
                    Some(Overridden::Limits(policy, responder)) => {
                        own = (policy, responder);
                        (&own.0, &own.1)
                    }
                    Some(Overridden::Exempt) => return ResponseFuture::call(inner, request),
                    Some(Overridden::Denied(response)) => return ResponseFuture::respond(response),
                    Some(Overridden::Pending) => {
                        let call = inner.defer(request);
                        return pending(
                            shared, source, key, policy, cost, responder, call, max_wait,
                        );
                    }
                }
            }
            _ => (policy, responder),
        };
        // What follows is `decided_after`'s too, for a request that waited
        // for its key's first answer: written out here, since a function
        // of both, called with this request's call, copied the request once
        // more (about a hundred instructions a request).
        let enforce = responder.enforces(&key);
        let waiter =
            max_wait.map(|max_wait| waiter(shared, &key, policy, cost, responder, max_wait));
        let settle =
            (config.settle.as_ref()).map(|rule| settle_call(shared, rule, &key, policy, cost));
        match shared.store.get_ref().try_check_now(&key, policy, cost) {
            Some(result) => {
                let report = responder.reporter();
                let result = shared.store.answer(&key, policy, cost, result, &report);
                ResponseFuture::decided(result, inner, request, responder, waiter, enforce, settle)
            }
            None => {
                let check = check(shared.clone(), key, policy, cost, responder);
                let call = inner.defer(request);
                let responder = responder.clone();
                ResponseFuture::check(check, call, responder, waiter, enforce, settle)
            }
        }
    }
}

/// A request whose key's override `source` has yet to answer about:
/// it waits for the first answer (up to the source's bound), then is
/// decided as it would have been. If the answer came in meanwhile (no
/// first answer to wait for), it is decided now.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)] // what `call` knows of the request, moved along
fn pending<K, St, F, M>(
    shared: &Arc<Shared<K, St>>,
    source: &dyn OverrideSource,
    key: Key,
    policy: &Policy,
    cost: u64,
    responder: &Arc<Responder>,
    call: Deferred<F>,
    max_wait: Option<Duration>,
) -> ResponseFuture<F, M>
where
    K: Send + Sync + 'static,
    St: Store,
    F: Future,
{
    let Some(first) = source.first_answer(&key, policy) else {
        let state = decided_after(shared, key, policy, cost, responder, call, max_wait);
        return ResponseFuture::new(state);
    };
    let (shared, arrived) = (shared.clone(), tokio::time::Instant::now());
    let (policy, responder) = (policy.clone(), responder.clone());
    ResponseFuture::new(State::Looking {
        first,
        call: Some(call),
        then: Some(Box::new(move |call| {
            let left = max_wait.map(|max_wait| max_wait.saturating_sub(arrived.elapsed()));
            decided_after(&shared, key, &policy, cost, &responder, call, left)
        })),
    })
}

/// What becomes of a request of `key` under `policy` (the layer's or the
/// chooser's) at `cost`, told by `responder`, that `waited` for its key's
/// first answer: as in `call`, under the key's override if one is in
/// force (the policy as it is, if the answer is still not in), then as
/// the store answers. In waiting mode it waits for admission for what is
/// `left` of its wait.
fn decided_after<K, St, F>(
    shared: &Arc<Shared<K, St>>,
    key: Key,
    policy: &Policy,
    cost: u64,
    responder: &Arc<Responder>,
    call: Deferred<F>,
    left: Option<Duration>,
) -> State<F, F::Output>
where
    K: Send + Sync + 'static,
    St: Store,
    F: Future,
{
    let config = &shared.config;
    let own;
    let (policy, responder) = match config.overrides.as_deref() {
        Some(source) => match overridden(&shared.responders, source, &key, policy, responder) {
            None | Some(Overridden::Pending) => (policy, responder),
            Some(Overridden::Limits(policy, responder)) => {
                own = (policy, responder);
                (&own.0, &own.1)
            }
            Some(Overridden::Exempt) => {
                return State::Calling {
                    future: call(),
                    finish: Finish::Headers(None),
                };
            }
            Some(Overridden::Denied(response)) => {
                return State::Responding {
                    response: Some(response),
                };
            }
        },
        None => (policy, responder),
    };
    let enforce = responder.enforces(&key);
    let waiter = left.map(|left| waiter(shared, &key, policy, cost, responder, left));
    let settle = (config.settle.as_ref()).map(|rule| settle_call(shared, rule, &key, policy, cost));
    match shared.store.get_ref().try_check_now(&key, policy, cost) {
        Some(result) => {
            let report = responder.reporter();
            let result = shared.store.answer(&key, policy, cost, result, &report);
            next_state(result, call, responder, waiter, enforce, settle)
        }
        None => State::Checking {
            check: check(shared.clone(), key, policy, cost, responder),
            call: Some(call),
            waiter,
            enforce,
            settle,
            responder: responder.clone(),
        },
    }
}

/// The answer to a request without a key: called through, or refused.
/// (Here and below, what most requests do not need is kept out of `call`,
/// whose code then stays small.)
#[cold]
#[inline(never)]
fn missing_key<K, S, F, M, B>(
    config: &Config<K>,
    inner: Inner<'_, S>,
    request: Request<B>,
) -> ResponseFuture<F, M>
where
    K: KeyExtractor<B>,
    S: Service<Request<B>, Future = F> + Clone,
    F: std::future::Future,
{
    match config.responder.missing {
        MissingKey::Allow => {
            config.responder.telemetry.keyless_let_through();
            ResponseFuture::call(inner, request)
        }
        MissingKey::ByCause | MissingKey::Error | MissingKey::Reject(_) => {
            let cause = config.extractor.missing(&request);
            let response = config.responder.missing_key(&cause);
            ResponseFuture::respond(response)
        }
    }
}

/// How a layer in waiting mode asks the store about `key` again, until
/// `max_wait` from now.
#[cold]
#[inline(never)]
fn waiter<K, St>(
    shared: &Arc<Shared<K, St>>,
    key: &Key,
    policy: &Policy,
    cost: u64,
    responder: &Arc<Responder>,
    max_wait: Duration,
) -> Waiter
where
    K: Send + Sync + 'static,
    St: Store,
{
    let (shared, key) = (shared.clone(), key.clone());
    let (policy, responder) = (policy.clone(), responder.clone());
    Waiter {
        recheck: Box::new(move || check(shared.clone(), key.clone(), &policy, cost, &responder)),
        deadline: crate::clock::instant_after(max_wait),
    }
}

/// Asks the store about `key` under `policy`, owning everything the
/// question needs.
fn check<K, St>(
    shared: Arc<Shared<K, St>>,
    key: Key,
    policy: &Policy,
    cost: u64,
    responder: &Arc<Responder>,
) -> Check
where
    K: Send + Sync + 'static,
    St: Store,
{
    let (policy, responder) = (policy.clone(), responder.clone());
    Box::pin(async move {
        shared
            .store
            .check_reported(&key, &policy, cost, &responder.reporter())
            .await
    })
}

/// The settle call of a request of `key` that reserved `reserved` under
/// `policy`, in a layer that settles by `rule`.
#[inline(never)]
pub(crate) fn settle_call<K, St>(
    shared: &Arc<Shared<K, St>>,
    rule: &Settle,
    key: &Key,
    policy: &Policy,
    reserved: u64,
) -> SettleCall
where
    K: Send + Sync + 'static,
    St: Store,
{
    let (shared, rule) = (shared.clone(), rule.clone());
    let (key, policy) = (key.clone(), policy.clone());
    Box::new(move |reservation, place, status, extensions| {
        let actual = rule.actual(status, extensions, reserved);
        if actual == reserved {
            return None;
        }
        let settlement =
            Settlement::new(reserved, actual, reservation.at).with_decided_by(reservation.by);
        Some(Box::pin(async move {
            let store = &shared.store;
            // As the answer to a request of the reserved cost: what the
            // headers take the next request of this layer to cost.
            let settled = store.settle_reserved(place, &key, &policy, settlement);
            settled.await.map(|decision| decision.with_cost(reserved))
        }))
    })
}
