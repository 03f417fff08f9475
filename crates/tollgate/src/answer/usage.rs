//! [`UsageReport`]: a key's usage under its policies, as JSON.

use std::fmt::Write as _;

use bytes::Bytes;
use http::Response;
use tollgate_core::ledger::{Ledger, Usage, UsageQuery};
use tollgate_core::{Key, StoreError};

use super::http::json_escaped;

/// A key's settled usage under each of its policies over a range of time,
/// from a usage ledger (see [`tollgate_core::ledger`]), as JSON:
///
/// ```json
/// {"granularity":"day","from":1769900400,"to":1769990400,"time_zone":"UTC",
///  "usage":{"items":{"total":3,"buckets":[{"start":1769904000,"end":1769990400,"units":3}]}}}
/// ```
///
/// Instants are Unix seconds, as GitHub's `reset`; `from` is the start of
/// the first bucket; only the buckets with any use are listed. What
/// [`UsageStatus`](crate::UsageStatus) answers; build one with
/// [`read`](UsageReport::read) to show an operator any user's usage.
///
/// ```
/// use tollgate::{ToKey, UsageReport};
/// use tollgate_core::ledger::{Granularity, Ledger, MemoryLedger, UsageQuery};
/// use tollgate_core::Timestamp;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ledger = MemoryLedger::new();
/// // The key a layer keyed by `ExtensionKey::<String>` made of her id.
/// let ada = "ada".to_key();
/// let day = Timestamp::from_secs(1_767_225_600); // 2026-01-01
/// ledger.record(&ada, "items", day, 3);
/// let query = UsageQuery::new(Granularity::Day, day, Timestamp::from_secs(1_767_312_000))?;
/// let report = UsageReport::read(&ledger, &ada, ["items", "items-pro"], query).await?;
/// assert_eq!(report.usage("items").map(|u| u.total()), Some(3));
/// assert_eq!(
///     report.to_json(),
///     r#"{"granularity":"day","from":1767225600,"to":1767312000,"time_zone":"UTC","usage":{"items":{"total":3,"buckets":[{"start":1767225600,"end":1767312000,"units":3}]},"items-pro":{"total":0,"buckets":[]}}}"#
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageReport {
    query: UsageQuery,
    from: u64,
    time_zone: String,
    usage: Vec<(String, Usage)>,
}

impl UsageReport {
    /// Reads `key`'s usage under each of `policies` (by name, each once)
    /// over `query` from `ledger`.
    ///
    /// # Errors
    ///
    /// The first [`StoreError`] of the ledger; the policies after it are
    /// not read.
    pub async fn read<'a, L: Ledger>(
        ledger: &L,
        key: &Key,
        policies: impl IntoIterator<Item = &'a str>,
        query: UsageQuery,
    ) -> Result<Self, StoreError> {
        let mut pairs: Vec<(&Key, &str)> = Vec::new();
        for policy in policies {
            pairs.push((key, policy));
        }
        Self::read_pairs(ledger, pairs, query).await
    }

    /// Reads each pair's usage: a policy's name and the key read under it,
    /// each policy once (the first pair of it).
    pub(crate) async fn read_pairs<'a, L: Ledger>(
        ledger: &L,
        pairs: impl IntoIterator<Item = (&'a Key, &'a str)>,
        query: UsageQuery,
    ) -> Result<Self, StoreError> {
        let mut usage: Vec<(String, Usage)> = Vec::new();
        for (key, policy) in pairs {
            if usage.iter().any(|(name, _)| name == policy) {
                continue;
            }
            let used = ledger.usage(key, policy, query).await?;
            usage.push((policy.to_owned(), used));
        }
        let settings = ledger.settings();
        let first = settings.bucket_start(query.granularity(), query.from());
        Ok(Self {
            query,
            from: first.as_micros() / 1_000_000,
            time_zone: settings.time_zone_name().unwrap_or("UTC").to_owned(),
            usage,
        })
    }

    /// The usage under the policy named `policy`, if the report has it.
    pub fn usage(&self, policy: &str) -> Option<&Usage> {
        self.usage
            .iter()
            .find(|(name, _)| name == policy)
            .map(|(_, u)| u)
    }

    /// The report's JSON.
    pub fn to_json(&self) -> String {
        let mut out = format!(
            r#"{{"granularity":"{}","from":{},"to":{},"time_zone":"{}","usage":{{"#,
            self.query.granularity(),
            self.from,
            self.query.to().as_micros() / 1_000_000,
            json_escaped(&self.time_zone),
        );
        for (i, (policy, usage)) in self.usage.iter().enumerate() {
            let comma = if i == 0 { "" } else { "," };
            let _ = write!(
                out,
                r#"{comma}"{}":{{"total":{},"buckets":["#,
                json_escaped(policy),
                usage.total()
            );
            for (j, b) in usage.buckets().iter().enumerate() {
                let comma = if j == 0 { "" } else { "," };
                let _ = write!(
                    out,
                    r#"{comma}{{"start":{},"end":{},"units":{}}}"#,
                    b.start().as_micros() / 1_000_000,
                    b.end().as_micros() / 1_000_000,
                    b.units()
                );
            }
            out.push_str("]}");
        }
        out.push_str("}}");
        out
    }

    /// The report as a `200 OK` of `application/json`.
    pub fn into_http_response(self) -> Response<Bytes> {
        super::http::json_ok(self.to_json())
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for UsageReport {
    fn into_response(self) -> axum::response::Response {
        self.into_http_response().map(axum::body::Body::from)
    }
}

/// 400 for a usage query whose parameters do not parse, saying why.
#[cfg(feature = "axum")]
pub(crate) fn bad_usage_query(error: &tollgate_core::ConfigError) -> Response<Bytes> {
    super::http::problem(http::StatusCode::BAD_REQUEST, &error.to_string())
}
