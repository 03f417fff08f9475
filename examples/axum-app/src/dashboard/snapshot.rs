//! One refresh of the dashboard's data, as JSON.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use serde_json::{Value, json};
use tollgate::ledger::{Ledger, UsageQuery};
use tollgate::telemetry::{
    ADAPTIVE_IN_FLIGHT, ADAPTIVE_LIMIT, ADAPTIVE_QUEUED, ADAPTIVE_SHED, CIRCUITS_OPEN, DECISIONS,
    DENY_CACHE_HITS, FALLBACKS, INFLIGHT_REJECTED, INFLIGHT_SLOTS, LEASE_DIRECT, LEASE_GRANTS,
    LEASE_RETURNS, LEASE_UNITS, LEASES_HELD, MEMORY_STORE_KEYS, NEAR_LIMIT, STORE_ERRORS,
    STORE_LATENCY, WAITS,
};
use tollgate::topkeys::{KeyLabel, Ranking};
use tollgate::{Clock, StoreError, SystemClock, ToKey};

use super::Sources;
use super::prom::Samples;
use crate::UserId;
use crate::topkeys::summary_json;

/// The outcomes of a decision, as the decision counter labels them.
const OUTCOMES: [&str; 3] = ["allowed", "limited", "shadow_limited"];

/// The keys shown per policy and ranking.
const TOP_SHOWN: usize = 5;

/// The users whose usage is shown, per policy: its most active ones.
const USAGE_SHOWN: usize = 3;

/// The decision counts of one refresh.
pub(super) struct Point {
    /// Unix milliseconds.
    at: u64,
    /// By policy, then by outcome (in the order of [`OUTCOMES`]).
    counts: BTreeMap<String, [u64; 3]>,
}

/// The dashboard's data now, its decision counts added to `history`
/// (which keeps the last `keep`).
pub(super) async fn make(
    sources: &Sources,
    history: &Mutex<VecDeque<Point>>,
    keep: usize,
) -> Value {
    let samples = Samples::parse(&sources.metrics.render());
    let at = SystemClock.now().as_micros() / 1_000;
    let policies = samples.label_values(DECISIONS, "policy");
    let counts: BTreeMap<String, [u64; 3]> = policies
        .iter()
        .map(|p| {
            let count = |outcome| samples.count(DECISIONS, &[("policy", p), ("outcome", outcome)]);
            (p.clone(), OUTCOMES.map(count))
        })
        .collect();
    let rates = {
        let mut history = history.lock().unwrap_or_else(PoisonError::into_inner);
        history.push_back(Point {
            at,
            counts: counts.clone(),
        });
        while history.len() > keep {
            history.pop_front();
        }
        rates(&history, &policies)
    };
    let mut shown = Vec::with_capacity(policies.len());
    let mut users = Vec::new();
    for policy in &policies {
        let top = top_keys(sources, policy).await;
        if let Some(active) = top.get("active").and_then(|a| a["keys"].as_array()) {
            let ids = active
                .iter()
                .filter_map(|k| k["label"].as_str()?.strip_prefix("user:"));
            users.extend(
                ids.take(USAGE_SHOWN)
                    .map(|id| (id.to_owned(), policy.clone())),
            );
        }
        let [allowed, limited, shadow_limited] = counts.get(policy).copied().unwrap_or_default();
        shown.push(json!({
            "name": policy,
            "allowed": allowed,
            "limited": limited,
            "shadow_limited": shadow_limited,
            "near_limit": samples.count(NEAR_LIMIT, &[("policy", policy)]),
            "rates": rates.get(policy).cloned().unwrap_or(Value::Null),
            "top": top,
        }));
    }
    json!({
        "at": at,
        "store": store(sources.store, &samples),
        "policies": shown,
        "times": rates.get("").cloned().unwrap_or(Value::Null),
        "leases": leases(&samples),
        "in_flight": in_flight(&samples),
        "adaptive": adaptive(&samples),
        "waits": {
            "admitted": samples.count(WAITS, &[("outcome", "admitted")]),
            "gave_up": samples.count(WAITS, &[("outcome", "gave_up")]),
        },
        "overrides": overrides(sources),
        "usage": usage(sources, users).await,
    })
}

/// Each policy's decisions per second between successive refreshes, by
/// outcome; under `""`, the times of those refreshes.
fn rates(history: &VecDeque<Point>, policies: &[String]) -> BTreeMap<String, Value> {
    let pairs: Vec<(&Point, &Point)> = history.iter().zip(history.iter().skip(1)).collect();
    let mut out = BTreeMap::new();
    let times: Vec<u64> = pairs.iter().map(|(_, b)| b.at).collect();
    out.insert(String::new(), json!(times));
    for policy in policies {
        let mut by_outcome = serde_json::Map::new();
        for (i, outcome) in OUTCOMES.iter().enumerate() {
            let series: Vec<f64> = pairs
                .iter()
                .map(|(a, b)| {
                    let count = |p: &Point| p.counts.get(policy).map_or(0, |c| c[i]);
                    let seconds = b.at.saturating_sub(a.at).max(1) as f64 / 1_000.0;
                    let per_second = count(b).saturating_sub(count(a)) as f64 / seconds;
                    (per_second * 10.0).round() / 10.0
                })
                .collect();
            by_outcome.insert((*outcome).to_owned(), json!(series));
        }
        out.insert(policy.clone(), Value::Object(by_outcome));
    }
    out
}

/// The policy's top limited and active keys, or the error that kept them.
async fn top_keys(sources: &Sources, policy: &str) -> Value {
    let mut top = serde_json::Map::new();
    for ranking in Ranking::ALL {
        let shown = match sources.top.top(policy, ranking).await {
            Ok(summary) => summary_json(&summary.truncated(TOP_SHOWN)),
            Err(error) => json!({ "error": error.to_string() }),
        };
        top.insert(ranking.as_str().to_owned(), shown);
    }
    Value::Object(top)
}

/// The store's health: the breaker, errors by kind, the failure policy's
/// decisions, the deny cache, the keys of the memory store and the
/// latency histogram.
fn store(kind: &str, samples: &Samples) -> Value {
    let errors: serde_json::Map<_, _> = StoreError::KINDS
        .iter()
        .map(|k| {
            (
                (*k).to_owned(),
                json!(samples.count(STORE_ERRORS, &[("outcome", k)])),
            )
        })
        .collect();
    let fallbacks: serde_json::Map<_, _> = ["open", "closed", "local_allowed", "local_limited"]
        .iter()
        .map(|o| {
            (
                (*o).to_owned(),
                json!(samples.count(FALLBACKS, &[("outcome", o)])),
            )
        })
        .collect();
    let buckets: Vec<Value> = samples
        .buckets(STORE_LATENCY)
        .into_iter()
        .map(|(le, count)| json!({ "le": le, "count": count }))
        .collect();
    json!({
        "kind": kind,
        "circuits_open": samples.count(CIRCUITS_OPEN, &[]),
        "errors": errors,
        "fallbacks": fallbacks,
        "deny_cache_hits": samples.count(DENY_CACHE_HITS, &[]),
        "memory_keys": samples.count(MEMORY_STORE_KEYS, &[]),
        "latency": {
            "count": samples.count(&format!("{STORE_LATENCY}_count"), &[]),
            "sum": samples.sum(&format!("{STORE_LATENCY}_sum"), &[]),
            "buckets": buckets,
        },
    })
}

fn leases(samples: &Samples) -> Value {
    json!({
        "held": samples.count(LEASES_HELD, &[]),
        "units": samples.count(LEASE_UNITS, &[]),
        "grants": samples.count(LEASE_GRANTS, &[]),
        "direct": samples.count(LEASE_DIRECT, &[]),
        "returns": samples.count(LEASE_RETURNS, &[]),
    })
}

fn in_flight(samples: &Samples) -> Value {
    let mut policies = samples.label_values(INFLIGHT_SLOTS, "policy");
    policies.extend(samples.label_values(INFLIGHT_REJECTED, "policy"));
    policies.sort();
    policies.dedup();
    let rows: Vec<Value> = policies
        .iter()
        .map(|p| {
            let policy = [("policy", p.as_str())];
            json!({
                "policy": p,
                "slots": samples.count(INFLIGHT_SLOTS, &policy),
                "rejected": samples.count(INFLIGHT_REJECTED, &policy),
            })
        })
        .collect();
    json!(rows)
}

fn adaptive(samples: &Samples) -> Value {
    let rows: Vec<Value> = samples
        .label_values(ADAPTIVE_LIMIT, "policy")
        .iter()
        .map(|p| {
            let policy = [("policy", p.as_str())];
            let shed = |class| samples.count(ADAPTIVE_SHED, &[("policy", p), ("priority", class)]);
            json!({
                "policy": p,
                "limit": samples.count(ADAPTIVE_LIMIT, &policy),
                "in_flight": samples.count(ADAPTIVE_IN_FLIGHT, &policy),
                "queued": samples.count(ADAPTIVE_QUEUED, &policy),
                "shed": {
                    "critical": shed("critical"),
                    "default": shed("default"),
                    "sheddable": shed("sheddable"),
                },
            })
        })
        .collect();
    json!(rows)
}

/// The overrides in force: the key's label, the policy, the rule and the
/// seconds left, if it expires.
fn overrides(sources: &Sources) -> Value {
    let now = SystemClock.now();
    let mut rows: Vec<Value> = sources
        .overrides
        .table()
        .entries(now)
        .into_iter()
        .map(|(key, policy, rule, expires)| {
            let left = expires.map(|at| at.saturating_duration_since(now).as_secs());
            json!({
                "key": sources.label.label(&key),
                "policy": policy,
                "rule": rule.to_string(),
                "expires_in_s": left,
            })
        })
        .collect();
    rows.sort_by(|a, b| {
        (a["policy"].as_str(), a["key"].as_str()).cmp(&(b["policy"].as_str(), b["key"].as_str()))
    });
    json!(rows)
}

/// This month's settled usage of each `(user, policy)`.
async fn usage(sources: &Sources, users: Vec<(String, String)>) -> Value {
    let ledger = &sources.ledger;
    let now = SystemClock.now();
    let Ok(query) = UsageQuery::from_params(ledger.settings(), now, Some("month"), None, None)
    else {
        return json!([]);
    };
    let mut rows = Vec::with_capacity(users.len());
    for (user, policy) in users {
        let key = UserId(user.clone()).to_key();
        let units = match ledger.usage(&key, &policy, query).await {
            Ok(usage) => json!(usage.total()),
            Err(error) => json!(error.to_string()),
        };
        rows.push(json!({ "user": user, "policy": policy, "month": units }));
    }
    json!(rows)
}
