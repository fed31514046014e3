//! Wall-clock timestamps serialised as RFC 3339, the form every sink prints.

use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serializer};

/// Serialise a `SystemTime` as RFC 3339 (UTC, seconds precision).
pub fn serialize<S: Serializer>(time: &SystemTime, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&humantime::format_rfc3339_seconds(*time))
}

/// Deserialise an RFC 3339 timestamp.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SystemTime, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_rfc3339_weak(&text).map_err(serde::de::Error::custom)
}

/// Format a timestamp for people and logs (RFC 3339, seconds).
pub fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// The same for an optional timestamp (`null` when absent).
pub mod option {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialise an optional `SystemTime` as RFC 3339 or `null`.
    pub fn serialize<S: Serializer>(
        time: &Option<SystemTime>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match time {
            Some(t) => serializer.collect_str(&humantime::format_rfc3339_seconds(*t)),
            None => serializer.serialize_none(),
        }
    }

    /// Deserialise an optional RFC 3339 timestamp.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<SystemTime>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|text| humantime::parse_rfc3339_weak(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}
