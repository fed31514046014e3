//! Faults: what went wrong, where, how bad it is and what should happen next.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::PciAddress;

/// How bad a fault is. Ordered: `Info < Warning < Fatal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth recording; nothing to do.
    Info,
    /// Degraded or suspicious; the node keeps working.
    Warning,
    /// The GPU or node cannot be trusted with work until the action is taken.
    Fatal,
}

/// What should happen next. Ordered by how disruptive it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Nothing.
    None,
    /// The application that hit the fault should be restarted.
    RestartApp,
    /// The GPU should be reset (drain its work first).
    ResetGpu,
    /// The node should be rebooted.
    Reboot,
    /// The node should be replaced.
    Replace,
}

/// Which source produced an observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// The kernel log (`/dev/kmsg`).
    Kmsg,
    /// NVML polling.
    Nvml,
    /// EC2 instance metadata (Spot, rebalance, scheduled events).
    Imds,
    /// The EC2 API (Capacity Block end).
    CapacityBlock,
    /// systemd-logind (host shutdown).
    Logind,
    /// The EFA devices (sysfs).
    Efa,
    /// The host's IMEX daemon (systemd over D-Bus).
    Imex,
}

/// The hardware a fault belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Component {
    /// A GPU, by PCI address.
    Gpu {
        /// The GPU's PCI address.
        pci: PciAddress,
    },
    /// An NVSwitch, by PCI address.
    Nvswitch {
        /// The switch's PCI address.
        pci: PciAddress,
    },
    /// An EFA (Elastic Fabric Adapter) device, by PCI address.
    Efa {
        /// The device's PCI address.
        pci: PciAddress,
    },
    /// The node as a whole.
    Node,
}

/// The kind of fault, in the vocabulary of the component that reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "type", content = "code", rename_all = "kebab-case")]
pub enum FaultCode {
    /// An NVIDIA Xid.
    Xid(u32),
    /// An NVSwitch SXid.
    Sxid(u32),
    /// The driver reported the GPU gone from the bus without an Xid line.
    FallenOffBus,
    /// Fewer GPUs than expected (on the bus, or visible to NVML).
    GpuMissing,
    /// NVML reports the GPU lost (`NVML_ERROR_GPU_IS_LOST`).
    GpuLost,
    /// NVML reports the GPU needs a reset (`NVML_ERROR_RESET_REQUIRED`).
    ResetRequired,
    /// ECC is turned off.
    EccDisabled,
    /// Uncorrectable ECC errors since the last reset (volatile counter).
    EccUncorrectedVolatile,
    /// Uncorrectable ECC errors over the GPU's life (aggregate counter).
    EccUncorrectedAggregate,
    /// Retired pages waiting for a reset (pre-Ampere).
    RetiredPagesPending,
    /// A row remap is pending: the GPU needs a reset to apply it.
    RemapPending,
    /// A row remap failed: the GPU needs replacing.
    RemapFailure,
    /// An NVLink link that was up in this boot is down.
    NvlinkDown,
    /// An NVLink link has not come up in this boot, past the boot grace period (Fabric
    /// Manager did not train it, or NVLink is disabled on this host).
    NvlinkInactive,
    /// NVLink error counters are rising.
    NvlinkErrors,
    /// The PCIe link trained narrower than the GPU's maximum.
    PcieDegraded,
    /// Hardware slowdown reported in clock-event reasons (judged by earlier versions; now
    /// evidence of [`FaultCode::GpuSlow`]: kept so their state files still load).
    ClockSlowdown,
    /// Slow but not broken: a busy GPU held back (hardware slowdown, thermal or power-brake
    /// clock events, a lowered power limit, clocks well under its busy peers', a PCIe link
    /// below its best or replaying), sustained over polls.
    GpuSlow,
    /// The driver's own required recovery action (NVML, R565+) is not "none".
    RecoveryAction,
    /// Fewer EFA devices than this instance type has, past the start-up grace.
    EfaMissing,
    /// An EFA device's network interface has no carrier (its link is down).
    EfaLinkDown,
    /// An EFA device's error counters are rising.
    EfaErrors,
    /// An EFA device's admin queue is failing (commands not completed, or in error).
    EfaAdminErrors,
    /// The `efa` driver logged a device failure (an admin command that never completed, the
    /// admin queue closed, a device reset that failed).
    EfaDriverError,
    /// A GPU has not registered with the NVLink fabric past the boot grace.
    FabricUnregistered,
    /// A GPU's NVLink fabric registration completed with an error.
    FabricRegistrationFailed,
    /// The NVLink fabric's health fields say the GPU's fabric is unhealthy (misconfigured,
    /// unhealthy routes).
    FabricUnhealthy,
    /// The NVLink fabric runs degraded (bandwidth, a recovery in progress, limited capacity).
    FabricDegraded,
    /// The host's IMEX unit is enabled but not running (failed, or not active after the
    /// start-up grace): multi-node NVLink jobs cannot share memory across the domain.
    ImexDown,
    /// The host's IMEX unit runs but no IMEX channel device exists for workloads to use.
    ImexNoChannels,
}

impl fmt::Display for FaultCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Xid(code) => write!(f, "Xid {code}"),
            Self::Sxid(code) => write!(f, "SXid {code}"),
            Self::FallenOffBus => f.write_str("fallen off the bus"),
            other => f.write_str(other.slug()),
        }
    }
}

impl FaultCode {
    /// A fault of the network fabric (EFA), which the networking condition carries, not the
    /// accelerated-hardware one.
    pub fn is_network(&self) -> bool {
        matches!(
            self,
            Self::EfaMissing
                | Self::EfaLinkDown
                | Self::EfaErrors
                | Self::EfaAdminErrors
                | Self::EfaDriverError
        )
    }

    /// The GPU is gone from the node: fallen off the bus (Xid 79 or the driver's bus line),
    /// lost to NVML, or missing from NVML's enumeration. On a device-plugin node this takes
    /// the whole node out: the NVIDIA device plugin builds its allocation over every GPU
    /// and refuses every GPU pod once one is lost.
    pub fn is_gpu_gone(&self) -> bool {
        matches!(
            self,
            Self::FallenOffBus | Self::Xid(79) | Self::GpuLost | Self::GpuMissing
        )
    }

    /// An occurrence (an Xid, an SXid, the bus line), latched until cleared, rather than a
    /// condition a polling source reports while it lasts.
    pub fn is_event(&self) -> bool {
        matches!(
            self,
            Self::Xid(_) | Self::Sxid(_) | Self::FallenOffBus | Self::EfaDriverError
        )
    }

    /// A stable kebab-case name (metric label, reason suffix).
    pub fn slug(&self) -> &'static str {
        match self {
            Self::Xid(_) => "xid",
            Self::Sxid(_) => "sxid",
            Self::FallenOffBus => "fallen-off-bus",
            Self::GpuMissing => "gpu-missing",
            Self::GpuLost => "gpu-lost",
            Self::ResetRequired => "reset-required",
            Self::EccDisabled => "ecc-disabled",
            Self::EccUncorrectedVolatile => "ecc-uncorrected-volatile",
            Self::EccUncorrectedAggregate => "ecc-uncorrected-aggregate",
            Self::RetiredPagesPending => "retired-pages-pending",
            Self::RemapPending => "remap-pending",
            Self::RemapFailure => "remap-failure",
            Self::NvlinkDown => "nvlink-down",
            Self::NvlinkInactive => "nvlink-inactive",
            Self::NvlinkErrors => "nvlink-errors",
            Self::PcieDegraded => "pcie-degraded",
            Self::ClockSlowdown => "clock-slowdown",
            Self::GpuSlow => "gpu-slow",
            Self::RecoveryAction => "recovery-action",
            Self::EfaMissing => "efa-missing",
            Self::EfaLinkDown => "efa-link-down",
            Self::EfaErrors => "efa-errors",
            Self::EfaAdminErrors => "efa-admin-errors",
            Self::EfaDriverError => "efa-driver-error",
            Self::FabricUnregistered => "fabric-unregistered",
            Self::FabricRegistrationFailed => "fabric-registration-failed",
            Self::FabricUnhealthy => "fabric-unhealthy",
            Self::FabricDegraded => "fabric-degraded",
            Self::ImexDown => "imex-down",
            Self::ImexNoChannels => "imex-no-channels",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Info => "info",
            Self::Warning => "warning",
            Self::Fatal => "fatal",
        })
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::RestartApp => "restart-app",
            Self::ResetGpu => "reset-gpu",
            Self::Reboot => "reboot",
            Self::Replace => "replace",
        })
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Kmsg => "kmsg",
            Self::Nvml => "nvml",
            Self::Imds => "imds",
            Self::CapacityBlock => "capacity-block",
            Self::Logind => "logind",
            Self::Efa => "efa",
            Self::Imex => "imex",
        })
    }
}

/// What the catalog says about a fault code: its name, NVIDIA's advice and our decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Classification {
    /// NVIDIA's mnemonic (e.g. `ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS`).
    pub name: String,
    /// What the code means.
    pub description: String,
    /// NVIDIA's immediate-action bucket (e.g. `RESTART_BM`), or empty where NVIDIA gives none.
    pub nvidia_action: String,
    /// Our severity.
    pub severity: Severity,
    /// Our action.
    pub action: Action,
}

/// One fault as a source saw it, before the core merges it into the health model.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultReport {
    /// Where it happened.
    pub component: Component,
    /// What happened.
    pub code: FaultCode,
    /// The catalog's verdict.
    pub class: Classification,
    /// Who saw it.
    pub source: SourceKind,
    /// When it was seen.
    pub at: SystemTime,
    /// The raw evidence (the kernel log line, trimmed).
    pub detail: String,
    /// The source's position (kernel log sequence number), so a restart resumes after it.
    pub cursor: Option<u64>,
    /// A `gpu-agent inject` drill (a genuine drill mark), not the hardware.
    pub drill: bool,
}

impl FaultReport {
    /// A sighting by `source` at `at` with no position to resume from and no drill mark:
    /// what every source but the kernel log reports.
    pub fn seen(
        source: SourceKind,
        at: SystemTime,
        component: Component,
        code: FaultCode,
        class: Classification,
        detail: String,
    ) -> Self {
        Self {
            component,
            code,
            class,
            source,
            at,
            detail,
            cursor: None,
            drill: false,
        }
    }
}

/// A fault in the node's health model: a report merged with its repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    /// Where it happened.
    pub component: Component,
    /// The GPU's index (bus order) when the component is a known GPU.
    pub gpu_index: Option<u32>,
    /// What happened.
    pub code: FaultCode,
    /// Who saw it.
    pub source: SourceKind,
    /// The catalog's verdict.
    #[serde(flatten)]
    pub class: Classification,
    /// First occurrence.
    #[serde(with = "super::time")]
    pub first_seen: SystemTime,
    /// Latest occurrence.
    #[serde(with = "super::time")]
    pub last_seen: SystemTime,
    /// How many times it was seen.
    pub count: u64,
    /// The latest raw evidence.
    pub detail: String,
    /// The boot it was last seen in.
    pub boot_id: String,
    /// Why its action was escalated beyond the catalog's (recurring across boots, or
    /// repeating on the same GPU), if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalated: Option<String>,
    /// Seen only in `gpu-agent inject` drills: never escalated, gone at the next boot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drill: bool,
}

impl Fault {
    /// The id of the checkpoint notice a fatal fault raises (trigger `fatal-fault`): one per
    /// fault and first sighting.
    pub fn notice_id(&self) -> String {
        format!(
            "fatal-fault:{}:{}",
            self.label(),
            super::time::rfc3339(self.first_seen)
        )
    }

    /// A short human label: `GPU 3 Xid 79`, `NVSwitch 0000:05:00.0 SXid 12028`.
    pub fn label(&self) -> String {
        match (self.component, self.gpu_index) {
            (Component::Gpu { .. }, Some(index)) => format!("GPU {index} {}", self.code),
            (Component::Gpu { pci }, None) => format!("GPU {pci} {}", self.code),
            (Component::Nvswitch { pci }, _) => format!("NVSwitch {pci} {}", self.code),
            (Component::Efa { pci }, _) => format!("EFA {pci} {}", self.code),
            (Component::Node, _) => format!("node {}", self.code),
        }
    }
}
