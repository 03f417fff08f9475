//! The harness: a memory store and two Redis stores (one per script order)
//! on one fake clock, and the cases it runs on them.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::runtime::Runtime;
use tollgate_core::{Decision, FakeClock, Key, MemoryStore, Policy, Settlement, Store, Timestamp};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};

pub(crate) static RT: LazyLock<Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
});

/// Redis stores per algorithm test, driven by their own fake clock: one as
/// the store runs by default, and one whose one-time script always reads
/// first (the default starts by writing first, and reads first once keys
/// are busy).
pub(crate) struct Harness {
    pub(crate) clock: FakeClock,
    pub(crate) redis: RedisStore,
    pub(crate) reading_first: RedisStore,
}

impl Harness {
    pub(crate) fn new(name: &str) -> Self {
        let clock = FakeClock::default();
        let connect = |prefix: String, read_first: bool| {
            RT.block_on(async {
                let url = require_redis().await;
                let builder = RedisStore::builder()
                    .prefix(prefix)
                    .deadline(Duration::from_secs(10))
                    .response_timeout(Duration::from_secs(10))
                    .connect_timeout(Duration::from_secs(2))
                    .test_clock(clock.clone());
                let builder = if read_first {
                    builder.test_write_first(false)
                } else {
                    builder
                };
                builder.connect(url.as_str()).await.unwrap()
            })
        };
        // Prefixes have at most 64 characters.
        let redis = connect(unique_prefix(&name[..name.len().min(24)]), false);
        let reading_first = connect(unique_prefix("read-first"), true);
        Self {
            clock,
            redis,
            reading_first,
        }
    }

    /// Runs `case` on a fresh memory store and on Redis, returning both
    /// decision sequences.
    pub(crate) fn run(&self, case: &Case) -> (Vec<Decision>, Vec<Decision>) {
        let key = next_key();
        let memory = MemoryStore::builder()
            .clock(self.clock.clone())
            .build()
            .unwrap();
        self.clock.set(Timestamp::from_micros(case.start));
        RT.block_on(async {
            let (mut from_memory, mut from_redis) = (Vec::new(), Vec::new());
            // The admitted requests: their costs and when.
            let mut admitted = Vec::new();
            for &(gap, op, which) in &case.arrivals {
                self.clock.advance(Duration::from_micros(gap));
                let policy = &case.policies[which];
                let reserved = op.reservation(&admitted);
                let (m, r) = self.apply(&memory, &key, policy, op, reserved).await;
                if let (Op::Check(cost), true) = (op, r.is_allowed()) {
                    admitted.push((cost, r.now()));
                }
                from_memory.push(m);
                from_redis.push(r);
            }
            (from_memory, from_redis)
        })
    }

    /// Does `op` at `key` on `memory` and on Redis, now; a settlement
    /// settles `reserved` (the last admitted request's cost and time), or
    /// one of cost 0. Returns the decisions of memory and Redis, after
    /// checking that Redis decides alike in both script orders.
    pub(crate) async fn apply(
        &self,
        memory: &MemoryStore,
        key: &Key,
        policy: &Policy,
        op: Op,
        reserved: Option<(u64, Timestamp)>,
    ) -> (Decision, Decision) {
        let now = tollgate_core::Clock::now(&self.clock);
        let (from_m, from_r, from_read_first) = match op {
            Op::Check(cost) => (
                memory.check(key, policy, cost).await,
                self.redis.check(key, policy, cost).await,
                self.reading_first.check(key, policy, cost).await,
            ),
            Op::Settle(actual) | Op::SettleOlder(actual, _) => {
                let (cost, at) = reserved.unwrap_or((0, now));
                let settlement = Settlement::new(cost, actual, at);
                (
                    memory.settle(key, policy, settlement).await,
                    self.redis.settle(key, policy, settlement).await,
                    self.reading_first.settle(key, policy, settlement).await,
                )
            }
            Op::Block(micros) => {
                let duration = Duration::from_micros(micros);
                memory.block(key, policy, duration).await.unwrap();
                self.redis.block(key, policy, duration).await.unwrap();
                self.reading_first
                    .block(key, policy, duration)
                    .await
                    .unwrap();
                (
                    memory.status(key, policy).await,
                    self.redis.status(key, policy).await,
                    self.reading_first.status(key, policy).await,
                )
            }
            Op::Reset => {
                memory.reset(key, policy).await.unwrap();
                self.redis.reset(key, policy).await.unwrap();
                self.reading_first.reset(key, policy).await.unwrap();
                (
                    memory.status(key, policy).await,
                    self.redis.status(key, policy).await,
                    self.reading_first.status(key, policy).await,
                )
            }
        };
        let decision = from_r.unwrap();
        assert_eq!(
            from_read_first.unwrap(),
            decision,
            "reading first decides as the default"
        );
        (from_m.unwrap(), decision)
    }

    /// Runs the history of `case` at two keys alike, then settles its last
    /// admitted request at `a` on one key and `b` on the other, and decides
    /// the next request at each. Returns, per key, the memory store's and
    /// Redis's decisions of the settlement and of the next request.
    pub(crate) fn settle_two(&self, case: &SettleCase) -> [[(Decision, Decision); 2]; 2] {
        let keys = [next_key(), next_key()];
        let memory = MemoryStore::builder()
            .clock(self.clock.clone())
            .build()
            .unwrap();
        let policy = &case.history.policies[0];
        self.clock.set(Timestamp::from_micros(case.history.start));
        RT.block_on(async {
            let mut admitted = Vec::new();
            for &(gap, op, _) in &case.history.arrivals {
                self.clock.advance(Duration::from_micros(gap));
                let reserved = op.reservation(&admitted);
                let mut decided = Vec::new();
                for key in &keys {
                    decided.push(self.apply(&memory, key, policy, op, reserved).await);
                }
                assert_eq!(decided[0], decided[1], "the two keys share a history");
                let (m, r) = &decided[0];
                assert_eq!(m, r, "{op:?} in the history");
                if let (Op::Check(cost), true) = (op, r.is_allowed()) {
                    admitted.push((cost, r.now()));
                }
            }
            let reserved = admitted.last().copied();
            self.clock.advance(Duration::from_micros(case.then));
            let (a, b) = case.costs;
            let settled = [
                self.apply(&memory, &keys[0], policy, Op::Settle(a), reserved)
                    .await,
                self.apply(&memory, &keys[1], policy, Op::Settle(b), reserved)
                    .await,
            ];
            let (gap, cost) = case.next;
            self.clock.advance(Duration::from_micros(gap));
            let next = [
                self.apply(&memory, &keys[0], policy, Op::Check(cost), None)
                    .await,
                self.apply(&memory, &keys[1], policy, Op::Check(cost), None)
                    .await,
            ];
            [settled, next]
        })
    }
}

/// A key no other case uses.
fn next_key() -> Key {
    static KEY: AtomicU64 = AtomicU64::new(0);
    Key::user(format!("k{}", KEY.fetch_add(1, Ordering::Relaxed)))
}

/// What a case does at a key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    /// Decides a request of this cost.
    Check(u64),
    /// Settles the last admitted request (or, before any, one of cost 0)
    /// at this actual cost.
    Settle(u64),
    /// Settles an admitted request this many before the last (or, before
    /// any such, one of cost 0) at this actual cost: a response that took
    /// longer than later ones, or a request settled again.
    SettleOlder(u64, usize),
    /// Blocks the key for this many µs, then peeks.
    Block(u64),
    /// Resets the key, then peeks. A later settlement of a request
    /// reserved before it meets the reset's fence.
    Reset,
}

impl Op {
    /// The admitted request this op settles, of those `admitted` so far
    /// (cost, when); `None` for an op that settles none.
    pub(crate) fn reservation(self, admitted: &[(u64, Timestamp)]) -> Option<(u64, Timestamp)> {
        let back = match self {
            Op::Settle(_) => 0,
            Op::SettleOlder(_, back) => back + 1,
            Op::Check(_) | Op::Block(_) | Op::Reset => return None,
        };
        admitted.iter().rev().nth(back).copied()
    }
}

/// Arrivals at one key under one or more configurations of one policy.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub(crate) policies: Vec<Policy>,
    pub(crate) start: u64,
    /// `(gap before the request in µs, what it does, which policy)`.
    pub(crate) arrivals: Vec<(u64, Op, usize)>,
}

/// A history at a key, then two actual costs `a < b` of its last admitted
/// request: the gap before the settlement, and the gap to the next
/// request and its cost.
#[derive(Debug, Clone)]
pub(crate) struct SettleCase {
    pub(crate) history: Case,
    pub(crate) then: u64,
    pub(crate) costs: (u64, u64),
    pub(crate) next: (u64, u64),
}

/// Memory and Redis (both script orders) settle `settlement` of `key`
/// alike; returns the decision.
pub(crate) fn settle(
    harness: &Harness,
    memory: &MemoryStore,
    key: &Key,
    policy: &Policy,
    settlement: Settlement,
) -> Decision {
    let (m, r) = RT.block_on(harness.apply(
        memory,
        key,
        policy,
        Op::Settle(settlement.actual()),
        Some((settlement.reserved(), settlement.reserved_at())),
    ));
    assert_eq!(m, r, "{policy}: settling {settlement:?}");
    r
}

/// Memory and Redis (both script orders) do `op` of `key` alike;
/// returns the decision.
pub(crate) fn op(
    harness: &Harness,
    memory: &MemoryStore,
    key: &Key,
    policy: &Policy,
    op: Op,
) -> Decision {
    let (m, r) = RT.block_on(harness.apply(memory, key, policy, op, None));
    assert_eq!(m, r, "{policy}: {op:?}");
    r
}
