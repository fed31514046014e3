//! `[imex]`: the host's IMEX daemon.

use serde::{Deserialize, Serialize};

use super::duration::{HOUR, SECOND};
use super::HumanDuration;

/// `[imex]`: the host's IMEX daemon, through which multi-node NVLink (GB200/GB300 NVL72)
/// shares GPU memory across the domain's nodes. Checked only where it is the host's job:
/// the instance type has an NVLink domain or the host unit is enabled, and never on a type
/// known to have none (p5, p6-b200...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImexConfig {
    /// Watch the host's IMEX unit (off by itself where IMEX is not the host's).
    pub enabled: bool,
    /// D-Bus system bus address (systemd's manager); empty: the standard system bus.
    pub bus_address: String,
    /// The host's IMEX unit.
    pub unit: String,
    /// Where the IMEX channel devices are (`channel0`, ...).
    pub channels_dir: std::path::PathBuf,
    /// How often the unit and its channels are read.
    pub poll_interval: HumanDuration<SECOND, HOUR>,
    /// From boot, how long the unit may take to become active.
    pub startup_grace: HumanDuration<0, HOUR>,
}

impl Default for ImexConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            bus_address: String::new(),
            unit: "nvidia-imex.service".into(),
            channels_dir: "/dev/nvidia-caps-imex-channels".into(),
            poll_interval: HumanDuration(std::time::Duration::from_secs(30)),
            startup_grace: HumanDuration(std::time::Duration::from_secs(300)),
        }
    }
}
