//! Durations written as strings (`"1s"`, `"10m"`, `"500ms"`) in the config file, each key
//! with the range it accepts: an absurd value (`hold = "1000000d"`) is an error naming the
//! key and line at load, never an overflow in the running daemon.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One millisecond, the unit of the bounds.
pub const MS: u64 = 1;
/// One second, in milliseconds.
pub const SECOND: u64 = 1000 * MS;
/// One minute, in milliseconds.
pub const MINUTE: u64 = 60 * SECOND;
/// One hour, in milliseconds.
pub const HOUR: u64 = 60 * MINUTE;
/// One day, in milliseconds.
pub const DAY: u64 = 24 * HOUR;

/// A duration parsed from a human string such as `"1s"` or `"10m"`, accepted only within
/// `MIN_MS..=MAX_MS` milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration<const MIN_MS: u64, const MAX_MS: u64>(pub Duration);

/// Why a duration was refused.
#[derive(Debug, thiserror::Error)]
pub enum DurationError {
    /// Not a duration.
    #[error("invalid duration {text:?}: {source} (write e.g. \"1s\", \"10m\", \"500ms\")")]
    Syntax {
        /// What was written.
        text: String,
        /// The parser's complaint.
        source: humantime::DurationError,
    },
    /// A duration outside the key's range.
    #[error("{text:?} is out of range: must be between {min} and {max}")]
    Range {
        /// What was written.
        text: String,
        /// The shortest accepted.
        min: humantime::FormattedDuration,
        /// The longest accepted.
        max: humantime::FormattedDuration,
    },
}

impl<const MIN_MS: u64, const MAX_MS: u64> HumanDuration<MIN_MS, MAX_MS> {
    /// The shortest duration accepted.
    pub const MIN: Duration = Duration::from_millis(MIN_MS);
    /// The longest duration accepted.
    pub const MAX: Duration = Duration::from_millis(MAX_MS);
}

impl<const MIN_MS: u64, const MAX_MS: u64> FromStr for HumanDuration<MIN_MS, MAX_MS> {
    type Err = DurationError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let value = humantime::parse_duration(text).map_err(|source| DurationError::Syntax {
            text: text.to_string(),
            source,
        })?;
        if value < Self::MIN || value > Self::MAX {
            return Err(DurationError::Range {
                text: text.to_string(),
                min: humantime::format_duration(Self::MIN),
                max: humantime::format_duration(Self::MAX),
            });
        }
        Ok(Self(value))
    }
}

impl<const MIN_MS: u64, const MAX_MS: u64> fmt::Display for HumanDuration<MIN_MS, MAX_MS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        humantime::format_duration(self.0).fmt(f)
    }
}

impl<'de, const MIN_MS: u64, const MAX_MS: u64> Deserialize<'de> for HumanDuration<MIN_MS, MAX_MS> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl<const MIN_MS: u64, const MAX_MS: u64> Serialize for HumanDuration<MIN_MS, MAX_MS> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_outside_its_keys_range_is_refused() {
        type Hold = HumanDuration<0, { 30 * MINUTE }>;
        assert_eq!(
            "50s".parse::<Hold>().expect("in range").0,
            Duration::from_secs(50)
        );
        assert_eq!("0s".parse::<Hold>().expect("the minimum").0, Duration::ZERO);
        assert_eq!("30m".parse::<Hold>().expect("the maximum").0, Hold::MAX);
        let e = "1000000d".parse::<Hold>().expect_err("absurd").to_string();
        assert!(e.contains("between 0s and 30m"), "{e}");
        let e = "99999999999999999999d"
            .parse::<Hold>()
            .expect_err("overflows")
            .to_string();
        assert!(e.contains("invalid duration"), "{e}");
        type Poll = HumanDuration<{ 100 * MS }, HOUR>;
        assert!("10ms".parse::<Poll>().is_err());
    }
}
