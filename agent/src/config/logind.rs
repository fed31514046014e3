//! `[logind]`: host shutdown through systemd-logind.

use serde::{Deserialize, Serialize};

use super::duration::HOUR;
use super::HumanDuration;

/// `[logind]`: host shutdown through systemd-logind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogindConfig {
    /// Watch for shutdown.
    pub enabled: bool,
    /// D-Bus system bus address; empty: the standard system bus.
    pub bus_address: String,
    /// Longest the shutdown is delayed while targets are signalled and finish (also capped
    /// by logind's `InhibitDelayMaxSec`, 60 s with the package's drop-in).
    pub max_delay: HumanDuration<0, HOUR>,
}

impl Default for LogindConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            bus_address: String::new(),
            max_delay: HumanDuration(std::time::Duration::from_secs(60)),
        }
    }
}
