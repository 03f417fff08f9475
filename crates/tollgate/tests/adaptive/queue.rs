//! The queue in front of the limit: a freed slot goes to the most
//! important waiter, a full queue makes room from the bottom, a class
//! closed by a refusal above it runs when it reopens, and waits end at
//! their deadline, counted from each request's entry.

use super::*;

/// A route held until the test lets it go, behind a limit of one request
/// at a time with a queue of at most `max_waiting` for `max_wait`.
fn one_at_a_time(max_waiting: usize, max_wait: Duration) -> (Held, AdaptiveHandle, Router) {
    let held = Held::default();
    let limit = AdaptiveLimit::builder("api").fixed(1).build().unwrap();
    let layer = layer(limit).queue(max_waiting, max_wait).unwrap();
    let state = layer.handle();
    let app = held.app(layer);
    (held, state, app)
}

#[tokio::test(start_paused = true)]
async fn a_freed_slot_goes_to_the_most_important_waiter_first() {
    let (held, state, app) = one_at_a_time(10, Duration::from_secs(60));
    let (first, _) = send(&app, Priority::Default, 1).await;
    let mut waiting = Vec::new();
    for class in [
        Priority::Sheddable,
        Priority::Default,
        Priority::Sheddable,
        Priority::Critical,
    ] {
        let (tasks, shed) = send(&app, class, 1).await;
        assert_eq!((tasks.len(), shed), (1, 0));
        waiting.extend(tasks);
    }
    assert_eq!(state.queued(), 4);
    // One at a time, 3 s apart.
    for _ in 0..5 {
        held.go.add_permits(1);
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    answered(first.into_iter().chain(waiting), StatusCode::OK).await;
    let order = held.started.lock().unwrap().clone();
    assert_eq!(
        order,
        [
            Priority::Default,
            Priority::Critical,
            Priority::Default,
            Priority::Sheddable,
            Priority::Sheddable,
        ]
    );
    assert_eq!((state.queued(), state.snapshot().in_flight), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_sheds_the_newest_waiter_of_the_lowest_class_below_a_newcomer() {
    let (held, state, app) = one_at_a_time(3, Duration::from_secs(60));
    let (first, _) = send(&app, Priority::Default, 1).await;
    let (default, _) = send(&app, Priority::Default, 1).await;
    let (older, _) = send(&app, Priority::Sheddable, 1).await;
    let (newer, _) = send(&app, Priority::Sheddable, 1).await;
    assert_eq!(state.queued(), 3);
    // A sheddable newcomer finds the queue full, and nothing below it.
    let (_, shed) = send(&app, Priority::Sheddable, 1).await;
    assert_eq!(shed, 1);
    // A critical one takes the place of the newest sheddable one, which
    // is told 503 at once; then a default one takes the older one's.
    let (critical, shed) = send(&app, Priority::Critical, 1).await;
    assert_eq!((critical.len(), shed), (1, 0));
    for task in newer {
        assert!(task.is_finished());
        assert_eq!(task.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
    }
    let (second_default, shed) = send(&app, Priority::Default, 1).await;
    assert_eq!((second_default.len(), shed), (1, 0));
    answered(older, StatusCode::SERVICE_UNAVAILABLE).await;
    // Critical and default ones fill it now: another default one is shed.
    let (_, shed) = send(&app, Priority::Default, 1).await;
    assert_eq!(shed, 1);
    assert_eq!(state.queued(), 3);
    assert_eq!(state.snapshot().refused_by_class, [0, 1, 3]);
    held.go.add_permits(4);
    answered(
        first
            .into_iter()
            .chain(critical)
            .chain(default)
            .chain(second_default),
        StatusCode::OK,
    )
    .await;
    let order = held.started.lock().unwrap().clone();
    assert_eq!(
        order,
        [
            Priority::Default,
            Priority::Critical,
            Priority::Default,
            Priority::Default,
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_makes_room_from_requests_that_gave_up_before_shedding_a_waiter() {
    let (held, state, app) = one_at_a_time(3, Duration::from_secs(60));
    let (first, _) = send(&app, Priority::Default, 1).await;
    let (critical, _) = send(&app, Priority::Critical, 1).await;
    let (gone, _) = send(&app, Priority::Critical, 1).await;
    let (sheddable, _) = send(&app, Priority::Sheddable, 1).await;
    // The second critical one gives up behind the first: it still counts
    // until it reaches the front, and the queue reads full.
    gone.iter().for_each(|task| task.abort());
    tokio::task::yield_now().await;
    assert_eq!(state.queued(), 3);
    // A default newcomer takes its place, not the sheddable one's.
    let (default, shed) = send(&app, Priority::Default, 1).await;
    assert_eq!((default.len(), shed), (1, 0));
    assert!(sheddable.iter().all(|task| !task.is_finished()));
    assert_eq!(state.queued(), 3);
    assert_eq!(state.snapshot().refused_by_class, [0, 0, 0]);
    held.go.add_permits(4);
    answered(
        first
            .into_iter()
            .chain(critical)
            .chain(default)
            .chain(sheddable),
        StatusCode::OK,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_waiter_of_a_class_closed_by_a_refusal_above_runs_when_it_reopens() {
    let (held, state, app) = one_at_a_time(2, Duration::from_secs(1));
    let (first, _) = send(&app, Priority::Critical, 1).await;
    let (critical, _) = send(&app, Priority::Critical, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (sheddable, _) = send(&app, Priority::Sheddable, 1).await;
    // The critical waiter gives up at 1 s: sheddable ones are closed
    // until 1.1 s. The running request ends at 1.05 s, with the class
    // still closed: nothing is in flight, and no release will come.
    tokio::time::sleep(Duration::from_millis(500)).await;
    answered(critical, StatusCode::SERVICE_UNAVAILABLE).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    held.go.add_permits(1);
    answered(first, StatusCode::OK).await;
    assert_eq!((state.snapshot().in_flight, state.queued()), (0, 1));
    // It runs when its class reopens, not when its wait ends at 1.5 s.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!((state.snapshot().in_flight, state.queued()), (1, 0));
    assert_eq!(held.started(), 2);
    held.go.add_permits(1);
    answered(sheddable, StatusCode::OK).await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_ends_at_its_deadline_and_a_full_queue_sheds_at_once() {
    let (held, state, app) = one_at_a_time(1, Duration::from_millis(100));
    let (first, _) = send(&app, Priority::Default, 1).await;
    let (waiter, shed) = send(&app, Priority::Critical, 1).await;
    assert_eq!((waiter.len(), shed), (1, 0));
    // The queue holds one: the next is shed without waiting.
    let (_, shed) = send(&app, Priority::Critical, 1).await;
    assert_eq!(shed, 1);
    let start = tokio::time::Instant::now();
    answered(waiter, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(state.snapshot().refused_by_class, [2, 0, 0]);
    assert_eq!((state.queued(), state.snapshot().in_flight), (0, 1));
    held.go.add_permits(1);
    answered(first, StatusCode::OK).await;
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_while_waiting_or_running_frees_its_slot() {
    let (held, state, app) = one_at_a_time(10, Duration::from_secs(5));
    let (running, _) = send(&app, Priority::Default, 1).await;
    let (waiting, _) = send(&app, Priority::Default, 1).await;
    assert_eq!((state.snapshot().in_flight, state.queued()), (1, 1));
    for task in waiting {
        task.abort();
    }
    tokio::task::yield_now().await;
    assert_eq!(state.queued(), 0);
    for task in running {
        task.abort();
    }
    tokio::task::yield_now().await;
    assert_eq!(state.snapshot().in_flight, 0);
    // The freed slot is there for the next request.
    let (next, shed) = send(&app, Priority::Default, 1).await;
    assert_eq!((next.len(), shed), (1, 0));
    held.go.add_permits(1);
    answered(next, StatusCode::OK).await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_is_counted_from_the_requests_entry_not_its_first_poll() {
    use tower::{Layer, Service};

    let layer = layer(AdaptiveLimit::builder("api").fixed(1).build().unwrap())
        .queue(10, Duration::from_secs(1))
        .unwrap();
    let state = layer.handle();
    let mut service = layer.layer(tower::service_fn(|_: Request<Body>| async {
        std::future::pending::<()>().await;
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    }));
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let running = tokio::spawn(service.call(request(Priority::Default)));
    tokio::task::yield_now().await;
    // Queued now, polled first 3 s later (behind a buffer, say): its
    // wait of a second ended long ago, and it is shed at once.
    let waiting = service.call(request(Priority::Default));
    assert_eq!(state.queued(), 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let start = tokio::time::Instant::now();
    let response = waiting.await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(start.elapsed(), Duration::ZERO);
    running.abort();
}

/// While a warm-up raises the limit, the requests waiting run as it rises,
/// though no request ends: they waited, with room for them, until a
/// request ended or came, and with none they were shed at their deadline.
/// Here the limit rises from 1 to 101 over 10 s (one more every 100 ms)
/// while the first request holds its slot: the four behind it run one a
/// rise, the last at 400 ms, where all four were shed at 5 s.
#[tokio::test(start_paused = true)]
async fn requests_waiting_run_as_a_warm_up_raises_the_limit() {
    let held = Held::default();
    let limit = AdaptiveLimit::builder("api")
        .bounds(1, 101)
        .initial(101)
        .warm_up(1, Duration::from_secs(10))
        .build()
        .unwrap();
    let layer = layer(limit).queue(10, Duration::from_secs(5)).unwrap();
    let state = layer.handle();
    let app = held.app(layer);
    let (first, _) = send(&app, Priority::Default, 1).await;
    let (waiting, shed) = send(&app, Priority::Default, 4).await;
    assert_eq!((waiting.len(), shed, state.queued()), (4, 0, 4));
    let mut running = Vec::new();
    // Halfway between rises.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for rise in 1..=4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        running.push((state.snapshot().in_flight, state.queued()));
        assert_eq!(state.snapshot().limit, 1 + rise);
    }
    assert_eq!(running, [(2, 3), (3, 2), (4, 1), (5, 0)]);
    held.go.add_permits(5);
    answered(first.into_iter().chain(waiting), StatusCode::OK).await;
}
