//! `[checkpoint]` and `[checkpoint.lead]`: the checkpoint signal to training processes.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::duration::{DAY, MINUTE};
use super::HumanDuration;

/// `[checkpoint]`: signal the training processes before the instance goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Signal targets on notices.
    pub enabled: bool,
    /// The signal (`SIGUSR1`); processes that opt in with `GPU_AGENT_CHECKPOINT_SIGNAL` get theirs.
    pub signal: String,
    /// Notice kinds that trigger a checkpoint: spot, scheduled-maintenance, capacity-block,
    /// shutdown (default), rebalance, fatal-fault.
    pub triggers: Vec<crate::model::NoticeKind>,
    /// How long before the deadline to signal, per kind (Spot and shutdown: at once).
    pub lead: LeadConfig,
    /// Device files whose holders are GPU processes.
    pub device_glob: String,
    /// Process names never signalled, beyond the built-in system daemons.
    pub exclude: Vec<String>,
    /// Honour `GPU_AGENT_CHECKPOINT_SIGNAL` in process environments (opt-in targets).
    pub opt_in_env: bool,
    /// Also cordon the node on a notice (for clusters without a termination handler; needs
    /// patch on nodes).
    pub cordon: bool,
    /// An ending of the instance already signalled covers a later ending within this window
    /// (a shutdown after a Spot notice or a Capacity Block end): one ending, one signal.
    pub ending_window: HumanDuration<0, DAY>,
    /// Fatal faults within this window of a fatal fault already signalled are the same
    /// incident (`fatal-fault` trigger): one incident, one signal.
    pub incident_window: HumanDuration<0, DAY>,
    /// After a signal, how long the agent waits for the signalled processes to finish; a
    /// host shutdown is held this long at most (keep it under logind's
    /// `InhibitDelayMaxSec` and `[logind] max_delay`).
    pub hold: HumanDuration<0, { 30 * MINUTE }>,
    /// The current ending as JSON, for trainers that poll instead of taking a signal
    /// (world-readable, replaced atomically, absent when nothing is pending); empty: off.
    pub notice_file: PathBuf,
    /// Where a signalled process confirms its checkpoint: it writes `done` (or the
    /// checkpoint's path) to `<ack_dir>/<its pid>`, as it sees both (read through its own
    /// root and PID namespace); empty: only an exit confirms.
    pub ack_dir: PathBuf,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            signal: "SIGUSR1".into(),
            triggers: vec![
                crate::model::NoticeKind::Spot,
                crate::model::NoticeKind::ScheduledMaintenance,
                crate::model::NoticeKind::CapacityBlock,
                crate::model::NoticeKind::Shutdown,
            ],
            lead: LeadConfig::default(),
            device_glob: "/dev/nvidia[0-9]*".into(),
            exclude: Vec::new(),
            opt_in_env: true,
            cordon: false,
            ending_window: HumanDuration(std::time::Duration::from_secs(3600)),
            incident_window: HumanDuration(std::time::Duration::from_secs(600)),
            hold: HumanDuration(std::time::Duration::from_secs(50)),
            notice_file: PathBuf::from("/run/gpu-agent/notice.json"),
            ack_dir: PathBuf::from("/run/gpu-agent/ack"),
        }
    }
}

/// `[checkpoint.lead]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct LeadConfig {
    /// Before scheduled maintenance's `NotBefore`.
    pub scheduled_maintenance: HumanDuration<0, DAY>,
    /// Before the Capacity Block's termination start (EndDate - 30 min).
    pub capacity_block: HumanDuration<0, DAY>,
}

impl Default for LeadConfig {
    fn default() -> Self {
        Self {
            scheduled_maintenance: HumanDuration(std::time::Duration::from_secs(600)),
            capacity_block: HumanDuration(std::time::Duration::from_secs(900)),
        }
    }
}
