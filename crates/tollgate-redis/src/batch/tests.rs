//! The batcher's queue on tokio's paused clock: who is taken into a call,
//! who gives up, and where a place goes.

use tollgate_core::Algorithm;

use super::*;
use crate::op::form::Form;

/// The deadline of the test batchers' store.
const DEADLINE: Duration = Duration::from_millis(50);

/// A batcher whose calls never come back.
struct Stuck(Batcher);

impl WordCalls for Stuck {
    fn batcher(&self, _: &dyn WordForm) -> Option<&Batcher> {
        Some(&self.0)
    }
    fn home(&self) -> &patience::Home {
        &patience::Home::NONE
    }
    async fn call_queued(
        &self,
        _: &dyn WordForm,
        _: &[Queued],
    ) -> Result<Vec<Word>, RedisStoreError> {
        std::future::pending().await
    }
}

/// A batcher whose calls take 45 ms and decide every request.
struct Slow(Batcher);

impl WordCalls for Slow {
    fn batcher(&self, _: &dyn WordForm) -> Option<&Batcher> {
        Some(&self.0)
    }
    fn home(&self) -> &patience::Home {
        &patience::Home::NONE
    }
    async fn call_queued(
        &self,
        _: &dyn WordForm,
        batch: &[Queued],
    ) -> Result<Vec<Word>, RedisStoreError> {
        tokio::time::sleep(Duration::from_millis(45)).await;
        Ok(batch.iter().map(|_| (7, 0)).collect())
    }
}

/// Every place of `inner` taken by a request of `policy`.
fn every_place<S: WordCalls>(inner: &Arc<S>, policy: &Policy) -> Vec<Place<S>> {
    let kind = Form::word_of(policy).unwrap();
    (0..IN_FLIGHT)
        .map(|_| match enter(inner, kind, request(policy)) {
            Turn::Now(place) => place,
            Turn::Queued(..) | Turn::Full => panic!("a place is free"),
        })
        .collect()
}

/// A request of `policy` queued in `inner`, whose places are taken.
fn queue<S: WordCalls>(
    inner: &Arc<S>,
    policy: &Policy,
) -> (oneshot::Receiver<Result<Word, RedisStoreError>>, u64) {
    let kind = Form::word_of(policy).unwrap();
    match enter(inner, kind, request(policy)) {
        Turn::Queued(reply, seq) => (reply, seq),
        Turn::Now(_) | Turn::Full => panic!("every place is taken"),
    }
}

fn request(policy: &Policy) -> Request<'_> {
    Request {
        key: "k",
        period: 0,
        step: 1,
        slack: 0,
        policy,
    }
}

/// A queued request taken into a call waits for that call's outcome,
/// past its own deadline: Redis may decide it. It gave up at its
/// deadline, and its caller's failure policy decided it again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_taken_into_a_call_waits_for_it_past_its_deadline() {
    let slow = Arc::new(Slow(Batcher::new(64, DEADLINE)));
    let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
    let mut places = every_place(&slow, &policy);
    let (reply, seq) = queue(&slow, &policy);
    let start = Instant::now();
    let waiting = {
        let slow = slow.clone();
        tokio::spawn(async move { wait(&slow.0, &patience::Home::NONE, reply, seq, || None).await })
    };
    // At 10 ms the call ahead fails (its place is given up unanswered):
    // the queued request is sent, and its call answers at 55 ms.
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(places.pop());
    let word = waiting.await.unwrap();
    assert_eq!(word.unwrap(), (7, 0));
    assert_eq!(start.elapsed(), Duration::from_millis(55));
}

/// A queued request that no call took gives up at its deadline, and
/// leaves the queue: it is never sent late.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_still_queued_at_its_deadline_gives_up_and_leaves_the_queue() {
    let stuck = Arc::new(Stuck(Batcher::new(64, DEADLINE)));
    let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
    let _places = every_place(&stuck, &policy);
    let (reply, seq) = queue(&stuck, &policy);
    let waited = wait(&stuck.0, &patience::Home::NONE, reply, seq, || None).await;
    assert!(
        matches!(waited, Err(RedisStoreError::Deadline(_))),
        "{waited:?}"
    );
    assert!(stuck.0.queue().waiting.is_empty());
}

/// `reply`'s answer, failing (rather than hanging, on the paused
/// clock) if none comes within a second.
async fn answer(
    reply: &mut oneshot::Receiver<Result<Word, RedisStoreError>>,
) -> Result<Word, RedisStoreError> {
    tokio::time::timeout(Duration::from_secs(1), reply)
        .await
        .expect("answered")
        .expect("sent")
}

/// A queued request that waited a deadline since the queue last moved
/// is not taken into the next call, which takes one that queued less
/// than a deadline before. Taken, it waited up to a ceiling in the
/// queue and another in the call. Once a call is answered, the queue
/// moves, and it is taken.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_that_waited_a_deadline_since_the_queue_moved_is_left_behind() {
    let slow = Arc::new(Slow(Batcher::new(64, DEADLINE)));
    let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
    let mut places = every_place(&slow, &policy);
    let (mut old, _) = queue(&slow, &policy);
    // A call is answered 30 ms later, and another request queues at 60.
    tokio::time::advance(Duration::from_millis(30)).await;
    places[0].answered();
    tokio::time::advance(Duration::from_millis(30)).await;
    let (mut young, _) = queue(&slow, &policy);
    // At 90 ms the other call returns unanswered. The requests' own
    // timers are not polled here: only the place's return judges them.
    tokio::time::advance(Duration::from_millis(30)).await;
    let start = Instant::now();
    drop(places.pop());
    assert_eq!(slow.0.queue().waiting.len(), 1);
    assert!(
        old.try_recv()
            .is_err_and(|e| e == oneshot::error::TryRecvError::Empty)
    );
    assert_eq!(answer(&mut young).await.unwrap(), (7, 0));
    assert_eq!(start.elapsed(), Duration::from_millis(45));
    // That answer moved the queue: the old request goes in the next call.
    assert_eq!(answer(&mut old).await.unwrap(), (7, 0));
    assert_eq!(start.elapsed(), Duration::from_millis(90));
}

/// A call answered less than a deadline before a place returns keeps
/// the queue moving: a request queued before it is taken, however long
/// ago it queued.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_of_a_moving_queue_is_taken_however_long_it_waited() {
    let slow = Arc::new(Slow(Batcher::new(64, DEADLINE)));
    let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
    let mut places = every_place(&slow, &policy);
    let (mut waiting, _) = queue(&slow, &policy);
    tokio::time::advance(Duration::from_millis(60)).await;
    places[0].answered();
    tokio::time::advance(Duration::from_millis(30)).await;
    drop(places.pop());
    assert_eq!(answer(&mut waiting).await.unwrap(), (7, 0));
}

/// A place that returns to a queue of old requests alone is given
/// back, free for the next request, and each old one is decided by its
/// own wait: it gives up at its deadline when no call was answered.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_place_returning_to_old_requests_alone_is_free_and_they_give_up() {
    let stuck = Arc::new(Stuck(Batcher::new(64, DEADLINE)));
    let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
    let kind = Form::word_of(&policy).unwrap();
    let mut places = every_place(&stuck, &policy);
    let (reply, seq) = queue(&stuck, &policy);
    tokio::time::advance(Duration::from_millis(60)).await;
    drop(places.pop());
    assert!(matches!(
        enter(&stuck, kind, request(&policy)),
        Turn::Now(_)
    ));
    let waited = wait(&stuck.0, &patience::Home::NONE, reply, seq, || None).await;
    assert!(
        matches!(waited, Err(RedisStoreError::Deadline(_))),
        "{waited:?}"
    );
    assert!(stuck.0.queue().waiting.is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn a_place_handed_to_a_task_that_never_runs_is_given_back() {
    // One request per call: each queued request is a batch of its own.
    // A deadline far longer than the test, on the real clock: every
    // queued request is young enough to be taken.
    let stuck = Arc::new(Stuck(Batcher::new(1, Duration::from_secs(3_600))));
    let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
    let kind = Form::word_of(&policy).unwrap();
    let places = every_place(&stuck, &policy);
    let mut queued: Vec<_> = (0..5).map(|_| queue(&stuck, &policy).0).collect();

    // A place is given up in a runtime shutting down: it and the first
    // batch queued behind it go to a task that never runs. Dropped
    // inside the spawn, that task's place gives the next batch up and
    // itself back, rather than hand on again, once per batch queued.
    let handle = crate::running::shut_down_runtime();
    let mut places = places.into_iter();
    {
        let _inside = handle.enter();
        drop(places.next());
    }
    // Answered at once, so that a regression fails rather than hangs.
    for mut dropped in queued.drain(..2) {
        let answer = dropped.try_recv();
        assert!(
            answer.is_err_and(|e| e == oneshot::error::TryRecvError::Closed),
            "its batch was dropped"
        );
    }
    for waiting in &mut queued {
        assert!(
            waiting
                .try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Empty)
        );
    }
    // The place is free again.
    assert!(matches!(
        enter(&stuck, kind, request(&policy)),
        Turn::Now(_)
    ));
    drop(places);
}
