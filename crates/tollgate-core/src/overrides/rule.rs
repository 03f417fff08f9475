//! [`Override`]: what an operator changes about one key's limits under
//! one policy, its text form, and what it makes of the policy.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::builder::IntoLimit;
use crate::error::ConfigError;
use crate::limit::Limit;
use crate::policy::Policy;

/// What an override does to one key under one policy: its own limits
/// (raise or lower), exempt, or deny. Set through an
/// [`OverrideStore`](crate::OverrideStore), with an optional expiry.
///
/// - [`Limits`](Override::Limits): the key is limited by these limits
///   (and burst) under the policy's algorithm and **name**. The name is the
///   identity of the key's state, so the key keeps what it used: raising
///   100/min to 1000/min mid-window gives it room, not a fresh quota, and
///   clearing the override carries its use back to the plan's limits.
/// - [`Exempt`](Override::Exempt): never refused, and not counted: the
///   request skips the store (no round trip), its response carries no
///   rate-limit headers (there is no limit to tell of), and the key's
///   state under the policy is left as it was, so it resumes there when
///   the exemption ends. To keep counting a tenant (for usage), raise its
///   limit instead. Not refused by an operator's block either, which
///   lives in the store: to shut an exempt key out, set a `deny` in the
///   exemption's place.
/// - [`Deny`](Override::Deny): always refused, consuming nothing, with
///   **403 Forbidden** (gRPC `PERMISSION_DENIED`), not 429: the refusal is
///   an operator's decision, not a rate, and a client that retries a 429
///   by itself must not retry this. Its problem body says the key is
///   denied by an operator and, for a deny that expires, when; its
///   `Retry-After` is the rest of the deny (none for a deny without expiry).
///
/// Its text form (for configuration, admin endpoints, and the Redis store)
/// is `exempt`, `deny`, or the limits separated by spaces, then perhaps
/// `burst N`:
///
/// ```
/// use tollgate_core::{Algorithm, Override, Policy};
///
/// let raised: Override = "1000/min 50/s burst 60".parse()?;
/// assert_eq!(raised.to_string(), "1000/min 50/s burst 60");
/// assert_eq!("exempt".parse::<Override>()?, Override::Exempt);
/// assert_eq!(Override::limit("10/h")?.to_string(), "10/h");
///
/// // Checked against the policy it will apply to: a fixed window has no burst.
/// let api = Policy::new("api", Algorithm::FixedWindow, "100/min")?;
/// let err = raised.check(&api).unwrap_err();
/// assert_eq!(err.to_string(), "algorithm fixed_window has no burst setting (only token_bucket, leaky_bucket and gcra do)");
/// assert!("often".parse::<Override>().is_err());
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Override {
    /// The key's own limits, all of which must hold, and its burst (by
    /// default, as for a policy, each limit's count).
    Limits {
        /// The limits.
        limits: Vec<Limit>,
        /// The burst, for the algorithms that have one.
        burst: Option<u64>,
    },
    /// Never refused, not counted.
    Exempt,
    /// Always refused, with 403.
    Deny,
}

impl Override {
    /// An override of one limit, without a burst of its own.
    ///
    /// # Errors
    ///
    /// When `limit` does not describe a valid limit.
    pub fn limit(limit: impl IntoLimit) -> Result<Self, ConfigError> {
        Ok(Self::Limits {
            limits: vec![limit.into_limit()?],
            burst: None,
        })
    }

    /// Checks that the override can apply to `policy`: its limits, burst
    /// and the policy's algorithm make a valid policy.
    ///
    /// # Errors
    ///
    /// As [`PolicyBuilder::build`](crate::PolicyBuilder::build), for the
    /// policy of the override's limits under `policy`'s name and algorithm.
    pub fn check(&self, policy: &Policy) -> Result<(), ConfigError> {
        match self {
            Self::Limits { limits, burst } => limited(policy, limits, *burst).map(drop),
            Self::Exempt | Self::Deny => Ok(()),
        }
    }
}

/// The policy of `limits` and `burst`, under `base`'s name, algorithm and
/// calendar: a monthly quota in Berlin stays a month in Berlin.
pub(super) fn limited(
    base: &Policy,
    limits: &[Limit],
    burst: Option<u64>,
) -> Result<Policy, ConfigError> {
    let mut builder = Policy::builder(base.name()).algorithm(base.algorithm());
    if let Some(calendar) = base.calendar() {
        builder = builder.calendar(calendar);
    }
    for &limit in limits {
        builder = builder.limit(limit);
    }
    if let Some(burst) = burst {
        builder = builder.burst(burst);
    }
    builder.build()
}

impl fmt::Display for Override {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exempt => f.write_str("exempt"),
            Self::Deny => f.write_str("deny"),
            Self::Limits { limits, burst } => {
                for (i, limit) in limits.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    write!(f, "{limit}")?;
                }
                match burst {
                    Some(burst) => write!(f, " burst {burst}"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl FromStr for Override {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let input = input.trim();
        match input {
            "exempt" => return Ok(Self::Exempt),
            "deny" => return Ok(Self::Deny),
            _ => {}
        }
        let mut words = input.split_ascii_whitespace();
        let mut limits = Vec::new();
        let mut burst = None;
        while let Some(word) = words.next() {
            if word == "burst" {
                let count = words.next().and_then(|n| n.parse().ok());
                let (Some(count), None) = (count, words.next()) else {
                    return Err(invalid(input));
                };
                burst = Some(count);
                break;
            }
            limits.push(word.parse::<Limit>()?);
        }
        if limits.is_empty() {
            return Err(invalid(input));
        }
        Ok(Self::Limits { limits, burst })
    }
}

fn invalid(input: &str) -> ConfigError {
    ConfigError::InvalidValue {
        setting: "override",
        value: input.to_owned(),
        reason: "expected exempt, deny, or limits such as \"1000/min 50/s\", then perhaps \"burst N\"",
    }
}

/// What an override in force makes of a request under a policy: what
/// [`OverrideSource::applied`](crate::OverrideSource::applied) answers.
#[derive(Debug, Clone)]
pub enum Applied {
    /// Decide under this policy: the policy's name and algorithm, the
    /// key's own limits.
    Limits(Policy),
    /// Let the request through without asking the store.
    Exempt,
    /// Refuse the request.
    Deny {
        /// How long the deny lasts still, if it expires.
        ends_in: Option<Duration>,
    },
    /// Not known yet: the source has yet to hear what applies to this key.
    /// A caller that can wait awaits
    /// [`OverrideSource::first_answer`](crate::OverrideSource::first_answer)
    /// (there may be none, if the answer came in meanwhile) and asks
    /// again; one that cannot decides under the policy as it is.
    ///
    /// Deciding a key that has limits of its own under its plan's carries
    /// the key's state over to the plan's limits, and a limit of its own
    /// whose period the plan lacks starts afresh after that: waiting is
    /// what keeps a restarted instance from giving the key a fresh quota.
    Pending,
}
