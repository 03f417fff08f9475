//! [`RedisTopKeys`]: each instance's top keys, published to Redis and
//! merged across instances.

mod form;

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::join_all;
use tollgate_core::topkeys::{Ranking, Summary, TopKeys};
use tollgate_core::{ConfigError, StoreError};

use crate::connect::{ManagedConnection, RedisConnection};
use crate::error::RedisStoreError;
use crate::script::DecisionScript;
use crate::store::Inner;

/// The top keys of every instance on the store's prefix (see
/// [`tollgate_core::topkeys`]): each instance counts its own decisions in
/// its [`TopKeys`] and publishes their summaries every
/// [`publish_interval`](RedisTopKeysBuilder::publish_interval) (10 s by
/// default); [`top`](RedisTopKeys::top) merges the summaries of every
/// other instance that published within its TTL (three of its intervals)
/// with this instance's own counts as they are.
///
/// **Error.** Each instance's summary bounds its counts by its floor (at
/// most `N_i / m` for its `N_i` decisions and `m` counters a shard); the
/// merged summary's bound is the sum of the instances' floors, at most
/// `N / m` for all `N` decisions together. A published summary is at
/// most an interval old.
///
/// **In Redis**, every key with a TTL of three intervals: the index of
/// instances `<prefix>:{topkeys}:instances` (a sorted set by the time of
/// their last publication), and each instance's hash
/// `<prefix>:{topkeys}:i<instance>`, one field `<ranking>:<policy>` per
/// summary. An instance that stops leaves with its TTL, and the index
/// within three of the longest intervals (instances may publish at
/// different intervals, each kept for three of its own). Only labels reach
/// Redis, never keys (see [`KeyLabel`](tollgate_core::topkeys::KeyLabel)):
/// every instance must label alike.
///
/// ```
/// use tollgate_core::topkeys::{Ranking, TopKeys, WatchedStore};
/// use tollgate_core::{Algorithm, Key, Policy, Store};
/// use tollgate_redis::{RedisStore, RedisTopKeys};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
/// # let unique = tollgate_core::Clock::now(&tollgate_core::SystemClock).as_micros();
/// let store = RedisStore::builder().prefix(format!("doc-top-{unique}")).connect(url.as_str()).await?;
/// let top = TopKeys::new();
/// let published = RedisTopKeys::builder(&store, top.clone()).build()?;
/// let store = WatchedStore::new(store, top);
/// let policy = Policy::new("doc-top", Algorithm::Gcra, "1/min")?;
/// for _ in 0..3 {
///     store.check(&Key::user("ada"), &policy, 1).await?;
/// }
/// let limited = published.top("doc-top", Ranking::Limited).await?;
/// assert_eq!(limited.keys()[0].count(), 2);
/// assert!(limited.keys()[0].label().starts_with("user:"));
/// # Ok(())
/// # }
/// ```
pub struct RedisTopKeys<C = ManagedConnection> {
    shared: Arc<Shared<C>>,
}

struct Shared<C> {
    store: Arc<Inner<C>>,
    top: TopKeys,
    index: String,
    hash: String,
    member: String,
    ttl: Duration,
    max_keys: usize,
    script: DecisionScript,
    task: Option<tokio::task::AbortHandle>,
    /// Held while a publication takes its summaries and writes them, so
    /// that publications land in the order they were taken: one taken
    /// earlier never overwrites a later one.
    publishing: tokio::sync::Mutex<()>,
}

impl<C> Drop for Shared<C> {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl<C> Clone for RedisTopKeys<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<C> std::fmt::Debug for RedisTopKeys<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTopKeys")
            .field("hash", &self.shared.hash)
            .field("ttl", &self.shared.ttl)
            .finish_non_exhaustive()
    }
}

impl<C> RedisTopKeys<C> {
    /// Starts configuring the publication of `top` on `store`'s
    /// connection and prefix.
    pub fn builder(store: &crate::RedisStore<C>, top: TopKeys) -> RedisTopKeysBuilder<C> {
        RedisTopKeysBuilder {
            store: store.inner.clone(),
            top,
            interval: Duration::from_secs(10),
            max_keys: 1_000,
        }
    }

    /// This instance's top keys.
    pub fn local(&self) -> &TopKeys {
        &self.shared.top
    }

    /// The Redis key of the index of instances.
    pub fn index_key(&self) -> &str {
        &self.shared.index
    }
}

impl<C: RedisConnection> RedisTopKeys<C> {
    /// Publishes this instance's summaries now.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when Redis could not be written.
    pub async fn publish(&self) -> Result<(), StoreError> {
        Ok(publish(&self.shared).await?)
    }

    /// The merged summary of `policy` under `ranking`, over every other
    /// instance that published within the TTL and this one as it counts
    /// now (cut to the published keys, as a publication would be): every
    /// key any instance holds, highest count first, with the merged bounds
    /// (see [`Summary::merge`]). A read writes nothing: a dashboard that
    /// asks for every policy's summaries every second costs Redis those
    /// reads, not a publication each.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when Redis could not be read, or holds a summary
    /// in a form this version does not read.
    pub async fn top(&self, policy: &str, ranking: Ranking) -> Result<Summary, StoreError> {
        Ok(read(&self.shared, policy, ranking).await?)
    }

    /// The policies any other live instance published, and those this one
    /// counts, sorted.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when Redis could not be read.
    pub async fn policies(&self) -> Result<Vec<String>, StoreError> {
        Ok(policies(&self.shared).await?)
    }
}

/// The policies in the hashes of every other live instance, and this
/// one's.
async fn policies<C: RedisConnection>(shared: &Shared<C>) -> Result<Vec<String>, RedisStoreError> {
    let connection = &shared.store.wire.connection;
    let mut policies: std::collections::BTreeSet<String> =
        shared.top.policies().into_iter().collect();
    for member in others(shared).await? {
        let hash = instance_hash(&shared.index, &member);
        let mut hkeys = redis::cmd("HKEYS");
        hkeys.arg(&hash);
        let fields: Vec<String> = connection.query_for_key(&hash, &hkeys).await?;
        for field in &fields {
            if let Some((policy, _)) = form::parse_field(field) {
                policies.insert(policy.to_owned());
            }
        }
    }
    Ok(policies.into_iter().collect())
}

/// The members of the index but this instance: the other instances that
/// published lately (this one's counts are read from this process).
async fn others<C: RedisConnection>(shared: &Shared<C>) -> Result<Vec<String>, RedisStoreError> {
    let mut zrange = redis::cmd("ZRANGE");
    zrange.arg(&shared.index).arg(0).arg(-1);
    let mut members: Vec<String> = shared
        .store
        .wire
        .connection
        .query_for_key(&shared.index, &zrange)
        .await?;
    members.retain(|member| *member != shared.member);
    Ok(members)
}

/// Publishes every policy's summaries, each cut to `max_keys` keys.
async fn publish<C: RedisConnection>(shared: &Shared<C>) -> Result<(), RedisStoreError> {
    let _in_order = shared.publishing.lock().await;
    let mut args = vec![
        shared.ttl.as_millis().to_string(),
        (MAX_INTERVAL * LIVES).as_millis().to_string(),
        shared.member.clone(),
    ];
    for policy in shared.top.policies() {
        for ranking in Ranking::ALL {
            let summary = shared
                .top
                .summary(&policy, ranking)
                .truncated(shared.max_keys);
            args.push(form::field(&policy, ranking));
            args.push(form::encode(&summary));
        }
    }
    let keys = [&shared.index, &shared.hash];
    let bytes = args.iter().map(String::len).sum::<usize>() + 128;
    shared
        .store
        .wire
        .eval(
            &shared.index,
            &shared.script,
            (3 + args.len(), bytes),
            |cmd| {
                cmd.arg(2).arg(&keys[..]).arg(&args);
            },
        )
        .await
        .map(drop)
}

/// Every other live instance's summary of `policy` under `ranking`, and
/// this one's as it counts now, merged.
async fn read<C: RedisConnection>(
    shared: &Shared<C>,
    policy: &str,
    ranking: Ranking,
) -> Result<Summary, RedisStoreError> {
    let connection = &shared.store.wire.connection;
    let members = others(shared).await?;
    let field = form::field(policy, ranking);
    let reads = members.iter().map(|member| {
        let hash = instance_hash(&shared.index, member);
        let field = &field;
        async move {
            let mut hget = redis::cmd("HGET");
            hget.arg(&hash).arg(field);
            connection
                .query_for_key::<Option<String>>(&hash, &hget)
                .await
        }
    });
    let mut summaries = Vec::with_capacity(members.len() + 1);
    summaries.push(
        shared
            .top
            .summary(policy, ranking)
            .truncated(shared.max_keys),
    );
    for value in join_all(reads).await {
        // An instance that expired since the index was read has no hash.
        if let Some(text) = value? {
            let summary = form::decode(&text).ok_or_else(|| {
                RedisStoreError::Protocol(format!(
                    "a top-keys summary not in this version's form: {field}"
                ))
            })?;
            summaries.push(summary);
        }
    }
    Ok(Summary::merge(summaries))
}

/// The hash of the instance `member`, beside the index.
fn instance_hash(index: &str, member: &str) -> String {
    let stem = index.strip_suffix("instances").unwrap_or(index);
    format!("{stem}i{member}")
}

/// The longest publish interval.
const MAX_INTERVAL: Duration = Duration::from_secs(3_600);

/// How many intervals a publication lives.
const LIVES: u32 = 3;

/// Configures a [`RedisTopKeys`]; made by [`RedisTopKeys::builder`].
pub struct RedisTopKeysBuilder<C> {
    store: Arc<Inner<C>>,
    top: TopKeys,
    interval: Duration,
    max_keys: usize,
}

impl<C> std::fmt::Debug for RedisTopKeysBuilder<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTopKeysBuilder")
            .field("interval", &self.interval)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl<C> RedisTopKeysBuilder<C> {
    /// How often the summaries are published (10 s by default, from
    /// 100 ms to an hour); a publication lives three intervals.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] outside that range.
    pub fn publish_interval(mut self, interval: Duration) -> Result<Self, ConfigError> {
        if interval < Duration::from_millis(100) || interval > MAX_INTERVAL {
            return Err(ConfigError::InvalidSetting {
                setting: "publish_interval",
                reason: "publish from every 100 ms to every hour",
            });
        }
        self.interval = interval;
        Ok(self)
    }

    /// The most keys published per policy and ranking (1,000 by default,
    /// at least 1): the highest counts; the floor rises to the highest
    /// count left out (see [`Summary::truncated`]).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] for 0.
    pub fn max_published_keys(mut self, max: usize) -> Result<Self, ConfigError> {
        if max == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "max_published_keys",
                reason: "publish at least 1 key",
            });
        }
        self.max_keys = max;
        Ok(self)
    }
}

impl<C: RedisConnection> RedisTopKeysBuilder<C> {
    /// The publisher, its task spawned on the current Tokio runtime; the
    /// task stops when the last clone is dropped.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] (setting `runtime`) outside a Tokio
    /// runtime.
    pub fn build(self) -> Result<RedisTopKeys<C>, ConfigError> {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| ConfigError::InvalidSetting {
                setting: "runtime",
                reason: "build the top keys inside a Tokio runtime: they publish in a task",
            })?;
        let prefix = self.store.names.prefix().to_owned();
        let index = format!("{prefix}:{{topkeys}}:instances");
        let member = format!("{:016x}", crate::ledger::instance_name());
        let interval = self.interval;
        let shared = Arc::new_cyclic(|weak: &Weak<Shared<C>>| {
            let task = runtime.spawn(publish_every(weak.clone(), interval));
            Shared {
                hash: instance_hash(&index, &member),
                index,
                member,
                store: self.store,
                top: self.top,
                ttl: interval * LIVES,
                max_keys: self.max_keys,
                script: DecisionScript::new(include_str!("../lua/topkeys/publish.lua")),
                task: Some(task.abort_handle()),
                publishing: tokio::sync::Mutex::new(()),
            }
        });
        Ok(RedisTopKeys { shared })
    }
}

/// Publishes every `interval` while the publisher lives.
async fn publish_every<C: RedisConnection>(top: Weak<Shared<C>>, interval: Duration) {
    let mut failing = false;
    loop {
        tokio::time::sleep(interval).await;
        let Some(shared) = top.upgrade() else {
            return;
        };
        match publish(&shared).await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("the top keys are published again");
            }
            Ok(()) => {}
            // Said once per outage, not every interval.
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "the top keys could not be published");
            }
            Err(_) => {}
        }
    }
}
