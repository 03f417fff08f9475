//! App instances with stores of their own sharing one in-flight limit:
//! exactly, with slots back on completion, client disconnect (also while
//! the slot is being taken) and handler panic, and after Redis loses them.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use futures::future::join_all;
use http::{Request, StatusCode};
use tokio::sync::Semaphore;
use tollgate::InFlightLimit;
use tollgate_redis::RedisStore;
use tollgate_tests::{RedisServer, unique_prefix};
use tower::ServiceExt;

use super::{Gate, comes_free, export, gated_app, instance, is_free, slot_sets, until};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_share_one_in_flight_limit_exactly() {
    let prefix = unique_prefix("inflight");
    let limit = InFlightLimit::new("exports", 5).unwrap();
    let gate = Gate {
        running: Arc::default(),
        most: Arc::default(),
        go: Arc::new(Semaphore::new(0)),
    };
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(instance(&prefix, &limit, &gate).await);
    }
    // 50 slow requests of one key, spread over the three instances.
    let calls: Vec<_> = (0..50)
        .map(|i| tokio::spawn(apps[i % 3].0.clone().oneshot(export())))
        .collect();
    until("5 requests run", || {
        gate.running.load(Ordering::SeqCst) == 5
    })
    .await;
    // The other 45 are turned away while the 5 run.
    until("45 requests answered", || {
        calls.iter().filter(|call| call.is_finished()).count() == 45
    })
    .await;
    gate.go.add_permits(5);
    let (mut ok, mut rejected) = (0, 0);
    for call in calls {
        let response = call.await.unwrap().unwrap();
        match response.status() {
            StatusCode::OK => {
                axum::body::to_bytes(Body::new(response.into_body()), 1024)
                    .await
                    .unwrap();
                ok += 1;
            }
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(response.headers()["x-concurrency-limit"], "5");
                rejected += 1;
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!((ok, rejected), (5, 45));
    assert_eq!(gate.most.load(Ordering::SeqCst), 5);

    // Every slot is back (released in the background).
    let store = &apps[0].1;
    assert!(comes_free(store, &limit).await, "the slots came back");

    // A client that goes away, and a handler that panics, on another
    // instance than the one asking.
    let one = InFlightLimit::new("exports-one", 1).unwrap();
    let (app, _) = instance(&prefix, &one, &gate).await;
    let (_, other) = instance(&prefix, &one, &gate).await;
    let running = gate.running.load(Ordering::SeqCst);
    let call = tokio::spawn(app.clone().oneshot(export()));
    until("the request runs", || {
        gate.running.load(Ordering::SeqCst) == running + 1
    })
    .await;
    assert!(!is_free(&other, &one).await, "held while the request runs");
    call.abort();
    let _ = call.await;
    assert!(
        comes_free(&other, &one).await,
        "given back when the client went away"
    );
    let call = tokio::spawn(
        app.clone()
            .oneshot(Request::get("/panic").body(Body::empty()).unwrap()),
    );
    assert!(call.await.unwrap_err().is_panic());
    assert!(
        comes_free(&other, &one).await,
        "given back when the handler panicked"
    );
    gate.go.add_permits(10);
}

/// After Redis loses its data (FLUSHALL, on a server of the test's own),
/// the running requests take their slots back at their next renewal: then
/// no new request gets in while they run, and once they are done exactly
/// the limit does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn running_requests_take_their_slots_back_after_a_flushall() {
    let server = RedisServer::spawn();
    let prefix = unique_prefix("inflight-flush");
    // Renewed every second: a loaded machine would have to stall a
    // renewal for 3 s to lose a slot by its lease.
    let limit = InFlightLimit::new("exports", 2)
        .unwrap()
        .lease(Duration::from_secs(3))
        .unwrap();
    let renewal_period = limit.lease_duration() / 3;
    let store = RedisStore::builder()
        .prefix(prefix.as_str())
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(server.url().as_str())
        .await
        .unwrap();
    let gate = Gate {
        running: Arc::default(),
        most: Arc::default(),
        go: Arc::new(Semaphore::new(0)),
    };
    let app = gated_app(&limit, &store, &gate);
    let mut con = server.connection();
    let held = |con: &mut redis::Connection| -> u64 {
        slot_sets(con, &prefix, "exports")
            .iter()
            .map(|set| redis::cmd("ZCARD").arg(set).query::<u64>(con).unwrap())
            .sum()
    };

    // Two long requests run.
    let running: Vec<_> = (0..2)
        .map(|_| tokio::spawn(app.clone().oneshot(export())))
        .collect();
    until("2 requests run", || {
        gate.running.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(held(&mut con), 2);

    // Redis loses every slot; within a renewal period both are back.
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    let flushed = std::time::Instant::now();
    // A renewal period, and room for a loaded machine's scheduling.
    let deadline = renewal_period * 3;
    while held(&mut con) < 2 {
        assert!(
            flushed.elapsed() < deadline,
            "the slots came back within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Of 5 new requests, none gets in while the two run.
    let statuses = join_all((0..5).map(|_| app.clone().oneshot(export()))).await;
    let statuses: Vec<StatusCode> = statuses.into_iter().map(|r| r.unwrap().status()).collect();
    assert_eq!(statuses, [StatusCode::TOO_MANY_REQUESTS; 5]);
    assert_eq!(gate.running.load(Ordering::SeqCst), 2);

    // The two finish and give their slots back.
    gate.go.add_permits(2);
    for call in running {
        let response = call.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        axum::body::to_bytes(Body::new(response.into_body()), 1024)
            .await
            .unwrap();
    }
    // Given back by a call in the background.
    let done = std::time::Instant::now();
    while held(&mut con) > 0 {
        assert!(
            done.elapsed() < Duration::from_secs(10),
            "the slots are given back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Of 5 new requests, exactly 2 run.
    let calls: Vec<_> = (0..5)
        .map(|_| tokio::spawn(app.clone().oneshot(export())))
        .collect();
    until("3 requests answered", || {
        calls.iter().filter(|call| call.is_finished()).count() == 3
    })
    .await;
    assert_eq!(gate.running.load(Ordering::SeqCst), 2);
    gate.go.add_permits(2);
    let mut statuses = Vec::new();
    for call in calls {
        let response = call.await.unwrap().unwrap();
        statuses.push(response.status());
        axum::body::to_bytes(Body::new(response.into_body()), 1024)
            .await
            .unwrap();
    }
    statuses.sort();
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(gate.most.load(Ordering::SeqCst), 2);
}

/// A request dropped while its slot is being taken (its client went away
/// before Redis answered) does not hold the slot until its lease ends: the
/// slot comes free within a second. Redis is paused while the request is
/// sent, so that it is surely still waiting for the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_while_its_slot_is_being_taken_gives_it_back() {
    let server = RedisServer::spawn();
    let limit = InFlightLimit::new("taking", 1).unwrap();
    let gate = Gate {
        running: Arc::default(),
        most: Arc::default(),
        go: Arc::new(Semaphore::new(0)),
    };
    let store = RedisStore::builder()
        .prefix(unique_prefix("inflight-taking"))
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(server.url().as_str())
        .await
        .unwrap();
    let app = gated_app(&limit, &store, &gate);
    assert!(is_free(&store, &limit).await, "connected, and free");
    server.pause_writes(300);
    let mut calling = Box::pin(app.oneshot(export()));
    assert!(futures::poll!(calling.as_mut()).is_pending());
    // Once the pause ends, Redis takes the slot (the check below is sent
    // after the request, on the same connection); the request is dropped
    // before it reads the answer.
    assert!(!is_free(&store, &limit).await, "the request holds the slot");
    drop(calling);
    assert!(
        comes_free(&store, &limit).await,
        "the dropped request's slot came back"
    );
    assert_eq!(
        gate.running.load(Ordering::SeqCst),
        0,
        "the handler never ran"
    );
}
