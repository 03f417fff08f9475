//! The replay: each logged request through each policy file's router.

use std::collections::HashMap;
use std::time::Duration;

use axum::Router;
use axum_app::AppConfig;
use http::StatusCode;
use tollgate::{BoxStore, ConfigError, FakeClock, MemoryStore, Timestamp};
use tollgate_sim::access::AccessRecord;
use tower::ServiceExt;

use crate::request;
use crate::tally::{Answer, ClientTally, LaneTally};

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
    /// The replay clock: the latest time of a replayed line.
    latest: Timestamp,
    out_of_order: u64,
    /// Of the lines out of order, the furthest behind: its time and the
    /// replay clock's then.
    furthest_behind: Option<(Timestamp, Timestamp)>,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay")
            .field("lanes", &self.lanes.len())
            .field("clients", &self.clients.len())
            .field("replayed", &self.replayed)
            .field("out_of_order", &self.out_of_order)
            .finish_non_exhaustive()
    }
}

impl Replay {
    /// How far behind the replay clock a line may be logged and still be
    /// replayed: one minute.
    ///
    /// The replay clock is the latest time logged so far, and never goes
    /// back. Servers write a line when the response is done, often with
    /// the time the request came in (Apache's `%t`), and several workers
    /// write to one file: a log's lines are out of order by the length of
    /// the slower requests, seconds as a rule. One minute takes in
    /// requests as slow as the usual proxy timeouts (nginx's
    /// `proxy_read_timeout` is 60 s by default), and a line that much
    /// behind is replayed at the clock's time, at most a minute late.
    ///
    /// A line further behind is not replayed but counted
    /// ([`out_of_order`](Replay::out_of_order)), and the report says so:
    /// replayed at the clock's time, it would be judged at an instant it
    /// does not belong to. Most often a single line dated far ahead (a
    /// wrong clock, `01/Jan/2099`) moved the clock, and every line after
    /// it is out of order: the report shows it at once, instead of
    /// refusals at the wrong time.
    pub const OUT_OF_ORDER_TOLERANCE: Duration = Duration::from_secs(60);

    /// The most keys each policy file's memory store holds in a replay
    /// made by [`new`](Replay::new): no bound.
    ///
    /// A server's store is bounded, against a flood of made-up keys; past
    /// its bound a new key is not tracked (`StoreError::Full`) and the
    /// file's failure policy answers in the store's place (a `503` under
    /// `closed`, every request let through under `open`), which would make
    /// the replay's answers the bound's, not the policies'. A replay tracks
    /// every key its log holds, and its memory grows with the keys still
    /// inside their windows (expired ones are swept): a replay that would
    /// rather be bounded sets [`with_max_keys`](Replay::with_max_keys), and
    /// the failure policy's answers then show in the report
    /// ([`LaneTally::answered_otherwise`]).
    pub const MAX_KEYS: usize = usize::MAX;

    /// A replay through each `(name, policy file)`, in this order, on
    /// stores of [`MAX_KEYS`](Replay::MAX_KEYS) keys.
    ///
    /// # Errors
    ///
    /// [`ReplayError::NoPolicies`] for an empty list.
    pub fn new(files: Vec<(String, AppConfig)>) -> Result<Self, ReplayError> {
        Self::with_max_keys(files, Self::MAX_KEYS)
    }

    /// A replay through each `(name, policy file)`, in this order, whose
    /// memory stores hold at most `max_keys` keys each (split evenly over
    /// the store's shards; see `MemoryStoreBuilder::max_keys`). Past the
    /// bound, the policy file's failure policy answers: under `closed` a
    /// `503`, counted in [`LaneTally::answered_otherwise`]; under `local`
    /// (the in-memory fallback decides, on its own state) or `open` (let
    /// through to the route) the report cannot tell those answers from
    /// the policies'.
    ///
    /// # Errors
    ///
    /// [`ReplayError::NoPolicies`] for an empty list;
    /// [`ReplayError::Store`] if a memory store cannot be built (a
    /// `max_keys` of 0).
    pub fn with_max_keys(
        files: Vec<(String, AppConfig)>,
        max_keys: usize,
    ) -> Result<Self, ReplayError> {
        if files.is_empty() {
            return Err(ReplayError::NoPolicies);
        }
        let mut lanes = Vec::with_capacity(files.len());
        for (name, config) in files {
            let clock = FakeClock::new(Timestamp::from_secs(0));
            let store = MemoryStore::builder()
                .clock(clock.clone())
                .max_keys(max_keys)
                .build()?;
            lanes.push(Lane {
                router: axum_app::app_with_handler_layer(
                    &config,
                    BoxStore::new(store),
                    axum::middleware::from_fn(request::answer_as_logged),
                ),
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
            latest: Timestamp::from_secs(0),
            out_of_order: 0,
            furthest_behind: None,
        })
    }

    /// Sends `record` through every policy file's router at its logged
    /// time and counts the answers. The replay clock never goes back: a
    /// line logged before it, by at most
    /// [`OUT_OF_ORDER_TOLERANCE`](Replay::OUT_OF_ORDER_TOLERANCE), is
    /// replayed at the clock's time; one further behind is not replayed
    /// and counted [out of order](Replay::out_of_order). A record that
    /// cannot be made a request is counted apart, and does not move the
    /// clock.
    pub async fn send(&mut self, record: &AccessRecord) {
        // An address as the layer keys it: an IPv4-mapped one is its IPv4
        // address (one client, whichever form the log wrote).
        let client = match (record.user(), record.ip()) {
            (Some(user), _) => user.to_owned(),
            (None, std::net::IpAddr::V6(v6)) => v6
                .to_ipv4_mapped()
                .map_or_else(|| v6.to_string(), |v4| v4.to_string()),
            (None, v4) => v4.to_string(),
        };
        // One request per policy file (a request is used up when sent).
        let requests: Option<Vec<_>> = self.lanes.iter().map(|_| request::build(record)).collect();
        let Some(requests) = requests else {
            self.unreplayable += 1;
            return;
        };
        let behind = self.latest.saturating_duration_since(record.time());
        if behind > Self::OUT_OF_ORDER_TOLERANCE {
            self.out_of_order += 1;
            let further = self
                .furthest_behind
                .is_none_or(|(time, clock)| behind > clock.saturating_duration_since(time));
            if further {
                self.furthest_behind = Some((record.time(), self.latest));
            }
            return;
        }
        self.latest = self.latest.max(record.time());
        let at = self.latest;
        let mut statuses = Vec::with_capacity(self.lanes.len());
        for (lane, request) in self.lanes.iter_mut().zip(requests) {
            lane.clock.set(at);
            // The router's error is `Infallible`.
            let Ok(response) = lane.router.clone().oneshot(request).await;
            let answer = answer(&response);
            match answer {
                Answer::Route => {}
                Answer::Refused => {
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
                Answer::Otherwise => {
                    *lane
                        .tally
                        .otherwise
                        .entry(response.status().as_u16())
                        .or_insert(0) += 1;
                }
            }
            lane.tally.timeline.add(at, answer);
            statuses.push((answer, at));
        }
        self.replayed += 1;
        let lanes = self.lanes.len();
        let tally = self
            .clients
            .entry(client)
            .or_insert_with(|| ClientTally::new(lanes));
        tally.requests += 1;
        for (refusals, (answer, at)) in tally.lanes.iter_mut().zip(statuses) {
            match answer {
                Answer::Refused => {
                    refusals.count += 1;
                    refusals.first.get_or_insert(at);
                    refusals.last = Some(at);
                }
                Answer::Route | Answer::Otherwise => {}
            }
        }
    }

    /// The requests replayed.
    pub fn replayed(&self) -> u64 {
        self.replayed
    }

    /// The records that could not be made a request (a header name or
    /// value that HTTP does not allow, a line break in a value, a logged
    /// status outside 100 to 999, say).
    pub fn unreplayable(&self) -> u64 {
        self.unreplayable
    }

    /// The lines logged more than
    /// [`OUT_OF_ORDER_TOLERANCE`](Replay::OUT_OF_ORDER_TOLERANCE) before
    /// the replay clock (the latest time replayed), which were not
    /// replayed.
    pub fn out_of_order(&self) -> u64 {
        self.out_of_order
    }

    /// Of the lines [out of order](Replay::out_of_order), the one furthest
    /// behind: its logged time, and the replay clock's time then (the
    /// latest time replayed before it). `None` if there was none.
    pub fn furthest_behind(&self) -> Option<(Timestamp, Timestamp)> {
        self.furthest_behind
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

/// Who answered `response`: the route's handler (whatever the status, a
/// logged `429` included), a limit's refusal (`429`), or someone else.
fn answer<B>(response: &http::Response<B>) -> Answer {
    if response
        .extensions()
        .get::<request::RouteAnswered>()
        .is_some()
    {
        Answer::Route
    } else if response.status() == StatusCode::TOO_MANY_REQUESTS {
        Answer::Refused
    } else {
        Answer::Otherwise
    }
}
