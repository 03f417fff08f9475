//! The `[overload]` section: the stand-in backend of `GET /work` and the
//! adaptive limit in front of it.

use std::time::Duration;

use tollgate::{AdaptiveLimit, LimitAlgorithm, Priority};

use super::ConfigFileError;
use super::raw::RawOverload;
use crate::overload::OverloadConfig;

/// The section checked; every field has a default.
pub(super) fn overload(raw: RawOverload) -> Result<OverloadConfig, ConfigFileError> {
    let field = |name: &str, value: &dyn std::fmt::Debug, why: &str| {
        ConfigFileError(format!(
            "[overload] field `{name}`: invalid value {value:?}: {why}"
        ))
    };
    let count = |name: &str, value: Option<i64>, default: u32| match value {
        None => Ok(default),
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=1_000_000).contains(n))
            .ok_or_else(|| field(name, &n, "expected 1 to 1000000")),
    };
    let workers = count("workers", raw.workers, 40)?;
    let service_ms = raw.service_ms.unwrap_or(20.0);
    if !(0.1..=60_000.0).contains(&service_ms) {
        return Err(field("service_ms", &service_ms, "expected 0.1 to 60000"));
    }
    let service = Duration::from_secs_f64(service_ms / 1_000.0);
    let algorithm = match raw.algorithm.as_deref() {
        None | Some("vegas") => LimitAlgorithm::Vegas,
        Some("gradient2") => LimitAlgorithm::Gradient2,
        Some("aimd") => LimitAlgorithm::Aimd {
            latency_ceiling: service * 2,
        },
        Some(other) => {
            return Err(field(
                "algorithm",
                &other,
                "expected vegas, gradient2 or aimd",
            ));
        }
    };
    let mut limit = AdaptiveLimit::builder("work")
        .algorithm(algorithm)
        .bounds(count("min", raw.min, 4)?, count("max", raw.max, 1_000)?);
    // Unset, the builder's default: 20 within the bounds.
    if let Some(initial) = raw.initial {
        limit = limit.initial(count("initial", Some(initial), 20)?);
    }
    let mut limit = limit
        .reserve(Priority::Critical, raw.reserve_critical.unwrap_or(0.2))
        .reserve(Priority::Default, raw.reserve_default.unwrap_or(0.1));
    match (raw.warm_up_from, raw.warm_up_secs) {
        (None, None) => {}
        (Some(from), Some(secs)) if secs.is_finite() && secs > 0.0 && secs <= 3_600.0 => {
            let from = count("warm_up_from", Some(from), 1)?;
            limit = limit.warm_up(from, Duration::from_secs_f64(secs));
        }
        (from, secs) => {
            return Err(field(
                "warm_up_from and warm_up_secs",
                &(from, secs),
                "give both, the seconds from 0 to 3600",
            ));
        }
    }
    let limit = limit.build().map_err(|error| match error {
        // The builder's settings, by the fields of the section that set them.
        tollgate::ConfigError::InvalidSetting { setting, reason } => {
            let (fields, value) = match setting {
                "reserve" => (
                    "reserve_critical` and `reserve_default",
                    format!(
                        "{}, {}",
                        shown(raw.reserve_critical),
                        shown(raw.reserve_default)
                    ),
                ),
                "adaptive limit bounds" => (
                    "min` and `max",
                    format!("{}, {}", shown(raw.min), shown(raw.max)),
                ),
                "adaptive limit initial" => ("initial", shown(raw.initial)),
                "warm_up" => ("warm_up_from", shown(raw.warm_up_from)),
                other => (other, String::new()),
            };
            ConfigFileError(format!(
                "[overload] field `{fields}`: invalid value {value}: {reason}"
            ))
        }
        other => ConfigFileError(format!("[overload]: {other}")),
    })?;
    let queue = match (raw.queue, raw.queue_wait_ms) {
        (None, None) => None,
        (Some(size), Some(wait)) => {
            let size = usize::try_from(size)
                .ok()
                .filter(|n| (1..=100_000).contains(n))
                .ok_or_else(|| field("queue", &size, "expected 1 to 100000"))?;
            let wait = u64::try_from(wait)
                .ok()
                .filter(|ms| (1..=60_000).contains(ms))
                .ok_or_else(|| field("queue_wait_ms", &wait, "expected 1 to 60000"))?;
            Some((size, Duration::from_millis(wait)))
        }
        (size, wait) => {
            return Err(field(
                "queue and queue_wait_ms",
                &(size, wait),
                "give both or neither",
            ));
        }
    };
    Ok(OverloadConfig {
        protect: raw.protect.unwrap_or(true),
        workers: workers as usize,
        service,
        limit,
        queue,
    })
}

/// A field's value as the file gave it, or `unset`.
fn shown<T: std::fmt::Debug>(value: Option<T>) -> String {
    value.map_or_else(|| "unset".to_owned(), |value| format!("{value:?}"))
}
