//! The adaptive concurrency layer through axum, on Tokio's paused clock:
//! each class is shed at exactly its reserved ceiling, dropped requests
//! free their slots, warm-up ramps the limit, clients that give up and
//! inner errors bring it down while a Tollgate layer's own 503s do not,
//! and the limit follows a scripted backend whose capacity halves and
//! comes back (`adaptive/backend.rs`); the queue in front of it is in
//! `adaptive/queue.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tollgate::{AdaptiveConcurrencyLayer, AdaptiveHandle, AdaptiveLimit, Priority};
use tower::ServiceExt;

/// The class a request claims in `x-priority` (tests only: a real app
/// takes it from what it authenticated).
fn by_header(request: &Request<Body>) -> Priority {
    request
        .headers()
        .get("x-priority")
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse().ok())
        .unwrap_or_default()
}

fn request(class: Priority) -> Request<Body> {
    Request::get("/work")
        .header("x-priority", class.as_str())
        .body(Body::empty())
        .unwrap()
}

/// A route whose requests run until the test lets them go, recording the
/// order in which they started.
#[derive(Clone)]
struct Held {
    go: Arc<Semaphore>,
    started: Arc<Mutex<Vec<Priority>>>,
}

impl Default for Held {
    fn default() -> Self {
        Self {
            go: Arc::new(Semaphore::new(0)),
            started: Arc::default(),
        }
    }
}

impl Held {
    fn app(&self, layer: AdaptiveConcurrencyLayer<fn(&Request<Body>) -> Priority>) -> Router {
        let held = self.clone();
        Router::new()
            .route(
                "/work",
                get(move |request: Request<Body>| {
                    let held = held.clone();
                    async move {
                        held.started.lock().unwrap().push(by_header(&request));
                        held.go.acquire().await.unwrap().forget();
                        "done"
                    }
                }),
            )
            .layer(layer)
    }

    fn started(&self) -> usize {
        self.started.lock().unwrap().len()
    }
}

fn fixed(limit: u32) -> AdaptiveLimit {
    AdaptiveLimit::builder("api")
        .fixed(limit)
        .reserve(Priority::Critical, 0.2)
        .reserve(Priority::Default, 0.1)
        .build()
        .unwrap()
}

fn layer(limit: AdaptiveLimit) -> AdaptiveConcurrencyLayer<fn(&Request<Body>) -> Priority> {
    AdaptiveConcurrencyLayer::new(limit).classify(by_header as fn(&Request<Body>) -> Priority)
}

/// Waits for every one of `tasks`, asserting each was answered `status`.
async fn answered(
    tasks: impl IntoIterator<Item = tokio::task::JoinHandle<StatusCode>>,
    status: StatusCode,
) {
    for task in tasks {
        assert_eq!(task.await.unwrap(), status);
    }
}

/// Sends `count` requests of `class` and lets every task run: returns the
/// running ones' handles and how many were shed at once.
async fn send(
    app: &Router,
    class: Priority,
    count: usize,
) -> (Vec<tokio::task::JoinHandle<StatusCode>>, usize) {
    let mut running = Vec::new();
    for _ in 0..count {
        let app = app.clone();
        running.push(tokio::spawn(async move {
            app.oneshot(request(class)).await.unwrap().status()
        }));
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let mut shed = 0;
    let mut still = Vec::new();
    for task in running {
        if task.is_finished() {
            assert_eq!(task.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
            shed += 1;
        } else {
            still.push(task);
        }
    }
    (still, shed)
}

#[tokio::test(start_paused = true)]
async fn each_class_is_shed_at_the_limit_less_what_is_kept_for_the_classes_above() {
    let held = Held::default();
    let layer = layer(fixed(10));
    let state = layer.handle();
    let app = held.app(layer);

    // Critical keeps 2 of 10, default 1 more: sheddable stops at 7.
    let (sheddable, shed) = send(&app, Priority::Sheddable, 10).await;
    assert_eq!((sheddable.len(), shed), (7, 3));
    let (default, shed) = send(&app, Priority::Default, 5).await;
    assert_eq!((default.len(), shed), (1, 4));
    let (critical, shed) = send(&app, Priority::Critical, 5).await;
    assert_eq!((critical.len(), shed), (2, 3));
    assert_eq!(held.started(), 10);

    let snapshot = state.snapshot();
    assert_eq!(snapshot.in_flight_by_class, [2, 1, 7]);
    assert_eq!(snapshot.refused_by_class, [3, 4, 3]);

    // Two sheddable requests finish (the route lets them go in the order
    // they started): 8 in flight, still above sheddable's 7 and at
    // default's 8.
    let mut sheddable = sheddable.into_iter();
    held.go.add_permits(2);
    answered(sheddable.by_ref().take(2), StatusCode::OK).await;
    assert_eq!(send(&app, Priority::Sheddable, 1).await.1, 1);
    assert_eq!(send(&app, Priority::Default, 1).await.1, 1);
    // One more: 7 in flight. Critical requests were refused a moment
    // ago, so for 100 ms the classes below are closed, whatever the room.
    held.go.add_permits(1);
    answered(sheddable.by_ref().take(1), StatusCode::OK).await;
    assert_eq!(send(&app, Priority::Default, 1).await.1, 1);
    // Then a default request may run, a sheddable one not.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(send(&app, Priority::Sheddable, 1).await.1, 1);
    let (last, shed) = send(&app, Priority::Default, 1).await;
    assert_eq!((last.len(), shed), (1, 0));
    held.go.add_permits(8);
    answered(
        sheddable.chain(default).chain(critical).chain(last),
        StatusCode::OK,
    )
    .await;
    assert_eq!(state.snapshot().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn a_shed_request_is_told_503_when_to_come_back_and_why() {
    let held = Held::default();
    let app = held.app(layer(fixed(1)));
    let (running, _) = send(&app, Priority::Critical, 1).await;
    let response = app
        .clone()
        .oneshot(request(Priority::Sheddable))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["status"], 503);
    assert_eq!(body["policy"], "api");
    assert_eq!(body["priority"], "sheddable");
    held.go.add_permits(1);
    answered(running, StatusCode::OK).await;
}

#[tokio::test(start_paused = true)]
async fn a_grpc_service_sheds_with_unavailable_and_a_pushback() {
    let held = Held::default();
    let app = held.app(layer(fixed(1)).grpc());
    let (running, _) = send(&app, Priority::Critical, 1).await;
    let response = app
        .clone()
        .oneshot(request(Priority::Default))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(response.headers()["grpc-retry-pushback-ms"], "1000");
    assert_eq!(response.headers()["retry-after"], "1");
    held.go.add_permits(1);
    for task in running {
        task.await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_response_future_dropped_before_its_first_poll_frees_its_slot() {
    use tower::{Layer, Service};

    let layer = layer(AdaptiveLimit::builder("api").fixed(1).build().unwrap());
    let state = layer.handle();
    let mut service = layer.layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    }));
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let future = service.call(request(Priority::Default));
    assert_eq!(state.snapshot().in_flight, 1);
    drop(future); // as a buffer's worker does when its caller is gone
    assert_eq!(state.snapshot().in_flight, 0);
    let response = service.call(request(Priority::Sheddable)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn warm_up_ramps_the_limit_from_its_start_to_the_maximum() {
    let limit = AdaptiveLimit::builder("api")
        .bounds(4, 104)
        .initial(104)
        .warm_up(4, Duration::from_secs(10))
        .build()
        .unwrap();
    let layer = layer(limit);
    let state = layer.handle();
    assert_eq!(state.snapshot().limit, 4);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(state.snapshot().limit, 54);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(state.snapshot().limit, 104);
}

#[path = "adaptive/backend.rs"]
mod backend;
#[path = "adaptive/queue.rs"]
mod queue;
#[path = "adaptive/stacked.rs"]
mod stacked;

#[tokio::test(start_paused = true)]
async fn beside_a_per_key_limit_a_request_refused_for_its_key_never_takes_a_slot() {
    use tollgate::{Algorithm, HeaderKey, Policy, RateLimitLayer};

    let protect = layer(fixed(10));
    let state = protect.handle();
    let per_user = RateLimitLayer::new(
        Policy::new("per-user", Algorithm::Gcra, "2/min").unwrap(),
        HeaderKey::new(http::HeaderName::from_static("x-user")),
    );
    let app = Router::new()
        .route("/work", get(|| async { "done" }))
        .layer(protect)
        .layer(per_user);
    let send = |user: &'static str| {
        let request = Request::get("/work")
            .header("x-user", user)
            .header("x-priority", "sheddable")
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(request)
    };
    let statuses = [
        send("ada").await.unwrap().status(),
        send("ada").await.unwrap().status(),
        send("ada").await.unwrap().status(),
        send("bob").await.unwrap().status(),
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::OK
        ]
    );
    let snapshot = state.snapshot();
    assert_eq!((snapshot.admitted, snapshot.in_flight), (3, 0));
    assert_eq!(snapshot.refused_by_class, [0, 0, 0]);
}

/// AIMD over 100 ms, from 10, taking windows of `size` requests in.
fn aimd_from_ten(size: u32) -> AdaptiveLimit {
    AdaptiveLimit::builder("api")
        .algorithm(tollgate::LimitAlgorithm::Aimd {
            latency_ceiling: Duration::from_millis(100),
        })
        .bounds(1, 100)
        .initial(10)
        .sample_window(Duration::ZERO, size)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn requests_whose_clients_gave_up_after_the_overload_latency_shrink_the_limit() {
    let held = Held::default();
    let layer = layer(aimd_from_ten(5));
    let state = layer.handle();
    let app = held.app(layer);
    // A window of five: four served in 10 ms, one client gone at 50 ms,
    // within the ceiling (the tail's): not a drop (that would be 9), and
    // the four served ran at most four at once, under half the limit:
    // unchanged.
    let (running, _) = send(&app, Priority::Default, 5).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    held.go.add_permits(4);
    tokio::time::sleep(Duration::from_millis(40)).await;
    let mut gave_up = 0;
    for task in running {
        if task.is_finished() {
            assert_eq!(task.await.unwrap(), StatusCode::OK);
        } else {
            task.abort();
            gave_up += 1;
        }
    }
    tokio::task::yield_now().await;
    assert_eq!(gave_up, 1);
    let snapshot = state.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.limit), (0, 10));
    // Ten clients time out after a second, none answered: an overload.
    // The window's five ran a second each: a tenth less.
    let (running, shed) = send(&app, Priority::Default, 10).await;
    assert_eq!((running.len(), shed), (10, 0));
    tokio::time::sleep(Duration::from_secs(1)).await;
    running.iter().for_each(|task| task.abort());
    tokio::task::yield_now().await;
    let snapshot = state.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.limit), (0, 9));
}

#[tokio::test(start_paused = true)]
async fn an_error_after_the_overload_latency_shrinks_the_limit_a_quick_one_does_not() {
    use tower::Layer;

    let layer = layer(aimd_from_ten(5));
    let state = layer.handle();
    // Answers after as many ms as the query says, or fails then if it
    // ends in '!' (a timeout inside the service).
    let service = layer.layer(tower::service_fn(|request: Request<Body>| async move {
        let query = request.uri().query().unwrap();
        let wait: u64 = query.trim_end_matches('!').parse().unwrap();
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if query.ends_with('!') {
            Err("timed out")
        } else {
            Ok(http::Response::new(Body::empty()))
        }
    }));
    let window = |queries: [&'static str; 5]| {
        let calls = queries.map(|query| {
            let service = service.clone();
            tokio::spawn(async move {
                let request = Request::get(format!("/work?{query}"))
                    .body(Body::empty())
                    .unwrap();
                service.oneshot(request).await.is_ok()
            })
        });
        async move {
            let mut ok = Vec::new();
            for call in calls {
                ok.push(call.await.unwrap());
            }
            ok
        }
    };
    // One error at 20 ms among four answers in 10 ms: the tail's, and
    // fast answers: one more.
    let ok = window(["10", "10", "20!", "10", "10"]).await;
    assert_eq!(ok, [true, true, false, true, true]);
    assert_eq!(state.snapshot().limit, 11);
    // Five errors after 500 ms: a tenth less.
    let ok = window(["500!"; 5]).await;
    assert_eq!(ok, [false; 5]);
    assert_eq!(state.snapshot().limit, 9);
}

#[tokio::test(start_paused = true)]
async fn a_503_a_tollgate_layer_inside_made_itself_is_not_the_services_overload() {
    use tollgate::{Algorithm, HeaderKey, Policy, RateLimitLayer};

    let protect = layer(aimd_from_ten(1));
    let state = protect.handle();
    let per_user = RateLimitLayer::new(
        Policy::new("per-user", Algorithm::Gcra, "1/min").unwrap(),
        HeaderKey::new(http::HeaderName::from_static("x-user")),
    )
    .rejection_status(StatusCode::SERVICE_UNAVAILABLE)
    .unwrap();
    // And a limit with an answer of its own, 503 too.
    let per_team = RateLimitLayer::new(
        Policy::new("per-team", Algorithm::Gcra, "1/min").unwrap(),
        HeaderKey::new(http::HeaderName::from_static("x-team")),
    )
    .rejection(|_| {
        let mut response = http::Response::new(bytes::Bytes::from_static(b"come back later"));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        response
    });
    let app = Router::new()
        .route("/work", get(|| async { "done" }))
        .route(
            "/busy",
            get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "busy") }),
        )
        .layer(per_team)
        .layer(per_user)
        .layer(protect);
    let send = |path: &'static str, user: &'static str| {
        let request = Request::get(path)
            .header("x-user", user)
            .header("x-team", if user == "cy" { "red" } else { user })
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(request)
    };
    assert_eq!(send("/work", "ada").await.unwrap().status(), StatusCode::OK);
    // The per-user limit refuses with 503: a refusal, not an overload.
    assert_eq!(
        send("/work", "ada").await.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(state.snapshot().limit, 10);
    // So does the per-team one, with its own answer ("red" used up by
    // its first request, "cy"'s second).
    assert_eq!(send("/work", "red").await.unwrap().status(), StatusCode::OK);
    let response = send("/work", "cy").await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "come back later"
    );
    assert_eq!(state.snapshot().limit, 10);
    // The service's own 503 is one: 10 × 0.9.
    assert_eq!(
        send("/busy", "bob").await.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(state.snapshot().limit, 9);
}

/// A Tollgate layer's own answers inside are no samples of the service,
/// whatever their status: a rejection status of 403, and a missing key's
/// 400. Only its overload-like ones (503) were marked, so a 403 refusal,
/// answered in microseconds, was a request served, and raised the limit.
#[tokio::test(start_paused = true)]
async fn a_tollgate_layers_own_answer_of_any_status_is_not_a_sample() {
    use tollgate::{Algorithm, HeaderKey, Policy, RateLimitLayer};

    let limit = AdaptiveLimit::builder("api")
        .algorithm(tollgate::LimitAlgorithm::Aimd {
            latency_ceiling: Duration::from_millis(100),
        })
        .bounds(1, 100)
        .initial(1)
        .sample_window(Duration::ZERO, 1)
        .build()
        .unwrap();
    let protect = layer(limit);
    let state = protect.handle();
    let per_user = RateLimitLayer::new(
        Policy::new("per-user", Algorithm::Gcra, "1/min").unwrap(),
        HeaderKey::new(http::HeaderName::from_static("x-user")),
    )
    .rejection_status(StatusCode::FORBIDDEN)
    .unwrap();
    let app = Router::new()
        .route("/work", get(|| async { "done" }))
        .layer(per_user)
        .layer(protect);
    let send = |user: Option<&'static str>| {
        let request = Request::get("/work");
        let request = match user {
            Some(user) => request.header("x-user", user),
            None => request,
        };
        app.clone().oneshot(request.body(Body::empty()).unwrap())
    };
    // Served at the limit of one: it grows to 2.
    assert_eq!(send(Some("ada")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(state.snapshot().limit, 2);
    assert_eq!(
        send(Some("ada")).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(send(None).await.unwrap().status(), StatusCode::BAD_REQUEST);
    assert_eq!(state.snapshot().limit, 2);
}
