//! `RedisCluster`: three masters and three replicas of private
//! `redis-server`s, made with `redis-cli --cluster create`.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::{INSTALL, RedisServer};

/// A Redis Cluster of 3 masters and 3 replicas on loopback, made with
/// `redis-cli --cluster create`; every node is killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    /// The nodes; which are masters is found with [`RedisCluster::masters`].
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// The cluster's node timeout: how long until a failed master's replica
    /// takes over.
    pub const NODE_TIMEOUT: Duration = Duration::from_millis(500);

    /// Starts the six nodes, creates the cluster and waits until every node
    /// reports `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// When `redis-server` or `redis-cli` is missing, or the cluster does
    /// not come up within 30 s.
    pub fn spawn() -> Self {
        Self::spawn_from(None)
    }

    /// As [`RedisCluster::spawn`], with the first node on `port`: one a
    /// store was already told to use as its seed.
    ///
    /// # Panics
    ///
    /// As [`RedisCluster::spawn`], and when `port` is taken.
    pub fn spawn_seeded_on(port: u16) -> Self {
        Self::spawn_from(Some(port))
    }

    fn spawn_from(first: Option<u16>) -> Self {
        let timeout = Self::NODE_TIMEOUT.as_millis().to_string();
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            timeout.as_str(),
            // The healthy masters serve while a failed master's replica
            // is promoted (Redis's default refuses every command until
            // then), as the guide asks.
            "--cluster-require-full-coverage",
            "no",
            // Replicas sync at once (the default waits 5 s for more replicas),
            // and a replica that never synced cannot take over.
            "--repl-diskless-sync-delay",
            "0",
        ];
        let nodes: Vec<RedisServer> = (0..6)
            .map(|i| match first {
                Some(port) if i == 0 => RedisServer::spawn_on(port, &args),
                Some(_) | None => RedisServer::spawn_with(&args),
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): {INSTALL}"));
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes };
        let started = Instant::now();
        while !cluster
            .nodes
            .iter()
            .all(|n| n.cluster_ok() && n.replica_synced())
        {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the cluster did not come up"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    /// The URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The indexes of the nodes that are masters now.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].role().as_deref() == Some("master"))
            .collect()
    }
}

impl RedisServer {
    fn cluster_ok(&self) -> bool {
        let info: Result<String, _> = redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query(&mut c));
        info.is_ok_and(|i| i.contains("cluster_state:ok"))
    }

    /// A master, or a replica whose link to its master is up.
    fn replica_synced(&self) -> bool {
        let info: Result<String, _> = redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c));
        info.is_ok_and(|i| i.contains("role:master") || i.contains("master_link_status:up"))
    }
}
