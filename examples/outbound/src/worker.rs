//! A worker: asks the limits, calls the partner, counts what happened;
//! and an instance, several workers sharing one store, as one process
//! runs them.

use std::ops::AddAssign;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tollgate::{Key, Store};

use crate::pacing::{PartnerLimits, Stop};
use crate::partner::Partner;

/// How the calls of a worker, an instance or a run ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Calls {
    /// Calls the partner accepted.
    pub ok: u64,
    /// Calls the partner answered 429.
    pub rejected: u64,
    /// Calls or limiter checks that failed otherwise.
    pub failed: u64,
    /// Workers that stopped because the day's quota was spent.
    pub day_over: u64,
}

impl AddAssign for Calls {
    fn add_assign(&mut self, other: Self) {
        self.ok += other.ok;
        self.rejected += other.rejected;
        self.failed += other.failed;
        self.day_over += other.day_over;
    }
}

impl Calls {
    /// One line, as a worker process reports to the demo's coordinator.
    pub fn to_line(&self) -> String {
        format!(
            "calls ok={} rejected={} failed={} day_over={}",
            self.ok, self.rejected, self.failed, self.day_over
        )
    }

    /// Reads a line of [`Calls::to_line`].
    pub fn from_line(line: &str) -> Option<Self> {
        let mut calls = Self::default();
        let fields = line.strip_prefix("calls ")?;
        for field in fields.split_whitespace() {
            let (name, value) = field.split_once('=')?;
            let value = value.parse().ok()?;
            match name {
                "ok" => calls.ok = value,
                "rejected" => calls.rejected = value,
                "failed" => calls.failed = value,
                "day_over" => calls.day_over = value,
                _ => return None,
            }
        }
        Some(calls)
    }
}

/// What a call to the partner came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Accepted.
    Ok,
    /// Answered 429.
    TooMany,
    /// Failed otherwise.
    Failed,
}

/// A way to call the partner: over HTTP ([`PartnerClient`]), or in
/// process ([`Partner`] itself, for tests on paused time).
pub trait CallPartner: Send + Sync {
    /// One call.
    fn call(&self) -> impl Future<Output = Answer> + Send;
}

impl CallPartner for Partner {
    /// A call in process, arriving now.
    async fn call(&self) -> Answer {
        match self.arrive() {
            None => Answer::Ok,
            Some(_) => Answer::TooMany,
        }
    }
}

/// An HTTP client of the partner's `POST /call`.
#[derive(Debug, Clone)]
pub struct PartnerClient {
    http: Client<HttpConnector, Empty<Bytes>>,
    uri: http::Uri,
}

impl PartnerClient {
    /// A client of the partner at `base` (`http://host:port`).
    ///
    /// # Errors
    ///
    /// When `base` does not make a URI.
    pub fn new(base: &str) -> Result<Self, http::uri::InvalidUri> {
        Ok(Self {
            http: Client::builder(TokioExecutor::new()).build_http(),
            uri: format!("{base}/call").parse()?,
        })
    }
}

impl CallPartner for PartnerClient {
    async fn call(&self) -> Answer {
        let request = Request::post(self.uri.clone()).body(Empty::new());
        let Ok(request) = request else {
            return Answer::Failed;
        };
        match self.http.request(request).await {
            Ok(response) if response.status() == StatusCode::OK => Answer::Ok,
            // The partner's log counts each kind of 429 (its
            // `x-partner-limit` says which).
            Ok(response) if response.status() == StatusCode::TOO_MANY_REQUESTS => Answer::TooMany,
            Ok(_) | Err(_) => Answer::Failed,
        }
    }
}

/// A worker: until `until`, or until the day's quota is spent, waits for
/// the limits' leave and calls the partner.
pub async fn work<St: Store + Clone>(
    limits: &PartnerLimits<St>,
    account: &Key,
    partner: &impl CallPartner,
    until: Instant,
) -> Calls {
    let mut calls = Calls::default();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match limits.admit(account, left).await {
            Ok(()) => match partner.call().await {
                Answer::Ok => calls.ok += 1,
                Answer::TooMany => calls.rejected += 1,
                Answer::Failed => calls.failed += 1,
            },
            Err(Stop::DayIsOver) => {
                calls.day_over += 1;
                break;
            }
            Err(Stop::NotInTime) => break,
            Err(Stop::Failed(why)) => {
                eprintln!("limiter failed: {why}");
                calls.failed += 1;
                // A store that fails fails fast: do not spin on it.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    calls
}

/// An instance: `workers` workers sharing `limits` (one store, so one
/// Redis connection per instance), for `run`.
pub async fn instance<St: Store + Clone + Send + Sync + 'static>(
    limits: PartnerLimits<St>,
    account: Key,
    partner: impl CallPartner + 'static,
    workers: usize,
    run: Duration,
) -> Calls {
    let until = Instant::now() + run;
    let shared = Arc::new((limits, account, partner));
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let shared = shared.clone();
            tokio::spawn(async move {
                let (limits, account, partner) = &*shared;
                work(limits, account, partner, until).await
            })
        })
        .collect();
    let mut total = Calls::default();
    for task in tasks {
        match task.await {
            Ok(calls) => total += calls,
            Err(_) => total.failed += 1,
        }
    }
    total
}
