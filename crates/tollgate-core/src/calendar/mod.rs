//! Calendar periods: limits per day, week or month that reset at the
//! boundaries of a time zone's calendar, with an optional offset.
//!
//! Time zones come from [jiff](https://docs.rs/jiff)'s bundled copy of the
//! IANA database (never the system's `/usr/share/zoneinfo`): every
//! instance running the same version of this crate draws the same
//! boundaries, whatever its machine has installed. jiff handles the
//! daylight-saving arithmetic (a local day is 23 or 25 hours across a
//! change; a civil time that falls in a gap is moved later by the gap, and
//! one that occurs twice takes its first occurrence, as RFC 5545 does).

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use jiff::SignedDuration;
use jiff::tz::{TimeZone, TimeZoneDatabase};
use parking_lot::Mutex;

use crate::error::ConfigError;

/// The calendar a policy's limits per day, week and month follow: a time
/// zone and a reset offset.
///
/// Under a calendar, a limit per day resets at local midnight plus the
/// offset, a limit per week on Monday at midnight plus the offset, and a
/// limit per month on the 1st at midnight plus the offset. The offset is
/// civil time: `"8h"` resets a daily limit at 08:00 on the local clock,
/// whatever daylight-saving time does, and `"2d 6h"` resets a monthly one
/// on the 3rd at 06:00. Only the fixed window takes calendar periods (its
/// count resets at the boundary); see [`PolicyBuilder::calendar`](crate::PolicyBuilder::calendar).
///
/// A calendar is small and `Copy`: each distinct zone is loaded once per
/// process from the bundled database and kept (there are a few hundred).
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::Calendar;
///
/// let berlin = Calendar::new("Europe/Berlin")?;
/// assert_eq!(berlin.zone(), "Europe/Berlin");
/// let eight = Calendar::utc().with_offset(Duration::from_secs(8 * 3600));
/// assert_eq!(eight.offset(), Duration::from_secs(8 * 3600));
/// assert_eq!(eight.to_string(), "UTC+8h");
///
/// let err = Calendar::new("Mars/Olympus").unwrap_err();
/// assert!(err.to_string().starts_with("unknown time zone \"Mars/Olympus\""));
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
#[derive(Clone, Copy)]
pub struct Calendar {
    zone: &'static Zone,
    offset_us: u64,
}

struct Zone {
    name: Box<str>,
    tz: TimeZone,
}

impl Calendar {
    /// The calendar of `zone`, an IANA time-zone name such as
    /// `"Europe/Berlin"` (matched without regard to case), with no offset.
    ///
    /// # Errors
    ///
    /// [`ConfigError::UnknownTimeZone`] when the bundled database has no
    /// such zone.
    pub fn new(zone: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            zone: intern(zone)?,
            offset_us: 0,
        })
    }

    /// The UTC calendar, with no offset.
    pub fn utc() -> Self {
        Self {
            zone: intern("UTC").unwrap_or_else(|_| utc_zone()),
            offset_us: 0,
        }
    }

    /// This calendar with periods that start `offset` after local midnight
    /// (on the 1st for months, on Monday for weeks), in civil time. It must
    /// be shorter than the shortest calendar period of the policy it is
    /// given to; [`PolicyBuilder::build`](crate::PolicyBuilder::build)
    /// checks it. Whole microseconds count; anything finer is dropped.
    #[must_use]
    pub fn with_offset(self, offset: Duration) -> Self {
        Self {
            offset_us: crate::time::duration_micros(offset),
            ..self
        }
    }

    /// The time zone's name, as the database spells it.
    pub fn zone(&self) -> &'static str {
        &self.zone.name
    }

    /// The reset offset after local midnight.
    pub fn offset(&self) -> Duration {
        Duration::from_micros(self.offset_us)
    }

    /// Parses an offset as written in configuration: whole numbers with
    /// units, separated by spaces or not, such as `"8h"`, `"2d 6h"` or
    /// `"1h30min"` (the units of [`Limit`](crate::Limit) up to days).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidValue`] naming what is wrong.
    pub fn parse_offset(input: &str) -> Result<Duration, ConfigError> {
        let invalid = |reason| ConfigError::InvalidValue {
            setting: "calendar offset",
            value: input.to_owned(),
            reason,
        };
        let mut rest = input.trim();
        if rest.is_empty() {
            return Err(invalid("expected a duration such as \"8h\" or \"2d 6h\""));
        }
        let mut total: u64 = 0;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(invalid("expected a number before each unit"));
            }
            let (number, tail) = rest.split_at(digits);
            let letters = tail.bytes().take_while(u8::is_ascii_alphabetic).count();
            let (unit, tail) = tail.split_at(letters);
            let number: u64 = number
                .parse()
                .map_err(|_| invalid("a number is too large"))?;
            let unit = crate::limit::unit_micros(&unit.to_ascii_lowercase())
                .filter(|&micros| micros <= 86_400_000_000)
                .ok_or_else(|| invalid("unknown unit: use s, min, h or d"))?;
            total = number
                .checked_mul(unit)
                .and_then(|n| total.checked_add(n))
                .ok_or_else(|| invalid("the offset is too long"))?;
            rest = tail.trim_start();
        }
        Ok(Duration::from_micros(total))
    }

    fn offset_signed(&self) -> SignedDuration {
        SignedDuration::from_micros(i64::try_from(self.offset_us).unwrap_or(i64::MAX))
    }
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Calendar")
            .field("zone", &self.zone())
            .field("offset", &self.offset())
            .finish()
    }
}

impl fmt::Display for Calendar {
    /// The zone, then `+` and the offset in the largest unit that divides
    /// it, when there is one: `Europe/Berlin`, `UTC+8h`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.zone())?;
        if self.offset_us > 0 {
            f.write_str("+")?;
            write_offset(f, self.offset_us)?;
        }
        Ok(())
    }
}

/// `micros` as whole units, largest first: `2d6h`, `90s`.
fn write_offset(f: &mut impl fmt::Write, micros: u64) -> fmt::Result {
    let units = [
        ("d", 86_400_000_000),
        ("h", 3_600_000_000),
        ("min", 60_000_000),
        ("s", 1_000_000),
        ("us", 1),
    ];
    let mut rest = micros;
    for (name, size) in units {
        if rest >= size {
            write!(f, "{}{name}", rest / size)?;
            rest %= size;
        }
    }
    Ok(())
}

/// The configuration form: `{ zone = "Europe/Berlin", offset = "8h" }`,
/// the offset optional ([`Calendar::parse_offset`]).
#[cfg(feature = "serde")]
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CalendarConfig {
    zone: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    offset: Option<String>,
}

#[cfg(feature = "serde")]
impl serde::Serialize for Calendar {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let offset = (self.offset_us > 0).then(|| {
            let mut text = String::new();
            let _ = write_offset(&mut text, self.offset_us);
            text
        });
        CalendarConfig {
            zone: self.zone().to_owned(),
            offset,
        }
        .serialize(serializer)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Calendar {
    /// Deserializes `{ zone, offset? }`; an unknown zone or an offset that
    /// does not parse is an error naming it.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let config = CalendarConfig::deserialize(deserializer)?;
        let calendar = Calendar::new(&config.zone).map_err(D::Error::custom)?;
        match config.offset {
            None => Ok(calendar),
            Some(offset) => Ok(
                calendar.with_offset(Calendar::parse_offset(&offset).map_err(D::Error::custom)?)
            ),
        }
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.zone.name == other.zone.name && self.offset_us == other.offset_us
    }
}

impl Eq for Calendar {}

impl std::hash::Hash for Calendar {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.zone.name.hash(state);
        self.offset_us.hash(state);
    }
}

/// The zones loaded so far, each once for the life of the process: a
/// calendar is `Copy`, and its decisions need no lock.
fn intern(name: &str) -> Result<&'static Zone, ConfigError> {
    static ZONES: OnceLock<Mutex<Vec<&'static Zone>>> = OnceLock::new();
    static DATABASE: OnceLock<TimeZoneDatabase> = OnceLock::new();
    let unknown = || ConfigError::UnknownTimeZone {
        zone: name.to_owned(),
    };
    let database = DATABASE.get_or_init(TimeZoneDatabase::bundled);
    let tz = database.get(name).map_err(|_| unknown())?;
    let canonical = tz.iana_name().ok_or_else(unknown)?.to_owned();
    let mut zones = ZONES.get_or_init(|| Mutex::new(Vec::new())).lock();
    if let Some(zone) = zones.iter().find(|z| *z.name == *canonical) {
        return Ok(zone);
    }
    let zone: &'static Zone = Box::leak(Box::new(Zone {
        name: canonical.into_boxed_str(),
        tz,
    }));
    zones.push(zone);
    Ok(zone)
}

/// UTC without the database, should the bundle lack it.
fn utc_zone() -> &'static Zone {
    static UTC: OnceLock<Zone> = OnceLock::new();
    UTC.get_or_init(|| Zone {
        name: "UTC".into(),
        tz: TimeZone::UTC,
    })
}

#[cfg(feature = "testing")]
pub(crate) mod cases;
pub(crate) mod period;
