//! The samples of the Prometheus text format the demo's `/metrics`
//! serves, read back so that the dashboard shows the very numbers
//! `/metrics` does.

/// One sample: a series' name, labels and value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// Every sample of one rendering of `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Samples(Vec<Sample>);

impl Samples {
    /// The samples of `text`; comment lines and lines that are no sample
    /// are skipped.
    pub(crate) fn parse(text: &str) -> Self {
        Self(text.lines().filter_map(sample).collect())
    }

    /// The sum of the samples named `name` whose labels include
    /// `labels` (0 when there is none).
    pub(crate) fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// [`sum`](Self::sum) as a count: rounded, and 0 for anything not a
    /// finite number at least 0.
    pub(crate) fn count(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let sum = self.sum(name, labels).round();
        if sum.is_finite() && sum >= 0.0 && sum < u64::MAX as f64 {
            sum as u64
        } else {
            0
        }
    }

    /// Each value of `label` among the samples named `name`, sorted, once.
    pub(crate) fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        let mut values: Vec<String> = self
            .matching(name, &[])
            .filter_map(|s| s.labels.iter().find(|(l, _)| l == label))
            .map(|(_, v)| v.clone())
            .collect();
        values.sort();
        values.dedup();
        values
    }

    /// The `(le, cumulative count)` buckets of the histogram `name`, in
    /// the order `/metrics` gives them.
    pub(crate) fn buckets(&self, name: &str) -> Vec<(String, u64)> {
        let bucket = format!("{name}_bucket");
        self.matching(&bucket, &[])
            .filter_map(|s| {
                let (_, le) = s.labels.iter().find(|(l, _)| l == "le")?;
                Some((le.clone(), self.count(&bucket, &[("le", le)])))
            })
            .collect()
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(l, v)| s.labels.iter().any(|(sl, sv)| sl == l && sv == v))
        })
    }
}

/// The sample on `line`: `name{label="value",...} value`.
fn sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().ok()?,
    };
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, labels(rest.strip_suffix('}')?)?),
        None => (series, Vec::new()),
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// The labels of `text` (`a="x",b="y"`), their values unescaped.
fn labels(text: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((name.trim_start_matches(',').to_owned(), value));
        rest = &after[end + 1..];
    }
    Some(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP tollgate_decisions_total Requests decided
# TYPE tollgate_decisions_total counter
tollgate_decisions_total{policy="a",outcome="allowed"} 3
tollgate_decisions_total{policy="a",outcome="limited"} 2
tollgate_decisions_total{policy="b \"q\"",outcome="allowed"} 5
tollgate_circuits_open 0
tollgate_store_latency_seconds_bucket{le="0.001"} 4
tollgate_store_latency_seconds_bucket{le="+Inf"} 6
tollgate_store_latency_seconds_sum 0.012
"#;

    #[test]
    fn sums_counts_and_buckets_read_back() {
        let samples = Samples::parse(TEXT);
        assert_eq!(samples.count("tollgate_decisions_total", &[]), 10);
        let a = [("policy", "a")];
        assert_eq!(samples.count("tollgate_decisions_total", &a), 5);
        let quoted = [("policy", "b \"q\""), ("outcome", "allowed")];
        assert_eq!(samples.count("tollgate_decisions_total", &quoted), 5);
        assert_eq!(
            samples.label_values("tollgate_decisions_total", "policy"),
            ["a", "b \"q\""]
        );
        assert_eq!(
            samples.buckets("tollgate_store_latency_seconds"),
            [("0.001".to_owned(), 4), ("+Inf".to_owned(), 6)]
        );
        assert!((samples.sum("tollgate_store_latency_seconds_sum", &[]) - 0.012).abs() < 1e-12);
        assert_eq!(samples.count("absent", &[]), 0);
    }
}
