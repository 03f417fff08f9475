//! Cost settled after the response, through the layer: exact refunds and
//! debt, headers after settling, only failures counted, and concurrent
//! reservations that never overshoot.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "support/flaky.rs"]
mod flaky;

use std::sync::atomic::Ordering;

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, Response, StatusCode, Uri};
use tollgate::{
    ActualCost, Algorithm, FailureMode, FakeClock, FallbackStore, GlobalKey, Key, MemoryStore,
    Policy, RateLimitLayer, Settle, Store, Timestamp,
};
use tower::ServiceExt;

use flaky::Flaky;

/// 10:00:40 UTC on 2023-11-14; a whole minute.
const T0: u64 = 1_700_000_040;

fn store() -> MemoryStore {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    MemoryStore::builder().clock(clock).build().unwrap()
}

/// `POST /complete?tokens=N` reports N tokens used.
fn tokens_app<St: Store>(layer: RateLimitLayer<GlobalKey, St>) -> Router {
    Router::new()
        .route(
            "/complete",
            post(|uri: Uri| async move {
                let tokens = uri.query().and_then(|q| q.strip_prefix("tokens="));
                let tokens = tokens.and_then(|n| n.parse().ok()).unwrap_or(0);
                (Extension(ActualCost(tokens)), "done")
            }),
        )
        .route_layer(layer)
}

fn complete(tokens: u64) -> Request<Body> {
    Request::post(format!("/complete?tokens={tokens}"))
        .body(Body::empty())
        .unwrap()
}

fn header<'a>(res: &'a Response<impl Sized>, name: &str) -> &'a str {
    res.headers().get(name).unwrap().to_str().unwrap()
}

#[tokio::test]
async fn a_refund_and_a_charge_show_in_the_headers_and_debt_delays_the_next_request() {
    // 10 tokens a minute, one every 6 s; each call reserves 5.
    let policy = Policy::new("tokens", Algorithm::Gcra, "10/min").unwrap();
    let layer = RateLimitLayer::new(policy, GlobalKey)
        .store(store())
        .cost(5)
        .settle(Settle::actual_cost());
    let app = tokens_app(layer);

    // Reserved 5, used 2: 8 remain, not 5.
    let res = app.clone().oneshot(complete(2)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-remaining"), "8");

    // Reserved 5 of the 8, used 9: 11 used of 10, one in debt.
    let res = app.clone().oneshot(complete(9)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-remaining"), "0");

    // The next reservation of 5 waits for 6 units: 36 s.
    let res = app.clone().oneshot(complete(5)).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), "36");
}

#[tokio::test]
async fn a_response_that_cost_what_it_reserved_is_not_settled_again() {
    let policy = Policy::new("tokens", Algorithm::FixedWindow, "10/min").unwrap();
    let layer = RateLimitLayer::new(policy, GlobalKey)
        .store(store())
        .cost(3)
        .settle(Settle::actual_cost());
    let app = Router::new()
        .route("/complete", post(|| async { "no ActualCost" }))
        .route_layer(layer);
    for remaining in ["7", "4", "1"] {
        let res = app.clone().oneshot(complete(0)).await.unwrap();
        assert_eq!(header(&res, "x-ratelimit-remaining"), remaining);
    }
    let res = app.oneshot(complete(0)).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn only_failed_logins_count() {
    let policy = Policy::new("login-failures", Algorithm::FixedWindow, "3/min").unwrap();
    let layer = RateLimitLayer::new(policy, GlobalKey)
        .store(store())
        .settle(Settle::count_only(|status| status.as_u16() >= 400));
    let app = Router::new()
        .route(
            "/login",
            post(|password: String| async move {
                if password == "demo" {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        )
        .route_layer(layer);
    let login = |password: &str| {
        Request::post("/login")
            .body(Body::from(password.to_owned()))
            .unwrap()
    };
    // Successes are refunded: any number of them, and all 3 failures left.
    for _ in 0..20 {
        let res = app.clone().oneshot(login("demo")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "x-ratelimit-remaining"), "3");
    }
    for remaining in ["2", "1", "0"] {
        let res = app.clone().oneshot(login("guess")).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(header(&res, "x-ratelimit-remaining"), remaining);
    }
    // Locked out for the rest of the minute, right password or not.
    let res = app.clone().oneshot(login("demo")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), "60");
}

/// The same on a gRPC layer: a call fails with a 200 whose `grpc-status`
/// (here `UNAUTHENTICATED`, as tonic answers every error, trailers-only)
/// is its status, and the rule sees it as a 401. It saw the 200, and
/// refunded every failure: the failed logins were never counted.
#[tokio::test]
async fn only_failed_grpc_logins_count() {
    let policy = Policy::new("login-failures", Algorithm::FixedWindow, "3/min").unwrap();
    let layer = RateLimitLayer::new(policy, GlobalKey)
        .store(store())
        .grpc()
        .settle(Settle::count_only(|status| status.as_u16() >= 400));
    let login = |password: &'static str| async move {
        let mut response = Response::new(Body::empty());
        let headers = response.headers_mut();
        headers.insert("content-type", "application/grpc".parse().unwrap());
        let code = if password == "demo" { "0" } else { "16" };
        headers.insert("grpc-status", code.parse().unwrap());
        Ok::<_, std::convert::Infallible>(response)
    };
    let service = tower::ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(move |request: Request<Body>| {
            let password = request.uri().path().trim_start_matches('/');
            login(if password == "demo" { "demo" } else { "guess" })
        }));
    let call = |password: &str| {
        let request = Request::post(format!("/{password}"))
            .body(Body::empty())
            .unwrap();
        service.clone().oneshot(request)
    };
    for _ in 0..5 {
        let res = call("demo").await.unwrap();
        assert_eq!(header(&res, "grpc-status"), "0");
        assert_eq!(header(&res, "x-ratelimit-remaining"), "3");
    }
    for remaining in ["2", "1", "0"] {
        let res = call("guess").await.unwrap();
        assert_eq!(header(&res, "grpc-status"), "16");
        assert_eq!(header(&res, "x-ratelimit-remaining"), remaining);
    }
    // Locked out: RESOURCE_EXHAUSTED, right password or not.
    let res = call("demo").await.unwrap();
    assert_eq!(header(&res, "grpc-status"), "8");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reservations_never_overshoot() {
    // 100 units a minute; 1,000 concurrent calls reserve 10 each and use 1.
    // While they run, reservations decide: exactly 10 fit at first. Each
    // settles down to 1 as it finishes, making room for 9 more: calls that
    // arrive later may use it, but the total used never passes 100.
    let policy = Policy::new("tokens", Algorithm::FixedWindow, "100/min").unwrap();
    let store = store();
    let layer = RateLimitLayer::new(policy.clone(), GlobalKey)
        .store(store.clone())
        .cost(10)
        .settle(Settle::actual_cost());
    let gate = std::sync::Arc::new(tokio::sync::Barrier::new(11));
    let app = Router::new()
        .route(
            "/complete",
            post({
                let gate = gate.clone();
                move || {
                    let gate = gate.clone();
                    async move {
                        // The 10 admitted wait until the test lets them go.
                        gate.wait().await;
                        (Extension(ActualCost(1)), "done")
                    }
                }
            }),
        )
        .route_layer(layer);
    let first: Vec<_> = (0..10)
        .map(|_| tokio::spawn(app.clone().oneshot(complete(0))))
        .collect();
    use tollgate::Store as _;
    let key = tollgate::Key::global();
    while store.status(&key, &policy).await.unwrap().remaining() > 0 {
        tokio::task::yield_now().await;
    }
    // While the first 10 are held, every other reservation is denied.
    let mut denied = 0;
    for _ in 0..990 {
        let res = app.clone().oneshot(complete(0)).await.unwrap();
        if res.status() == StatusCode::TOO_MANY_REQUESTS {
            denied += 1;
        }
    }
    assert_eq!(denied, 990);
    gate.wait().await;
    for call in first {
        assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    // Settled to 1 each: 90 remain.
    let status = store.status(&key, &policy).await.unwrap();
    assert_eq!(status.remaining(), 90);
}

/// A settling layer over `store` that falls back on `local`, reserving
/// 500 tokens of 1,000 a minute per call.
fn flaky_app(store: &Flaky, local: &MemoryStore) -> Router {
    let policy = Policy::new("tokens", Algorithm::Gcra, "1000/min").unwrap();
    let layer = RateLimitLayer::new(policy, GlobalKey)
        .store(store.clone())
        .on_store_error(FailureMode::Local)
        .local_fallback(local.clone())
        .cost(500)
        .settle(Settle::actual_cost());
    tokens_app(layer)
}

/// With nothing left in `shared` for the minute, a request `app` reserves
/// 500 for while `shared` fails its checks, and that used 10: reserved in
/// `local`, it is settled there (990 left), and `shared` gets nothing back.
async fn reserved_locally_settled_there(
    app: &Router,
    shared: &Flaky,
    local: &MemoryStore,
    policy: &Policy,
) {
    let spent = shared
        .inner
        .check_sync(&Key::global(), policy, 1_000)
        .unwrap();
    assert_eq!(spent.remaining(), 0);
    shared.fail_check.store(true, Ordering::SeqCst);
    let res = app.clone().oneshot(complete(10)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-remaining"), "990");
    shared.fail_check.store(false, Ordering::SeqCst);
    let after = shared.inner.status(&Key::global(), policy).await.unwrap();
    assert_eq!(after.remaining(), 0, "the shared store got nothing back");
    let here = local.status(&Key::global(), policy).await.unwrap();
    assert_eq!(here.remaining(), 990, "settled where it was reserved");
}

/// A settlement goes where its reservation was made. Reserved by the local
/// fallback while the shared store failed, it is settled there: the
/// refund went to the shared store, which never charged it, and handed
/// out 490 tokens for free. Reserved in the shared store, whose
/// settlement then fails, it is not moved to the local fallback (where
/// the shared store lost it): the failure is reported and the headers
/// show the reservation.
#[tokio::test]
async fn a_settlement_goes_where_its_reservation_was_made() {
    let policy = Policy::new("tokens", Algorithm::Gcra, "1000/min").unwrap();
    let shared = Flaky::new(store());
    let local = store();
    let app = flaky_app(&shared, &local);
    reserved_locally_settled_there(&app, &shared, &local, &policy).await;

    // Reserved in a fresh shared store, used 900; the settlement fails.
    let shared = Flaky::new(store());
    let local = store();
    let app = flaky_app(&shared, &local);
    shared.fail_settle.store(true, Ordering::SeqCst);
    let res = app.clone().oneshot(complete(900)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-remaining"), "500");
    let reserved = shared.inner.status(&Key::global(), &policy).await.unwrap();
    assert_eq!(reserved.remaining(), 500, "the reservation stands");
    assert!(local.is_empty(), "the local fallback took no charge");
}

/// A layer over a `FallbackStore` of the app's own, with a local fallback
/// of its own: a request that fallback reserved while the shared store
/// failed is settled in it, as its decision says (`decided_by`). The
/// layer's settlement said that the store it was given made the
/// reservation, so that store settled it in the shared store, which never
/// charged it: 490 tokens for free.
#[tokio::test]
async fn a_settlement_reaches_the_fallback_of_the_store_the_layer_was_given() {
    let policy = Policy::new("tokens", Algorithm::Gcra, "1000/min").unwrap();
    let shared = Flaky::new(store());
    let inner_local = store();
    let given = FallbackStore::new(shared.clone())
        .on_store_error(FailureMode::Local)
        .local_fallback(inner_local.clone());
    let layer = RateLimitLayer::new(policy.clone(), GlobalKey)
        .store(given)
        .cost(500)
        .settle(Settle::actual_cost());
    let app = tokens_app(layer);
    reserved_locally_settled_there(&app, &shared, &inner_local, &policy).await;
}

/// A memory store whose settlements act at once and answer a second
/// later (a slow reply).
#[derive(Clone)]
struct SlowToAnswer(MemoryStore);

impl Store for SlowToAnswer {
    async fn check(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Result<tollgate::Decision, tollgate::StoreError> {
        self.0.check(key, policy, cost).await
    }

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: tollgate::Settlement,
    ) -> Result<tollgate::Decision, tollgate::StoreError> {
        let settled = self.0.settle(key, policy, settlement).await;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        settled
    }

    async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), tollgate::StoreError> {
        self.0.reset(key, policy).await
    }

    async fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: std::time::Duration,
    ) -> Result<(), tollgate::StoreError> {
        self.0.block(key, policy, duration).await
    }
}

/// A response dropped while its settlement is on its way (its client
/// gone, or a timeout) is settled all the same, and a usage ledger
/// records the settlement: it recorded the 500 reserved where the limit
/// counted the 412 used, for good.
#[tokio::test(start_paused = true)]
async fn a_settlement_whose_response_is_dropped_is_recorded_all_the_same() {
    use tollgate::ledger::{Granularity, Ledger, MemoryLedger, MeteredStore, UsageQuery};
    let memory = store();
    let metered = MeteredStore::new(SlowToAnswer(memory.clone()), MemoryLedger::new());
    let policy = Policy::new("tokens", Algorithm::Gcra, "1000/min").unwrap();
    let layer = RateLimitLayer::new(policy.clone(), GlobalKey)
        .store(metered.clone())
        .cost(500)
        .settle(Settle::actual_cost());
    let app = tokens_app(layer);
    let request = app.oneshot(complete(412));
    let dropped = tokio::time::timeout(std::time::Duration::from_millis(100), request).await;
    assert!(dropped.is_err(), "dropped while settling");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let used = memory.status(&Key::global(), &policy).await.unwrap();
    assert_eq!(used.used(), 412);
    let (from, to) = (
        Timestamp::from_secs(T0 - 86_400),
        Timestamp::from_secs(T0 + 86_400),
    );
    let query = UsageQuery::new(Granularity::Day, from, to).unwrap();
    let usage = metered
        .ledger()
        .usage(&Key::global(), "tokens", query)
        .await;
    assert_eq!(usage.unwrap().total(), 412);
}
