//! The live operator dashboard: `GET /admin/dashboard`, a page served by
//! the demo itself (no external service, no CDN), and `GET
//! /admin/dashboard/data`, what it shows, behind the admin token.
//!
//! The page holds no data: it asks for the admin token, keeps it in the
//! tab's session storage, and reads `/admin/dashboard/data` with it every
//! second. That answer is made once a second by one task, whoever
//! watches, from one rendering of `/metrics` (so the page's numbers are
//! the ones `/metrics` gives), this instance's or every instance's top
//! keys, the overrides in force and the month's usage of the top users:
//! - per policy, requests admitted, limited and shadow-limited, in total
//!   and per second over the last five minutes, with the near-limit count
//!   and the policy's top limited and top active keys;
//! - the store's health: its breaker, its errors by kind, the failure
//!   policy's decisions, the deny cache and the latency histogram;
//! - leases, in-flight slots, and the adaptive limits with their sheds;
//! - the overrides in force and the usage of this month.

mod page;
mod prom;
mod snapshot;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::{AdminToken, AppLedger, AppOverrides, AppTopKeys};

use snapshot::Point;

/// How often the dashboard's data is made, and the page refreshes.
pub const REFRESH: Duration = Duration::from_secs(1);

/// How many refreshes the rate charts span (five minutes).
const HISTORY: usize = 300;

/// What the dashboard reads; made once, kept across reloads of the policy
/// file. Clones share it; its task stops when the last clone is dropped.
#[derive(Clone)]
pub struct Dashboard {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("store", &self.shared.sources.store)
            .finish_non_exhaustive()
    }
}

/// Where the dashboard's numbers come from.
pub struct Sources {
    /// The exporter `/metrics` renders.
    pub metrics: PrometheusHandle,
    /// The top keys.
    pub top: AppTopKeys,
    /// The overrides.
    pub overrides: AppOverrides,
    /// The usage ledger.
    pub ledger: AppLedger,
    /// What the store is, as shown: `memory`, `redis`, `redis (sentinel)`.
    pub store: &'static str,
    /// How keys are shown: as the top keys label them.
    pub label: crate::topkeys::DemoLabel,
}

struct Shared {
    sources: Sources,
    /// The decision counts of the last refreshes, oldest first.
    history: Mutex<VecDeque<Point>>,
    /// The latest answer of `/admin/dashboard/data`.
    latest: Mutex<Arc<str>>,
}

impl Dashboard {
    /// The dashboard of `sources`, refreshed every [`REFRESH`] by a task
    /// on the current Tokio runtime (call it inside one).
    pub fn start(sources: Sources) -> Self {
        let shared = Arc::new(Shared {
            sources,
            history: Mutex::new(VecDeque::with_capacity(HISTORY + 1)),
            latest: Mutex::new(Arc::from("{}")),
        });
        tokio::spawn(refresh_every(Arc::downgrade(&shared)));
        Self { shared }
    }

    /// `GET /admin/dashboard` and, with `token`, `GET
    /// /admin/dashboard/data`.
    pub fn routes(&self, token: AdminToken) -> Router {
        let shared = self.shared.clone();
        let data = move |request: Request| {
            let (shared, token) = (shared.clone(), token.clone());
            async move {
                if let Some(refused) = token.refuses(&request) {
                    return refused;
                }
                let body = shared
                    .latest
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                (
                    [
                        (header::CONTENT_TYPE, "application/json"),
                        (header::CACHE_CONTROL, "no-store"),
                    ],
                    body.to_string(),
                )
                    .into_response()
            }
        };
        Router::new()
            .route("/admin/dashboard", get(page))
            .route("/admin/dashboard/app.js", get(script))
            .route("/admin/dashboard/data", get(data))
    }
}

/// The page's script.
async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        page::SCRIPT,
    )
        .into_response()
}

/// The page: markup and style, with no data in it.
async fn page() -> Response {
    (
        StatusCode::OK,
        [
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'",
            ),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        Html(page::HTML),
    )
        .into_response()
}

/// Makes the dashboard's data every [`REFRESH`] until the dashboard is
/// dropped.
async fn refresh_every(shared: Weak<Shared>) {
    let mut ticks = tokio::time::interval(REFRESH);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticks.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let body = snapshot::make(&shared.sources, &shared.history, HISTORY).await;
        *shared.latest.lock().unwrap_or_else(PoisonError::into_inner) = Arc::from(body.to_string());
    }
}
