//! Flushing a ledger's records to Redis (one script call per key, all sent
//! at once), and reading buckets back (one `MGET` per query).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::join_all;
use tollgate_core::Key;
use tollgate_core::ledger::{Granularity, LedgerEntry, MAX_BUCKET_UNITS, Usage, UsageQuery};

use crate::connect::RedisConnection;
use crate::error::RedisStoreError;

use super::Shared;

/// Under a test clock, buckets live at least ten minutes of real time, as
/// the store's keys do: fake time does not pass with Redis's.
const TEST_CLOCK_MIN_TTL_MS: u64 = 600_000;

/// The Redis key of one bucket: `<stem>:<h|d|m><start in seconds>`.
pub(super) fn bucket_key(stem: &str, granularity: Granularity, start_secs: u64) -> String {
    let letter = match granularity {
        Granularity::Hour => 'h',
        Granularity::Day => 'd',
        Granularity::Month => 'm',
    };
    format!("{stem}:{letter}{start_secs}")
}

/// How long a key's marker of the last batch applied is kept: a batch
/// whose reply was lost and that is sent again within this time is not
/// counted twice.
pub(super) const MARKER_TTL: Duration = Duration::from_secs(86_400);

/// One key's records of one flush, under its sequence number: sent again
/// as they are, with the same number, until Redis answers.
pub(super) struct Batch {
    seq: u64,
    policy: Box<str>,
    key: Key,
    entries: Vec<LedgerEntry>,
}

impl Batch {
    /// The policy and key whose records the batch holds.
    fn owner(&self) -> (Box<str>, Key) {
        (self.policy.clone(), self.key.clone())
    }
}

/// Sends the batches a failed flush left, and every pending record but
/// those of keys whose earlier batch is still to be sent again, all at
/// once: of as many keys as the batches sent again leave room for under
/// `max_pending_keys`, so that the batches kept for the next flush, should
/// all fail, never exceed it (the keys left wait, pending, for the next
/// flush). A batch whose call failed is kept as it is, number included, for
/// the next flush, so that a batch Redis applied but whose reply was lost
/// is not applied twice; its key's new records wait until it went through
/// (written first under a later number, they would make Redis skip it: a
/// key's marker keeps the last number applied), then follow in the same
/// flush. Every other key's records are written whatever fails. The first
/// error is returned.
///
/// Once every batch went through, the pairs a round left pending for lack
/// of room go in a second round, which has room for them all (no more
/// than `max_pending_keys` pairs are pending): `Ok` means every record
/// made before the call is written, as a flush at shutdown needs. (Pairs
/// recorded while a round was on its way wait for the next flush.)
pub(super) async fn flush<C: RedisConnection>(shared: &Shared<C>) -> Result<(), RedisStoreError> {
    if round(shared).await? == Room::Short {
        round(shared).await?;
    }
    Ok(())
}

/// Whether a round of [`flush`] had room for every pending pair.
#[derive(Debug, PartialEq, Eq)]
enum Room {
    Enough,
    /// It took as many as it had room for: some may be left.
    Short,
}

/// One round of [`flush`].
async fn round<C: RedisConnection>(shared: &Shared<C>) -> Result<Room, RedisStoreError> {
    let mut batches = std::mem::take(&mut *shared.retry.lock());
    let held: HashSet<(Box<str>, Key)> = batches.iter().map(Batch::owner).collect();
    let room = shared.max_pending.saturating_sub(batches.len());
    let fresh = pending_batches(shared, room, |owner| !held.contains(owner));
    let room = match fresh.len() >= room {
        true => Room::Short,
        false => Room::Enough,
    };
    batches.extend(fresh);
    if batches.is_empty() {
        return Ok(room);
    }
    let sent = send(shared, batches).await;
    // The held keys whose batch went through: their records now.
    let still: HashSet<(Box<str>, Key)> = shared.retry.lock().iter().map(Batch::owner).collect();
    let released: HashSet<_> = held.difference(&still).collect();
    if released.is_empty() {
        return sent.map(|()| room);
    }
    let left = shared.max_pending.saturating_sub(still.len());
    let batches = pending_batches(shared, left, |owner| released.contains(&owner));
    let followed = match batches.is_empty() {
        true => Ok(()),
        false => send(shared, batches).await,
    };
    sent.and(followed).map(|()| room)
}

/// What [`flush`] does, for the one pair of `policy` and `key`: its batch
/// kept from a failed flush, then its records, all at once once that batch
/// went through; every other pair's records and batches wait for the next
/// flush. For a read of that pair's usage, which needs only its own
/// records written (a flush of every pair per read made one script call
/// per pair recorded since the last flush, for every read). When the
/// batches kept from failed flushes leave no room for its own, it flushes
/// every pair first, as [`flush`] does, which sends them. Every error it
/// returns leaves records of this pair unwritten.
pub(super) async fn flush_one<C: RedisConnection>(
    shared: &Shared<C>,
    policy: &str,
    key: &Key,
) -> Result<(), RedisStoreError> {
    let is_mine = |b: &Batch| &*b.policy == policy && b.key == *key;
    let mine: Vec<Batch> = {
        let mut retry = shared.retry.lock();
        let (mine, others) = std::mem::take(&mut *retry).into_iter().partition(is_mine);
        *retry = others;
        mine
    };
    let room = || shared.retry.lock().len() < shared.max_pending;
    let held = !mine.is_empty();
    if !held && !room() {
        // Every batch the bound allows waits to be sent again: they go
        // first, as a flush of every pair sends them, to make room; a
        // failure leaves this pair's records unwritten, and says so.
        flush(shared).await?;
        if !room() {
            return Err(RedisStoreError::QueueFull);
        }
    }
    let mut batches = mine;
    if !held {
        batches.extend(pair_batch(shared, policy, key));
    }
    if batches.is_empty() {
        return Ok(());
    }
    let sent = send(shared, batches).await;
    if !held || holds(shared, policy, key) || !room() {
        return sent;
    }
    // Its batch went through: its records since follow.
    match pair_batch(shared, policy, key) {
        None => sent,
        Some(batch) => send(shared, vec![batch]).await,
    }
}

/// The pending records of `key` under `policy`, as one batch under a new
/// number, if it has any.
fn pair_batch<C: RedisConnection>(shared: &Shared<C>, policy: &str, key: &Key) -> Option<Batch> {
    let entries = shared.pending.take_pair(key, policy);
    (!entries.is_empty()).then(|| Batch {
        seq: shared.seq.fetch_add(1, Ordering::Relaxed),
        policy: policy.into(),
        key: key.clone(),
        entries,
    })
}

/// The pending records of the keys `take` picks, of `room` keys at most,
/// as one batch per key under a new number; the others stay pending.
fn pending_batches<C: RedisConnection>(
    shared: &Shared<C>,
    room: usize,
    take: impl Fn(&(Box<str>, Key)) -> bool,
) -> Vec<Batch> {
    let mut by_key: HashMap<(Box<str>, Key), Vec<LedgerEntry>> = HashMap::new();
    // Only the pairs taken leave the ledger: the others keep their room.
    let picked = shared
        .pending
        .take_pairs(room, |policy, key| take(&(policy.into(), key.clone())));
    for entry in picked {
        let owner = (entry.policy().into(), entry.key().clone());
        by_key.entry(owner).or_default().push(entry);
    }
    by_key
        .into_iter()
        .map(|((policy, key), entries)| Batch {
            seq: shared.seq.fetch_add(1, Ordering::Relaxed),
            policy,
            key,
            entries,
        })
        .collect()
}

/// Whether records of `key` under `policy` wait to be written: in a batch
/// to be sent again, and perhaps behind it.
pub(super) fn holds<C: RedisConnection>(shared: &Shared<C>, policy: &str, key: &Key) -> bool {
    (shared.retry.lock().iter()).any(|b| &*b.policy == policy && b.key == *key)
}

/// Sends `batches` at once; those that failed go back to the retry list.
/// If the flush is dropped on its way (its caller went away: a client of
/// the usage endpoint, say), all of them go back, numbers included: none
/// is lost, and one that Redis applied is skipped when sent again.
async fn send<C: RedisConnection>(
    shared: &Shared<C>,
    batches: Vec<Batch>,
) -> Result<(), RedisStoreError> {
    let mut on_their_way = OnTheirWay { shared, batches };
    let now_ms = shared.now().as_micros() / 1_000;
    let calls = on_their_way
        .batches
        .iter()
        .map(|batch| write(shared, batch, now_ms));
    let results = join_all(calls).await;
    let batches = std::mem::take(&mut on_their_way.batches);
    let mut first_error = None;
    for (result, batch) in results.into_iter().zip(batches) {
        if let Err(error) = result {
            shared.retry.lock().push(batch);
            first_error.get_or_insert(error);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Batches sent and not yet answered: back to the retry list if dropped
/// with them.
struct OnTheirWay<'a, C: RedisConnection> {
    shared: &'a Shared<C>,
    batches: Vec<Batch>,
}

impl<C: RedisConnection> Drop for OnTheirWay<'_, C> {
    fn drop(&mut self) {
        if !self.batches.is_empty() {
            self.shared.retry.lock().append(&mut self.batches);
        }
    }
}

/// One key's batch in one script call.
async fn write<C: RedisConnection>(
    shared: &Shared<C>,
    batch: &Batch,
    now_ms: u64,
) -> Result<(), RedisStoreError> {
    let stem = shared.names.usage_stem(&batch.policy, &batch.key);
    let mut keys = Vec::with_capacity(batch.entries.len() + 1);
    keys.push(format!("{stem}:f{:016x}", shared.instance));
    let marker_ttl_ms = MARKER_TTL.as_millis();
    let mut args = vec![
        i64::try_from(batch.seq).unwrap_or(i64::MAX),
        i64::try_from(marker_ttl_ms).unwrap_or(i64::MAX),
    ];
    for e in batch.entries.iter().filter(|e| e.units() != 0) {
        let expires_ms = shared
            .settings
            .expires_at(e.granularity(), e.start())
            .as_micros()
            / 1_000;
        let mut ttl_ms = expires_ms.saturating_sub(now_ms);
        if shared.test_clock() {
            ttl_ms = ttl_ms.max(TEST_CLOCK_MIN_TTL_MS);
        }
        if ttl_ms == 0 {
            // Past its retention already: the bucket is gone, or going.
            continue;
        }
        keys.push(bucket_key(
            &stem,
            e.granularity(),
            e.start().as_micros() / 1_000_000,
        ));
        args.push(e.units());
        args.push(i64::try_from(ttl_ms).unwrap_or(i64::MAX));
    }
    if keys.len() == 1 {
        return Ok(());
    }
    let call = shared.store.wire.eval(
        &keys[0],
        &shared.script,
        (1 + 3 * keys.len(), 64 * keys.len()),
        |cmd| {
            cmd.arg(keys.len()).arg(&keys).arg(&args);
        },
    );
    match tokio::time::timeout(shared.flush_timeout, call).await {
        Ok(reply) => reply.map(drop),
        Err(_) => Err(RedisStoreError::Deadline(shared.flush_timeout)),
    }
}

/// The buckets of `query` of `key` under `policy`, in one `MGET`.
pub(super) async fn read<C: RedisConnection>(
    shared: &Shared<C>,
    key: &Key,
    policy: &str,
    query: &UsageQuery,
) -> Result<Usage, RedisStoreError> {
    let starts = query.bucket_starts(&shared.settings);
    let stem = shared.names.usage_stem(policy, key);
    let g = query.granularity();
    let keys: Vec<String> = starts
        .iter()
        .map(|s| bucket_key(&stem, g, s.as_micros() / 1_000_000))
        .collect();
    let Some(first) = keys.first() else {
        return Ok(Usage::from_buckets(&shared.settings, query, []));
    };
    let mut cmd = redis::cmd("MGET");
    cmd.arg(&keys);
    let read = shared.store.wire.connection.query_for_key(first, &cmd);
    let values: Vec<Option<i64>> = match tokio::time::timeout(shared.flush_timeout, read).await {
        Ok(values) => values?,
        Err(_) => return Err(RedisStoreError::Deadline(shared.flush_timeout)),
    };
    let units = starts.into_iter().zip(values).map(|(start, value)| {
        let units = value.unwrap_or(0).clamp(0, MAX_BUCKET_UNITS).unsigned_abs();
        (start, units)
    });
    Ok(Usage::from_buckets(&shared.settings, query, units))
}

#[cfg(test)]
mod tests {
    use tollgate_core::Key;
    use tollgate_core::ledger::Granularity;

    use super::bucket_key;
    use crate::keys::{KeyNamer, hash_slot};

    #[test]
    fn a_keys_buckets_share_its_cluster_slot_and_keys_spread() {
        let names = KeyNamer::new("tg", None).unwrap();
        let stem = names.usage_stem("api", &Key::user("ada"));
        assert!(stem.starts_with("tg:usage/api:{"), "{stem}");
        let slot = hash_slot(&stem);
        for g in Granularity::ALL {
            assert_eq!(hash_slot(&bucket_key(&stem, g, 1_767_225_600)), slot);
        }
        assert_eq!(
            bucket_key(&stem, Granularity::Month, 7),
            format!("{stem}:m7")
        );
        let other = names.usage_stem("api", &Key::user("bob"));
        assert_ne!(hash_slot(&other), slot);
    }
}
