//! Policies given on the command line.

use tollgate_core::{Algorithm, ConfigError, Policy};

/// Parses `[NAME=]ALGORITHM:LIMIT[+LIMIT...][@BURST]`, for example
/// `sliding_log:300/5min`, `api=gcra:10/s+500/h` or `tb=token_bucket:5/s@20`.
/// Without a name, the policy is named after the algorithm and limits.
///
/// ```
/// use tollgate_sim::parse_policy;
///
/// let p = parse_policy("search=sliding_log:2/s+100/h")?;
/// assert_eq!(p.name(), "search");
/// assert_eq!(p.limits().len(), 2);
/// assert!(parse_policy("gcra:0/s").is_err());
/// # Ok::<(), String>(())
/// ```
///
/// # Errors
///
/// A message naming the part that is wrong.
pub fn parse_policy(spec: &str) -> Result<Policy, String> {
    let (name, rest) = match spec.split_once('=') {
        Some((name, rest)) => (Some(name.trim()), rest),
        None => (None, spec),
    };
    let (algorithm, limits) = rest.split_once(':').ok_or_else(|| {
        format!("policy {spec:?}: expected [NAME=]ALGORITHM:LIMIT[+LIMIT...][@BURST]")
    })?;
    let algorithm: Algorithm = algorithm
        .trim()
        .parse()
        .map_err(|e: ConfigError| format!("policy {spec:?}: {e}"))?;
    let (limits, burst) = match limits.split_once('@') {
        Some((limits, burst)) => {
            let burst = burst
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("policy {spec:?}: invalid burst {burst:?}"))?;
            (limits, Some(burst))
        }
        None => (limits, None),
    };
    let default_name: String = format!("{algorithm}-{limits}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.:-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut builder = Policy::builder(name.map_or_else(|| short_name(default_name), str::to_owned))
        .algorithm(algorithm);
    for limit in limits.split('+') {
        builder = builder.limit(limit.trim());
    }
    if let Some(burst) = burst {
        builder = builder.burst(burst);
    }
    builder.build().map_err(|e| format!("policy {spec:?}: {e}"))
}

/// `name` if it is short enough for a policy's name, else its first part
/// and a hash of the whole (FNV-1a, the same on every run), so that a spec
/// of many limits given without a name is not refused for the name made
/// up for it.
fn short_name(name: String) -> String {
    // The longest name tollgate-core takes.
    const MAX: usize = 64;
    if name.len() <= MAX {
        return name;
    }
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{}-{hash:016x}", &name[..MAX - 17])
}
