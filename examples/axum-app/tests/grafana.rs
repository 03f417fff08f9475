//! The Grafana dashboard, `grafana/tollgate.json`, against tollgate's
//! metrics (`tollgate::telemetry::ALL`): every metric its queries name
//! exists, with the labels they use, and every metric has a panel.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::BTreeSet;

use regex::Regex;
use serde_json::Value;
use tollgate::telemetry::{ALL, Metric, MetricKind};

const DASHBOARD: &str = include_str!("../grafana/tollgate.json");

fn dashboard() -> Value {
    serde_json::from_str(DASHBOARD).unwrap()
}

/// Every PromQL text of the dashboard: each panel's target `expr` (rows
/// nest panels too) and each template variable's `query` and
/// `definition`, with the target's legend format if any.
fn queries(dashboard: &Value) -> Vec<(String, Option<String>)> {
    fn walk(value: &Value, out: &mut Vec<(String, Option<String>)>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(expr)) = map.get("expr") {
                    let legend = map.get("legendFormat").and_then(Value::as_str);
                    out.push((expr.clone(), legend.map(str::to_owned)));
                }
                for value in map.values() {
                    walk(value, out);
                }
            }
            Value::Array(values) => values.iter().for_each(|v| walk(v, out)),
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] == "query" {
            for field in ["query", "definition"] {
                let query = match &variable[field] {
                    Value::String(query) => query.clone(),
                    // Newer Grafanas keep a variable's query as an object.
                    object => object["query"].as_str().unwrap_or_default().to_owned(),
                };
                out.push((query, None));
            }
        }
    }
    out
}

/// The metric of ALL a series name belongs to: the name itself, or a
/// histogram's `_bucket`, `_sum` or `_count` series.
fn metric_of(series: &str) -> Option<&'static Metric> {
    ALL.iter().find(|m| m.name() == series).or_else(|| {
        ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            let base = series.strip_suffix(suffix)?;
            ALL.iter()
                .find(|m| m.name() == base && m.kind() == MetricKind::Histogram)
        })
    })
}

/// The labels a series has: its metric's, and `le` on a histogram's
/// buckets.
fn labels_of(series: &str) -> Vec<&'static str> {
    let metric = metric_of(series).unwrap_or_else(|| panic!("{series} is not in ALL"));
    let mut labels = metric.labels().to_vec();
    if series.ends_with("_bucket") {
        labels.push("le");
    }
    labels
}

/// The `tollgate_*` series names of a query.
fn series(query: &str) -> Vec<String> {
    let name = Regex::new(r"\btollgate_[a-z0-9_]+\b").unwrap();
    name.find_iter(query)
        .map(|m| m.as_str().to_owned())
        .collect()
}

/// The names of the metrics of ALL that `series` names, or the first name
/// that is none of them.
fn named_metrics(dashboard: &Value) -> Result<BTreeSet<&'static str>, String> {
    let mut named = BTreeSet::new();
    for (query, _) in queries(dashboard) {
        for series in series(&query) {
            let metric = metric_of(&series).ok_or(format!("{series} (in {query})"))?;
            named.insert(metric.name());
        }
    }
    Ok(named)
}

#[test]
fn every_metric_the_dashboard_names_exists() {
    let named = named_metrics(&dashboard()).unwrap_or_else(|unknown| {
        panic!("the dashboard names a metric tollgate does not have: {unknown}")
    });
    assert!(!named.is_empty());
}

#[test]
fn every_metric_has_a_panel() {
    let named = named_metrics(&dashboard()).unwrap();
    let missing: Vec<&str> = ALL
        .iter()
        .map(Metric::name)
        .filter(|name| !named.contains(name))
        .collect();
    assert!(missing.is_empty(), "metrics without a panel: {missing:?}");
}

#[test]
fn a_made_up_metric_is_caught() {
    // The check above would fail on a dashboard with a name tollgate
    // does not have, or a histogram suffix on a counter.
    for bogus in ["tollgate_bogus_total", "tollgate_decisions_total_bucket"] {
        let text = DASHBOARD.replacen("tollgate_circuits_open", bogus, 1);
        let unknown = named_metrics(&serde_json::from_str(&text).unwrap()).unwrap_err();
        assert!(unknown.starts_with(bogus), "{unknown}");
    }
}

#[test]
fn every_label_a_query_uses_is_one_its_metric_has() {
    let matchers = Regex::new(r"(tollgate_[a-z0-9_]+)\s*\{([^}]*)\}").unwrap();
    let matcher = Regex::new(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)").unwrap();
    let grouping = Regex::new(r"\b(?:by|without)\s*\(([^)]*)\)").unwrap();
    let label_values =
        Regex::new(r"label_values\(\s*(tollgate_[a-z0-9_]+)\s*,\s*(\w+)\s*\)").unwrap();
    let legend = Regex::new(r"\{\{\s*(\w+)\s*\}\}").unwrap();
    let mut checked = 0;
    for (query, legend_format) in queries(&dashboard()) {
        // A matcher's labels: those of its series.
        for m in matchers.captures_iter(&query) {
            let has = labels_of(&m[1]);
            for label in matcher.captures_iter(&m[2]) {
                assert!(
                    has.contains(&&label[1]),
                    "{}: no label {} in {query}",
                    &m[1],
                    &label[1]
                );
                checked += 1;
            }
        }
        // A grouping's, and a legend's: those of every series of the query.
        let used: Vec<String> = grouping
            .captures_iter(&query)
            .flat_map(|g| {
                g[1].split(',')
                    .map(|l| l.trim().to_owned())
                    .collect::<Vec<_>>()
            })
            .chain(
                legend
                    .captures_iter(legend_format.as_deref().unwrap_or_default())
                    .map(|l| l[1].to_owned()),
            )
            .filter(|l| !l.is_empty())
            .collect();
        for series in series(&query) {
            let has = labels_of(&series);
            for label in &used {
                assert!(
                    has.contains(&label.as_str()),
                    "{series}: no label {label} in {query}"
                );
                checked += 1;
            }
        }
        for m in label_values.captures_iter(&query) {
            assert!(labels_of(&m[1]).contains(&&m[2]), "{query}");
            checked += 1;
        }
    }
    assert!(checked > 0);
}

#[test]
fn the_dashboard_picks_its_prometheus_and_its_policies() {
    let dashboard = dashboard();
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 39);
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let variable = |name: &str| {
        variables
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no variable {name}"))
    };
    let datasource = variable("datasource");
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
    let policy = variable("policy");
    assert_eq!(policy["type"], "query");
    assert_eq!(
        policy["query"],
        "label_values(tollgate_decisions_total, policy)"
    );
    // Every panel and target reads from the chosen data source.
    let mut targets = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}",
            panel["title"]
        );
        for target in panel["targets"].as_array().unwrap() {
            assert_eq!(target["datasource"]["uid"], "${datasource}");
            targets += 1;
        }
    }
    assert_eq!(targets, 25);
}
