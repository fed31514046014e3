//! The node's health as the core publishes it to every sink.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{Fault, PciAddress, Severity, SourceKind};

/// Overall health of a GPU or the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// No warning or fatal fault.
    Healthy,
    /// At least one warning, no fatal fault.
    Warning,
    /// At least one fatal fault.
    Fatal,
}

impl Health {
    /// The health implied by the worst severity present.
    pub fn from_worst(worst: Option<Severity>) -> Self {
        match worst {
            Some(Severity::Fatal) => Self::Fatal,
            Some(Severity::Warning) => Self::Warning,
            Some(Severity::Info) | None => Self::Healthy,
        }
    }

    /// Exit code for `status` and `check`: 0 healthy, 1 any warning or fatal.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Healthy => 0,
            Self::Warning | Self::Fatal => 1,
        }
    }
}

/// One GPU row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// Index in PCI bus order (what `nvidia-smi` shows by default on these hosts).
    pub index: u32,
    /// PCI address.
    pub pci: PciAddress,
    /// Worst fault on this GPU.
    pub health: Health,
    /// Labels of the faults on this GPU (`Xid 79`).
    pub faults: Vec<String>,
}

/// Whether a source is running, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "reason", rename_all = "lowercase")]
pub enum SourceState {
    /// Starting up.
    Starting,
    /// Running.
    On,
    /// Turned off by config or not applicable on this host; the reason says which.
    Off(String),
    /// Stopped by an error; the reason names it.
    Failed(String),
    /// Reached the end of its input (a kernel log captured to a file).
    Ended,
}

/// A source and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStatus {
    /// Which source.
    pub source: SourceKind,
    /// Its state.
    #[serde(flatten)]
    pub state: SourceState,
}

/// Kernel-log reading statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KmsgStats {
    /// Records read since the agent started.
    pub records_read: u64,
    /// Records the kernel overwrote before we read them (ring-buffer overrun).
    pub records_lost: u64,
    /// Records that matched a GPU or NVSwitch fault pattern.
    pub records_matched: u64,
}

/// Everything `status` shows; published by the core after every change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthSnapshot {
    /// Agent version.
    pub version: String,
    /// This node's name.
    pub node_name: String,
    /// The kernel's boot id.
    pub boot_id: String,
    /// Overall health.
    pub health: Health,
    /// One-line summary (also systemd's `STATUS=`).
    pub summary: String,
    /// GPUs found on the PCI bus.
    pub gpus: Vec<GpuStatus>,
    /// Every fault in the model, worst first.
    pub faults: Vec<Fault>,
    /// Sources and their state.
    pub sources: Vec<SourceStatus>,
    /// Kernel-log statistics.
    pub kmsg: KmsgStats,
    /// When the snapshot was taken.
    #[serde(with = "super::time")]
    pub updated_at: SystemTime,
}
