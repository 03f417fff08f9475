//! The responders of the policies a chooser picks.

use std::sync::{Arc, PoisonError, RwLock};

use tollgate_core::Policy;

use crate::response::Responder;

/// The responders of the policies a chooser picks, made on first use and
/// kept by policy name: a fixed set of plans costs no allocation per
/// request.
pub(crate) struct Responders {
    own: Arc<Responder>,
    chosen: RwLock<Vec<Arc<Responder>>>,
    /// The responders of keys' own limits (overrides), by policy name and
    /// fingerprint.
    overridden: RwLock<Vec<(u64, Arc<Responder>)>>,
}

/// The most chosen policies whose responders are kept; beyond them (a
/// chooser that makes a policy per tenant, say), one is made per request.
const MAX_CHOSEN: usize = 256;

impl Responders {
    pub(crate) fn new(own: Arc<Responder>) -> Self {
        Self {
            own,
            chosen: RwLock::default(),
            overridden: RwLock::default(),
        }
    }

    /// The responder of requests under `policy`.
    pub(crate) fn of(&self, policy: &Policy) -> Arc<Responder> {
        let name = policy.name();
        if *self.own.policy == *name {
            return self.own.clone();
        }
        let chosen = self.chosen.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = chosen.iter().find(|r| *r.policy == *name) {
            return known.clone();
        }
        drop(chosen);
        let made = Arc::new(self.own.for_policy(policy));
        let mut chosen = self.chosen.write().unwrap_or_else(PoisonError::into_inner);
        if chosen.len() < MAX_CHOSEN {
            chosen.push(made.clone());
        }
        made
    }

    /// The responder of requests under `own`, a key's own limits under
    /// the policy `base` tells of: its headers tell `own`'s limits, and it
    /// counts in `base`'s metrics (the policy's name is the same).
    pub(crate) fn overridden(&self, base: &Arc<Responder>, own: &Policy) -> Arc<Responder> {
        let (name, fingerprint) = (own.name(), own.fingerprint());
        let made = self
            .overridden
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let known = made
            .iter()
            .find(|(f, r)| *f == fingerprint && *r.policy == *name);
        if let Some((_, known)) = known {
            return known.clone();
        }
        drop(made);
        let made = Arc::new(base.with_values(own));
        let mut kept = self
            .overridden
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if kept.len() < MAX_CHOSEN {
            kept.push((fingerprint, made.clone()));
        }
        made
    }
}
