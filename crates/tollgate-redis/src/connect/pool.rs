//! A bb8 pool of multiplexed connections: [`Pool`], and
//! [`RedisStoreBuilder::connect_pool`].
//!
//! A call that waits for a pooled connection while the pool serves the
//! app's other calls waits on the app's own load, not on Redis: its wait
//! is not counted towards the store's deadline (see [`after_checkout`]),
//! and it gives up only when the pool serves no one for a checkout timeout
//! and a quarter of one more, in which our runtime went idle
//! ([`RedisStoreError::PoolTimeout`], a failure), or at the store's
//! ceiling: [`RedisStoreError::PoolBusy`] (the app's own load) if the
//! pool served other calls meanwhile, `PoolTimeout` if it served none.
//! Once the call has its connection, its own deadline and ceiling start:
//! a pooled call can wait two ceilings in all.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use bb8::{PooledConnection, RunError};
use bb8_redis::RedisConnectionManager;
use redis::IntoConnectionInfo;
use redis::{Cmd, FromRedisValue};
use tokio::time::Instant;

use crate::builder::RedisStoreBuilder;
use crate::connect::connection::RedisConnection;
use crate::error::RedisStoreError;
use crate::patience::{self, Home, Missed};
use crate::store::RedisStore;

/// A bb8 pool of multiplexed Redis connections (from `bb8-redis`).
pub type Pool = bb8::Pool<RedisConnectionManager>;

impl RedisStoreBuilder {
    /// Connects through a bb8 pool of multiplexed connections.
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect_pool(
        self,
        url: impl IntoConnectionInfo,
    ) -> Result<RedisStore<Pool>, RedisStoreError> {
        self.check()?;
        let manager = RedisConnectionManager::new(url)?;
        let pool = bb8::Pool::builder()
            .max_size(self.pool_size)
            .connection_timeout(self.checkout_timeout)
            .build(manager)
            .await?;
        self.build(pool).await
    }
}

impl RedisConnection for Pool {
    fn is_one_server(&self) -> bool {
        true
    }

    async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd) -> Result<T, RedisStoreError> {
        let mut con = checkout(self).await?;
        Ok(cmd.query_async(&mut *con).await?)
    }

    fn handed_out(&self) -> Option<u64> {
        Some(handed_out(self))
    }
}

tokio::task_local! {
    /// The checkout of the store call being polled, if the store waits for
    /// its connection (see [`after_checkout`]).
    static CHECKOUT: Arc<Checkout>;
}

/// A store call's wait for a pooled connection.
struct Checkout {
    /// Set once the call has its connection: its deadline starts then.
    in_hand: AtomicBool,
    /// When the call stops waiting for a connection while the pool serves
    /// others: the store's ceiling.
    until: Instant,
    /// The store's runtime, judged with the call's.
    home: Home,
}

/// Runs `call` under the store's `deadline`, which starts once the call
/// has its pooled connection: until then, the pool's own rule bounds its
/// wait, which ends by the store's ceiling (see [`checkout`]). A
/// connection of another kind, which cannot say when it has one, gets its
/// deadline at the ceiling and a slack. `sent` is moved to when the deadline started.
pub(crate) async fn after_checkout<F: Future>(
    deadline: Duration,
    home: &Home,
    sent: &mut Instant,
    call: F,
) -> Result<F::Output, Missed> {
    let start = Instant::now();
    let checkout = Arc::new(Checkout {
        in_hand: AtomicBool::new(false),
        until: patience::after(start, patience::ceiling(deadline)),
        home: home.clone(),
    });
    let mut call = pin!(CHECKOUT.scope(checkout.clone(), call));
    // For the pool, a margin past its own end of the wait, so that the
    // wait's outcome is its own (a deadline shorter than a checkout would
    // otherwise cut a checkout still under way at the ceiling).
    let margin = patience::ceiling(deadline).saturating_add(patience::slack(deadline));
    let mut bound = pin!(tokio::time::sleep_until(patience::after(start, margin)));
    let waited = poll_fn(|cx| match call.as_mut().poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending if checkout.in_hand.load(Ordering::Relaxed) => Poll::Ready(None),
        Poll::Pending => bound.as_mut().poll(cx).map(|()| None),
    })
    .await;
    match waited {
        Some(output) => Ok(output),
        None => {
            *sent = Instant::now();
            patience::within(deadline, home, call).await
        }
    }
}

/// A connection from `pool`. A checkout that times out while the pool
/// handed connections to other calls, or whose timer our own runtime ran
/// late, met the app's own load: it waits again, until the store's
/// ceiling. One that times out on time while the pool handed out nothing
/// checks out once more for a slack ([`patience::slack`] of the checkout
/// timeout): if that gets no connection, times out on time too, the pool
/// handed out none meanwhile, and every worker of our runtime went idle
/// meanwhile ([`patience::Parks`]), it fails with
/// [`RedisStoreError::PoolTimeout`]: the pool's connections cannot be
/// made, or do not answer its checks. If a worker stayed busy, the calls
/// that would give a connection back may be among the tasks that wait,
/// and it waits again. At the ceiling, a wait during which the pool served
/// others fails with [`RedisStoreError::PoolBusy`] (the app's own load),
/// and one during which it served no one, with `PoolTimeout` (as
/// [`patience`]'s ceiling is a failure).
async fn checkout(
    pool: &Pool,
) -> Result<PooledConnection<'_, RedisConnectionManager>, RedisStoreError> {
    let checkout = CHECKOUT.try_with(Arc::clone).ok();
    let at_ceiling = || checkout.as_ref().is_some_and(|c| Instant::now() >= c.until);
    let home = checkout.as_ref().map_or(&Home::NONE, |c| &c.home);
    let mut served_others = false;
    // A checkout that timed out on time with nothing handed out: the idle
    // count from then, and the pool's count of checkouts served before it.
    let mut judging: Option<(patience::Parks, u64)> = None;
    loop {
        let before = handed_out(pool);
        let asked = Instant::now();
        // Within the store's ceiling, however long a checkout may wait;
        // one slack once a checkout timed out on time.
        let timeout = pool.config().connection_timeout;
        let (wait, until) = match &judging {
            Some(_) => {
                let wait = patience::slack(timeout);
                let until = checkout
                    .as_ref()
                    .map(|c| patience::after(asked, wait).min(c.until));
                (wait, until)
            }
            None => (timeout, checkout.as_ref().map(|c| c.until)),
        };
        let got = match until {
            Some(until) => tokio::time::timeout_at(until, pool.get())
                .await
                .unwrap_or(Err(RunError::TimedOut)),
            None => pool.get().await,
        };
        match got {
            Ok(connection) => {
                if let Some(checkout) = &checkout {
                    checkout.in_hand.store(true, Ordering::Relaxed);
                }
                return Ok(connection);
            }
            Err(RunError::User(e)) => return Err(RedisStoreError::Redis(e)),
            Err(RunError::TimedOut) => {
                if let Some((parks, before)) = judging.take() {
                    // Judged as the first: after the other ready tasks have
                    // had their turn, and only if its timer fired on time.
                    tokio::task::yield_now().await;
                    let served = handed_out(pool) > before;
                    if !served && !ran_late(pool, asked, wait, home) && parks.went_idle() {
                        return Err(RedisStoreError::PoolTimeout);
                    }
                    served_others |= served;
                } else {
                    let served = handed_out(pool) > before;
                    served_others |= served;
                    // (A checkout the ceiling cut short says nothing by
                    // itself.)
                    if !served && !at_ceiling() && !ran_late(pool, asked, wait, home) {
                        if checkout.is_none() {
                            return Err(RedisStoreError::PoolTimeout);
                        }
                        judging = Some((patience::Parks::now(home), before));
                        continue;
                    }
                }
                if at_ceiling() || checkout.is_none() {
                    return Err(match served_others {
                        true => RedisStoreError::PoolBusy,
                        false => RedisStoreError::PoolTimeout,
                    });
                }
            }
        }
    }
}

/// How many checkouts of `pool` have got a connection so far.
fn handed_out(pool: &Pool) -> u64 {
    let statistics = pool.state().statistics;
    statistics.get_direct + statistics.get_waited
}

/// Whether a checkout asked for at `asked` that waits `wait` timed out
/// late, or with tasks of our runtime waiting for a worker: our runtime
/// did not run its timer (nor, likely, the calls that would have given a
/// connection back) in time. The slack is [`patience`]'s of the pool's
/// checkout timeout, and the backlog is [`patience`]'s.
fn ran_late(pool: &Pool, asked: Instant, wait: Duration, home: &Home) -> bool {
    let timeout = pool.config().connection_timeout;
    asked.elapsed() > wait.saturating_add(patience::slack(timeout)) || patience::backlogged(home)
}
