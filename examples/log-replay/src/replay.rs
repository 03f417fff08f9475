//! The replay: each logged request through each policy file's router.

use std::collections::HashMap;

use axum::Router;
use axum_app::AppConfig;
use http::StatusCode;
use tollgate::{BoxStore, Clock, ConfigError, FakeClock, MemoryStore, Timestamp};
use tollgate_sim::access::AccessRecord;
use tower::ServiceExt;

use crate::request;
use crate::tally::{ClientTally, LaneTally};

/// Why a replay could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The memory store refused its settings.
    #[error("cannot build the memory store: {0}")]
    Store(#[from] ConfigError),
    /// No policy file to replay through.
    #[error("no policy file to replay through")]
    NoPolicies,
}

/// One policy file: the demo's router on its own store and clock.
struct Lane {
    router: Router,
    clock: FakeClock,
    tally: LaneTally,
}

/// Replays requests through one or more policy files side by side, and
/// counts what each refused, per client and over time.
pub struct Replay {
    lanes: Vec<Lane>,
    clients: HashMap<String, ClientTally>,
    replayed: u64,
    unreplayable: u64,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay")
            .field("lanes", &self.lanes.len())
            .field("clients", &self.clients.len())
            .field("replayed", &self.replayed)
            .finish_non_exhaustive()
    }
}

impl Replay {
    /// A replay through each `(name, policy file)`, in this order.
    ///
    /// # Errors
    ///
    /// [`ReplayError::NoPolicies`] for an empty list;
    /// [`ReplayError::Store`] if a memory store cannot be built.
    pub fn new(files: Vec<(String, AppConfig)>) -> Result<Self, ReplayError> {
        if files.is_empty() {
            return Err(ReplayError::NoPolicies);
        }
        let mut lanes = Vec::with_capacity(files.len());
        for (name, config) in files {
            let clock = FakeClock::new(Timestamp::from_secs(0));
            let store = MemoryStore::builder().clock(clock.clone()).build()?;
            lanes.push(Lane {
                router: axum_app::app(&config, BoxStore::new(store)),
                clock,
                tally: LaneTally {
                    name,
                    ..LaneTally::default()
                },
            });
        }
        Ok(Replay {
            lanes,
            clients: HashMap::new(),
            replayed: 0,
            unreplayable: 0,
        })
    }

    /// Sends `record` through every policy file's router at its logged
    /// time (a clock never goes back: a line logged out of order is
    /// replayed at the latest time seen) and counts the answers. A record
    /// that cannot be made a request is counted apart.
    pub async fn send(&mut self, record: &AccessRecord) {
        let client = match record.user() {
            Some(user) => user.to_owned(),
            None => record.ip().to_string(),
        };
        let mut statuses = Vec::with_capacity(self.lanes.len());
        for lane in &mut self.lanes {
            let Some(request) = request::build(record) else {
                self.unreplayable += 1;
                return;
            };
            if record.time() > lane.clock.now() {
                lane.clock.set(record.time());
            }
            let at = lane.clock.now();
            // The router's error is `Infallible`.
            let Ok(response) = lane.router.clone().oneshot(request).await;
            let refused = response.status() == StatusCode::TOO_MANY_REQUESTS;
            if refused {
                lane.tally.refused += 1;
                let policy = response
                    .headers()
                    .get(tollgate::headers::X_RATELIMIT_RESOURCE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
                    .unwrap_or_else(|| {
                        if response.headers().contains_key(tollgate::CONCURRENCY_LIMIT) {
                            "in-flight".to_owned()
                        } else {
                            "unnamed".to_owned()
                        }
                    });
                *lane.tally.by_policy.entry(policy).or_insert(0) += 1;
            }
            lane.tally.timeline.add(at, refused);
            statuses.push((refused, at));
        }
        self.replayed += 1;
        let lanes = self.lanes.len();
        let tally = self
            .clients
            .entry(client)
            .or_insert_with(|| ClientTally::new(lanes));
        tally.requests += 1;
        for (refusals, (refused, at)) in tally.lanes.iter_mut().zip(statuses) {
            if refused {
                refusals.count += 1;
                refusals.first.get_or_insert(at);
                refusals.last = Some(at);
            }
        }
    }

    /// The requests replayed.
    pub fn replayed(&self) -> u64 {
        self.replayed
    }

    /// The records that could not be made a request (a header name or
    /// value that HTTP does not allow, a line break in a value, say).
    pub fn unreplayable(&self) -> u64 {
        self.unreplayable
    }

    /// Each policy file's totals, in the order given.
    pub fn lanes(&self) -> impl Iterator<Item = &LaneTally> {
        self.lanes.iter().map(|l| &l.tally)
    }

    /// The tally of `client` (a logged user, or an address).
    pub fn client(&self, client: &str) -> Option<&ClientTally> {
        self.clients.get(client)
    }

    /// Every client's tally, in no particular order.
    pub fn clients(&self) -> impl Iterator<Item = (&str, &ClientTally)> {
        self.clients.iter().map(|(k, v)| (k.as_str(), v))
    }
}
