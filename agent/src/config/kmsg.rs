//! `[kmsg]`: the kernel-log source.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::duration::{DAY, MS};
use super::HumanDuration;

/// `[kmsg]`: the kernel-log source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KmsgConfig {
    /// Follow the kernel log.
    pub enabled: bool,
    /// The kernel log device, or a file holding a `/dev/kmsg` dump.
    pub path: PathBuf,
    /// How often a repeating fault is summarised in the agent's own log.
    pub repeat_log_interval: HumanDuration<MS, DAY>,
    /// Count fault lines written by userspace (any facility but the kernel's) as faults.
    /// Off: only the kernel's own lines and `gpu-agent inject`'s marked drill lines count, so
    /// nothing that can write to `/dev/kmsg` can forge an Xid; the rest are counted as
    /// ignored. On: for test rigs that replay real lines through `/dev/kmsg`.
    pub accept_userspace: bool,
}

impl Default for KmsgConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: PathBuf::from("/dev/kmsg"),
            repeat_log_interval: HumanDuration(std::time::Duration::from_secs(60)),
            accept_userspace: false,
        }
    }
}
