//! Which Redis server answered: the deny cache's denials are only as good
//! as the server they came from.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::running::Running;

/// The server the deny cache's denials came from, by its `run_id`, which
/// a restart changes. While the cache answers, the store asks Redis for
/// its `run_id` at most once per [`ServerIdentity::INTERVAL`] and clears the
/// cache when it changed (a restart, or a failover behind one address), so
/// a denial never outlives the state it mirrors by more than that plus a
/// round trip. A `FLUSHALL` on the same server keeps the `run_id`: such
/// denials last until they expire.
pub(crate) struct ServerIdentity {
    run_id: std::sync::Mutex<Option<String>>,
    /// When the last check started, in ms since the store's origin, plus 1.
    checked_at: std::sync::atomic::AtomicU64,
    checking: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ServerIdentity {
    /// How often at most a store asks for the `run_id`.
    pub(crate) const INTERVAL: Duration = Duration::from_millis(500);

    pub(crate) fn new(run_id: Option<String>) -> Self {
        Self {
            run_id: std::sync::Mutex::new(run_id),
            checked_at: std::sync::atomic::AtomicU64::new(0),
            checking: std::sync::Arc::default(),
        }
    }

    /// Whether a check should start now (`now_ms` since the origin); if
    /// so, marks it started, until the check drops what this returns.
    pub(crate) fn due(&self, now_ms: u64) -> Option<Running> {
        let last = self.checked_at.load(Ordering::Acquire);
        let interval = u64::try_from(Self::INTERVAL.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now_ms + 1 < last.saturating_add(interval) {
            return None;
        }
        let running = Running::take(&self.checking)?;
        self.checked_at.store(now_ms + 1, Ordering::Release);
        Some(running)
    }

    /// Records the `run_id` Redis reported; whether it differs from the
    /// one known before.
    pub(crate) fn saw(&self, run_id: &str) -> bool {
        let mut known = self
            .run_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let changed = known.as_deref().is_some_and(|known| known != run_id);
        if known.as_deref() != Some(run_id) {
            *known = Some(run_id.to_owned());
        }
        changed
    }
}

/// The value of `field` in an `INFO` reply.
fn info_field<'a>(info: &'a redis::Value, field: &str) -> Option<&'a str> {
    let text = match info {
        redis::Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?,
        redis::Value::VerbatimString { text, .. } => text.as_str(),
        redis::Value::SimpleString(text) => text.as_str(),
        _ => return None,
    };
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// Redis's clock in µs in an `INFO server` reply (`server_time_usec`).
pub(crate) fn server_time(info: &redis::Value) -> Option<u64> {
    info_field(info, "server_time_usec")?.parse().ok()
}

/// The `run_id` in an `INFO server` reply: a random id that a restarted
/// server draws anew.
pub(crate) fn run_id(info: &redis::Value) -> Option<&str> {
    info_field(info, "run_id")
}

/// The `redis_version` in an `INFO server` reply, if it is older than 7.0.
/// A reply without a readable version (a Redis-compatible server that
/// leaves it out) is not refused.
pub(crate) fn too_old(info: &redis::Value) -> Option<String> {
    let version = info_field(info, "redis_version")?;
    let major: u32 = version.split('.').next()?.parse().ok()?;
    (major < 7).then(|| version.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::RedisStoreError;

    #[test]
    fn a_changed_run_id_is_noticed_and_checks_are_spaced() {
        let info = redis::Value::BulkString(
            b"# Server\r\nredis_version:7.0.15\r\nrun_id:3f2a\r\ntcp_port:6379\r\nserver_time_usec:1764390000123456\r\n".to_vec(),
        );
        assert_eq!(run_id(&info), Some("3f2a"));
        assert_eq!(server_time(&info), Some(1_764_390_000_123_456));
        assert_eq!(server_time(&redis::Value::Nil), None);
        let server = ServerIdentity::new(Some("3f2a".into()));
        assert!(!server.saw("3f2a"));
        assert!(server.saw("77b1"), "a restarted server");
        assert!(!server.saw("77b1"));
        // At most one check per interval, and one at a time.
        let running = server.due(10_000);
        assert!(running.is_some());
        assert!(server.due(10_001).is_none(), "one is running");
        drop(running);
        assert!(server.due(10_001).is_none(), "too soon");
        assert!(server.due(10_000 + 500).is_some());
    }

    #[test]
    fn servers_older_than_redis_7_are_refused() {
        let info = |text: &str| redis::Value::BulkString(text.as_bytes().to_vec());
        let v6 = info("# Server\r\nredis_version:6.2.14\r\nredis_mode:standalone\r\n");
        assert_eq!(too_old(&v6).as_deref(), Some("6.2.14"));
        assert_eq!(
            RedisStoreError::UnsupportedVersion {
                version: "6.2.14".into()
            }
            .to_string(),
            "redis 6.2.14 is too old: tollgate needs Redis 7.0 or later"
        );
        assert_eq!(too_old(&info("# Server\r\nredis_version:7.0.15\r\n")), None);
        // Valkey reports the Redis version it is compatible with.
        let valkey = info("redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n");
        assert_eq!(too_old(&valkey), None);
        assert_eq!(too_old(&info("# Server\r\n")), None);
        assert_eq!(too_old(&redis::Value::Nil), None);
    }
}
