//! Tollgate's outbound demo: many workers call one third-party API whose
//! quota is 25 calls per 5 s and 300 per minute. A [`RateLimitLayer`] in
//! waiting mode wraps each worker's HTTP client, and the workers share the
//! limit through one store (Redis across processes and machines), so the
//! API never answers 429.
//!
//! Run with: `cargo run -p outbound -- [--workers N] [--calls M] [--redis-url URL]`

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use tollgate::{
    Algorithm, Clock, ConfigError, GlobalKey, Limit, MemoryStore, Policy, RateLimitLayer, Store,
};
use tower::{Service, ServiceExt};

/// The API's quota: 25 calls per 5 s and 300 per minute.
pub const QUOTA: [(u64, Duration); 2] =
    [(25, Duration::from_secs(5)), (300, Duration::from_secs(60))];

/// The resource name the API reports in its rate-limit headers.
pub const API_RESOURCE: &str = "third-party-api";
/// The resource name of the client-side limit.
pub const CLIENT_RESOURCE: &str = "partner-quota";

/// A quota: counts per period, all of which hold.
pub type Quota = [(u64, Duration)];

/// The client-side policy: `quota`, each period lengthened by `margin` to
/// absorb the delay between the limiter's decision and the call's arrival
/// (zero when client and API share a clock and nothing is in flight).
///
/// # Errors
///
/// When the quota is not a valid policy.
pub fn client_policy(quota: &Quota, margin: Duration) -> Result<Policy, ConfigError> {
    let mut builder = Policy::builder(CLIENT_RESOURCE).algorithm(Algorithm::SlidingLog);
    for &(count, period) in quota {
        builder = builder.limit(Limit::new(count, period + margin));
    }
    builder.build()
}

/// What the API saw.
#[derive(Debug, Default)]
pub struct ApiLog {
    /// When each accepted call arrived, in µs by the API's clock.
    pub accepted: Vec<u64>,
    /// How many calls it answered with 429.
    pub rejected: u64,
}

/// A stand-in for a third-party API: `POST /call` answers 200 while the
/// callers are within `quota` (enforced exactly, by the API's own clock),
/// and 429 otherwise, logging every call.
///
/// # Errors
///
/// When the quota is not a valid policy.
pub fn third_party_api(
    clock: impl Clock,
    quota: &Quota,
) -> Result<(Router, Arc<Mutex<ApiLog>>), ConfigError> {
    let mut builder = Policy::builder(API_RESOURCE).algorithm(Algorithm::SlidingLog);
    for &(count, period) in quota {
        builder = builder.limit(Limit::new(count, period));
    }
    let policy = builder.build()?;
    let store = MemoryStore::builder()
        .clock(ClockRef(Arc::new(clock)))
        .build()?;
    let log = Arc::new(Mutex::new(ApiLog::default()));
    let state = (store, policy, log.clone());
    let router = Router::new().route("/call", post(call)).with_state(state);
    Ok((router, log))
}

#[derive(Debug, Clone)]
struct ClockRef(Arc<dyn Clock>);

impl Clock for ClockRef {
    fn now(&self) -> tollgate::Timestamp {
        self.0.now()
    }
}

type ApiState = (MemoryStore, Policy, Arc<Mutex<ApiLog>>);

async fn call(
    State((store, policy, log)): State<ApiState>,
) -> (StatusCode, [(&'static str, String); 2]) {
    let decision = store.check_sync(&tollgate::Key::global(), &policy, 1);
    let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
    match decision {
        Ok(d) if d.is_allowed() => {
            log.accepted.push(d.now().as_micros());
            let remaining = d.remaining().to_string();
            (
                StatusCode::OK,
                [
                    ("x-ratelimit-resource", API_RESOURCE.to_owned()),
                    ("x-ratelimit-remaining", remaining),
                ],
            )
        }
        // Like a real API, the rejection says nothing is left. The client's
        // layer then keeps these headers (a limit with fewer remaining
        // wins), so the caller can tell the API's 429 from its own.
        _ => {
            log.rejected += 1;
            (
                StatusCode::TOO_MANY_REQUESTS,
                [
                    ("x-ratelimit-resource", API_RESOURCE.to_owned()),
                    ("x-ratelimit-remaining", "0".to_owned()),
                ],
            )
        }
    }
}

/// The most calls found in any window of each period of `quota`, from the
/// API's arrival times: `(limit, period, most)`.
pub fn busiest_windows(accepted: &[u64], quota: &Quota) -> Vec<(u64, Duration, usize)> {
    let mut times = accepted.to_vec();
    times.sort_unstable();
    quota
        .iter()
        .map(|&(count, period)| {
            let span = u64::try_from(period.as_micros()).unwrap_or(u64::MAX);
            let mut start = 0;
            let mut most = 0;
            for end in 0..times.len() {
                while times[end] - times[start] >= span {
                    start += 1;
                }
                most = most.max(end - start + 1);
            }
            (count, period, most)
        })
        .collect()
}

/// How the calls of a run ended.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Calls the API answered 200.
    pub ok: usize,
    /// Calls the API answered 429.
    pub api_rejected: usize,
    /// Calls the client-side limiter gave up on (the wait would exceed the maximum).
    pub gave_up: usize,
    /// Calls that failed otherwise.
    pub failed: usize,
}

/// Runs `workers` tasks making `calls` calls each through the services
/// `client(worker)` makes, and counts the outcomes.
pub async fn run_workers<S, B>(workers: usize, calls: usize, client: impl Fn(usize) -> S) -> Outcome
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug + Send,
{
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let mut service = client(w);
            tokio::spawn(async move {
                let mut outcome = Outcome::default();
                for _ in 0..calls {
                    let request = http::Request::post("/call").body(Body::empty());
                    let Ok(request) = request else {
                        outcome.failed += 1;
                        continue;
                    };
                    let result = match service.ready().await {
                        Ok(ready) => ready.call(request).await,
                        Err(e) => Err(e),
                    };
                    match result {
                        Ok(res) if res.status().is_success() => outcome.ok += 1,
                        Ok(res) if res.status() == StatusCode::TOO_MANY_REQUESTS => {
                            let from_api = res
                                .headers()
                                .get("x-ratelimit-resource")
                                .is_some_and(|v| v == API_RESOURCE);
                            if from_api {
                                outcome.api_rejected += 1;
                            } else {
                                outcome.gave_up += 1;
                            }
                        }
                        _ => outcome.failed += 1,
                    }
                }
                outcome
            })
        })
        .collect();
    let mut total = Outcome::default();
    for task in tasks {
        let o = task.await.unwrap_or(Outcome {
            failed: calls,
            ..Outcome::default()
        });
        total.ok += o.ok;
        total.api_rejected += o.api_rejected;
        total.gave_up += o.gave_up;
        total.failed += o.failed;
    }
    total
}

/// The client layer: the quota, shared through `store`, waiting up to
/// `max_wait` per call instead of failing.
pub fn client_layer<St: Store>(
    policy: Policy,
    store: St,
    max_wait: Duration,
) -> RateLimitLayer<GlobalKey, St> {
    RateLimitLayer::new(policy, GlobalKey)
        .store(store)
        .wait(max_wait)
}
