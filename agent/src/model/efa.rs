//! The EFA devices as the `efa` source found them, for `status` and metrics.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::PciAddress;

/// One EFA device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EfaDevice {
    /// The RDMA device name (`rdmap79s0`).
    pub name: String,
    /// PCI address.
    pub pci: Option<PciAddress>,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// The network interfaces of the device (`device/net/*`); EFA-only interfaces have none.
    pub netdevs: Vec<String>,
    /// Whether the link is up (`carrier` of its interface); `None`: no interface to say.
    pub link_up: Option<bool>,
    /// The GPUs this device serves: behind the same PCIe switch, else on the same NUMA node.
    pub gpus: Vec<PciAddress>,
    /// Each counter's rate over the source's window, per minute (the error counters, and the
    /// bytes sent and received: [`EFA_TRAFFIC_COUNTERS`]).
    pub rates: BTreeMap<String, f64>,
    /// Pod containers holding it (the kubelet's pod-resources `List`); filled in when
    /// `status` asks, empty in the core's snapshots.
    #[serde(default)]
    pub holders: Vec<super::GpuHolder>,
}

/// The port counters of the bytes an EFA device sent and received: never judged as faults;
/// the funnel reads their rates (a pod busy on its GPUs whose EFA devices move nothing).
pub const EFA_TRAFFIC_COUNTERS: [&str; 2] = ["tx_bytes", "rx_bytes"];

/// What a polling source enumerated along with its faults.
#[derive(Debug, Clone, PartialEq)]
pub enum Inventory {
    /// NVML: the GPUs with identity and telemetry, and the driver version.
    Gpus {
        /// The GPUs enumerated.
        gpus: Vec<super::GpuIdentity>,
        /// The driver version, if known.
        driver_version: Option<String>,
    },
    /// The EFA devices.
    Efa(Vec<EfaDevice>),
    /// The host's IMEX unit.
    Imex(ImexState),
}

/// The host's IMEX daemon as the `imex` source last read it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImexState {
    /// The unit (`nvidia-imex.service`).
    pub unit: String,
    /// Its `ActiveState` (`active`, `activating`, `failed`, ...).
    pub active_state: String,
    /// IMEX channel devices present.
    pub channels: u32,
}
