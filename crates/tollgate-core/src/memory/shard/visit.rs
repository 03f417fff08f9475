//! The work a shard does on a key in the form of its policy's shape:
//! decide, settle, seed, and take a key's state under another
//! configuration.

use crate::decision::Decision;
use crate::error::StoreError;
use crate::memory::form::{Form, KeyHash, Visit};
use crate::policy::Policy;
use crate::settle::Settlement;
use crate::state::PolicyState;
use crate::time::Timestamp;

use super::{Shard, Shared};

pub(super) type Decided = Result<Decision, StoreError>;

pub(super) struct Check<'a> {
    pub(super) shared: &'a Shared,
    pub(super) shard: &'a mut Shard,
    pub(super) base: KeyHash,
    pub(super) now: Timestamp,
    pub(super) cost: u64,
}

impl Visit for Check<'_> {
    type Out = Decided;

    #[inline(always)]
    fn visit<F: Form>(self, policy: &Policy) -> Decided {
        // A block forgets the key under the configurations of the name the
        // store lists, at most `MAX_CONFIGS`: state kept under one it
        // forgot since (more configurations, such as per-key overrides,
        // came) outlives the block, so a shard that holds a block looks it
        // up for held keys too. Blocks are rare: the rest pay a length.
        if !self.shard.maps.blocks.is_empty()
            && let Some(blocked) = self.shard.blocked(self.base, policy, self.now)
        {
            return Ok(blocked);
        }
        let hash = self.base ^ policy.config_mix();
        match F::map(&mut self.shard.maps).get_mut(&hash) {
            Some(held) => Ok(F::decide(held, policy, self.now, self.cost)),
            None => self.new_key::<F>(policy),
        }
    }
}

impl Check<'_> {
    /// Decides for a key the shard holds nothing of under `policy`: carried
    /// over from another configuration, or new. Out of line, to keep the
    /// check of a held key short.
    #[inline(never)]
    fn new_key<F: Form>(self, policy: &Policy) -> Decided {
        if let Some(blocked) = self.shard.blocked(self.base, policy, self.now) {
            return Ok(blocked);
        }
        let carried = self
            .shard
            .other(self.shared, self.base, policy, self.now, false)
            .map(|(state, _)| state);
        let (decision, held, expires_at) = F::decide_new(carried, policy, self.now, self.cost);
        // A peek, or a request that can never be admitted, leaves nothing to keep.
        if expires_at > self.now.as_micros() {
            let hash = self.base ^ policy.config_mix();
            self.shard
                .admit::<F>(self.shared, self.now, hash, held, expires_at)?;
        }
        Ok(decision)
    }
}

pub(super) struct Settle<'a> {
    pub(super) shared: &'a Shared,
    pub(super) shard: &'a mut Shard,
    pub(super) base: KeyHash,
    pub(super) now: Timestamp,
    pub(super) settlement: &'a Settlement,
}

impl Visit for Settle<'_> {
    type Out = Decided;

    fn visit<F: Form>(self, policy: &Policy) -> Decided {
        let hash = self.base ^ policy.config_mix();
        // A refund behind a reset's or a block's fence settles nothing.
        let nothing;
        let settlement = if self.shard.fenced(self.base, self.now, self.settlement) {
            nothing = self.settlement.behind_fence();
            &nothing
        } else {
            self.settlement
        };
        if let Some(held) = F::map(&mut self.shard.maps).get_mut(&hash) {
            let before = F::expires_at(held);
            let decision = F::settle(held, policy, self.now, settlement);
            // A refund can bring the key's expiry forward.
            let expires_at = F::expires_at(held);
            if expires_at < before {
                self.shard.expires(self.now.as_micros(), expires_at);
            }
            return Ok(decision);
        }
        if let Some(blocked) = self.shard.blocked(self.base, policy, self.now) {
            return Ok(blocked);
        }
        // A refund or a charge of a key kept under a configuration that
        // does not carry over to the settlement's whole (a plan, an
        // override or a deploy the key has moved on from) changes nothing:
        // carrying the key over would drop what its own limits hold. It
        // reports the key's state as the settlement's configuration reads
        // it.
        let changes = self.settlement.refund() > 0 || self.settlement.charge() > 0;
        let other = self
            .shard
            .other(self.shared, self.base, policy, self.now, changes);
        let state = match other {
            Some((state, false)) => state,
            Some((state, true)) => {
                let (mut held, _) = F::hold(state, policy);
                let nothing = settlement.unchanged();
                return Ok(F::settle(&mut held, policy, self.now, &nothing));
            }
            None => PolicyState::new(policy, self.now),
        };
        // In the form it is kept in first, then settled, as the Redis
        // scripts do: a compact form bounds what it holds (a window word
        // its count), and the bound applies before the settlement.
        let (mut held, _) = F::hold(state, policy);
        let decision = F::settle(&mut held, policy, self.now, settlement);
        let expires_at = F::expires_at(&held);
        if expires_at > self.now.as_micros() {
            self.shard
                .admit::<F>(self.shared, self.now, hash, held, expires_at)?;
        }
        Ok(decision)
    }
}

pub(super) struct Seed<'a> {
    pub(super) shared: &'a Shared,
    pub(super) shard: &'a mut Shard,
    pub(super) base: KeyHash,
    pub(super) now: Timestamp,
    pub(super) state: PolicyState,
}

impl Visit for Seed<'_> {
    type Out = Result<(), StoreError>;

    fn visit<F: Form>(self, policy: &Policy) -> Self::Out {
        let mut state = self.state;
        state.carry_to(policy, self.now);
        let hash = self.base ^ policy.config_mix();
        if self.shard.blocked(self.base, policy, self.now).is_some() {
            return Ok(());
        }
        let map = F::map(&mut self.shard.maps);
        if let Some(taken) = map.remove(&hash) {
            // Held already (this fallback decided the key before, in this
            // failure or an earlier one): each limit keeps the more used
            // of the two, so that neither what the store counted since an
            // earlier failure nor what was admitted here is forgotten.
            let merged = match F::state(taken, policy, self.now) {
                Some(held) => held.more_used(state, policy, self.now),
                None => state,
            };
            let (held, expires_at) = F::hold(merged, policy);
            map.insert(hash, held);
            self.shard.expires(self.now.as_micros(), expires_at);
            return Ok(());
        }
        // Held under another configuration (a failure's local share before
        // the instance count changed, say): carried over, as a check
        // carries it, and merged the same way, so that what this fallback
        // admitted under it is not forgotten.
        let carried = self
            .shard
            .other(self.shared, self.base, policy, self.now, false);
        let state = match carried {
            Some((carried, _)) => carried.more_used(state, policy, self.now),
            None => state,
        };
        let (held, expires_at) = F::hold(state, policy);
        if expires_at <= self.now.as_micros() {
            return Ok(());
        }
        self.shard
            .admit::<F>(self.shared, self.now, hash, held, expires_at)
    }
}

/// Takes a key's state under another configuration out of the shard, or
/// (`keep`) a copy of it, leaving it held.
pub(super) struct Take<'a> {
    pub(super) shard: &'a mut Shard,
    pub(super) hash: KeyHash,
    pub(super) now: Timestamp,
    pub(super) keep: bool,
}

impl Visit for Take<'_> {
    type Out = Option<PolicyState>;

    fn visit<F: Form>(self, policy: &Policy) -> Self::Out {
        let map = F::map(&mut self.shard.maps);
        let held = match self.keep {
            true => map.get(&self.hash)?.clone(),
            false => map.remove(&self.hash)?,
        };
        F::state(held, policy, self.now)
    }
}
