//! Settling a request's actual cost: one call, alone, of the policy's
//! script, with the settlement's arguments.

use tollgate_core::{Decision, Key, Policy, Settlement};

use crate::connect::RedisConnection;
use crate::deny_cache::{DenyCache, Uncertain};
use crate::error::RedisStoreError;
use crate::keys::fence_key;
use crate::op::form::Form;
use crate::op::general::settle_request;
use crate::op::word::{SettleArgs, Word, WordForm, WordOp, decision};
use crate::op::word_reply::words_at;
use crate::store::RedisStore;
use crate::wire::Wire;

impl<C: RedisConnection> RedisStore<C> {
    /// Settles a request's actual cost, as [`Store::settle`](tollgate_core::Store::settle) does, keeping
    /// the Redis-specific error: one script call, alone (neither batched
    /// nor queued behind the key's decisions, which it need not wait for:
    /// every call is atomic), under the store's deadline and breaker. A
    /// denial of the key in the local deny cache is dropped, since a
    /// refund may have made room. When a refund's call failed after Redis
    /// may have run it (a missed deadline, a connection lost on the way),
    /// the denial stops answering for Redis, and stands only while Redis
    /// cannot answer.
    ///
    /// # Errors
    ///
    /// As [`RedisStore::decide`].
    pub async fn settle_key(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: &Settlement,
    ) -> Result<Decision, RedisStoreError> {
        let inner = &*self.inner;
        let state_key = inner.names.state_key(policy, key);
        let sent_at = inner.local_now();
        let refund = settlement.refund() > 0;
        // A refund that failed or was dropped on its way may have run.
        let cache = &inner.deny_cache;
        let uncertain = Uncertain::new(cache, &state_key, DenyCache::demote, refund);
        let settled = self.settled(policy, &state_key, settlement).await;
        uncertain.came_back(&settled);
        let decision = settled?;
        // A refund may have made room; a charge moved the end of the
        // denial, which the cached one would answer unchanged.
        inner.deny_cache.remove(&state_key);
        // A refund or a charge of a key kept under another configuration
        // may have changed nothing (see `lua/lib/carry.lua`): its decision
        // replaces no record of that configuration.
        let known = &inner.last_known;
        match (refund, settlement.charge() > 0) {
            (true, _) => known.refresh(&state_key, policy, &decision, sent_at),
            (false, true) => known.charged(&state_key, policy, &decision, sent_at),
            (false, false) => known.record(&state_key, policy, &decision, sent_at),
        }
        Ok(decision)
    }

    /// [`RedisStore::settle_key`]'s call.
    async fn settled(
        &self,
        policy: &Policy,
        state_key: &str,
        settlement: &Settlement,
    ) -> Result<Decision, RedisStoreError> {
        let inner = &*self.inner;
        let wire = &inner.wire;
        Ok(match Form::word_of(policy) {
            Some(form) => {
                let args = settle_args(form, policy, settlement);
                let call = wire.settle_word(form, state_key, policy, &args);
                let (now, word) = inner.gated(state_key, call).await?;
                decision(form, policy, now, word, WordOp::Settle(settlement))
                    .ok_or_else(|| RedisStoreError::Protocol("no decision".into()))?
            }
            None => {
                let request = match policy.params().first() {
                    Some(_) => settle_request(settlement),
                    None => "0".to_owned(),
                };
                let call = wire.settle_general(state_key, policy, &request);
                inner.gated(state_key, call).await?
            }
        })
    }
}

/// What a settlement sends a word script for `policy` (see the scripts'
/// headers: `tat.lua`, `window_word.lua`).
fn settle_args(form: &dyn WordForm, policy: &Policy, settlement: &Settlement) -> SettleArgs {
    match policy.params().first() {
        Some(p) => form.settle_args(p.interval_us, p.period_us, settlement),
        None => SettleArgs::none(),
    }
}

impl<C: RedisConnection> Wire<C> {
    /// Sends a settlement of a key of a word form, alone: the key's word
    /// before it.
    pub(crate) async fn settle_word(
        &self,
        form: &dyn WordForm,
        key: &str,
        policy: &Policy,
        args: &SettleArgs,
    ) -> Result<Word, RedisStoreError> {
        let script = form.settle_script(&self.scripts);
        let (now, min_ttl_ms) = self.test_time();
        let request = form.arg(args.mark, args.period, args.step, args.slack, policy);
        let bytes = 128 + 2 * key.len() + policy.state_descriptor().len();
        let sent_local = self.local_now();
        let reply = self
            .eval(key, script, (7, bytes), |cmd| {
                cmd.arg(2).arg(key).arg(fence_key(key)).arg(&request);
                if now > 0 {
                    cmd.arg(now).arg(min_ttl_ms);
                }
            })
            .await?;
        self.read((now, sent_local), |reading| words_at(&reply, 1, reading))?
            .first()
            .copied()
            .ok_or_else(|| RedisStoreError::Protocol("no word in the reply".into()))
    }
}
