//! The store's deadline, told apart from our own runtime's lateness.
//!
//! A deadline that fires on time while the reply is still out, and after
//! which our runtime goes idle (every worker of it) within a slack with the
//! reply still out, is Redis's lateness: a store failure. A deadline whose
//! timer fires late, because the app's own runtime was too busy to poll
//! the timer (and the connection's reader, and the request) in time, says
//! nothing of Redis: the reply may have been in the socket all along, or
//! the command not yet written. Nor does one that fires on time while
//! ready tasks wait for a worker, or after which a worker stays busy with
//! its own queue through that slack: the reader may be among the tasks
//! that wait. Such a request waits on for its reply, up to a hard ceiling
//! of [`CEILING`] deadlines, where it ends: a failure of Redis if our
//! runtime ran the ceiling's timer on time with no ready task waiting for
//! a worker. If it ran it late, the call gets a last look of one slack
//! once our runtime runs again (a reply that sat unread through a stall
//! of the whole process is read then), and ends as that look's timer was
//! run: on time, a failure of Redis; late, or with ready tasks waiting,
//! our own lateness still ([`Missed::Busy`]), if Redis answered lately.

use std::future::Future;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;

/// How many deadlines a call whose deadline fired late may take in all:
/// past this ceiling it fails, however late our runtime was.
pub(crate) const CEILING: u32 = 4;

/// How late a deadline's timer may fire and still count as on time: a
/// quarter of the deadline, and never less than [`MIN_SLACK`] (the timer
/// wheel's millisecond, and a busy machine's scheduling).
const SLACK_DIVISOR: u32 = 4;

/// The least slack a deadline's timer gets.
const MIN_SLACK: Duration = Duration::from_millis(2);

/// Why a call ended without its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missed {
    /// The deadline fired on time, and the runtime went idle after it with
    /// the reply still out: Redis was late.
    Deadline,
    /// The deadline fired late, or on a runtime that stayed busy after it
    /// (our runtime was late), and the call went on to the ceiling without
    /// its reply, whose timer our runtime ran on time, with no ready task
    /// waiting for a worker: Redis was late.
    Ceiling,
    /// As [`Missed::Ceiling`], but our runtime ran the ceiling's timer
    /// late or with ready tasks waiting for a worker, and the last look
    /// after it as well (see [`last_look`]): our runtime, or the whole
    /// process, was too busy to read the reply, which may be in. Or Redis
    /// hung meanwhile: the store asks whether it answered lately.
    Busy,
}

impl Missed {
    /// The wait the call missed: the deadline or the ceiling.
    pub(crate) fn waited(self, deadline: Duration) -> Duration {
        match self {
            Missed::Deadline => deadline,
            Missed::Ceiling | Missed::Busy => ceiling(deadline),
        }
    }
}

/// The longest a deadline, timeout or breaker cooldown may be: waits are
/// added to clock readings, and a day keeps every sum far from overflow.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(86_400);

/// The hard ceiling of a call under `deadline`.
pub(crate) fn ceiling(deadline: Duration) -> Duration {
    deadline.saturating_mul(CEILING)
}

/// How late a timer of `wait` may fire and still count as on time.
pub(crate) fn slack(wait: Duration) -> Duration {
    (wait / SLACK_DIVISOR).max(MIN_SLACK)
}

/// The least time within which Redis must have answered a call for a
/// call that ended [`Missed::Busy`] to be the app's own load (see
/// [`lately`]).
const LATELY: Duration = Duration::from_secs(1);

/// How lately Redis must have answered a call (any call of the same
/// breaker) for a call that ended [`Missed::Busy`] to be the app's own
/// load, not Redis's lateness: two ceilings, and at least [`LATELY`].
/// While Redis answers, a runtime too busy to read a reply is the app's
/// own load. Once Redis has answered nothing for that long, a miss is
/// Redis's again, however busy the app: a hung Redis on an app whose
/// runtime stays busy (its own requests keep coming) still opens the
/// breaker, within that time and the misses the breaker needs.
pub(crate) fn lately(deadline: Duration) -> Duration {
    ceiling(deadline).saturating_mul(2).max(LATELY)
}

/// The least the connection's own response timeout is by default.
const MIN_BACKSTOP: Duration = Duration::from_secs(1);

/// The connection's own response timeout under `deadline`, by default:
/// one deadline past the ceiling, and at least [`MIN_BACKSTOP`], so that
/// the store's judgment comes first, and a reply that waited in the socket
/// while our process was stalled past the ceiling is still there for the
/// last look (see [`within`]) once it runs again: that timeout, fired in
/// such a call, would drop the reply unread.
pub(crate) fn backstop(deadline: Duration) -> Duration {
    deadline.saturating_mul(CEILING + 1).max(MIN_BACKSTOP)
}

/// Runs `call` under `deadline`. When the deadline fires, the call is
/// polled once more after the runtime's other ready tasks (the
/// connection's reader among them) have had their turn, so a reply that
/// is already in is a success. If the timer fired late, or the runtime
/// has ready tasks waiting for a worker, the call waits on until the
/// ceiling. If it fired on time, the call waits one slack more, judged
/// the same way: it has missed its deadline if that timer fired on time
/// too and every worker of the runtime went idle meanwhile with the reply
/// still out ([`Parks`]), and waits on until the ceiling otherwise (the
/// connection's reader, with the reply, may be among the tasks in the
/// workers' own queues). At the ceiling it ends as [`last_look`] judges.
pub(crate) async fn within<F: Future>(
    deadline: Duration,
    home: &impl Runtimes,
    call: F,
) -> Result<F::Output, Missed> {
    let start = Instant::now();
    let last = after(start, ceiling(deadline));
    let slack = slack(deadline);
    let mut call = std::pin::pin!(call);
    let mut due = after(start, deadline);
    // Set once the deadline fired on time: the slack after it is waited.
    let mut parks: Option<Parks> = None;
    loop {
        let on_time = match until(due, slack, home, call.as_mut()).await {
            Ok(output) => return Ok(output),
            Err(on_time) => on_time,
        };
        if due >= last {
            return last_look(on_time, slack, home, call).await;
        }
        due = match (parks.take(), on_time) {
            (None, true) => {
                parks = Some(Parks::now(home));
                after(Instant::now(), slack).min(last)
            }
            (Some(parks), true) if parks.went_idle() => return Err(Missed::Deadline),
            (Some(_) | None, _) => last,
        };
    }
}

/// Waits for `call` at most `wait`, judged as [`within`] judges its
/// ceiling ([`last_look`]).
pub(crate) async fn at_most<F: Future>(
    wait: Duration,
    slack: Duration,
    home: &impl Runtimes,
    call: F,
) -> Result<F::Output, Missed> {
    let mut call = std::pin::pin!(call);
    match until(after(Instant::now(), wait), slack, home, call.as_mut()).await {
        Ok(output) => Ok(output),
        Err(on_time) => last_look(on_time, slack, home, call).await,
    }
}

/// Waits for `call` until `due`, then polls it once more after the
/// runtime's other ready tasks have had their turn (the grace poll): its
/// output, or whether our runtime ran the timer on time: within `slack`,
/// with no ready task waiting for a worker.
async fn until<F: Future>(
    due: Instant,
    slack: Duration,
    home: &impl Runtimes,
    mut call: std::pin::Pin<&mut F>,
) -> Result<F::Output, bool> {
    if let Ok(output) = tokio::time::timeout_at(due, call.as_mut()).await {
        return Ok(output);
    }
    // How long the yield took counts as lateness too: on a starved
    // runtime it is one more turn of the busy tasks.
    tokio::task::yield_now().await;
    if let Some(output) = call.as_mut().now_or_never() {
        return Ok(output);
    }
    Err(Instant::now().saturating_duration_since(due) <= slack && !backlogged(home))
}

/// How a wait ends at its ceiling, whose timer our runtime ran
/// `on_time` or not. On time: [`Missed::Ceiling`], the other side's
/// lateness. Late (our runtime, or the whole process, was stalled, or
/// ready tasks waited for a worker): the reply may have sat unread
/// meanwhile, so the call gets a last look, a slack more from when our
/// runtime runs again, in which such a reply is read. Still out at its
/// end: [`Missed::Ceiling`] if that look's timer fired on time (a hung
/// Redis, on an app whose stall has ended), else [`Missed::Busy`].
async fn last_look<F: Future>(
    on_time: bool,
    slack: Duration,
    home: &impl Runtimes,
    call: std::pin::Pin<&mut F>,
) -> Result<F::Output, Missed> {
    if on_time {
        return Err(Missed::Ceiling);
    }
    match until(after(Instant::now(), slack), slack, home, call).await {
        Ok(output) => Ok(output),
        Err(true) => Err(Missed::Ceiling),
        Err(false) => Err(Missed::Busy),
    }
}

/// The runtime a store was built on: its connection's tasks (the reader
/// of Redis's replies among them) run there, so its lateness is our own
/// too, judged with that of the runtime the call runs on when the two
/// differ (a store built on the main runtime, used from per-thread ones).
/// Connections made later, a bb8 pool's or the redis crate's own
/// reconnection after a dropped connection, run their tasks on the
/// runtime of the call that made them, which this does not follow (a
/// replacement the store asks for itself is made on the home runtime:
/// see [`crate::running::hand_on_runtime`]). A home runtime that has
/// shut down never goes idle: a late call then waits to the ceiling.
#[derive(Clone, Debug)]
pub(crate) struct Home(Option<tokio::runtime::Handle>);

impl Home {
    /// None: only the runtime a call runs on is judged.
    pub(crate) const NONE: Home = Home(None);

    /// The runtime this runs on, if any.
    pub(crate) fn here() -> Self {
        Home(tokio::runtime::Handle::try_current().ok())
    }

    /// The runtime, if known.
    pub(crate) fn handle(&self) -> Option<&tokio::runtime::Handle> {
        self.0.as_ref()
    }

    /// `runtime`, for tests.
    #[cfg(test)]
    pub(crate) fn of(runtime: tokio::runtime::Handle) -> Self {
        Home(Some(runtime))
    }
}

/// The runtimes whose lateness is a wait's own: the one it runs on and,
/// once each, those whose tasks must run for it to end (see [`Home`]).
/// Looked at only once a deadline has fired.
pub(crate) trait Runtimes {
    /// Each of them, the current one first.
    fn runtimes(&self) -> Vec<tokio::runtime::Handle>;
}

impl Runtimes for Home {
    /// The one a call runs on, and the store's if another.
    fn runtimes(&self) -> Vec<tokio::runtime::Handle> {
        let current = tokio::runtime::Handle::try_current().ok();
        let home = self
            .0
            .clone()
            .filter(|home| current.as_ref().is_none_or(|c| c.id() != home.id()));
        current.into_iter().chain(home).collect()
    }
}

/// Whether a runtime of the call (see [`Home`]) has tasks ready to run
/// that no worker has picked up yet: on a multi-threaded runtime a burst of
/// requests queues there, and the connection's task that would read
/// Redis's reply waits behind them, while the deadline's timer still fires
/// on time. Such a deadline is our own queueing too.
pub(crate) fn backlogged(home: &impl Runtimes) -> bool {
    home.runtimes()
        .iter()
        .any(|runtime| runtime.metrics().global_queue_depth() > 0)
}

/// Whether every worker of the call's runtimes (see [`Home`]) went idle
/// (had nothing left to run) since a wait that timed out on time, or is
/// idle now. Only then is the wait the other side's failure: until then,
/// the task that would end it (the connection's reader with Redis's reply,
/// a call giving back a pooled connection) may be among the tasks in a
/// busy worker's own queue, which [`backlogged`] does not see and which
/// another worker cannot always take (the task a worker runs next is its
/// own). Looked at after the timeout, not from the wait's start: a worker
/// that went idle early in the wait (the one that sent the command, say)
/// says nothing of a burst that came after it. On a runtime with nothing
/// else to do, every worker goes idle as the waiter waits on. A runtime
/// with a worker busy throughout (a long synchronous poll) waits to the
/// ceiling, and so does a call outside any runtime of a store built
/// outside one.
pub(crate) struct Parks(Vec<(tokio::runtime::Handle, Vec<u64>)>);

impl Parks {
    /// From now.
    pub(crate) fn now(home: &impl Runtimes) -> Self {
        Parks(
            home.runtimes()
                .into_iter()
                .map(|runtime| {
                    let metrics = runtime.metrics();
                    let counts = (0..metrics.num_workers())
                        .map(|worker| metrics.worker_park_count(worker))
                        .collect();
                    (runtime, counts)
                })
                .collect(),
        )
    }

    /// Whether every worker went idle since, or is idle now.
    pub(crate) fn went_idle(&self) -> bool {
        !self.0.is_empty()
            && self.0.iter().all(|(runtime, counts)| {
                let metrics = runtime.metrics();
                metrics.num_workers() == counts.len()
                    && !counts.is_empty()
                    && counts.iter().enumerate().all(|(worker, &parks)| {
                        // Parks and unparks alike count: odd while it is
                        // parked.
                        metrics.worker_park_count(worker) != parks
                            || metrics.worker_park_unpark_count(worker) % 2 == 1
                    })
            })
    }
}

/// `start + wait`, or a time far enough ahead when that overflows.
pub(crate) fn after(start: Instant, wait: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);
    start
        .checked_add(wait)
        .or_else(|| start.checked_add(FAR))
        .unwrap_or(start)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// Blocks the runtime's one thread for `stall`, as a CPU-bound task does.
    fn spin(stall: Duration) {
        let end = std::time::Instant::now() + stall;
        while std::time::Instant::now() < end {
            std::hint::spin_loop();
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_reply_that_is_in_is_a_success_however_late() {
        let deadline = Duration::from_millis(10);
        let (send, receive) = tokio::sync::oneshot::channel::<u32>();
        let reply = tokio::spawn(async move {
            // Replies at once, but the runtime is blocked past the deadline.
            spin(deadline * 3);
            let _ = send.send(7);
        });
        assert_eq!(
            within(deadline, &Home::here(), receive).await.ok(),
            Some(Ok(7))
        );
        assert!(reply.await.is_ok());
    }

    /// Keeps the runtime busy from `after` on, with a task always ready
    /// (as a burst of requests keeps it), until the returned flag is set.
    fn busy_from(after: Duration) -> (Arc<AtomicBool>, tokio::task::JoinHandle<()>) {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = Arc::clone(&stop);
            async move {
                if !after.is_zero() {
                    tokio::time::sleep(after).await;
                }
                while !stop.load(Ordering::Relaxed) {
                    tokio::task::yield_now().await;
                }
            }
        });
        (stop, task)
    }

    /// A call that never answers under `deadline`, with the runtime busy
    /// from `busy` on.
    async fn never_answered(deadline: Duration, busy: Duration) -> Result<(), Missed> {
        let (stop, busy) = busy_from(busy);
        let missed = within(deadline, &Home::here(), std::future::pending::<()>()).await;
        stop.store(true, Ordering::Relaxed);
        assert!(busy.await.is_ok());
        missed
    }

    /// Whether a call missed the ceiling, not its deadline. On the real
    /// clock of a busy machine the ceiling's own timer, and its last
    /// look's, may fire late, which makes it `Busy`: both waited to the
    /// ceiling.
    fn waited_to_the_ceiling(missed: Result<(), Missed>) -> bool {
        matches!(missed, Err(Missed::Ceiling | Missed::Busy))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_deadline_through_which_the_runtime_never_went_idle_waits_for_the_ceiling() {
        // Busy throughout, while its timers still fire on time: it never
        // parks, so the deadline is our own queueing, not Redis's.
        let missed = never_answered(Duration::from_millis(10), Duration::ZERO).await;
        assert!(waited_to_the_ceiling(missed), "{missed:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_runtime_idle_early_in_a_deadline_but_busy_at_its_end_waits_for_the_ceiling() {
        // Idle at first (the runtime parks while the burst is yet to
        // come), then busy from a quarter of the deadline on, or from its
        // last eighth, through its end: the idle start says nothing of the
        // end.
        let deadline = Duration::from_millis(40);
        for busy in [deadline / 4, deadline * 7 / 8] {
            let missed = never_answered(deadline, busy).await;
            assert!(
                waited_to_the_ceiling(missed),
                "busy from {busy:?}: {missed:?}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reply_held_by_a_busy_worker_while_another_idles_waits_for_it() {
        // The task that would answer is stuck on one worker (as the
        // connection's reader can be, in the queue of a worker busy with a
        // long poll) through the deadline and the slack after it, while
        // the other worker, with nothing to run, goes idle: the runtime is
        // not idle, so the call waits on, and the answer comes.
        let deadline = Duration::from_millis(40);
        let (send, receive) = tokio::sync::oneshot::channel::<u32>();
        let (started, busy) = tokio::sync::oneshot::channel::<()>();
        let holder = tokio::spawn(async move {
            let _ = started.send(());
            spin(deadline * 3);
            let _ = send.send(7);
        });
        busy.await.unwrap();
        // The call on the other worker (the test's own thread is none).
        let home = Home::here();
        let call = tokio::spawn(async move { within(deadline, &home, receive).await });
        assert_eq!(call.await.unwrap(), Ok(Ok(7)));
        assert!(holder.await.is_ok());
    }

    // The tests below run on tokio's paused clock: the runtime's
    // lateness is an `advance` inside the call, which the machine's load
    // cannot stretch (a stall on the real clock, followed by a real sleep,
    // could be stretched past the ceiling by a busy machine).

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_late_timer_waits_for_the_reply_until_the_ceiling() {
        let deadline = Duration::from_millis(10);
        let call = async {
            // The clock moves past the deadline while the call runs, as
            // when our runtime is too busy to fire the timer: late.
            tokio::time::advance(deadline * 2).await;
            tokio::time::sleep(deadline).await;
            5
        };
        assert_eq!(within(deadline, &Home::here(), call).await, Ok(5));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_runtime_late_in_the_slack_after_an_on_time_deadline_waits_for_the_reply() {
        let deadline = Duration::from_millis(20);
        let call = async {
            // Still out when the deadline fires, on time.
            tokio::time::sleep(deadline + Duration::from_millis(1)).await;
            // Then the runtime is late in the slack after it: the slack's
            // timer fires late, and the runtime went idle before (the
            // reply may be in, its reader not yet run).
            tokio::time::advance(slack(deadline) * 3).await;
            tokio::time::sleep(deadline).await;
            5
        };
        assert_eq!(within(deadline, &Home::here(), call).await, Ok(5));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn an_on_time_deadline_is_missed_and_the_ceiling_is_hard() {
        let deadline = Duration::from_millis(20);
        let never = std::future::pending::<()>();
        let started = Instant::now();
        assert_eq!(
            within(deadline, &Home::here(), never).await,
            Err(Missed::Deadline)
        );
        // Missed at the deadline and the slack after it, no later.
        assert_eq!(started.elapsed(), deadline + slack(deadline));
        let late_and_never = async {
            tokio::time::advance(deadline * 2).await;
            std::future::pending::<()>().await;
        };
        let started = Instant::now();
        assert_eq!(
            within(deadline, &Home::here(), late_and_never).await,
            Err(Missed::Ceiling)
        );
        assert_eq!(started.elapsed(), deadline * CEILING);
        assert_eq!(Missed::Ceiling.waited(deadline), deadline * CEILING);
    }

    /// A call that runs late at its deadline (the clock moves a deadline
    /// past it while the call runs) and at its ceiling (whose timer then
    /// fires a deadline late, as when the whole process was stalled),
    /// then goes on as `after`.
    async fn late_at_the_ceiling<T>(deadline: Duration, after: impl Future<Output = T>) -> T {
        tokio::time::advance(deadline * 2).await;
        tokio::time::sleep(deadline * 2 - Duration::from_millis(1)).await;
        tokio::time::advance(deadline).await;
        after.await
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_reply_read_at_the_last_look_after_a_late_ceiling_is_a_success() {
        // The reply, in meanwhile, is read in the last look.
        let deadline = Duration::from_millis(20);
        let read = late_at_the_ceiling(deadline, async {
            tokio::time::sleep(slack(deadline) / 2).await;
            5
        });
        assert_eq!(within(deadline, &Home::here(), read).await, Ok(5));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_runtime_late_at_the_ceiling_then_on_time_with_no_reply_misses_it() {
        // On time through the last look, with no reply: Redis's lateness,
        // as a hung Redis on an app whose stall has ended.
        let deadline = Duration::from_millis(20);
        let never = late_at_the_ceiling(deadline, std::future::pending::<()>());
        let started = Instant::now();
        assert_eq!(
            within(deadline, &Home::here(), never).await,
            Err(Missed::Ceiling)
        );
        // The stall, and the last look's slack after it.
        assert_eq!(
            started.elapsed(),
            deadline * (CEILING + 1) - Duration::from_millis(1) + slack(deadline)
        );
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_runtime_late_at_the_ceiling_and_its_last_look_is_busy() {
        // Late at the last look too: the reply may be in, unread. The
        // store asks whether Redis answered lately; the ceiling and one
        // slack bound the wait but for the stalls themselves.
        let deadline = Duration::from_millis(20);
        let late_again = late_at_the_ceiling(deadline, async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            tokio::time::advance(deadline).await;
            std::future::pending::<()>().await;
        });
        let started = Instant::now();
        assert_eq!(
            within(deadline, &Home::here(), late_again).await,
            Err(Missed::Busy)
        );
        assert_eq!(started.elapsed(), deadline * (CEILING + 2));
        assert_eq!(Missed::Busy.waited(deadline), deadline * CEILING);
    }
}
