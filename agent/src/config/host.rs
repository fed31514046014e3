//! `[sysfs]` and `[procfs]`: where the host's kernel filesystems are.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[sysfs]`: where sysfs is mounted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SysfsConfig {
    /// Root directory (`/sys`).
    pub root: PathBuf,
}

impl Default for SysfsConfig {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/sys"),
        }
    }
}

/// `[procfs]`: where procfs is mounted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcfsConfig {
    /// Root directory (`/proc`).
    pub root: PathBuf,
}

impl Default for ProcfsConfig {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/proc"),
        }
    }
}
