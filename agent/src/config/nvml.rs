//! `[nvml]`: GPU health polled through NVML.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::duration::{DAY, HOUR, MS};
use super::HumanDuration;

/// `[nvml]`: GPU health polled through NVML (no DCGM needed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvmlConfig {
    /// Poll NVML.
    pub enabled: bool,
    /// The NVML library: a file name searched the usual way, or a path.
    pub library: PathBuf,
    /// How often to poll.
    pub poll_interval: HumanDuration<{ 100 * MS }, HOUR>,
    /// GPUs this node should have; 0 derives it from the instance type (DMI product name)
    /// or, failing that, from the NVIDIA GPUs on the PCI bus.
    pub expected_gpus: u32,
    /// From boot, how long NVLinks that have not come up yet are not judged: on HGX hosts
    /// nvidia-fabricmanager trains them after the agent starts. A link that was up and goes
    /// down is fatal at once, grace or not; one never up after the grace is a warning.
    pub nvlink_boot_grace: HumanDuration<0, DAY>,
    /// A condition NVML found (ECC, remapped rows, NVLink, PCIe, fabric, a missing GPU)
    /// clears only this long after the last poll that saw it, so a reading that comes and
    /// goes is one fault, not a node condition that flips each poll (0: at the first clean
    /// poll).
    pub clear_after: HumanDuration<0, DAY>,
    /// Utilisation (percent) from which a GPU is busy: only a busy GPU is judged slow (an
    /// idle one clocks down and lowers its PCIe generation to save power). In the funnel,
    /// a MIG device's GPU instance is busy from this SM activity (GPM; MIG mode gives no
    /// utilisation).
    pub busy_percent: u32,
    /// GPM's tensor activity (percent, Hopper and later; in MIG mode, of the GPU instance)
    /// from which a GPU is productive: doing the work training does, not waiting in a
    /// collective. Tensor work this high counts as busy in the funnel too.
    pub productive_percent: u32,
    /// Busy polls in a row with evidence of being held back (clock events, a lowered
    /// power limit, a straggling clock, a PCIe link below its best or replaying) before a
    /// GPU is slow.
    pub slow_after_polls: u32,
    /// An SM clock under this share of the median of the node's other busy GPUs in the same
    /// power state (all at their power limit, or all under it) is evidence of being held
    /// back.
    pub slow_clock_ratio: f64,
}

impl Default for NvmlConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            library: PathBuf::from("libnvidia-ml.so.1"),
            poll_interval: HumanDuration(std::time::Duration::from_secs(10)),
            expected_gpus: 0,
            nvlink_boot_grace: HumanDuration(std::time::Duration::from_secs(600)),
            clear_after: HumanDuration(std::time::Duration::from_secs(60)),
            busy_percent: 80,
            productive_percent: 10,
            slow_after_polls: 3,
            slow_clock_ratio: 0.8,
        }
    }
}
