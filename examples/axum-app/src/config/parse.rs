//! Reading a policy file: its global settings, then each route entry,
//! and no policy name used twice.

use std::collections::HashMap;
use std::num::NonZeroU64;

use tollgate::{ClientIp, FailureMode, HeaderStyle, UnknownFailureMode};

use super::overload::overload;
use super::raw::RawConfig;
use super::route::route;
use super::{AppConfig, ConfigFileError, RouteConfig};

impl AppConfig {
    /// Parses and checks a policy file.
    ///
    /// # Errors
    ///
    /// A [`ConfigFileError`] naming the field and the value at fault.
    pub fn parse(text: &str) -> Result<Self, ConfigFileError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigFileError(e.to_string()))?;
        let header_style = match raw.header_style.as_deref() {
            // `github_full` named the five headers when the default sent
            // four; it is kept for the files that say it.
            None | Some("github" | "github_full") => HeaderStyle::GitHub,
            Some("ietf") => HeaderStyle::Ietf,
            Some("both") => HeaderStyle::Both,
            Some("none") => HeaderStyle::None,
            Some(other) => {
                return Err(bad(
                    "header_style",
                    other,
                    "expected github, ietf, both or none",
                ));
            }
        };
        let failure = match raw.failure.as_deref() {
            None => FailureMode::default(),
            Some(name) => name.parse().map_err(|_: UnknownFailureMode| {
                let names = FailureMode::ALL.map(FailureMode::as_str);
                bad(
                    "failure",
                    name,
                    &format!("expected one of {}", names.join(", ")),
                )
            })?,
        };
        let instances = match raw.instances {
            None => NonZeroU64::MIN,
            Some(n) => u64::try_from(n)
                .ok()
                .and_then(NonZeroU64::new)
                .ok_or_else(|| {
                    bad(
                        "instances",
                        &n.to_string(),
                        "must be at least 1 (the number of app servers sharing the limits)",
                    )
                })?,
        };
        let ipv6_prefix = match raw.ipv6_prefix {
            None => 56,
            Some(bits) => u8::try_from(bits)
                .ok()
                .filter(|b| (32..=128).contains(b))
                .ok_or_else(|| bad("ipv6_prefix", &bits.to_string(), "expected 32 to 128"))?,
        };
        let client_ip = ClientIp::new()
            .trusted_proxies(&raw.trusted_proxies)
            .and_then(|c| c.ipv6_prefix(ipv6_prefix))
            .map_err(|e| ConfigFileError(e.to_string()))?;
        if raw.routes.is_empty() {
            return Err(ConfigFileError(
                "no [[route]] entries: nothing would be limited".into(),
            ));
        }
        let routes = raw
            .routes
            .into_iter()
            .enumerate()
            .map(|(i, r)| route(i + 1, r))
            .collect::<Result<Vec<RouteConfig>, _>>()?;
        refuse_shared_names(&routes)?;
        let overload = overload(raw.overload.unwrap_or_default())?;
        Ok(Self {
            overload,
            header_style,
            failure,
            instances,
            client_ip,
            trusted_proxies: raw.trusted_proxies,
            ipv6_prefix,
            routes,
        })
    }
}

/// A policy's name is the identity of its state: two routes with one name
/// would share counts, and with different limits would rewrite each
/// other's state on every request.
fn refuse_shared_names(routes: &[RouteConfig]) -> Result<(), ConfigFileError> {
    let mut first: HashMap<&str, (usize, &RouteConfig)> = HashMap::new();
    for (i, r) in routes.iter().enumerate() {
        let names = std::iter::once(r.policy.name()).chain(r.plans.iter().map(|p| p.policy.name()));
        for name in names {
            if let Some((n, earlier)) = first.insert(name, (i + 1, r)) {
                return Err(ConfigFileError(format!(
                    "route {} ({} {}): field `name`: invalid value {:?}: route {n} ({} {}) has that name \
                     already; a policy's name identifies its state, so give each route its own",
                    i + 1,
                    r.method,
                    r.path,
                    name,
                    earlier.method,
                    earlier.path,
                )));
            }
        }
    }
    Ok(())
}

fn bad(field: &str, value: &str, why: &str) -> ConfigFileError {
    ConfigFileError(format!("field `{field}`: invalid value {value:?}: {why}"))
}
