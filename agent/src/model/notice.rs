//! Notices: a known end of the instance (or a reason to checkpoint), with a deadline.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::SourceKind;

/// What kind of end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoticeKind {
    /// Spot interruption notice (`spot/instance-action`).
    Spot,
    /// Rebalance recommendation (a Spot interruption may follow).
    Rebalance,
    /// Scheduled maintenance: reboot, stop or retirement.
    ScheduledMaintenance,
    /// The Capacity Block's end (termination starts 30 minutes before `EndDate`).
    CapacityBlock,
    /// The host is shutting down (logind `PrepareForShutdown`).
    Shutdown,
    /// A fatal GPU fault (surviving ranks may want to save state).
    FatalFault,
}

impl NoticeKind {
    /// Every kind.
    pub const ALL: [Self; 6] = [
        Self::Spot,
        Self::Rebalance,
        Self::ScheduledMaintenance,
        Self::CapacityBlock,
        Self::Shutdown,
        Self::FatalFault,
    ];

    /// Stable name (config keys, metric labels).
    pub fn name(self) -> &'static str {
        match self {
            Self::Spot => "spot",
            Self::Rebalance => "rebalance",
            Self::ScheduledMaintenance => "scheduled-maintenance",
            Self::CapacityBlock => "capacity-block",
            Self::Shutdown => "shutdown",
            Self::FatalFault => "fatal-fault",
        }
    }

    /// Does this kind mean the instance is going away (`InterruptionPending`)?
    pub fn ends_instance(self) -> bool {
        matches!(
            self,
            Self::Spot | Self::ScheduledMaintenance | Self::CapacityBlock | Self::Shutdown
        )
    }
}

impl fmt::Display for NoticeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One notice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// Stable id: the same notice seen again has the same id; a changed notice a new one.
    pub id: String,
    /// What kind.
    pub kind: NoticeKind,
    /// When the instance goes (or, for a recommendation or fault, when it was issued).
    #[serde(with = "super::time")]
    pub deadline: SystemTime,
    /// The notice's own words.
    pub detail: String,
    /// Who saw it.
    pub source: SourceKind,
}

impl Notice {
    /// When this notice is acted on (the checkpoint signal, `InterruptionPending`):
    /// `deadline - lead` for scheduled maintenance and a Capacity Block end; `None`, at once,
    /// for a Spot notice, a shutdown, a rebalance recommendation or a fatal fault.
    pub fn act_at(&self, lead: std::time::Duration) -> Option<SystemTime> {
        match self.kind {
            NoticeKind::ScheduledMaintenance | NoticeKind::CapacityBlock => {
                Some(self.deadline.checked_sub(lead).unwrap_or(self.deadline))
            }
            NoticeKind::Spot
            | NoticeKind::Shutdown
            | NoticeKind::Rebalance
            | NoticeKind::FatalFault => None,
        }
    }
}

/// What the checkpoint sink did for a notice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointReport {
    /// The notice.
    pub notice_id: String,
    /// Processes signalled.
    pub signalled: u32,
    /// Processes holding a GPU that were skipped (no handler, excluded).
    pub skipped: u32,
    /// The notice already signalled for the same ending or incident, when this one was
    /// covered by it: one incident, one signal.
    #[serde(default)]
    pub covered_by: Option<String>,
    /// Signalled processes (PIDs) still running, while the agent watches them finish.
    #[serde(default)]
    pub waiting_for: Vec<i32>,
    /// Every signalled process has exited, or the hold has passed: a shutdown may go on.
    #[serde(default)]
    pub settled: bool,
    /// When the signals went out (for a covered notice: the covering notice's signal).
    #[serde(with = "super::time::option", default)]
    pub signalled_at: Option<SystemTime>,
    /// Distinct pods the signalled processes run in.
    #[serde(default)]
    pub pods: u32,
    /// Signalled processes that confirmed: wrote their ack file, or exited.
    #[serde(default)]
    pub confirmed: u32,
    /// Milliseconds from the signal to the last confirmation, once every signalled process
    /// confirmed.
    #[serde(default)]
    pub confirmed_in_ms: Option<u64>,
    /// Signalled processes (PIDs) that had not confirmed when the watch ended (the deadline,
    /// or the hold for a shutdown).
    #[serde(default)]
    pub unconfirmed: Vec<i32>,
    /// Why each process holding a GPU was not signalled (`pid name: why`).
    #[serde(default)]
    pub not_signalled: Vec<String>,
}

/// The longest checkpoint lead a pod holding this node's GPUs declares
/// (`gpu-agent.io/checkpoint-lead`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredLead {
    /// The lead.
    #[serde(with = "duration_secs")]
    pub lead: std::time::Duration,
    /// `namespace/name` of the pod that declares it.
    pub pod: String,
}

/// The longest lead a pod may declare where `configured` is the node's: four times it,
/// but never under 10 minutes (a short configured lead still lets a slow save start early)
/// nor over 2 hours (one tenant's typo, `120h` for `120s`, never signals days early).
pub fn lead_cap(configured: std::time::Duration) -> std::time::Duration {
    const FLOOR: std::time::Duration = std::time::Duration::from_secs(10 * 60);
    const CEILING: std::time::Duration = std::time::Duration::from_secs(2 * 3600);
    configured.saturating_mul(4).clamp(FLOOR, CEILING)
}

/// The lead a pod's own processes are signalled with: its declared lead, capped by
/// [`lead_cap`], and never shorter than the configured one. Only that pod's processes go
/// early; the node (`InterruptionPending`, NVRx, every other pod) keeps the configured lead.
pub fn pod_lead(
    configured: std::time::Duration,
    declared: std::time::Duration,
) -> std::time::Duration {
    declared.min(lead_cap(configured)).max(configured)
}

/// A duration as whole seconds.
mod duration_secs {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<std::time::Duration, D::Error> {
        u64::deserialize(d).map(std::time::Duration::from_secs)
    }
}
