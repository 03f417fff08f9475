//! The rate-limit service.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tollgate_core::{Decision, Key, MemoryStore, Policy, PolicyState, Store, StoreError};
use tower_service::Service;

use crate::body::{BodyKind, WrapBody};
use crate::extract::KeyExtractor;
use crate::future::{Check, Inner, ResponseFuture, Waiter};
use crate::response::{FailureMode, MissingKey, Responder};

/// Configuration and state shared by a layer's services and their clones.
pub(crate) struct Shared<K, St> {
    pub(crate) policy: Policy,
    pub(crate) store: Arc<St>,
    pub(crate) extractor: Arc<K>,
    pub(crate) cost: u64,
    pub(crate) wait: Option<Duration>,
    pub(crate) local: MemoryStore,
    pub(crate) local_policy: Policy,
    pub(crate) responder: Arc<Responder>,
}

impl<K, St: Store> Shared<K, St> {
    /// Applies the local fallback to a store failure, if configured. A key
    /// the store still remembers takes its use along into the fallback
    /// (scaled to the local share), rather than starting afresh.
    fn fall_back(
        &self,
        key: &Key,
        result: Result<Decision, StoreError>,
    ) -> Result<Decision, StoreError> {
        match result {
            Err(error) if self.responder.failure == FailureMode::Local => {
                let telemetry = &self.responder.telemetry;
                telemetry.store_failed(Some(FailureMode::Local), &error);
                if let Some(last) = self.store.last_known(key, &self.policy) {
                    let state = PolicyState::seeded(&self.local_policy, &last);
                    // A full fallback decides below as it would anyway.
                    let _ = self.local.seed(key, &self.local_policy, state);
                }
                let local = self.local.check_sync(key, &self.local_policy, self.cost);
                if let Ok(decision) = &local {
                    telemetry.decided_locally(decision.is_allowed());
                }
                local
            }
            other => other,
        }
    }
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
        &self.shared.policy
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
            .field("policy", &self.shared.policy)
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
    type Future = ResponseFuture<S::Future, S, ReqBody, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        // The service that `poll_ready` drove to readiness. A request the
        // store decides at once calls it in place; a request that waits for
        // the store takes it along and leaves a clone here.
        let inner = Inner::Ready(&mut self.inner);
        let responder = shared.responder.clone();

        let Some(key) = shared.extractor.extract(&request) else {
            return match shared.responder.missing {
                MissingKey::Allow => ResponseFuture::call(inner, request, responder),
                _ => {
                    let cause = shared.extractor.missing(&request);
                    let response = shared.responder.missing_key(&cause);
                    ResponseFuture::respond(response, responder)
                }
            };
        };

        let enforce = shared.responder.enforces(&key);
        let waiter = shared.wait.map(|max_wait| Waiter {
            recheck: {
                let (shared, key) = (shared.clone(), key.clone());
                Box::new(move || check(shared.clone(), key.clone()))
            },
            deadline: tokio::time::Instant::now() + max_wait,
        });
        match shared
            .store
            .try_check_now(&key, &shared.policy, shared.cost)
        {
            Some(result) => {
                let result = shared.fall_back(&key, result);
                ResponseFuture::decided(result, inner, request, responder, waiter, enforce)
            }
            None => {
                let check = check(shared.clone(), key);
                let inner = inner.into_owned();
                ResponseFuture::check(check, inner, request, responder, waiter, enforce)
            }
        }
    }
}

/// Asks the store, owning everything the question needs.
fn check<K, St>(shared: Arc<Shared<K, St>>, key: Key) -> Check
where
    K: Send + Sync + 'static,
    St: Store,
{
    Box::pin(async move {
        let result = shared.store.check(&key, &shared.policy, shared.cost).await;
        shared.fall_back(&key, result)
    })
}
