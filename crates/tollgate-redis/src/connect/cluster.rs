//! A Redis Cluster connection that isolates failures per node, and
//! [`RedisStoreBuilder::connect_cluster`].

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, FromRedisValue,
    IntoConnectionInfo, ServerErrorKind, Value,
};

use crate::builder::RedisStoreBuilder;
use crate::connect::connection::RedisConnection;
use crate::error::RedisStoreError;
use crate::keys::hash_slot;
use crate::running::Running;
use crate::store::RedisStore;

const SLOTS: usize = 16_384;

/// How long the slot map is watched after a call last missed its
/// deadline (see [`ClusterConnection::late`]).
const WATCH_FOR: Duration = Duration::from_secs(5);

/// How often a watched slot map is read, at most.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// A Redis Cluster connection: one multiplexed connection per node and a
/// slot map from `CLUSTER SLOTS`.
///
/// Each decision goes to the master of its key's hash slot, so a failed
/// master affects only its own slots: requests for other slots never wait
/// on its connection (they may wait, up to about a deadline, for a place
/// among the store's calls on their way, which a hung master's calls hold
/// until their deadline). `MOVED` updates the slot and retries once on the new owner,
/// `ASK` retries once with `ASKING`, both safe because the script did not
/// run. A connection error drops that node's connection and refreshes the
/// slot map in the background (one refresh at a time), so that after a
/// failover the new master is found without any request waiting for it.
#[derive(Clone)]
pub struct ClusterConnection {
    inner: Arc<Inner>,
}

struct Inner {
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// The first seed's settings (user, password, TLS): every node's
    /// connection is made with them, at its own address.
    template: ConnectionInfo,
    seeds: Vec<String>,
    connections: Mutex<HashMap<String, MultiplexedConnection>>,
    slots: RwLock<Vec<Arc<str>>>,
    refreshing: Arc<AtomicBool>,
    /// Until when the slot map is read again and again, as long as it
    /// does not change: a master stopped answering (see
    /// [`ClusterConnection::late`]).
    watch_until: Mutex<Option<tokio::time::Instant>>,
    /// The runtime the connection was made on: its refreshes run there.
    home: crate::patience::Home,
}

impl std::fmt::Debug for ClusterConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConnection")
            .field("masters", &self.masters())
            .finish_non_exhaustive()
    }
}

impl ClusterConnection {
    /// Connects through any of `seeds` (`host:port`) and reads the slot map;
    /// every node is connected to with `template`'s settings.
    pub(crate) async fn connect(
        (template, seeds): (ConnectionInfo, Vec<String>),
        config: AsyncConnectionConfig,
        connect_timeout: Duration,
    ) -> Result<Self, RedisStoreError> {
        let this = Self {
            inner: Arc::new(Inner {
                config,
                connect_timeout,
                template,
                seeds,
                connections: Mutex::new(HashMap::new()),
                slots: RwLock::new(vec![Arc::from(""); SLOTS]),
                refreshing: Arc::new(AtomicBool::new(false)),
                watch_until: Mutex::new(None),
                home: crate::patience::Home::here(),
            }),
        };
        if let Err(error) = this.refresh().await {
            // No node answers yet: the store starts without a slot map and
            // reads one when a call needs it.
            tracing::warn!(
                error = &error as &dyn std::error::Error,
                "no Redis Cluster node is reachable; the store starts without one, answers by the failure policy, and connects when a node answers"
            );
        }
        Ok(this)
    }

    /// The current masters' addresses.
    pub fn masters(&self) -> Vec<String> {
        let slots = self
            .inner
            .slots
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let mut masters: Vec<String> = slots
            .iter()
            .filter(|a| !a.is_empty())
            .map(|a| a.to_string())
            .collect();
        masters.sort();
        masters.dedup();
        masters
    }

    async fn connection(&self, addr: &str) -> Result<MultiplexedConnection, RedisStoreError> {
        let existing = self
            .inner
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(addr)
            .cloned();
        if let Some(con) = existing {
            return Ok(con);
        }
        let client = redis::Client::open(self.node_info(addr)?)?;
        let con = tokio::time::timeout(
            self.inner.connect_timeout,
            client.get_multiplexed_async_connection_with_config(&self.inner.config),
        )
        .await
        .map_err(|_| RedisStoreError::Deadline(self.inner.connect_timeout))??;
        self.inner
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(addr.to_owned(), con.clone());
        Ok(con)
    }

    fn forget(&self, addr: &str) {
        self.inner
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(addr);
    }

    /// Reads `CLUSTER SLOTS` from the first node that answers: the known
    /// masters, then the seeds.
    /// The settings of the node at `addr` (`host:port`, or `[v6]:port`): the
    /// seeds' user, password and TLS, at that address.
    fn node_info(&self, addr: &str) -> Result<ConnectionInfo, RedisStoreError> {
        let bad = || RedisStoreError::Protocol(format!("a cluster node at {addr:?}"));
        let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let at = match self.inner.template.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            // A plain TCP seed (a cluster has no Unix sockets between nodes).
            _ => ConnectionAddr::Tcp(host, port),
        };
        Ok(self.inner.template.clone().set_addr(at))
    }

    /// Reads the slot map; whether it changed.
    async fn refresh(&self) -> Result<bool, RedisStoreError> {
        let mut candidates = self.masters();
        candidates.extend(self.inner.seeds.iter().cloned());
        let mut last = RedisStoreError::Protocol("no cluster node to ask for slots".into());
        for addr in candidates {
            let reply = async {
                let mut con = self.connection(&addr).await?;
                let mut cmd = redis::cmd("CLUSTER");
                cmd.arg("SLOTS");
                tokio::time::timeout(
                    self.inner.connect_timeout,
                    cmd.query_async::<Vec<Value>>(&mut con),
                )
                .await
                .map_err(|_| RedisStoreError::Deadline(self.inner.connect_timeout))?
                .map_err(RedisStoreError::from)
            }
            .await;
            match reply.and_then(|ranges| parse_slots(&ranges, &addr)) {
                Ok(map) => {
                    let mut slots = self
                        .inner
                        .slots
                        .write()
                        .unwrap_or_else(PoisonError::into_inner);
                    let changed = *slots != map;
                    *slots = map;
                    return Ok(changed);
                }
                Err(e) => {
                    self.forget(&addr);
                    last = e;
                }
            }
        }
        Err(last)
    }

    fn refresh_in_background(&self) {
        let Some(running) = Running::take(&self.inner.refreshing) else {
            return;
        };
        let Some(runtime) = crate::running::hand_on_runtime(&self.inner.home) else {
            return;
        };
        let this = self.clone();
        runtime.spawn(async move {
            let _running = running;
            loop {
                let changed = this.refresh().await;
                // At most one refresh per 50 ms while a node stays down.
                tokio::time::sleep(Duration::from_millis(50)).await;
                if changed.unwrap_or(false) || !this.watching() {
                    break;
                }
                tokio::time::sleep(WATCH_EVERY.saturating_sub(Duration::from_millis(50))).await;
            }
        });
    }

    /// Whether the slot map is still watched; a watch that ran out ends.
    fn watching(&self) -> bool {
        let mut until = self
            .inner
            .watch_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let watching = until.is_some_and(|t| tokio::time::Instant::now() < t);
        if !watching {
            *until = None;
        }
        watching
    }

    fn owner(&self, key: &str) -> Arc<str> {
        let slots = self
            .inner
            .slots
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        slots[usize::from(hash_slot(key))].clone()
    }

    async fn send<T: FromRedisValue + Send>(
        &self,
        addr: &str,
        cmd: &Cmd,
        asking: bool,
    ) -> Result<T, redis::RedisError> {
        let mut con = match self.connection(addr).await {
            Ok(con) => con,
            Err(RedisStoreError::Redis(e)) => return Err(e),
            Err(other) => {
                return Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    other.to_string(),
                )));
            }
        };
        if asking {
            let (value,): (T,) = redis::pipe()
                .cmd("ASKING")
                .ignore()
                .add_command(cmd.clone())
                .query_async(&mut con)
                .await?;
            Ok(value)
        } else {
            cmd.query_async(&mut con).await
        }
    }
}

impl RedisStoreBuilder {
    /// Connects to a Redis Cluster through any of `nodes` (URLs such as
    /// `redis://10.0.0.1:6379`), with a [`ClusterConnection`]: each decision
    /// goes to its slot's master, a failed master affects only its slots,
    /// and the circuit breaker is kept per range of 128 slots. Every node
    /// is reached with the first URL's user, password and TLS
    /// (`rediss://`), at the address the cluster gives for it.
    ///
    /// As on a single server, the store's deadline judges a call first: a
    /// call the app's own busy runtime kept waiting past its deadline
    /// waits on for its reply, and the connections' response timeout
    /// defaults to one deadline past the ceiling
    /// ([`response_timeout`](Self::response_timeout)). A master that stops
    /// answering fails its calls at the deadline, and the slot map is read
    /// again, so that a replica promoted in its place is found.
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`]; [`ConfigError::InvalidSetting`](tollgate_core::ConfigError::InvalidSetting)
    /// for no node at all.
    pub async fn connect_cluster<I: IntoConnectionInfo>(
        self,
        nodes: impl IntoIterator<Item = I>,
    ) -> Result<RedisStore<ClusterConnection>, RedisStoreError> {
        self.check()?;
        let mut seeds = Vec::new();
        let mut template = None;
        for node in nodes {
            let info = node.into_connection_info()?;
            seeds.push(info.addr().to_string());
            template.get_or_insert(info);
        }
        let template = template.ok_or(tollgate_core::ConfigError::InvalidSetting {
            setting: "nodes",
            reason: "name at least one cluster node",
        })?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout_or_default()));
        let seeds = (template, seeds);
        let connection = ClusterConnection::connect(seeds, config, self.connect_timeout).await?;
        Self {
            breaker_ranges: 128,
            ..self
        }
        .build(connection)
        .await
    }
}

impl RedisConnection for ClusterConnection {
    /// Sends `cmd` (such as `SCRIPT LOAD`) to every master; returns the
    /// last master's reply.
    async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd) -> Result<T, RedisStoreError> {
        let mut reply = None;
        for addr in self.masters() {
            reply = Some(self.send(&addr, cmd, false).await?);
        }
        reply.ok_or_else(|| {
            self.refresh_in_background();
            RedisStoreError::NotConnected {
                reason: "no Redis Cluster node has answered yet".into(),
            }
        })
    }

    async fn query_for_key<T: FromRedisValue + Send>(
        &self,
        key: &str,
        cmd: &Cmd,
    ) -> Result<T, RedisStoreError> {
        let addr = self.owner(key);
        if addr.is_empty() {
            self.refresh_in_background();
            return Err(RedisStoreError::NotConnected {
                reason: format!("no master known for slot {}", hash_slot(key)),
            });
        }
        match self.send(&addr, cmd, false).await {
            Ok(v) => Ok(v),
            Err(e) => match e.kind() {
                ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
                    let asking = e.kind() == ErrorKind::Server(ServerErrorKind::Ask);
                    let target = e
                        .redirect_node()
                        .map(|(host, port)| endpoint(Some(host), port, &addr));
                    let Some(target) = target else {
                        return Err(e.into());
                    };
                    if !asking {
                        let slot = usize::from(hash_slot(key));
                        self.inner
                            .slots
                            .write()
                            .unwrap_or_else(PoisonError::into_inner)[slot] =
                            Arc::from(target.as_str());
                        self.refresh_in_background();
                    }
                    Ok(self.send(&target, cmd, asking).await?)
                }
                _ if e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout() =>
                {
                    self.forget(&addr);
                    self.refresh_in_background();
                    Err(e.into())
                }
                _ => Err(e.into()),
            },
        }
    }

    fn refresh(&self) {
        self.refresh_in_background();
    }

    /// A master that stopped answering (hung, or cut off without a reset)
    /// gives no error to tell when the cluster has promoted a replica in
    /// its place (after its node timeout and an election): the slot map
    /// is read again every 100 ms until it changes, for five seconds after
    /// a call last missed its deadline, so that the promoted replica is
    /// found within about 100 ms. (A master that dies fails its calls at
    /// once, and each failure reads the map again.) Its connection stays:
    /// its calls end at their deadline, and it serves again if the master
    /// does.
    fn late(&self) {
        *self
            .inner
            .watch_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) =
            Some(tokio::time::Instant::now() + WATCH_FOR);
        self.refresh_in_background();
    }
}

/// The address of a node named `host` (`None`: NULL), at `port`, by a
/// reply of the node at `asked`: `host:port`, `[host]:port` for IPv6; a
/// NULL or empty host is the host of the node that replied, as the Redis
/// Cluster spec has it (a one-node cluster, a `MOVED` to `:6381`).
fn endpoint(host: Option<&str>, port: impl std::fmt::Display, asked: &str) -> String {
    let asked_host = asked.rsplit_once(':').map_or(asked, |(host, _)| host);
    match host.unwrap_or("") {
        "" => format!("{asked_host}:{port}"),
        v6 if v6.contains(':') && !v6.starts_with('[') => format!("[{v6}]:{port}"),
        host => format!("{host}:{port}"),
    }
}

/// The slot map of a `CLUSTER SLOTS` reply, asked of the node at `asked`:
/// each slot's master, as [`endpoint`] names it.
fn parse_slots(ranges: &[Value], asked: &str) -> Result<Vec<Arc<str>>, RedisStoreError> {
    let bad = || RedisStoreError::Protocol("unexpected CLUSTER SLOTS reply".into());
    let int = |v: &Value| match v {
        Value::Int(n) => usize::try_from(*n).ok(),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let mut map: Vec<Arc<str>> = vec![Arc::from(""); SLOTS];
    for range in ranges {
        let Value::Array(items) = range else {
            return Err(bad());
        };
        let (Some(start), Some(end)) = (items.first().and_then(int), items.get(1).and_then(int))
        else {
            return Err(bad());
        };
        let Some(Value::Array(master)) = items.get(2) else {
            return Err(bad());
        };
        // NULL: the node asked. (`?`, a node that does not know its
        // endpoint, stays as it is: its calls fail, not the whole map.)
        let host = match master.first() {
            Some(Value::Nil) => None,
            host => Some(host.and_then(text).ok_or_else(bad)?),
        };
        let Some(port) = master.get(1).and_then(int) else {
            return Err(bad());
        };
        let addr: Arc<str> = Arc::from(endpoint(host.as_deref(), port, asked));
        if let Some(range) = map.get_mut(start..=end.min(SLOTS - 1)) {
            range.fill(addr.clone());
        }
    }
    if map.iter().any(|a| a.is_empty()) {
        return Err(RedisStoreError::Protocol(
            "CLUSTER SLOTS leaves slots uncovered".into(),
        ));
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        let master = vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
        ];
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(master),
        ])
    }

    /// A master named NULL or `""` is at the host that was asked, and an
    /// IPv6 one is bracketed: such a slot map failed the app's start with
    /// a URL that did not parse (found by an audit); `"?"` fails its own
    /// calls only.
    #[test]
    fn every_endpoint_a_node_may_name_is_an_address() {
        let null = Value::Array(vec![
            Value::Int(5_001),
            Value::Int(8_000),
            Value::Array(vec![Value::Nil, Value::Int(7004)]),
        ]);
        let ranges = [
            range(0, 5_000, "", 7001),
            null,
            range(8_001, 10_000, "?", 7002),
            range(10_001, 16_383, "2001:db8::7", 7003),
        ];
        let map = parse_slots(&ranges, "10.0.0.9:7000").unwrap();
        assert_eq!(&*map[0], "10.0.0.9:7001");
        assert_eq!(&*map[5_001], "10.0.0.9:7004");
        // Unknown: its calls fail, the map stands.
        assert_eq!(&*map[8_001], "?:7002");
        assert_eq!(&*map[16_383], "[2001:db8::7]:7003");
        // A MOVED to a bare port, or to IPv6.
        assert_eq!(endpoint(Some(""), 6381, "[::1]:7000"), "[::1]:6381");
        assert_eq!(endpoint(Some("::1"), 6381, "x:1"), "[::1]:6381");
    }
}
