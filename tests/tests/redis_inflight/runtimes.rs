//! A layer built on the app's runtime and used from a job worker's runtime
//! of its own thread, which runs tasks only while that thread blocks on a
//! future: the slot's give-back does not wait for the worker's next job.

use std::convert::Infallible;
use std::time::Duration;

use http::Response;
use tollgate_tests::{one_worker_runtime, thread_runtime, unique_prefix};
use tower::{Service, ServiceExt};

use super::*;

/// A service of `limit` in `store`, layered on `home`, whose responses
/// have empty bodies.
fn job_service(
    home: &tokio::runtime::Runtime,
    limit: &InFlightLimit,
    store: &RedisStore,
) -> impl Service<
    Request<Body>,
    Response = Response<tollgate::InFlightBody<Body>>,
    Error = Infallible,
    Future: Send,
> + Clone
+ Send
+ 'static {
    let _home = home.enter();
    tower::ServiceBuilder::new()
        .layer(InFlightLayer::new(limit.clone(), GlobalKey).store(store.clone()))
        .service_fn(|_: Request<Body>| async { Ok(Response::new(Body::empty())) })
}

/// The app's runtime (of worker threads), a store built on it, and a
/// limit of one request in flight.
fn home_store_and_limit() -> (tokio::runtime::Runtime, RedisStore, InFlightLimit) {
    let home = one_worker_runtime();
    let url = home.block_on(require_redis());
    let builder = RedisStore::builder().prefix(unique_prefix("inflight-runtimes"));
    let store = home.block_on(builder.connect(url.as_str())).unwrap();
    (home, store, InFlightLimit::new("jobs", 1).unwrap())
}

/// A job on a worker's thread: the worker's runtime blocks on one request
/// through `service`, reads its response to the end, and then the thread
/// goes on to other work (no task of that runtime runs until its next
/// job). Returns the response's status.
fn one_job(
    worker: &tokio::runtime::Runtime,
    service: impl Service<
        Request<Body>,
        Response = Response<tollgate::InFlightBody<Body>>,
        Error = Infallible,
    >,
) -> http::StatusCode {
    worker.block_on(async move {
        let response = service.oneshot(export()).await.unwrap();
        let status = response.status();
        axum::body::to_bytes(Body::new(response.into_body()), usize::MAX)
            .await
            .unwrap();
        status
    })
}

/// The worker's runtime never runs again after its job; the slot is free
/// within a second all the same (given back on the runtime the layer was
/// built on), and the worker's next job is admitted.
#[test]
fn a_slot_a_job_workers_runtime_gave_back_is_free_before_its_next_job() {
    let (home, store, limit) = home_store_and_limit();
    let service = job_service(&home, &limit, &store);
    let worker_service = service.clone();
    let worker = std::thread::spawn(move || {
        let worker = thread_runtime();
        let first = one_job(&worker, worker_service.clone());
        (worker, worker_service, first)
    });
    let (worker, worker_service, first) = worker.join().unwrap();
    assert_eq!(first, http::StatusCode::OK);
    assert!(
        home.block_on(comes_free(&store, &limit)),
        "the slot is given back while the worker's runtime runs nothing"
    );
    let second = std::thread::spawn(move || one_job(&worker, worker_service))
        .join()
        .unwrap();
    assert_eq!(second, http::StatusCode::OK, "the next job is admitted");
}

/// A job's response dropped outside any runtime (the job returned it from
/// the worker's runtime): its slot is given back on the layer's runtime,
/// not held until its lease ends.
#[test]
fn a_slot_dropped_outside_any_runtime_is_given_back() {
    let (home, store, limit) = home_store_and_limit();
    let service = job_service(&home, &limit, &store);
    let response = std::thread::spawn(move || {
        thread_runtime()
            .block_on(service.oneshot(export()))
            .unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);
    assert!(
        !home.block_on(is_free(&store, &limit)),
        "held by the response"
    );
    drop(response);
    assert!(
        home.block_on(comes_free(&store, &limit)),
        "given back once the response is dropped"
    );
}

/// A layer built on a runtime that then shut down (one for the app's
/// set-up only), used from a job worker's runtime: the slot of a request
/// that runs for more than two leases stays held, renewed, and is free
/// once its response is dropped. (Both went to the runtime shut down,
/// which dropped them unrun: a second request took the slot of one still
/// running, and a slot was held until its lease ended.)
#[test]
fn a_layer_whose_runtime_shut_down_renews_and_gives_back_on_the_workers() {
    let (home, store, _) = home_store_and_limit();
    let lease = Duration::from_millis(600);
    let limit = InFlightLimit::new("jobs", 1).unwrap().lease(lease).unwrap();
    let set_up = one_worker_runtime();
    let service = job_service(&set_up, &limit, &store);
    drop(set_up);
    let (ran, running) = std::sync::mpsc::channel();
    let (end, ends) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        thread_runtime().block_on(async move {
            let response = service.oneshot(export()).await.unwrap();
            ran.send(response.status()).unwrap();
            // The job runs on (its runtime running) until told to end.
            while ends.try_recv().is_err() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            drop(response);
            tokio::time::sleep(Duration::from_millis(300)).await;
        });
    });
    assert_eq!(running.recv().unwrap(), http::StatusCode::OK);
    std::thread::sleep(lease * 2 + lease / 3);
    assert!(
        !home.block_on(is_free(&store, &limit)),
        "held by the request still running, past two leases"
    );
    end.send(()).unwrap();
    worker.join().unwrap();
    assert!(
        home.block_on(is_free(&store, &limit)),
        "given back once the response was dropped"
    );
}
