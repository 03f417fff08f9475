//! The in-flight limit through the layer, in memory: exactly N requests of
//! a key run at once, and slots come back on completion, when the client
//! goes away, when the body is dropped unread, and when the handler
//! panics; and a running request renews a lost slot until it has it back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tollgate::{
    FailureMode, GlobalKey, InFlightLayer, InFlightLimit, Key, MemoryStore, Renewal, SlotStore,
    Slots, StoreError,
};
use tower::ServiceExt;

/// A slow route: each request runs until the test hands it a permit, and
/// counts how many run at once.
#[derive(Clone)]
struct Slow {
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    started: Arc<AtomicUsize>,
    go: Arc<Semaphore>,
}

impl Default for Slow {
    fn default() -> Self {
        Self {
            running: Arc::default(),
            most: Arc::default(),
            started: Arc::default(),
            go: Arc::new(Semaphore::new(0)),
        }
    }
}

async fn panics() -> &'static str {
    panic!("the handler failed")
}

impl Slow {
    fn app<St: SlotStore + Clone + 'static>(&self, layer: InFlightLayer<GlobalKey, St>) -> Router {
        let slow = self.clone();
        Router::new()
            .route(
                "/export",
                get(move || {
                    let slow = slow.clone();
                    async move {
                        let now = slow.running.fetch_add(1, Ordering::SeqCst) + 1;
                        slow.most.fetch_max(now, Ordering::SeqCst);
                        slow.started.fetch_add(1, Ordering::SeqCst);
                        slow.go.acquire().await.unwrap().forget();
                        slow.running.fetch_sub(1, Ordering::SeqCst);
                        "exported"
                    }
                }),
            )
            .route("/panic", get(panics))
            .route_layer(layer)
    }
}

fn get_path(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

async fn until(what: impl Fn() -> bool) {
    while !what() {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_five_of_fifty_run_at_once_and_slots_come_back_on_completion() {
    let store = MemoryStore::new();
    let limit = InFlightLimit::new("exports", 5).unwrap();
    let layer = InFlightLayer::new(limit.clone(), GlobalKey).store(store.clone());
    let slow = Slow::default();
    let app = slow.app(layer);
    let calls: Vec<_> = (0..50)
        .map(|_| tokio::spawn(app.clone().oneshot(get_path("/export"))))
        .collect();
    // 45 are turned away at once; 5 run. Every refusal is in before a
    // slot comes back: a request still undecided then (on a loaded
    // machine) would take the freed slot and wait for a sixth permit.
    until(|| slow.started.load(Ordering::SeqCst) == 5).await;
    until(|| calls.iter().filter(|c| c.is_finished()).count() == 45).await;
    slow.go.add_permits(5);
    let (mut ok, mut rejected) = (0, 0);
    for call in calls {
        let response = call.await.unwrap().unwrap();
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(response.headers()["x-concurrency-limit"], "5");
            assert_eq!(response.headers()["retry-after"], "1");
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json"
            );
            rejected += 1;
        } else {
            assert_eq!(response.status(), StatusCode::OK);
            // Read to the end: the slot comes back.
            response.into_body().collect().await.unwrap();
            ok += 1;
        }
    }
    assert_eq!((ok, rejected), (5, 45));
    assert_eq!(slow.most.load(Ordering::SeqCst), 5);
    assert_eq!(slow.started.load(Ordering::SeqCst), 5);
    // Every slot is back: 5 more run.
    let key = Key::global();
    for holder in 0..5 {
        assert!(store.acquire(&key, &limit, holder).await.unwrap().acquired);
    }
    assert!(!store.acquire(&key, &limit, 99).await.unwrap().acquired);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_a_dropped_body_and_a_panic_give_the_slot_back() {
    let store = MemoryStore::new();
    let limit = InFlightLimit::new("exports", 1).unwrap();
    let layer = InFlightLayer::new(limit.clone(), GlobalKey).store(store.clone());
    let slow = Slow::default();
    let app = slow.app(layer);
    let key = Key::global();
    let free = || async {
        let taken = store.acquire(&key, &limit, 7).await.unwrap().acquired;
        if taken {
            store.release(&key, &limit, 7).await.unwrap();
        }
        taken
    };

    // The client goes away while the handler runs.
    let call = tokio::spawn(app.clone().oneshot(get_path("/export")));
    until(|| slow.started.load(Ordering::SeqCst) == 1).await;
    assert!(!free().await, "held while the request runs");
    call.abort();
    let _ = call.await;
    assert!(free().await, "given back when the client went away");

    // The response body dropped unread.
    slow.go.add_permits(1);
    let response = app.clone().oneshot(get_path("/export")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!free().await, "held until the body is done");
    drop(response);
    assert!(free().await, "given back when the body was dropped");

    // The handler panics.
    let call = tokio::spawn(app.clone().oneshot(get_path("/panic")));
    assert!(call.await.unwrap_err().is_panic());
    assert!(free().await, "given back when the handler panicked");
}

#[tokio::test]
async fn a_grpc_server_refuses_with_resource_exhausted_and_a_pushback() {
    let limit = InFlightLimit::new("streams", 1).unwrap();
    let app = Router::new()
        .route("/greeter", get(|| async { "hello" }))
        .layer(InFlightLayer::new(limit, GlobalKey).grpc());
    let held = app.clone().oneshot(get_path("/greeter")).await.unwrap();
    let refused = app.clone().oneshot(get_path("/greeter")).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let headers = refused.headers();
    assert_eq!(refused.status(), StatusCode::OK, "trailers-only");
    assert_eq!(headers["grpc-status"], "8");
    assert_eq!(headers["grpc-retry-pushback-ms"], "1000");
    assert_eq!(headers["x-concurrency-limit"], "1");
    assert!(headers.contains_key("grpc-status-details-bin"));
    drop(held);
    let again = app.oneshot(get_path("/greeter")).await.unwrap();
    assert!(!again.headers().contains_key("grpc-status"));
}

/// The memory store's slots, renewed as leases are (as on Redis), with
/// holder ids in order from 1 and every renewal's answer recorded; given
/// back at once, as in memory, and the give-backs counted. While `away`,
/// takes and renewals fail, as on a Redis that is away: its breaker open,
/// or, while `refused`, its connection refused.
#[derive(Clone, Default)]
struct Leasing {
    slots: MemoryStore,
    next: Arc<AtomicU64>,
    renewals: Arc<Mutex<Vec<Renewal>>>,
    away: Arc<std::sync::atomic::AtomicBool>,
    refused: Arc<std::sync::atomic::AtomicBool>,
    /// While `away`: calls time out, as on a Redis that is slow.
    slow: Arc<std::sync::atomic::AtomicBool>,
    /// While `away`: calls meet the process's own load.
    overloaded: Arc<std::sync::atomic::AtomicBool>,
    /// While `away`: calls fail on a dropped connection, which may have
    /// been applied (a Redis that restarted).
    dropped: Arc<std::sync::atomic::AtomicBool>,
    given_back: Arc<AtomicUsize>,
}

impl Leasing {
    fn failing(&self) -> Result<(), StoreError> {
        if !self.away.load(Ordering::SeqCst) {
            return Ok(());
        }
        if self.slow.load(Ordering::SeqCst) {
            return Err(StoreError::Timeout(Duration::from_millis(50)));
        }
        if self.overloaded.load(Ordering::SeqCst) {
            return Err(StoreError::Overloaded);
        }
        if self.dropped.load(Ordering::SeqCst) {
            let dropped = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
            return Err(StoreError::backend(dropped));
        }
        Err(match self.refused.load(Ordering::SeqCst) {
            true => StoreError::unavailable(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "refused",
            )),
            false => StoreError::CircuitOpen,
        })
    }
}

impl SlotStore for Leasing {
    async fn acquire(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<Slots, StoreError> {
        self.failing()?;
        self.slots.acquire(key, limit, holder).await
    }

    async fn renew(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<Renewal, StoreError> {
        self.failing()?;
        let renewal = self.slots.renew(key, limit, holder).await?;
        self.renewals.lock().unwrap().push(renewal);
        Ok(renewal)
    }

    async fn release(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<(), StoreError> {
        self.given_back.fetch_add(1, Ordering::SeqCst);
        self.slots.release(key, limit, holder).await
    }

    fn release_now(&self, key: &Key, limit: &InFlightLimit, holder: u64) -> bool {
        self.given_back.fetch_add(1, Ordering::SeqCst);
        self.slots.release_now(key, limit, holder)
    }

    fn new_holder(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst) + 1
    }
}

/// A layer of one slot on [`Leasing`], with a lease of 3 s (renewed every
/// second), and one export running on it.
async fn one_export_running() -> (
    Leasing,
    InFlightLimit,
    Slow,
    Router,
    tokio::task::JoinHandle<Result<http::Response<axum::body::Body>, std::convert::Infallible>>,
) {
    let store = Leasing::default();
    let limit = InFlightLimit::new("exports", 1)
        .unwrap()
        .lease(Duration::from_secs(3))
        .unwrap();
    let slow = Slow::default();
    let app = slow.app(InFlightLayer::new(limit.clone(), GlobalKey).store(store.clone()));
    let running = tokio::spawn(app.clone().oneshot(get_path("/export")));
    until(|| slow.started.load(Ordering::SeqCst) == 1).await;
    (store, limit, slow, app, running)
}

/// Asserts that a request to `app`'s slow route is refused at once.
/// (Admitted, it would wait for the handler's permit: a time limit makes
/// that a failure rather than a hang.)
async fn refused_at_once(app: &Router) {
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        app.clone().oneshot(get_path("/export")),
    )
    .await
    .expect("refused at once, not admitted")
    .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A running request whose slot the store lost is counted again at its
/// next renewal, past the limit while another request holds the only
/// slot; when that one ends, a new request is still refused, as the
/// first still runs. (It was taken back only once a slot was free, and a
/// new request took the freed slot first: two ran against a limit of
/// one.) Tokio's paused clock drives the renewals.
#[tokio::test(start_paused = true)]
async fn a_running_request_whose_slot_was_lost_counts_again_at_its_next_renewal() {
    let (store, limit, slow, app, running) = one_export_running().await;
    let key = Key::global();
    // The store loses holder 1's slot, and another request (99) takes it.
    store.release(&key, &limit, 1).await.unwrap();
    assert!(store.acquire(&key, &limit, 99).await.unwrap().acquired);
    // A renewal a second later finds it gone, and takes it back.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(*store.renewals.lock().unwrap(), [Renewal::RetakenPastLimit]);
    // 99 is done; the first request still runs, and holds the slot.
    store.release(&key, &limit, 99).await.unwrap();
    refused_at_once(&app).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        *store.renewals.lock().unwrap(),
        [Renewal::RetakenPastLimit, Renewal::Renewed]
    );
    slow.go.add_permits(1);
    let done = running.await.unwrap().unwrap();
    done.into_body().collect().await.unwrap();
    // Given back at once: a new request runs.
    let again = tokio::spawn(app.oneshot(get_path("/export")));
    until(|| slow.started.load(Ordering::SeqCst) == 2).await;
    slow.go.add_permits(1);
    assert_eq!(again.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// A renewal that fails at once is tried again after a quarter of the
/// renewal period: a running request whose slot the store lost while it
/// was away counts again soon after the store is back, not a whole period
/// later. (The next try came a whole period later: for that long new
/// requests took the lost slot, and ran beside it past the limit.) Away
/// with its breaker open, refusing connections, or on a dropped
/// connection, as after a Redis restart that lost the slots: that failure
/// may have been applied, and waited the whole period, with 3 exports
/// running under a limit of 2 for about 0.9 s against a Redis.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_failed_is_tried_again_within_a_quarter_of_its_period() {
    for (refused, dropped) in [(false, false), (true, false), (false, true)] {
        renewed_after_an_absence(refused, dropped).await;
    }
}

async fn renewed_after_an_absence(refused: bool, dropped: bool) {
    let (store, limit, slow, app, running) = one_export_running().await;
    // The store loses holder 1's slot, and is away for its first renewal.
    store.release(&Key::global(), &limit, 1).await.unwrap();
    store.refused.store(refused, Ordering::SeqCst);
    store.dropped.store(dropped, Ordering::SeqCst);
    store.away.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(store.renewals.lock().unwrap().is_empty());
    store.away.store(false, Ordering::SeqCst);
    // Tried again 250 ms after the failure: the slot is taken back.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(*store.renewals.lock().unwrap(), [Renewal::Retaken]);
    refused_at_once(&app).await;
    // Then every second again, from the try that got through (at 1.25 s,
    // so not at 2 s but at 2.25 s).
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(*store.renewals.lock().unwrap(), [Renewal::Retaken]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        *store.renewals.lock().unwrap(),
        [Renewal::Retaken, Renewal::Renewed]
    );
    slow.go.add_permits(1);
    let done = running.await.unwrap().unwrap();
    done.into_body().collect().await.unwrap();
}

/// A renewal that timed out waits the whole period for its next try: the
/// store is slow, and trying sooner would add to its load. So does one
/// that met the process's own load.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_timed_out_waits_the_whole_period() {
    for overloaded in [false, true] {
        renewed_a_period_after_failing(overloaded).await;
    }
}

async fn renewed_a_period_after_failing(overloaded: bool) {
    let (store, limit, slow, _app, running) = one_export_running().await;
    store.release(&Key::global(), &limit, 1).await.unwrap();
    store.slow.store(!overloaded, Ordering::SeqCst);
    store.overloaded.store(overloaded, Ordering::SeqCst);
    store.away.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    store.away.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(store.renewals.lock().unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(*store.renewals.lock().unwrap(), [Renewal::Retaken]);
    slow.go.add_permits(1);
    let done = running.await.unwrap().unwrap();
    done.into_body().collect().await.unwrap();
}

/// Takes the slot in its store, then fails as if the reply were lost on
/// its way back (a reset connection): the slot is held, and the caller
/// does not know it.
#[derive(Clone, Default)]
struct LostReply(Leasing);

impl SlotStore for LostReply {
    async fn acquire(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<Slots, StoreError> {
        self.0.acquire(key, limit, holder).await?;
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        Err(StoreError::backend(reset))
    }

    async fn renew(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<Renewal, StoreError> {
        self.0.renew(key, limit, holder).await
    }

    async fn release(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<(), StoreError> {
        self.0.release(key, limit, holder).await
    }

    fn release_now(&self, key: &Key, limit: &InFlightLimit, holder: u64) -> bool {
        self.0.release_now(key, limit, holder)
    }

    fn new_holder(&self) -> u64 {
        self.0.new_holder()
    }
}

/// A backend failure may come after the store took the slot (its reply
/// lost on the way back): the slot is given back, as after a timeout. It
/// was held until its lease ended, and with a limit of one the key could
/// run nothing in the store for that long. Under the local fallback, or
/// let through (open), the request's registration holds it in the store
/// while the request runs, and gives it back when it ends; refused
/// (closed), the request never holds it, and it is given back at once.
#[tokio::test]
async fn a_slot_taken_before_a_lost_reply_is_given_back() {
    for (mode, status) in [
        (FailureMode::Local, StatusCode::OK),
        (FailureMode::Closed, StatusCode::SERVICE_UNAVAILABLE),
        (FailureMode::Open, StatusCode::OK),
    ] {
        let store = LostReply::default();
        let limit = InFlightLimit::new("exports", 1).unwrap();
        // A fallback of its own: the process's holds the slots of the
        // other tests' exports, running beside it.
        let layer = InFlightLayer::new(limit.clone(), GlobalKey)
            .store(store.clone())
            .on_store_error(mode)
            .local_fallback(MemoryStore::new());
        let app = Router::new()
            .route("/export", get(|| async { "exported" }))
            .route_layer(layer);
        let res = app.oneshot(get_path("/export")).await.unwrap();
        assert_eq!(res.status(), status, "{mode:?}");
        res.into_body().collect().await.unwrap();
        let key = Key::global();
        let freed = async {
            for _ in 0..1_000 {
                if store.0.acquire(&key, &limit, 99).await.unwrap().acquired {
                    return true;
                }
                tokio::task::yield_now().await;
            }
            false
        };
        assert!(freed.await, "{mode:?}: the slot is still held");
    }
}

/// Outside a Tokio runtime (an executor of the app's own), a store of
/// leases takes a slot without a panic, and gives it back; nothing renews
/// it meanwhile. (Its renewal was spawned on Tokio, which panicked on the
/// request path, after the slot was taken.)
#[test]
fn a_slot_of_leases_is_taken_and_given_back_outside_a_tokio_runtime() {
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }
    let store = Leasing::default();
    let limit = InFlightLimit::new("jobs", 1).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(InFlightLayer::new(limit.clone(), GlobalKey).store(store.clone()));
    let held = block_on(app.clone().oneshot(get_path("/"))).unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let refused = block_on(app.clone().oneshot(get_path("/"))).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(held);
    let again = block_on(app.oneshot(get_path("/"))).unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert!(store.renewals.lock().unwrap().is_empty());
}

/// A request that the local fallback gave a slot while the store was
/// away, and that runs on once it is back, counts in the store from its
/// next renewal: another instance's request is refused there until it
/// ends. (It was never in the store, and the limit ran twice over for as
/// long as it ran.) So does one let through under `FailureMode::Open`.
#[tokio::test(start_paused = true)]
async fn a_slot_taken_locally_while_the_store_was_away_counts_there_once_it_is_back() {
    for mode in [FailureMode::Local, FailureMode::Open] {
        taken_while_away_counts_once_back(mode).await;
    }
}

/// An export of limit 1 (a lease of 3 s) on a `Leasing` store, under
/// `mode`, started while the store is away: the store, the limit, the
/// export's handler, and the request running.
async fn exporting_while_away(
    mode: FailureMode,
    refused: bool,
) -> (
    Leasing,
    InFlightLimit,
    Slow,
    tokio::task::JoinHandle<Result<http::Response<axum::body::Body>, std::convert::Infallible>>,
) {
    let store = Leasing::default();
    let limit = InFlightLimit::new("exports", 1)
        .unwrap()
        .lease(Duration::from_secs(3))
        .unwrap();
    let slow = Slow::default();
    let app = slow.app(
        InFlightLayer::new(limit.clone(), GlobalKey)
            .store(store.clone())
            .on_store_error(mode)
            .local_fallback(MemoryStore::new()),
    );
    store.away.store(true, Ordering::SeqCst);
    store.refused.store(refused, Ordering::SeqCst);
    let running = tokio::spawn(app.clone().oneshot(get_path("/export")));
    until(|| slow.started.load(Ordering::SeqCst) == 1).await;
    (store, limit, slow, running)
}

async fn taken_while_away_counts_once_back(mode: FailureMode) {
    let (store, limit, slow, running) = exporting_while_away(mode, false).await;
    store.away.store(false, Ordering::SeqCst);
    let key = Key::global();
    // Its renewal a second later registers it in the store.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let other = store.acquire(&key, &limit, 99).await.unwrap();
    assert!(!other.acquired, "{mode:?}");
    slow.go.add_permits(1);
    let done = running.await.unwrap().unwrap();
    assert_eq!(done.status(), StatusCode::OK);
    done.into_body().collect().await.unwrap();
    // Given back in the store too.
    assert!(store.acquire(&key, &limit, 99).await.unwrap().acquired);
}

/// A request the failure policy let run while the store was away for all
/// of it never reached the store: nothing of it is given back there. (Its
/// give-back would fail, and be tried again through the outage, taking
/// the place of give-backs that matter.) Away with its breaker open, or
/// its connection refused (which was a `Backend` error, "may have acted").
#[tokio::test(start_paused = true)]
async fn a_request_that_never_reached_the_store_gives_nothing_back_there() {
    let away = [FailureMode::Local, FailureMode::Open].map(|mode| [(mode, false), (mode, true)]);
    for (mode, refused) in away.into_iter().flatten() {
        let (store, _, slow, running) = exporting_while_away(mode, refused).await;
        // Its renewals, a second apart, fail too.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        slow.go.add_permits(1);
        let done = running.await.unwrap().unwrap();
        assert_eq!(done.status(), StatusCode::OK, "{mode:?}");
        done.into_body().collect().await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let given_back = store.given_back.load(Ordering::SeqCst);
        assert_eq!(given_back, 0, "{mode:?}, refused: {refused}");
    }
}

/// A store of several connections, as a pool is: a renewal, once sent, is
/// applied when the test lets it through (its connection was slow), even if
/// the caller stops waiting for it; a give-back is applied at once.
#[derive(Clone)]
struct Pooled {
    slots: MemoryStore,
    /// Renewals sent, and the permits that let them through.
    sent: Arc<AtomicUsize>,
    through: Arc<Semaphore>,
}

impl SlotStore for Pooled {
    async fn acquire(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<Slots, StoreError> {
        self.slots.acquire(key, limit, holder).await
    }

    async fn renew(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<Renewal, StoreError> {
        self.sent.fetch_add(1, Ordering::SeqCst);
        let (store, key, limit) = (self.clone(), key.clone(), limit.clone());
        let applied = tokio::spawn(async move {
            store.through.acquire().await.unwrap().forget();
            store.slots.renew(&key, &limit, holder).await
        });
        applied.await.unwrap()
    }

    async fn release(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<(), StoreError> {
        self.slots.release(key, limit, holder).await
    }
}

/// A request that ends while its slot's renewal is on its way gives the
/// slot back after the renewal's reply: on a store of several connections
/// (a pool), a give-back sent at once reached the store first, and the
/// renewal then took the slot back for a whole lease, refusing every
/// request of a key limited to one.
#[tokio::test(start_paused = true)]
async fn a_slot_whose_renewal_is_on_its_way_when_its_request_ends_is_given_back_after_it() {
    let store = Pooled {
        slots: MemoryStore::new(),
        sent: Arc::default(),
        through: Arc::new(Semaphore::new(0)),
    };
    let limit = InFlightLimit::new("exports", 1)
        .unwrap()
        .lease(Duration::from_secs(3))
        .unwrap();
    let slow = Slow::default();
    let app = slow.app(InFlightLayer::new(limit.clone(), GlobalKey).store(store.clone()));
    let running = tokio::spawn(app.clone().oneshot(get_path("/export")));
    until(|| slow.started.load(Ordering::SeqCst) == 1).await;
    // A renewal a second later is sent, and held on its way.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(store.sent.load(Ordering::SeqCst), 1);
    // The request ends meanwhile.
    slow.go.add_permits(1);
    let done = running.await.unwrap().unwrap();
    done.into_body().collect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The renewal reaches the store, and the slot is free after it.
    store.through.add_permits(1);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let key = Key::global();
    let taken = store.slots.acquire(&key, &limit, 99).await.unwrap();
    assert!(taken.acquired, "the slot is held: {taken:?}");
    assert_eq!(
        store.sent.load(Ordering::SeqCst),
        1,
        "no renewal after the end"
    );
}
