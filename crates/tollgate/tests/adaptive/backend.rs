//! The limit follows a scripted backend whose capacity halves and comes
//! back.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tollgate::Priority;

use super::*;
/// A backend of `workers` that each serve one request in `service`; the
/// others queue for a worker, so latency grows with concurrency.
#[derive(Clone)]
struct Backend {
    workers: Arc<Semaphore>,
    service: Duration,
    served: Arc<AtomicUsize>,
}

impl Backend {
    fn app(&self, layer: AdaptiveConcurrencyLayer<fn(&Request<Body>) -> Priority>) -> Router {
        let backend = self.clone();
        Router::new()
            .route(
                "/work",
                get(move || {
                    let backend = backend.clone();
                    async move {
                        let _worker = backend.workers.acquire().await.unwrap();
                        tokio::time::sleep(backend.service).await;
                        backend.served.fetch_add(1, Ordering::SeqCst);
                        "done"
                    }
                }),
            )
            .layer(layer)
    }
}

/// Offers `rate` requests per second for `span`, a fifth of them critical
/// and the rest sheddable; returns how many of each class were admitted,
/// the median limit over the last second (sampled every 50 ms: a Vegas
/// probe halves it for a moment now and then), and whether a sheddable
/// request was admitted within 100 ms after a critical one was shed.
async fn offer(
    app: &Router,
    state: &AdaptiveHandle,
    rate: u64,
    span: Duration,
) -> ([usize; 3], u32, bool) {
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let end = tokio::time::Instant::now() + span;
    let mut tasks = Vec::new();
    let mut sent = 0u64;
    let mut limits = Vec::new();
    let every = rate / 20;
    while tokio::time::Instant::now() < end {
        tick.tick().await;
        if sent.is_multiple_of(every) && end - tokio::time::Instant::now() <= Duration::from_secs(1)
        {
            limits.push(state.snapshot().limit);
        }
        let class = if sent.is_multiple_of(5) {
            Priority::Critical
        } else {
            Priority::Sheddable
        };
        sent += 1;
        let app = app.clone();
        let outcomes = outcomes.clone();
        tasks.push(tokio::spawn(async move {
            let at = tokio::time::Instant::now();
            let future = app.oneshot(request(class));
            tokio::pin!(future);
            // Whether the layer answered at once (shed) or let it run.
            let status = match futures_poll_once(&mut future).await {
                Some(response) => response.unwrap().status(),
                None => {
                    outcomes.lock().unwrap().push((at, class, true));
                    return future.await.unwrap().status();
                }
            };
            outcomes.lock().unwrap().push((at, class, false));
            status
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let outcomes = outcomes.lock().unwrap();
    let mut admitted = [0; 3];
    for &(_, class, ran) in outcomes.iter() {
        if ran {
            admitted[class.index()] += 1;
        }
    }
    limits.sort_unstable();
    let limit = limits[limits.len() / 2];
    // The guarantee: once a critical request is shed, no sheddable one is
    // admitted for the next 100 ms.
    let crossed = outcomes.iter().any(|&(at, class, ran)| {
        class == Priority::Critical
            && !ran
            && outcomes.iter().any(|&(other, class, ran)| {
                class == Priority::Sheddable
                    && ran
                    && other >= at
                    && other - at < Duration::from_millis(100)
            })
    });
    (admitted, limit, crossed)
}

/// Polls `future` once: its output if it is ready at once.
async fn futures_poll_once<F: std::future::Future + Unpin>(future: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut *future).poll(cx) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn the_limit_follows_a_backend_whose_capacity_halves_and_comes_back() {
    let backend = Backend {
        workers: Arc::new(Semaphore::new(20)),
        service: Duration::from_millis(10),
        served: Arc::default(),
    };
    let limit = AdaptiveLimit::builder("api")
        .bounds(2, 400)
        .reserve(Priority::Critical, 0.2)
        .build()
        .unwrap();
    let layer = layer(limit);
    let state = layer.handle();
    let app = backend.app(layer);
    // Capacity 2,000/s; offered 3x that.
    let (admitted, full, crossed) = offer(&app, &state, 6_000, Duration::from_secs(5)).await;
    assert!(
        !crossed,
        "a critical request was shed while a sheddable one was admitted"
    );
    let served = backend.served.swap(0, Ordering::SeqCst);
    assert!(
        served >= 9_000,
        "served {served} of a capacity of 10,000 in 5 s"
    );
    assert_eq!(admitted.iter().sum::<usize>(), served);
    assert!((20..=40).contains(&full), "limit {full} for 20 workers");

    // Half the workers go away: the limit comes down within 5 s.
    backend.workers.acquire_many(10).await.unwrap().forget();
    let (admitted, halved, crossed) = offer(&app, &state, 6_000, Duration::from_secs(5)).await;
    // Critical requests alone (1,200/s) are more than 10 workers serve:
    // some are shed, and then no sheddable one gets in.
    assert!(admitted[0] < 5_900, "critical admitted: {admitted:?}");
    assert!(!crossed);
    assert!((10..=25).contains(&halved), "limit {halved} for 10 workers");
    backend.served.swap(0, Ordering::SeqCst);

    // They come back: the limit recovers within 10 s.
    backend.workers.add_permits(10);
    let (_, back, crossed) = offer(&app, &state, 6_000, Duration::from_secs(10)).await;
    assert!(!crossed);
    assert!(
        (20..=40).contains(&back),
        "limit {back} for 20 workers again"
    );
    let served = backend.served.load(Ordering::SeqCst);
    assert!(
        served >= 18_000,
        "served {served} of a capacity of 20,000 in 10 s"
    );
}
