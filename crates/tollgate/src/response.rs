//! The settings a layer answers with (`Responder`), shared by its services;
//! what the answers say is made in `answer/`.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{Response, StatusCode};
use tollgate_core::{Decision, Key, Policy};

use crate::answer::StoreRefusal;
use crate::answer::headers::{Decoration, HeaderStyle, Values};
use crate::answer::{self, MissingKey, Protocol};
use crate::extract::MissingCause;
use crate::report::{Chosen, Reporter, Telemetry, Verdict};

pub(crate) type CustomRejection = Arc<dyn Fn(&Decision) -> Response<Bytes> + Send + Sync>;

/// Builds the responses the layer answers by itself.
#[derive(Clone)]
pub(crate) struct Responder {
    pub(crate) headers: HeaderStyle,
    pub(crate) status: StatusCode,
    pub(crate) custom: Option<CustomRejection>,
    pub(crate) missing: MissingKey,
    /// Whether answers are HTTP problems or gRPC statuses.
    pub(crate) protocol: Protocol,
    /// The percentage of keys whose denials are enforced; the others run
    /// in shadow mode.
    pub(crate) enforce_percent: u8,
    /// Shared by every service of one layer, so throttling holds across them.
    pub(crate) telemetry: Arc<Telemetry>,
    /// The telemetry of the policies a chooser picks, shared likewise.
    chosen: Arc<Chosen>,
    /// The policy's header values, made once.
    pub(crate) values: Values,
    pub(crate) policy: Arc<str>,
    /// The name of the store a rate-limit layer asks (`Store::name`), for
    /// traces: set when the layer makes a service.
    pub(crate) store: &'static str,
}

impl Responder {
    /// The responder of the policy named `policy`, whose header values are
    /// `values`.
    pub(crate) fn new(policy: &str, values: Values) -> Self {
        Self::with_telemetry(policy, values, Telemetry::new(policy))
    }

    fn with_telemetry(policy: &str, values: Values, telemetry: Telemetry) -> Self {
        Self {
            headers: HeaderStyle::default(),
            status: StatusCode::TOO_MANY_REQUESTS,
            custom: None,
            missing: MissingKey::default(),
            protocol: Protocol::Http,
            enforce_percent: 100,
            telemetry: Arc::new(telemetry),
            chosen: Arc::default(),
            values,
            policy: Arc::from(policy),
            store: "memory",
        }
    }

    /// The responder of `policy`: its header values, and its metrics with
    /// near-limit counts per limit.
    pub(crate) fn of(policy: &Policy) -> Self {
        Self::with_telemetry(policy.name(), Values::of(policy), Telemetry::of(policy))
    }

    /// This responder for requests a chooser put under `policy`: headers
    /// and problem bodies name it, and it counts in its own metrics.
    pub(crate) fn for_policy(&self, policy: &Policy) -> Self {
        Self {
            telemetry: self.chosen.of(policy),
            values: Values::of(policy),
            policy: Arc::from(policy.name()),
            ..self.clone()
        }
    }

    /// This responder for a key's own limits `own` (an override) under
    /// its policy: headers tell `own`'s limits; the metrics stay the
    /// policy's.
    pub(crate) fn with_values(&self, own: &Policy) -> Self {
        Self {
            values: Values::of(own),
            ..self.clone()
        }
    }

    /// The answer to a request of a key an operator's override denies,
    /// for `ends_in` still if it expires: 403 (see
    /// `answer::denied_by_operator`). Counted as `denied`.
    pub(crate) fn denied_by_operator(
        &self,
        ends_in: Option<std::time::Duration>,
    ) -> Response<Bytes> {
        self.telemetry.denied_by_operator();
        answer::denied_by_operator(&self.policy, ends_in, self.protocol)
    }

    /// Whether denials of `key` are enforced rather than shadowed.
    #[inline]
    pub(crate) fn enforces(&self, key: &Key) -> bool {
        match self.enforce_percent {
            100.. => true,
            0 => false,
            percent => ramp_bucket(key) < u64::from(percent),
        }
    }
}

/// A key's place on the enforcement ramp, 0 to 99: the same on every
/// machine and in every version, so a key enforced at 10% stays enforced
/// at 20%. (The same for the same key: a header value over 64 bytes
/// became another key, its digest, in the version that made it so.)
#[inline(never)]
fn ramp_bucket(key: &Key) -> u64 {
    // FNV-1a over the kind and the bytes, then a SplitMix64 finaliser to
    // spread FNV's weak low bits.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let kind = key.kind().as_str().as_bytes();
    for &byte in kind.iter().chain([0xff].iter()).chain(key.as_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^= hash >> 31;
    hash % 100
}

impl fmt::Debug for Responder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Responder")
            .field("headers", &self.headers)
            .field("status", &self.status)
            .field("custom", &self.custom.as_ref().map(|_| ".."))
            .field("missing", &self.missing)
            .field("protocol", &self.protocol)
            .field("enforce_percent", &self.enforce_percent)
            .field("store", &self.store)
            .finish()
    }
}

impl Responder {
    /// What the response to an admitted request will need for its headers
    /// (`None` when the layer sends none); `Decoration::write` adds them.
    #[inline]
    pub(crate) fn decoration(&self, decision: &Decision) -> Option<Decoration> {
        self.admitted_decoration(decision, true)
    }

    /// [`decoration`](Self::decoration) of a request admitted by a layer
    /// that `enforce`s its limit for the key, or lets it through in shadow
    /// mode (see `Decoration::raise_wait`).
    #[inline]
    pub(crate) fn admitted_decoration(
        &self,
        decision: &Decision,
        enforce: bool,
    ) -> Option<Decoration> {
        Decoration::new(self.headers, decision, &self.policy, &self.values, enforce)
    }

    /// Records a decision of the store, and what became of the request.
    #[inline]
    pub(crate) fn decided(&self, decision: &Decision, verdict: Verdict) {
        self.telemetry.decided(decision, verdict, self.store);
    }

    /// What the failure policy reports to.
    pub(crate) fn reporter(&self) -> Reporter<'_> {
        self.telemetry.reporter(self.store)
    }

    /// The response to a denied request.
    pub(crate) fn reject(&self, decision: &Decision) -> Response<Bytes> {
        let mut response = match &self.custom {
            Some(custom) => {
                let mut response = custom(decision);
                answer::mark_own(&mut response);
                response
            }
            None => self.problem(decision),
        };
        let headers = response.headers_mut();
        if !headers.contains_key(RETRY_AFTER) {
            answer::write_retry_after(decision, headers);
        }
        if let Some(decoration) = self.decoration(decision) {
            decoration.write(headers);
        }
        response
    }

    /// The layer's own answer to a denied request.
    fn problem(&self, decision: &Decision) -> Response<Bytes> {
        answer::denied(decision, &self.policy, self.status, self.protocol)
    }

    /// The response to a request without a key, unless it is let through:
    /// its status and the words the client reads follow `self.missing`
    /// and `cause`. Logged through the throttle.
    pub(crate) fn missing_key(&self, cause: &MissingCause) -> Response<Bytes> {
        self.telemetry.key_missing(cause);
        answer::missing_key(self.missing, cause, self.protocol)
    }

    /// The response to a request refused because the store failed.
    pub(crate) fn refused(&self, refusal: &StoreRefusal) -> Response<Bytes> {
        answer::refused(refusal, self.protocol)
    }
}
