//! Counters through the `metrics` facade: decisions by outcome, shadow
//! mode and its per-key ramp, store failures by kind and the failure
//! policy's decisions, and the memory store's key gauge.
#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "support/down.rs"]
mod down;
#[path = "support/flaky.rs"]
mod flaky;

use std::collections::BTreeSet;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tollgate::telemetry::{DECISIONS, FALLBACKS, KEYLESS, MEMORY_STORE_KEYS, STORE_ERRORS};
use tollgate::{
    Algorithm, FailureMode, FakeClock, HeaderKey, Key, MemoryStore, Policy, RateLimitLayer,
    RateLimiter, Timestamp,
};
use tower::ServiceExt;

use down::Down;

/// Runs `test` on a current-thread runtime with `recorder` installed.
fn with_recorder<F: Future>(recorder: &DebuggingRecorder, test: impl FnOnce() -> F) -> F::Output {
    metrics::with_local_recorder(recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(test())
    })
}

/// Every counter and gauge, by name and labels. (A snapshot drains the
/// recorder's counters: take one per test.)
struct Values(Vec<(String, Labels, f64)>);

type Labels = Vec<(String, String)>;

impl Values {
    fn take(snapshotter: &Snapshotter) -> Self {
        let values = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let key = key.key();
                let labels = key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                let value = match value {
                    DebugValue::Counter(n) => n as f64,
                    DebugValue::Gauge(g) => g.into_inner(),
                    DebugValue::Histogram(_) => panic!("{} is a histogram", key.name()),
                };
                (key.name().to_owned(), labels, value)
            });
        Self(values.collect())
    }

    /// The value with exactly these labels (0 if absent).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && l.len() == labels.len()
                    && l.iter()
                        .zip(labels)
                        .all(|(a, b)| (a.0.as_str(), a.1.as_str()) == *b)
            })
            .map_or(0.0, |(.., v)| *v)
    }
}

fn client_header() -> HeaderKey {
    HeaderKey::new(http::HeaderName::from_static("x-client"))
}

async fn send(app: &Router, client: &str) -> StatusCode {
    let request = Request::get("/")
        .header("x-client", client)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(request).await.unwrap().status()
}

/// A day of traffic from several clients, the same for every app it is
/// sent to: (seconds to advance the clock first, client, requests).
const TRAFFIC: &[(u64, &str, usize)] = &[
    (0, "a", 8),
    (0, "b", 3),
    (10, "c", 12),
    (20, "a", 4),
    (30, "b", 9),
    (60, "a", 6),
    (5, "c", 2),
    (120, "d", 20),
];

/// Sends [`TRAFFIC`] to a fixed window of 5/min on a fake clock; returns
/// how many requests got each status.
async fn replay(layer: RateLimitLayer<HeaderKey, MemoryStore>, clock: &FakeClock) -> (u64, u64) {
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let (mut ok, mut limited) = (0, 0);
    for &(advance, client, requests) in TRAFFIC {
        clock.advance(Duration::from_secs(advance));
        for _ in 0..requests {
            match send(&app, client).await {
                StatusCode::OK => ok += 1,
                StatusCode::TOO_MANY_REQUESTS => limited += 1,
                other => panic!("unexpected {other}"),
            }
        }
    }
    (ok, limited)
}

fn fixed_window(name: &str) -> Policy {
    Policy::new(name, Algorithm::FixedWindow, "5/min").unwrap()
}

fn store_at_minute_start() -> (FakeClock, MemoryStore) {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_040));
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    (clock, store)
}

#[test]
fn decisions_are_counted_exactly_by_policy_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (ok, limited, values) = with_recorder(&recorder, || async {
        let (clock, store) = store_at_minute_start();
        let layer = RateLimitLayer::new(fixed_window("counted"), client_header());
        let (ok, limited) = replay(layer.store(store.clone()), &clock).await;
        (ok, limited, Values::take(&snapshotter))
    });
    // Minute 0: a 5 of 8+4, b 3 of 3, c 5 of 12. Minute 1: b 5 of 9.
    // Minute 2: a 5 of 6, c 2 of 2. Minute 4: d 5 of 20.
    assert_eq!((ok, limited), (5 + 3 + 5 + 5 + 5 + 2 + 5, 64 - 30));
    let counted = |outcome| values.get(DECISIONS, &[("policy", "counted"), ("outcome", outcome)]);
    assert_eq!(counted("allowed"), 30.0);
    assert_eq!(counted("limited"), 34.0);
    assert_eq!(counted("shadow_limited"), 0.0);
    // Every client's key was inserted once (none has been swept yet)...
    assert_eq!(values.get(MEMORY_STORE_KEYS, &[]), 4.0);
    // ...and a dropped store takes its keys off the gauge (a snapshot
    // drains, so this one holds the change since the last).
    assert_eq!(Values::take(&snapshotter).get(MEMORY_STORE_KEYS, &[]), -4.0);
}

#[test]
fn a_shadow_policy_never_rejects_and_counts_what_enforcing_rejects() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (enforced, shadowed) = with_recorder(&recorder, || async {
        let (clock, store) = store_at_minute_start();
        let enforced = replay(
            RateLimitLayer::new(fixed_window("enforced"), client_header()).store(store),
            &clock,
        )
        .await;
        let (clock, store) = store_at_minute_start();
        let shadowed = replay(
            RateLimitLayer::new(fixed_window("shadowed"), client_header())
                .store(store)
                .shadow(),
            &clock,
        )
        .await;
        (enforced, shadowed)
    });
    assert_eq!(enforced, (30, 34));
    assert_eq!(shadowed, (64, 0), "shadow mode never answers 429");
    let values = Values::take(&snapshotter);
    let count =
        |policy, outcome| values.get(DECISIONS, &[("policy", policy), ("outcome", outcome)]);
    assert_eq!(count("shadowed", "shadow_limited"), 34.0);
    assert_eq!(
        count("shadowed", "shadow_limited"),
        count("enforced", "limited")
    );
    assert_eq!(count("shadowed", "allowed"), count("enforced", "allowed"));
    assert_eq!(count("shadowed", "limited"), 0.0);
}

/// Clients whose second request in an hour is rejected by a 1/h policy
/// enforced for `percent` of keys.
async fn enforced_clients(percent: u8) -> BTreeSet<usize> {
    let policy = Policy::new(format!("ramp{percent}"), Algorithm::Gcra, "1/h").unwrap();
    let layer = RateLimitLayer::new(policy, client_header())
        .enforce_percent(percent)
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let mut enforced = BTreeSet::new();
    for client in 0..2_000 {
        let client_id = format!("client-{client}");
        assert_eq!(send(&app, &client_id).await, StatusCode::OK);
        let second = send(&app, &client_id).await;
        // A key is either always enforced or never.
        assert_eq!(send(&app, &client_id).await, second);
        if second == StatusCode::TOO_MANY_REQUESTS {
            enforced.insert(client);
        }
    }
    enforced
}

#[test]
fn the_enforcement_ramp_is_stable_per_key() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (none, ten, thirty, all) = with_recorder(&recorder, || async {
        (
            enforced_clients(0).await,
            enforced_clients(10).await,
            enforced_clients(30).await,
            enforced_clients(100).await,
        )
    });
    assert!(none.is_empty());
    assert_eq!(all.len(), 2_000);
    // About the asked share of 2,000 keys (binomial: within 4 sigma).
    assert!((200 - 54..=200 + 54).contains(&ten.len()), "{}", ten.len());
    assert!(
        (600 - 82..=600 + 82).contains(&thirty.len()),
        "{}",
        thirty.len()
    );
    // Raising the percentage keeps every key enforced so far.
    assert!(ten.is_subset(&thirty));
    // Each shadowed key's second and third requests are counted as shadow_limited.
    let values = Values::take(&snapshotter);
    let shadowed = values.get(
        DECISIONS,
        &[("policy", "ramp30"), ("outcome", "shadow_limited")],
    );
    assert_eq!(shadowed, 2.0 * (2_000 - thirty.len()) as f64);
    let limited = values.get(DECISIONS, &[("policy", "ramp30"), ("outcome", "limited")]);
    assert_eq!(limited, 2.0 * thirty.len() as f64);
}

#[test]
fn store_failures_are_counted_by_kind_and_by_what_the_failure_policy_did() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_recorder(&recorder, || async {
        for (name, mode) in [
            ("open", FailureMode::Open),
            ("closed", FailureMode::Closed),
            ("local", FailureMode::Local),
        ] {
            // A store with room for one key: every other key fails.
            let full = MemoryStore::builder().max_keys(1).build().unwrap();
            let policy = Policy::new(name, Algorithm::Gcra, "1/min").unwrap();
            let app = Router::new().route("/", get(|| async { "ok" })).layer(
                RateLimitLayer::new(policy, client_header())
                    .store(full)
                    .on_store_error(mode),
            );
            for i in 0..8 {
                send(&app, &format!("c{i}")).await;
            }
            // The local fallback limits c1 (a new key there) to 1/min too.
            send(&app, "c1").await;
        }
    });
    let values = Values::take(&snapshotter);
    let get = |name, policy, outcome| values.get(name, &[("policy", policy), ("outcome", outcome)]);
    for policy in ["open", "closed", "local"] {
        // The first client fits; the seven others, and c1 again, fail.
        assert_eq!(get(STORE_ERRORS, policy, "full"), 8.0, "{policy}");
        assert_eq!(get(STORE_ERRORS, policy, "timeout"), 0.0, "{policy}");
    }
    assert_eq!(get(FALLBACKS, "open", "open"), 8.0);
    assert_eq!(get(FALLBACKS, "closed", "closed"), 8.0);
    assert_eq!(get(FALLBACKS, "local", "local_allowed"), 7.0);
    assert_eq!(get(FALLBACKS, "local", "local_limited"), 1.0);
    // Local decisions are decisions: 1 + 7 allowed, c1's second limited.
    assert_eq!(get(DECISIONS, "local", "allowed"), 8.0);
    assert_eq!(get(DECISIONS, "local", "limited"), 1.0);
    // Failing open or closed decides nothing.
    assert_eq!(get(DECISIONS, "open", "allowed"), 1.0);
    assert_eq!(get(DECISIONS, "closed", "allowed"), 1.0);
}

#[test]
fn the_in_flight_limit_counts_slots_held_and_rejections() {
    use tollgate::telemetry::{INFLIGHT_REJECTED, INFLIGHT_SLOTS};
    use tollgate::{InFlightLayer, InFlightLimit};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (during, after) = with_recorder(&recorder, || async {
        let limit = InFlightLimit::new("exports", 2).unwrap();
        let layer = InFlightLayer::new(limit, client_header());
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        let request = |client: &str| {
            Request::get("/")
                .header("x-client", client)
                .body(Body::empty())
                .unwrap()
        };
        // Two responses held (their bodies unread), a third turned away,
        // and one of another client.
        let first = app.clone().oneshot(request("a")).await.unwrap();
        let second = app.clone().oneshot(request("a")).await.unwrap();
        let third = app.clone().oneshot(request("a")).await.unwrap();
        let other = app.clone().oneshot(request("b")).await.unwrap();
        assert_eq!(
            [
                first.status(),
                second.status(),
                third.status(),
                other.status()
            ],
            [200, 200, 429, 200]
        );
        let during = Values::take(&snapshotter);
        drop((first, second, other));
        (during, Values::take(&snapshotter))
    });
    let labels = [("policy", "exports")];
    assert_eq!(during.get(INFLIGHT_SLOTS, &labels), 3.0);
    assert_eq!(during.get(INFLIGHT_REJECTED, &labels), 1.0);
    // The recorder drains on each snapshot: the second holds the change
    // since the first, every slot given back.
    assert_eq!(after.get(INFLIGHT_SLOTS, &labels), -3.0);
}

/// An in-flight limit's store failures count as a rate limit's do, by
/// kind and by what the failure policy made of them; and a layer that
/// decides no rates registers no decision series (none stuck at 0).
#[test]
fn in_flight_store_failures_are_counted_and_no_decisions_are_invented() {
    use tollgate::{InFlightLayer, InFlightLimit};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_recorder(&recorder, || async {
        for (name, mode) in [
            ("slots-open", FailureMode::Open),
            ("slots-closed", FailureMode::Closed),
            ("slots-local", FailureMode::Local),
        ] {
            let limit = InFlightLimit::new(name, 2).unwrap();
            let layer = InFlightLayer::new(limit, client_header())
                .store(Down)
                .on_store_error(mode);
            let app = Router::new()
                .route("/", get(|| async { "ok" }))
                .layer(layer);
            let request = || {
                Request::get("/")
                    .header("x-client", "a")
                    .body(Body::empty())
                    .unwrap()
            };
            // Three held at once: under `local`, 2 fit this instance's
            // share and the third is turned away.
            let mut held = Vec::new();
            for _ in 0..3 {
                held.push(app.clone().oneshot(request()).await.unwrap());
            }
            let held: Vec<_> = held.iter().map(|r| r.status()).collect();
            let expected = match mode {
                FailureMode::Open => [200, 200, 200],
                FailureMode::Closed => [503, 503, 503],
                FailureMode::Local => [200, 200, 429],
            };
            assert_eq!(held, expected, "{name}");
        }
    });
    let values = Values::take(&snapshotter);
    let get = |name, policy, outcome| values.get(name, &[("policy", policy), ("outcome", outcome)]);
    for policy in ["slots-open", "slots-closed", "slots-local"] {
        assert_eq!(get(STORE_ERRORS, policy, "timeout"), 3.0, "{policy}");
        assert!(
            values
                .0
                .iter()
                .all(|(n, l, _)| n != DECISIONS
                    || !l.iter().any(|(k, v)| k == "policy" && v == policy)),
            "{policy}"
        );
    }
    assert_eq!(get(FALLBACKS, "slots-open", "open"), 3.0);
    assert_eq!(get(FALLBACKS, "slots-closed", "closed"), 3.0);
    assert_eq!(get(FALLBACKS, "slots-local", "local_allowed"), 2.0);
    assert_eq!(get(FALLBACKS, "slots-local", "local_limited"), 1.0);
}

#[test]
fn an_adaptive_layer_reports_its_limit_in_flight_queue_and_sheds_by_class() {
    use tollgate::telemetry::{ADAPTIVE_IN_FLIGHT, ADAPTIVE_LIMIT, ADAPTIVE_QUEUED, ADAPTIVE_SHED};
    use tollgate::{AdaptiveConcurrencyLayer, AdaptiveLimit, Priority};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_recorder(&recorder, || async {
        let limit = AdaptiveLimit::builder("work").fixed(2).build().unwrap();
        let layer = AdaptiveConcurrencyLayer::new(limit)
            .classify(|request: &Request<Body>| {
                if request.uri().path() == "/low" {
                    Priority::Sheddable
                } else {
                    Priority::Critical
                }
            })
            .queue(1, Duration::from_secs(60))
            .unwrap();
        let go = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        let held = {
            let go = go.clone();
            move || {
                let go = go.clone();
                async move {
                    go.acquire().await.unwrap().forget();
                    "done"
                }
            }
        };
        let app = Router::new()
            .route("/high", get(held.clone()))
            .route("/low", get(held))
            .layer(layer);
        let send = |path: &'static str| {
            let app = app.clone();
            tokio::spawn(async move {
                let request = Request::get(path).body(Body::empty()).unwrap();
                app.oneshot(request).await.unwrap().status()
            })
        };
        // Two run, one waits, and the next of each class is shed.
        let running = [send("/high"), send("/high")];
        let waiting = send("/high");
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(send("/low").await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            send("/high").await.unwrap(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let values = Values::take(&snapshotter);
        let work = [("policy", "work")];
        assert_eq!(values.get(ADAPTIVE_LIMIT, &work), 2.0);
        assert_eq!(values.get(ADAPTIVE_IN_FLIGHT, &work), 2.0);
        assert_eq!(values.get(ADAPTIVE_QUEUED, &work), 1.0);
        let shed = |class| values.get(ADAPTIVE_SHED, &[("policy", "work"), ("priority", class)]);
        assert_eq!(
            (shed("critical"), shed("default"), shed("sheddable")),
            (1.0, 0.0, 1.0)
        );
        go.add_permits(3);
        for task in running.into_iter().chain([waiting]) {
            assert_eq!(task.await.unwrap(), StatusCode::OK);
        }
        let values = Values::take(&snapshotter);
        assert_eq!(values.get(ADAPTIVE_IN_FLIGHT, &work), 0.0);
        assert_eq!(values.get(ADAPTIVE_QUEUED, &work), 0.0);
    });
}

/// Past the first 1,024 policies a chooser picks (one per tenant, say),
/// the rest are counted under one `policy` label, `other policies`: the
/// series stay bounded, and a request registers no metric anew (each
/// registered all 17 of its counters again, found by an audit).
#[test]
fn past_1024_chosen_policies_the_rest_are_counted_as_other_policies() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let values = with_recorder(&recorder, || async {
        let default = Policy::new("tenant-default", Algorithm::Gcra, "1000/s").unwrap();
        let chooser = |request: &Request<Body>| {
            let tenant = request.headers().get("x-client")?.to_str().ok()?;
            Policy::new(format!("tenant-{tenant}"), Algorithm::Gcra, "1000/s").ok()
        };
        let layer = RateLimitLayer::new(default, client_header()).choose_policy(chooser);
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        for i in 0..1_100 {
            assert_eq!(send(&app, &format!("t{i}")).await, StatusCode::OK);
        }
        for _ in 0..100 {
            assert_eq!(send(&app, "t1050").await, StatusCode::OK);
        }
        Values::take(&snapshotter)
    });
    let allowed = |policy| values.get(DECISIONS, &[("policy", policy), ("outcome", "allowed")]);
    assert_eq!(allowed("tenant-t0"), 1.0);
    assert_eq!(allowed("tenant-t1023"), 1.0);
    assert_eq!(allowed("tenant-t1050"), 0.0);
    assert_eq!(allowed("other policies"), 76.0 + 100.0);
    // Near-limit counts of other policies are not a key's own limits'.
    let near = values
        .0
        .iter()
        .filter(|(name, ..)| name == tollgate::telemetry::NEAR_LIMIT);
    let other = |(_, labels, _): &&(String, Labels, f64)| {
        labels
            .iter()
            .any(|(k, v)| k == "policy" && v == "other policies")
    };
    assert_eq!(near.filter(other).count(), 0);
    let policies: BTreeSet<&str> = (values.0.iter())
        .filter(|(name, ..)| name == DECISIONS)
        .filter_map(|(_, labels, _)| labels.iter().find(|(k, _)| k == "policy"))
        .map(|(_, v)| v.as_str())
        .collect();
    // The first 1,024 chosen, the other ones, and the layer's default.
    assert_eq!(policies.len(), 1_024 + 2);
}

/// A limiter's failed settlement is counted in the store errors, as the
/// layer's is; the decisions count only the check.
#[test]
fn a_limiters_failed_settlement_is_a_store_error() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_recorder(&recorder, || async {
        let shared = flaky::Flaky::new(MemoryStore::new());
        let policy = Policy::new("tokens-settled", Algorithm::TokenBucket, "1000/min").unwrap();
        let limiter = RateLimiter::with_store(policy, shared.clone());
        let key = Key::user("acme");
        let reservation = limiter.check_n(&key, 300).await.unwrap();
        shared.fail(true);
        for _ in 0..3 {
            assert!(limiter.settle(&key, &reservation, 300, 900).await.is_err());
        }
    });
    let values = Values::take(&snapshotter);
    let get =
        |name, outcome| values.get(name, &[("policy", "tokens-settled"), ("outcome", outcome)]);
    assert_eq!(get(STORE_ERRORS, "timeout"), 3.0);
    assert_eq!(get(DECISIONS, "allowed"), 1.0);
}

/// A request an operator's deny refuses is counted as `denied`, by the
/// layer and by a limiter, and no store decides it; a request without a
/// key is counted by whose mistake it was, or as let through.
#[test]
fn denials_by_an_operator_and_requests_without_a_key_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_recorder(&recorder, || async {
        let overrides = tollgate::MemoryOverrides::new();
        let mallory = Key::header("mallory");
        let deny: tollgate::Override = "deny".parse().unwrap();
        for name in ["denied-layer", "denied-limiter"] {
            let policy = Policy::new(name, Algorithm::Gcra, "10/s").unwrap();
            tollgate::OverrideStore::set(&overrides, &mallory, &policy, deny.clone(), None)
                .await
                .unwrap();
        }
        let layer = Policy::new("denied-layer", Algorithm::Gcra, "10/s").unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(layer, client_header()).overrides(overrides.clone()));
        for _ in 0..3 {
            assert_eq!(send(&app, "mallory").await, StatusCode::FORBIDDEN);
        }
        assert_eq!(send(&app, "ada").await, StatusCode::OK);
        let keyless = Request::get("/").body(Body::empty()).unwrap();
        let status = app.clone().oneshot(keyless).await.unwrap().status();
        assert_eq!(status, StatusCode::BAD_REQUEST);

        let limited = Policy::new("denied-limiter", Algorithm::Gcra, "10/s").unwrap();
        let limiter = RateLimiter::new(limited).overrides(overrides);
        for _ in 0..2 {
            assert!(!limiter.check(&mallory).await.unwrap().is_allowed());
        }

        let allow = Policy::new("keyless-allowed", Algorithm::Gcra, "10/s").unwrap();
        let layer = RateLimitLayer::new(allow, client_header())
            .on_missing_key(tollgate::MissingKey::Allow)
            .unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        for _ in 0..4 {
            let keyless = Request::get("/").body(Body::empty()).unwrap();
            let status = app.clone().oneshot(keyless).await.unwrap().status();
            assert_eq!(status, StatusCode::OK);
        }
    });
    let values = Values::take(&snapshotter);
    let get = |name, policy, outcome| values.get(name, &[("policy", policy), ("outcome", outcome)]);
    assert_eq!(get(DECISIONS, "denied-layer", "denied"), 3.0);
    assert_eq!(get(DECISIONS, "denied-layer", "allowed"), 1.0);
    assert_eq!(get(DECISIONS, "denied-layer", "limited"), 0.0);
    assert_eq!(get(DECISIONS, "denied-limiter", "denied"), 2.0);
    assert_eq!(get(DECISIONS, "denied-limiter", "limited"), 0.0);
    assert_eq!(get(KEYLESS, "denied-layer", "client"), 1.0);
    assert_eq!(get(KEYLESS, "keyless-allowed", "let_through"), 4.0);
    // Registered on first use only: no `denied` series for a policy that
    // never saw one.
    assert!(!values.0.iter().any(|(n, l, _)| n == DECISIONS
        && l.contains(&("policy".into(), "keyless-allowed".into()))
        && l.contains(&("outcome".into(), "denied".into()))));
}
