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

/// Numbers NVML reports per GPU (for metrics); `None` where not supported.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuTelemetry {
    /// Uncorrectable ECC errors since the last reset.
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Uncorrectable ECC errors over the GPU's life.
    pub ecc_uncorrected_aggregate: Option<u64>,
    /// Rows remapped for correctable errors.
    pub remapped_rows_correctable: Option<u32>,
    /// Rows remapped for uncorrectable errors.
    pub remapped_rows_uncorrectable: Option<u32>,
    /// NVLink links up.
    pub nvlink_up: Option<u32>,
    /// NVLink links the GPU has.
    pub nvlink_total: Option<u32>,
    /// NVLink replay errors, all links.
    pub nvlink_replay_errors: Option<u64>,
    /// NVLink recovery errors, all links.
    pub nvlink_recovery_errors: Option<u64>,
    /// NVLink CRC errors, all links.
    pub nvlink_crc_errors: Option<u64>,
    /// Current PCIe generation (drops at idle for power saving).
    pub pcie_gen: Option<u32>,
    /// The highest PCIe generation this GPU and its slot can train to together.
    pub pcie_gen_max: Option<u32>,
    /// Current PCIe width.
    pub pcie_width: Option<u32>,
    /// The widest PCIe link this GPU and its slot allow together.
    pub pcie_width_max: Option<u32>,
    /// The driver's required recovery action as read this poll (0: none); `None` where it
    /// could not be read (older driver, GPU lost). Only an explicit 0 ends the faults the
    /// driver asked a recovery for.
    #[serde(default)]
    pub recovery_action: Option<u32>,
    /// Percent of the driver's last sample period (1/6 s to 1 s) a kernel ran on the GPU. A
    /// resident kernel counts as busy whether it does work or waits: it says the GPU is held
    /// busy, not that it is productive.
    #[serde(default)]
    pub utilization_gpu: Option<u32>,
    /// Percent of the same period the GPU's memory was read or written.
    #[serde(default)]
    pub utilization_memory: Option<u32>,
    /// The SM clock now, MHz.
    #[serde(default)]
    pub sm_clock_mhz: Option<u32>,
    /// The SM clock's maximum, MHz.
    #[serde(default)]
    pub sm_clock_max_mhz: Option<u32>,
    /// The power limit the driver enforces, mW.
    #[serde(default)]
    pub power_limit_mw: Option<u32>,
    /// The GPU's default power limit, mW (one enforced below it was lowered by someone).
    #[serde(default)]
    pub power_limit_default_mw: Option<u32>,
    /// PCIe link-level retransmissions since the driver loaded (rising: a marginal link).
    #[serde(default)]
    pub pcie_replay_errors: Option<u32>,
    /// GPM (Hopper and later), over the last poll interval: share of the SMs busy, percent.
    /// `None`: unknown (no GPM, a vGPU guest, the first poll), never 0.
    #[serde(default)]
    pub sm_active_percent: Option<u32>,
    /// GPM: warps resident against the SMs' capacity, percent.
    #[serde(default)]
    pub sm_occupancy_percent: Option<u32>,
    /// GPM: any tensor pipe busy, percent: the work training does.
    #[serde(default)]
    pub tensor_active_percent: Option<u32>,
    /// GPM: DRAM bandwidth in use, percent.
    #[serde(default)]
    pub dram_bw_percent: Option<u32>,
    /// In MIG mode, GPM's activity of each MIG device's GPU instance (a pod holding a MIG
    /// device is judged by its own instance); empty when MIG is off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_activity: Vec<MigActivity>,
}

/// GPM's activity of one MIG device's GPU instance over the last poll interval, percent;
/// `None`: unknown (no GPM, the first poll), never 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigActivity {
    /// The MIG device's UUID (`MIG-...`).
    pub uuid: String,
    /// Share of the instance's SMs busy.
    pub sm_active_percent: Option<u32>,
    /// Warps resident against the instance's SMs' capacity.
    pub sm_occupancy_percent: Option<u32>,
    /// Any tensor pipe of the instance busy.
    pub tensor_active_percent: Option<u32>,
    /// The instance's DRAM bandwidth in use.
    pub dram_bw_percent: Option<u32>,
}

/// What NVML says a GPU is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuIdentity {
    /// PCI address (the join key with kernel-log faults).
    pub pci: Option<PciAddress>,
    /// NVML's index.
    pub nvml_index: u32,
    /// UUID (`GPU-...`).
    pub uuid: Option<String>,
    /// Product name.
    pub name: Option<String>,
    /// Board serial.
    pub serial: Option<String>,
    /// UUIDs of its MIG devices (`MIG-...`), when MIG is on.
    #[serde(default)]
    pub mig_uuids: Vec<String>,
    /// Its NVLink fabric registration (GB200/GB300 NVL72, NVLink-5 HGX); `None` where the
    /// GPU registers with no fabric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<GpuFabric>,
    /// Telemetry from the latest poll.
    pub telemetry: GpuTelemetry,
}

/// A GPU's NVLink fabric registration: which NVLink domain it is in, and how it stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFabric {
    /// `not-started`, `in-progress` or `completed`.
    pub state: String,
    /// The clique (NVLink partition) id.
    pub clique_id: u32,
    /// The fabric cluster's UUID: GPUs with the same one share an NVLink domain.
    pub cluster_uuid: String,
    /// What the fabric's health fields say is wrong; `None`: nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
}

/// One GPU row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// Index in PCI bus order (what `nvidia-smi` shows by default on these hosts).
    pub index: u32,
    /// PCI address.
    pub pci: PciAddress,
    /// Product name, UUID, serial and telemetry, where NVML reported them.
    pub nvml: Option<GpuIdentity>,
    /// Worst fault on this GPU.
    pub health: Health,
    /// Labels of the faults on this GPU (`Xid 79`).
    pub faults: Vec<String>,
    /// Pod containers holding it (the kubelet's pod-resources `List`); filled in when
    /// `status` asks, empty in the core's snapshots.
    #[serde(default)]
    pub holders: Vec<super::GpuHolder>,
    /// Its fence (a DRA `DeviceTaintRule` on it and its MIG devices), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<super::GpuFence>,
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

/// A pod that holds GPUs and has kept none of them busy (or busy only without tensor work)
/// for the funnel's window: paid for, and not kept at work. Information for the job's
/// owners, never a fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldIdle {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod.
    pub pod: String,
    /// The GPUs it holds (index, bus order).
    pub gpus: Vec<u32>,
    /// Since when none of them worked.
    #[serde(with = "crate::model::time")]
    pub since: SystemTime,
    /// One was busy, but with no tensor work (GPM): a rank waiting in a collective, not an
    /// idle GPU.
    #[serde(default)]
    pub busy_without_tensor_work: bool,
}

/// Whether the code and data the fault path runs are locked in memory (`host::resident`):
/// after start-up the agent hands its program's pages back, watches which it maps again
/// (the steady state, and every fault path rehearsed once), and locks those.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum FaultPathLock {
    /// Every page of the program stays mapped: the hand-back has not run yet, or is off.
    Kept {
        /// Why (`page_out_after = 0`, not handed back yet).
        reason: String,
    },
    /// Start-up's pages are handed back; the pages used again are being watched.
    Watching,
    /// The working set is locked; the rest of the program is handed back.
    Locked {
        /// Locked, KiB.
        locked_kib: u64,
        /// Of which locked later, when code outside the first set ran (0: the set held).
        grown_kib: u64,
    },
    /// The working set could not be locked, so nothing is handed back: every page stays
    /// mapped (and reclaimable under memory pressure).
    Refused {
        /// Why (the `mlock` error; `LimitMEMLOCK` too low).
        reason: String,
    },
}

impl Default for FaultPathLock {
    fn default() -> Self {
        Self::Kept {
            reason: "not handed back yet".into(),
        }
    }
}

/// A Node condition as gpu-agent last wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCondition {
    /// Its type (`AcceleratedHardwareReady`, `MaintenancePlanned`, ...).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    /// Its reason.
    pub reason: String,
}

/// A sink and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkStatus {
    /// Which sink (`kubernetes`, ...).
    pub sink: String,
    /// Its state.
    #[serde(flatten)]
    pub state: SourceState,
}

impl PendingEnd {
    /// Is it acted on at `now` (`InterruptionPending` True, the checkpoint signal due)?
    pub fn due(&self, now: SystemTime) -> bool {
        self.act_at.is_none_or(|at| now >= at)
    }
}

/// A known end of this instance (Spot notice, scheduled maintenance, Capacity Block end,
/// shutdown).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingEnd {
    /// What kind of end (`spot`, `scheduled-maintenance`, `capacity-block`, `shutdown`).
    pub kind: String,
    /// When the instance goes.
    #[serde(with = "super::time")]
    pub deadline: SystemTime,
    /// The notice's detail.
    pub detail: String,
    /// Processes signalled to checkpoint for it.
    pub signalled: u32,
    /// When it is acted on: the checkpoint signal and `InterruptionPending` (deadline -
    /// lead); `None`: at once (a Spot notice, a shutdown).
    #[serde(with = "super::time::option", default)]
    pub act_at: Option<SystemTime>,
    /// A pod that declares a longer checkpoint (`gpu-agent.io/checkpoint-lead`), and when its
    /// own processes are signalled (the node's `act_at` stays the configured lead's).
    #[serde(default)]
    pub lead_from: Option<String>,
    /// The notice already signalled for this ending, if this one was covered by it.
    #[serde(default)]
    pub covered_by: Option<String>,
    /// Signalled processes still running (what a shutdown waits for).
    #[serde(default)]
    pub waiting_for: Vec<i32>,
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
    /// Records skipped because their header could not be parsed.
    #[serde(default)]
    pub records_unparsed: u64,
    /// Fault lines written by userspace (not the kernel, not a `gpu-agent inject` drill),
    /// ignored unless `[kmsg] accept_userspace`.
    #[serde(default)]
    pub records_ignored: u64,
}

/// Kernel-log reading statistics as the reader counts them (shared between the kernel-log
/// thread and the core, which puts them into snapshots).
#[derive(Debug, Default)]
pub struct KmsgCounters {
    /// Records read.
    pub read: std::sync::atomic::AtomicU64,
    /// Records lost to overruns or while the agent was stopped.
    pub lost: std::sync::atomic::AtomicU64,
    /// Records that matched a fault pattern.
    pub matched: std::sync::atomic::AtomicU64,
    /// Records whose header could not be parsed.
    pub unparsed: std::sync::atomic::AtomicU64,
    /// Userspace fault lines ignored.
    pub ignored: std::sync::atomic::AtomicU64,
    /// One more than the sequence number of the newest record read that gave no fault report
    /// (0: none). Every fault record before it was already sent to the core, so after the
    /// core has merged its queue the cursor may advance to it (at a clean stop).
    pub quiet_through: std::sync::atomic::AtomicU64,
}

impl KmsgCounters {
    /// The counts so far.
    pub fn stats(&self) -> KmsgStats {
        use std::sync::atomic::Ordering::Relaxed;
        KmsgStats {
            records_read: self.read.load(Relaxed),
            records_lost: self.lost.load(Relaxed),
            records_matched: self.matched.load(Relaxed),
            records_unparsed: self.unparsed.load(Relaxed),
            records_ignored: self.ignored.load(Relaxed),
        }
    }
}

/// Everything `status` shows; published by the core after every change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthSnapshot {
    /// Agent version.
    pub version: String,
    /// This node's name.
    pub node_name: String,
    /// Where the node name came from.
    pub node_name_source: super::NameSource,
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
    /// Sinks that can be off or failing, and their state.
    pub sinks: Vec<SinkStatus>,
    /// The instance's pending end, if one is known (the earliest).
    pub pending_end: Option<PendingEnd>,
    /// Every current notice.
    pub notices: Vec<super::Notice>,
    /// What the checkpoint sink did for current notices.
    pub checkpoints: Vec<super::CheckpointReport>,
    /// Kernel-log statistics.
    pub kmsg: KmsgStats,
    /// NVIDIA driver version (from NVML), if known.
    pub driver_version: Option<String>,
    /// The EFA devices the `efa` source found (empty: none, or the source is off).
    #[serde(default)]
    pub efa: Vec<super::EfaDevice>,
    /// The host's IMEX unit, where the `imex` source watches it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imex: Option<super::ImexState>,
    /// The Node conditions as the node-conditions sink last wrote them (empty: none written).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<NodeCondition>,
    /// Pods holding GPUs that none of them kept busy for the funnel's window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_idle: Vec<HeldIdle>,
    /// Whether the fault path's pages are locked in memory.
    #[serde(default)]
    pub fault_path_lock: FaultPathLock,
    /// What per-GPU fencing can do on this node; `None`: off (no DRA driver, no
    /// DeviceTaintRule API, turned off, or no Kubernetes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing: Option<super::Fencing>,
    /// The pod-resources lookup behind each GPU's `holders`; `None` in the core's snapshots
    /// and when the lookup is turned off.
    #[serde(default)]
    pub holders: Option<super::HolderView>,
    /// How long before its deadline each kind of notice is acted on (`[checkpoint.lead]`),
    /// as the core applies it; in-process only (not in `status` JSON).
    #[serde(skip)]
    pub leads: std::collections::BTreeMap<super::NoticeKind, std::time::Duration>,
    /// When the snapshot was taken.
    #[serde(with = "super::time")]
    pub updated_at: SystemTime,
}

impl HealthSnapshot {
    /// The lead notices of `kind` are acted on with (zero where none is configured).
    pub fn lead(&self, kind: super::NoticeKind) -> std::time::Duration {
        self.leads.get(&kind).copied().unwrap_or_default()
    }

    /// The UUID of the GPU `fault` is on, where NVML named it.
    pub fn gpu_uuid(&self, fault: &Fault) -> Option<&str> {
        let index = fault.gpu_index?;
        self.gpus
            .iter()
            .find(|g| g.index == index)?
            .nvml
            .as_ref()?
            .uuid
            .as_deref()
    }

    /// Is `fault` answered by fencing its GPU alone (so the node condition leaves it out)?
    /// Only a fault confined to one GPU, on a GPU the DRA driver publishes, whose rules are
    /// confirmed on the server at `NoSchedule` or stronger ([`super::Fencing::covers`]).
    pub fn fenced_instead(&self, fault: &Fault) -> bool {
        fault.confined_to_gpu()
            && self
                .fencing
                .as_ref()
                .zip(self.gpu_uuid(fault))
                .is_some_and(|(fencing, uuid)| fencing.covers(uuid))
    }
}
