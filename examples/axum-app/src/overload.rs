//! Protecting the service itself: `GET /work` runs on a stand-in backend
//! of fixed capacity (a number of workers, each taking a service time),
//! behind an [`AdaptiveConcurrencyLayer`] that sheds the least important
//! requests first. A request's class is its `x-priority` header
//! (`critical`, `default` or `sheddable`; anything else is `default`).
//!
//! With an admin token, `GET /admin/overload` shows the layer's state and
//! `POST /admin/backend?workers=N` changes the backend's capacity, to see
//! the limit follow it.
//!
//! The backend's work goes on when its client gives up, as a database
//! query does: without the layer, a queue of abandoned work builds up at
//! overload and every answer comes too late.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, http};
use serde::Deserialize;
use tokio::sync::{Mutex, Semaphore};
use tollgate::{AdaptiveConcurrencyLayer, AdaptiveHandle, AdaptiveLimit, Priority};

use crate::AdminToken;

/// The `[overload]` section of the policy file, checked.
#[derive(Debug, Clone)]
pub struct OverloadConfig {
    /// Whether `GET /work` is behind the adaptive layer (off: the bare
    /// backend, to compare).
    pub protect: bool,
    /// The stand-in backend's workers at the start.
    pub workers: usize,
    /// How long a worker takes per request, on average (each request
    /// takes from 80 % to 120 % of it).
    pub service: Duration,
    /// The adaptive limit.
    pub limit: AdaptiveLimit,
    /// How many requests may wait for a slot, and how long.
    pub queue: Option<(usize, Duration)>,
}

/// The stand-in backend and the layer in front of it, made once per
/// process: a reload of the policy file keeps both (and what the limit
/// has learned).
#[derive(Clone)]
pub struct Overload {
    backend: Arc<Backend>,
    layer: Option<Protection>,
}

/// The layer in front of the backend, classifying by [`priority`].
type Protection = AdaptiveConcurrencyLayer<fn(&Request) -> Priority>;

/// A request's class, from its `x-priority` header. A real service takes
/// it from what it authenticated, not from what a client claims.
fn priority(request: &Request) -> Priority {
    request
        .headers()
        .get("x-priority")
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse().ok())
        .unwrap_or_default()
}

impl Overload {
    /// The backend and layer of `config`.
    ///
    /// # Errors
    ///
    /// The layer's [`ConfigError`](tollgate::ConfigError) for a queue out
    /// of range.
    pub fn new(config: &OverloadConfig) -> Result<Self, tollgate::ConfigError> {
        let layer = if config.protect {
            let layer = AdaptiveConcurrencyLayer::new(config.limit.clone())
                .classify(priority as fn(&Request) -> Priority);
            Some(match config.queue {
                Some((max_waiting, max_wait)) => layer.queue(max_waiting, max_wait)?,
                None => layer,
            })
        } else {
            None
        };
        Ok(Self {
            backend: Arc::new(Backend::new(config.workers, config.service)),
            layer,
        })
    }

    /// The layer's state, if the route is protected.
    pub fn handle(&self) -> Option<AdaptiveHandle> {
        self.layer.as_ref().map(AdaptiveConcurrencyLayer::handle)
    }

    /// `GET /work`, and with `admin` the admin routes of this module.
    pub fn routes(&self, admin: Option<AdminToken>) -> Router {
        crate::serve::record_route(self.own_routes(admin))
    }

    fn own_routes(&self, admin: Option<AdminToken>) -> Router {
        let backend = self.backend.clone();
        let work = get(move || {
            let backend = backend.clone();
            async move { backend.work().await }
        });
        let work = match &self.layer {
            Some(layer) => work.layer(layer.clone()),
            None => work,
        };
        let router = Router::new().route("/work", work);
        let Some(token) = admin else {
            return router;
        };
        let (state, backend, token2) = (self.handle(), self.backend.clone(), token.clone());
        router
            .route(
                "/admin/overload",
                get(move |request: Request| {
                    let state = state.clone();
                    let backend = backend.clone();
                    async move {
                        if let Some(refused) = token.refuses(&request) {
                            return refused;
                        }
                        Json(report(state.as_ref(), backend.workers().await)).into_response()
                    }
                }),
            )
            .route(
                "/admin/backend",
                post({
                    let backend = self.backend.clone();
                    move |request: Request| {
                        let backend = backend.clone();
                        async move {
                            if let Some(refused) = token2.refuses(&request) {
                                return refused;
                            }
                            let workers = Query::<Resize>::try_from_uri(request.uri())
                                .ok()
                                .map(|Query(resize)| resize.workers)
                                .filter(|n| (1..=1_000_000).contains(n));
                            let Some(workers) = workers else {
                                let text = "workers must be from 1 to 1000000\n";
                                return (StatusCode::BAD_REQUEST, text).into_response();
                            };
                            backend.resize(workers).await;
                            StatusCode::NO_CONTENT.into_response()
                        }
                    }
                }),
            )
    }
}

/// `?workers=N`.
#[derive(Debug, Deserialize)]
struct Resize {
    workers: usize,
}

/// The JSON of `GET /admin/overload`.
fn report(state: Option<&AdaptiveHandle>, workers: usize) -> serde_json::Value {
    let Some(state) = state else {
        return serde_json::json!({ "protected": false, "workers": workers });
    };
    let snapshot = state.snapshot();
    let by_class = |values: [u64; 3]| {
        let mut map = serde_json::Map::new();
        for class in Priority::ALL {
            map.insert(class.as_str().into(), values[class.index()].into());
        }
        map
    };
    serde_json::json!({
        "protected": true,
        "workers": workers,
        "limit": snapshot.limit,
        "in_flight": snapshot.in_flight,
        "queued": state.queued(),
        "admitted": snapshot.admitted,
        "shed": by_class(snapshot.refused_by_class),
        "in_flight_by_class": by_class(snapshot.in_flight_by_class.map(u64::from)),
    })
}

/// A backend of a fixed number of workers; requests beyond them queue.
struct Backend {
    slots: Arc<Semaphore>,
    workers: Mutex<usize>,
    service: Duration,
    draws: AtomicU64,
}

impl Backend {
    fn new(workers: usize, service: Duration) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(workers)),
            workers: Mutex::new(workers),
            service,
            draws: AtomicU64::new(0),
        }
    }

    async fn workers(&self) -> usize {
        *self.workers.lock().await
    }

    /// Sets the number of workers; fewer take effect as running work ends.
    async fn resize(&self, workers: usize) {
        let mut current = self.workers.lock().await;
        if workers > *current {
            self.slots.add_permits(workers - *current);
        } else if workers < *current {
            let fewer = u32::try_from(*current - workers).unwrap_or(u32::MAX);
            let slots = self.slots.clone();
            tokio::spawn(async move {
                if let Ok(taken) = slots.acquire_many(fewer).await {
                    taken.forget();
                }
            });
        }
        *current = workers;
    }

    /// One request's work: wait for a worker, then take 80 % to 120 % of
    /// the service time. It runs to its end even if the client gives up.
    async fn work(&self) -> Response {
        let slots = self.slots.clone();
        let service = self.service.mul_f64(0.8 + 0.4 * self.draw());
        let job = tokio::spawn(async move {
            let Ok(_worker) = slots.acquire_owned().await else {
                return false;
            };
            tokio::time::sleep(service).await;
            true
        });
        match job.await {
            Ok(true) => (
                [(http::header::CONTENT_TYPE, "application/json")],
                "{\"done\":true}",
            )
                .into_response(),
            Ok(false) | Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        }
    }

    /// A number from 0 to 1 (splitmix64 over a counter).
    fn draw(&self) -> f64 {
        let mut x = self
            .draws
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}
