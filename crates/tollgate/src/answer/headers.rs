//! Rate-limit response headers.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tollgate_core::{Algorithm, Decision, Policy};

use super::ietf::{ietf_values, next_unit};
use super::numbers::{SMALL, number};
use super::prebuilt::{self, Window};
use super::wait::{Wait, retry_after_secs, write_retry_after};

/// `x-ratelimit-limit`: capacity of the binding limit.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `x-ratelimit-remaining`: requests the binding limit still admits now.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `x-ratelimit-used`: `limit - remaining`.
pub const X_RATELIMIT_USED: HeaderName = HeaderName::from_static("x-ratelimit-used");
/// `x-ratelimit-reset`: when the binding limit is fully back, in UTC epoch
/// seconds, rounded up.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `x-ratelimit-resource`: the policy's name.
pub const X_RATELIMIT_RESOURCE: HeaderName = HeaderName::from_static("x-ratelimit-resource");

/// `tollgate-exceeded`, on a refusal only: the policy and the limit of
/// it that fired, as `<policy>; limit=<limit>` (`api; limit=10/s`), or
/// `<policy>; blocked` for a key an operator blocked, in every header
/// style and in gRPC metadata.
pub const TOLLGATE_EXCEEDED: HeaderName = HeaderName::from_static("tollgate-exceeded");

/// `RateLimit-Policy` (IETF draft): every limit of the policy.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF draft): every limit's remaining quota.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// GitHub's five `x-ratelimit-*` headers (the default), as GitHub sends
    /// them, for the binding limit: `x-ratelimit-limit`, `-remaining`,
    /// `-used` (`limit - remaining`), `-reset` and `-resource`. When several
    /// layers limit one route (per IP, then per user), the headers describe
    /// the one with the fewest requests remaining (of layers left with
    /// none, the one whose quota is fully back the latest), and a 429's
    /// `Retry-After` waits until every layer that admitted the request and
    /// was left with none admits again (but a layer in shadow mode, which
    /// refuses nothing).
    ///
    /// Remaining counts units, as costs do. A request refused for costing
    /// more than remains is told what remains (`x-ratelimit-remaining: 2`
    /// for a request of cost 4, say), and one that costs more than the
    /// capacity is told its key's state as it is. GitHub's clients read
    /// GitHub's requests of cost 1: octokit's throttling plugin retries a
    /// refusal as a primary limit only when remaining is `0`, so it does
    /// not retry the first (its `Retry-After` says when it would pass),
    /// and retries the second once its key is back, in vain, when its key
    /// has none left.
    #[default]
    GitHub,
    /// The same as [`HeaderStyle::GitHub`], which sends all five of
    /// GitHub's headers again.
    #[deprecated(note = "the same as `HeaderStyle::GitHub`, which sends all five headers")]
    GitHubFull,
    /// The IETF draft's (draft-ietf-httpapi-ratelimit-headers-10)
    /// `RateLimit-Policy` and `RateLimit` structured fields, with one item
    /// per limit of the policy:
    ///
    /// ```text
    /// RateLimit-Policy: "search-0";q=25;w=5, "search-1";q=300;w=60
    /// RateLimit: "search-0";r=0;t=3, "search-1";r=290;t=42
    /// ```
    ///
    /// Items are named after the policy, with `-<index>` when it has several
    /// limits. `q` is the capacity, `w` the period in seconds (rounded up),
    /// `r` the remaining quota and `t` the seconds until more quota is
    /// available (rounded up; 0 while none is used): for a limit with none
    /// left, when a request denied would be admitted; otherwise when the
    /// next unit comes back (a token bucket, leaky bucket or GCRA limit
    /// gives one back every period divided by its count; a fixed window all
    /// at its end; a sliding window or log is counted to when it is fully
    /// back, the stores telling nothing sooner).
    Ietf,
    /// [`HeaderStyle::GitHub`] and [`HeaderStyle::Ietf`].
    Both,
    /// No rate-limit headers. Rejections still carry `Retry-After` (a
    /// layer of this style leaves a nearer layer's as it is).
    None,
}

/// What a response's rate-limit headers need, taken when the decision is
/// made: the figures of the decision, and the style and the policy's values
/// to write them with. An admitted request's response future carries this
/// (56 bytes) until the inner service answers, rather than the whole
/// decision (120) and the layer's settings: the future is moved several
/// times on its way to being polled, and every move copies it, and holding
/// the settings would cost a reference count per request.
#[derive(Debug)]
pub(crate) struct Decoration {
    limit: u64,
    remaining: u64,
    reset_secs: u64,
    /// When this layer admits a request again, if the decision left its
    /// binding limit empty; else none.
    empty_for: Wait,
    /// Whether the layer enforces its limit for the key (not in shadow
    /// mode), for an admitted request: a settlement's decoration is made
    /// so too. (A denial's is made as enforced; it raises nothing.)
    pub(crate) enforce: bool,
    style: HeaderStyle,
    values: Values,
    /// `RateLimit-Policy` and `RateLimit`, when the style sends them: made
    /// at once, since they are formatted (and allocate) anyway.
    ietf: Option<Box<[HeaderValue; 2]>>,
}

impl Decoration {
    /// The headers of `style` for `decision` under the policy `policy`,
    /// whose values are `values`, or `None` for a style that sends none;
    /// made by a layer that `enforce`s its limit for the key (not in
    /// shadow mode: see [`Decoration::raise_wait`]).
    pub(crate) fn new(
        style: HeaderStyle,
        decision: &Decision,
        policy: &str,
        values: &Values,
        enforce: bool,
    ) -> Option<Self> {
        #[allow(deprecated)] // `GitHubFull`, kept for its users, is `GitHub`
        let ietf = match style {
            HeaderStyle::Ietf | HeaderStyle::Both => {
                ietf_values(decision, policy, values.drains).map(Box::new)
            }
            HeaderStyle::GitHub | HeaderStyle::GitHubFull => None,
            HeaderStyle::None => return None,
        };
        let binding = decision.binding();
        // Of a request admitted by a layer that enforces its limit only: a
        // denial's own refusal tells its wait, and a layer in shadow mode
        // refuses nothing. The layer admits a request of this one's cost
        // (at least 1: a store of another crate may not report it) again
        // when every limit it left short has room for it.
        let cost = decision.cost().max(1);
        let empty_for = match enforce && decision.is_allowed() {
            true => (decision.limits().iter())
                .filter(|s| s.remaining() < cost)
                .map(|s| next_unit(s, values.drains, cost))
                .max()
                .filter(|wait| !wait.is_zero())
                .map_or(Wait::NONE, Wait::of),
            false => Wait::NONE,
        };
        Some(Self {
            limit: binding.capacity(),
            remaining: binding.remaining(),
            reset_secs: (decision.now() + binding.reset()).as_secs_ceil(),
            empty_for,
            enforce,
            style,
            values: values.clone(),
            ietf,
        })
    }

    /// Whether a quota fully back at `reset_secs` is back later than the
    /// nearer layer's whose GitHub headers `headers` holds (or theirs
    /// cannot be read).
    #[cold]
    fn back_later(reset_secs: u64, headers: &HeaderMap) -> bool {
        let reset = headers
            .iter()
            .find(|(name, _)| **name == X_RATELIMIT_RESET)
            .and_then(|(_, value)| value.to_str().ok()?.parse::<u64>().ok());
        reset.is_none_or(|reset| reset < reset_secs)
    }

    /// A nearer layer's refusal (a 429 or a 503, with its `Retry-After`;
    /// or gRPC's `RESOURCE_EXHAUSTED` or `UNAVAILABLE`, with its pushback,
    /// `RetryInfo` and message too) of a request this layer admitted and
    /// left short of another of its cost waits at least until this layer
    /// admits such a request again: the client would meet this one's
    /// refusal next. An HTTP refusal's body, which the layer does not
    /// read, keeps the wait its text tells.
    #[inline]
    pub(crate) fn raise_wait<B>(&self, response: &mut http::Response<B>) {
        if self.empty_for != Wait::NONE {
            raise_wait(response, self.empty_for.get());
        }
    }

    /// Writes the headers into `headers`. When a nearer layer already wrote
    /// GitHub headers, they are replaced only if this decision leaves fewer
    /// requests, or none as theirs but is fully back later.
    pub(crate) fn write(self, headers: &mut HeaderMap) {
        let values = &*self.values;
        if let Some(values) = self.ietf {
            // Appended: stacked layers each add their items, and field
            // lines of a structured list combine into one list.
            let [policy, state] = *values;
            headers.append(RATELIMIT_POLICY, policy);
            headers.append(RATELIMIT, state);
        }
        #[allow(deprecated)] // `GitHubFull`, kept for its users, is `GitHub`
        match self.style {
            HeaderStyle::GitHub | HeaderStyle::GitHubFull | HeaderStyle::Both => {}
            HeaderStyle::Ietf | HeaderStyle::None => return,
        }
        // Room for the five headers and one more: axum adds `content-length`
        // after the layer. A map that must grow then grows now, once, while
        // it holds a header or two, rather than later, when every entry it
        // holds would be moved and re-indexed. (A response with a body
        // holds seven headers then, one more than `http`'s first allocation
        // of a map has room for: the growth is the price of GitHub's fifth
        // header.)
        headers.reserve(6);
        // Stacked layers (per IP, then per user) all decorate one response:
        // the GitHub headers describe the tightest of them. A nearer
        // layer's figure is looked for by comparing names, not by a lookup,
        // which hashes the name byte by byte: a response holds few headers,
        // and most names differ from this one in length.
        // A nearer layer's figure that cannot be read is replaced.
        // (Against the constant name itself: compared with a name behind a
        // reference, each header cost a whole comparison.)
        let nearer = headers
            .iter()
            .find(|(name, _)| **name == X_RATELIMIT_REMAINING)
            .and_then(|(_, value)| value.to_str().ok()?.parse::<u64>().ok());
        if let Some(nearer) = nearer {
            // Of two layers left empty, the one fully back later binds.
            let fewer = nearer > self.remaining
                || (nearer == 0
                    && self.remaining == 0
                    && Self::back_later(self.reset_secs, headers));
            if !fewer {
                return;
            }
        }
        // In GitHub's order.
        headers.insert(X_RATELIMIT_LIMIT, values.limit(self.limit));
        headers.insert(X_RATELIMIT_REMAINING, values.remaining(self.remaining));
        // `used` is the binding limit's capacity less what remains.
        headers.insert(
            X_RATELIMIT_USED,
            number(self.limit.saturating_sub(self.remaining)),
        );
        headers.insert(X_RATELIMIT_RESET, epoch_secs(self.reset_secs));
        if let Some(name) = &values.name {
            headers.insert(X_RATELIMIT_RESOURCE, name.clone());
        }
    }
}

/// Raises the wait a refusal in `response` tells, if it is one (a 429 or a
/// 503, or their gRPC codes, or a layer's refusal in its own rejection
/// status, a 403 say, which `tollgate-exceeded` marks) and tells a
/// shorter one, to `wait`: its
/// `Retry-After` in whole seconds (one that is not a number of seconds, a
/// date the app set, is left as it is), and a gRPC refusal's pushback and
/// `RetryInfo`, to the millisecond.
#[cold]
fn raise_wait<B>(response: &mut http::Response<B>, wait: Duration) {
    match super::grpc::http_status(response) {
        http::StatusCode::TOO_MANY_REQUESTS | http::StatusCode::SERVICE_UNAVAILABLE => {}
        _ if response.headers().contains_key(TOLLGATE_EXCEEDED) => {}
        _ => return,
    }
    let grpc = response.status() == http::StatusCode::OK;
    let headers = response.headers_mut();
    let secs = retry_after_secs(wait);
    let told = headers.get(http::header::RETRY_AFTER);
    let told = told.and_then(|t| t.to_str().ok()?.parse::<u64>().ok());
    let later = told.is_some_and(|told| told < secs);
    if later {
        headers.insert(http::header::RETRY_AFTER, number(secs));
    }
    if grpc {
        super::grpc::wait_longer(headers, wait);
    }
}

/// A policy's [`PolicyValues`]: kept for good (copied without a reference
/// count) where the budget of `prebuilt` allows, made otherwise.
#[derive(Debug, Clone)]
pub(crate) enum Values {
    Kept(&'static PolicyValues),
    Made(Arc<PolicyValues>),
}

impl Values {
    /// The values of `policy`, kept for good where the budget allows.
    pub(crate) fn of(policy: &Policy) -> Self {
        let name = policy.name();
        let capacities: Vec<u64> = policy.params().iter().map(|p| p.capacity).collect();
        // Everything the values are made of, each field set apart.
        let algorithm = policy.algorithm();
        let key = format!("policy values\0{name}\0{capacities:?}\0{algorithm}");
        let held = name.len() + capacities.len() * std::mem::size_of::<LimitValues>();
        match prebuilt::keep(&key, held, || PolicyValues::of(policy)) {
            Some(kept) => Values::Kept(kept),
            None => Values::Made(Arc::new(PolicyValues::of(policy))),
        }
    }

    /// The values of a policy of that name, made now, with no limit made
    /// ahead: for headers written outside a layer.
    pub(crate) fn named(name: &str) -> Self {
        Values::Made(Arc::new(PolicyValues::named(name)))
    }
}

impl std::ops::Deref for Values {
    type Target = PolicyValues;

    fn deref(&self) -> &PolicyValues {
        match self {
            Values::Kept(values) => values,
            Values::Made(values) => values,
        }
    }
}

/// The header values a policy's responses repeat, made once per layer (and
/// per policy a chooser picks): the name (`x-ratelimit-resource`), the
/// capacity of each limit (`x-ratelimit-limit`), and the numbers just
/// below each large capacity (the `x-ratelimit-remaining` of a key that
/// has used little of it), over static bytes where the budget of
/// `prebuilt` allows.
#[derive(Debug)]
pub(crate) struct PolicyValues {
    name: Option<HeaderValue>,
    limits: Box<[LimitValues]>,
    /// Whether the policy's limits give one unit back every interval (the
    /// rate-based algorithms), so that the IETF `t` of a limit left empty
    /// tells when the next one comes back rather than when all of them
    /// have. `false` where the policy is not known.
    drains: bool,
}

/// The values of one limit's capacity.
#[derive(Debug)]
struct LimitValues {
    capacity: u64,
    value: HeaderValue,
    /// The numbers just below it, for a capacity of [`SMALL`] and more
    /// (smaller numbers are static anyway).
    below: Option<Window>,
}

impl PolicyValues {
    /// The values of a policy of that name, with no limit made ahead.
    fn named(name: &str) -> Self {
        Self {
            name: shared_value(name.as_bytes()),
            limits: Box::default(),
            drains: false,
        }
    }

    /// The values of `policy`, over static bytes within the budget.
    fn of(policy: &Policy) -> Self {
        let mut limits: Vec<LimitValues> = Vec::new();
        for capacity in policy.params().iter().map(|params| params.capacity) {
            if limits.iter().any(|known| known.capacity == capacity) {
                continue;
            }
            let below = (capacity >= SMALL)
                .then(|| Window::below(capacity))
                .flatten();
            let value = match below.and_then(|below| below.get(capacity)) {
                Some(value) => value,
                None if capacity < SMALL => number(capacity),
                None => match shared_value(itoa::Buffer::new().format(capacity).as_bytes()) {
                    Some(value) => value,
                    None => continue,
                },
            };
            limits.push(LimitValues {
                capacity,
                value,
                below,
            });
        }
        let name = policy.name();
        let drains = match policy.algorithm() {
            Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket => true,
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => false,
        };
        Self {
            name: prebuilt::value(name).or_else(|| shared_value(name.as_bytes())),
            limits: limits.into_boxed_slice(),
            drains,
        }
    }

    /// `x-ratelimit-limit` for a limit of `capacity`: the policy's own
    /// value, or one written now for any other (the share of a limit that
    /// the local fallback decides by, say).
    fn limit(&self, capacity: u64) -> HeaderValue {
        match self.limits.iter().find(|known| known.capacity == capacity) {
            Some(known) => known.value.clone(),
            None => number(capacity),
        }
    }

    /// `x-ratelimit-remaining`: prebuilt when it is just below one of the
    /// policy's capacities, written now otherwise.
    fn remaining(&self, remaining: u64) -> HeaderValue {
        if remaining >= SMALL {
            let prebuilt = self
                .limits
                .iter()
                .find_map(|known| known.below?.get(remaining));
            if let Some(value) = prebuilt {
                return value;
            }
        }
        number(remaining)
    }
}

/// `text` as a header value whose clones share one buffer, or `None` if
/// it cannot be one.
fn shared_value(text: &[u8]) -> Option<HeaderValue> {
    let bytes = Bytes::copy_from_slice(text);
    // The first clone of a `Bytes` made from a vector moves it into a
    // shared, reference-counted buffer; do it now rather than per response.
    drop(bytes.clone());
    HeaderValue::from_maybe_shared(bytes).ok()
}

/// An epoch-seconds header value, reusing this thread's last one when the
/// second is the same: responses within a second share one buffer.
fn epoch_secs(secs: u64) -> HeaderValue {
    thread_local! {
        static LAST: std::cell::RefCell<(u64, HeaderValue)> =
            const { std::cell::RefCell::new((u64::MAX, HeaderValue::from_static(""))) };
    }
    LAST.with(|last| match last.try_borrow_mut() {
        Ok(mut last) => {
            if last.0 != secs {
                let value = HeaderValue::from(secs);
                // Make the buffer shared now, so clones do not allocate.
                drop(value.clone());
                *last = (secs, value);
            }
            last.1.clone()
        }
        Err(_) => HeaderValue::from(secs),
    })
}

/// Writes the rate-limit headers of `decision`, made under the policy named
/// `policy`, in `style`, as the layer writes them (but for the one
/// difference below), and
/// `Retry-After` when the decision denies: for code that decides outside
/// the layer, such as a middleware over [`RateLimiter`](crate::RateLimiter).
/// Known only by its name here, the policy's algorithm is not: the IETF
/// `t` of a limit that an admitted request used counts to when it is
/// fully back, where the layer counts to its next unit for the rate-based
/// algorithms.
///
/// ```
/// use http::HeaderMap;
/// use tollgate::headers::{self, HeaderStyle};
/// use tollgate::{Algorithm, Key, Policy, RateLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateLimiter::new(Policy::new("api", Algorithm::Gcra, "10/min")?);
/// let decision = limiter.check(&Key::user("ada")).await?;
/// let mut response_headers = HeaderMap::new();
/// headers::write(HeaderStyle::GitHub, &decision, "api", &mut response_headers);
/// assert_eq!(response_headers["x-ratelimit-remaining"], "9");
/// assert_eq!(response_headers["x-ratelimit-used"], "1");
/// assert_eq!(response_headers["x-ratelimit-resource"], "api");
/// # Ok(())
/// # }
/// ```
pub fn write(style: HeaderStyle, decision: &Decision, policy: &str, headers: &mut HeaderMap) {
    if !decision.is_allowed() {
        write_retry_after(decision, headers);
    }
    if let Some(decoration) = Decoration::new(style, decision, policy, &Values::named(policy), true)
    {
        decoration.write(headers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_seconds_are_reused_within_a_second_only() {
        assert_eq!(epoch_secs(1_795_341_660), "1795341660");
        assert_eq!(epoch_secs(1_795_341_660), "1795341660");
        assert_eq!(epoch_secs(1_795_341_661), "1795341661");
    }
}
