//! Per-GPU fencing: a GPU taken out of scheduling on its own (a DRA `DeviceTaintRule`)
//! instead of the whole node.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Component, Fault};

/// The taint key of every DeviceTaintRule gpu-agent writes.
pub const TAINT_KEY: &str = "gpu-agent.io/gpu-fault";

/// How hard a fenced device is kept from work. Ordered: a fence only ever moves up this
/// ladder while its fault lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaintEffect {
    /// Visible only: the device schedules as before (a warning).
    None,
    /// No new claim gets the device (a fault fatal for this GPU).
    NoSchedule,
    /// Pods using the device are evicted too.
    NoExecute,
}

impl TaintEffect {
    /// Every effect, mildest first.
    pub const ALL: [Self; 3] = [Self::None, Self::NoSchedule, Self::NoExecute];

    /// The name the Kubernetes API uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::NoSchedule => "NoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }

    /// Parse the API's name; an unknown effect is `None`, as the API server treats it.
    pub fn parse(name: &str) -> Self {
        Self::ALL
            .into_iter()
            .find(|e| e.name() == name)
            .unwrap_or(Self::None)
    }
}

impl fmt::Display for TaintEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One GPU fenced on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFence {
    /// The GPU's UUID (how its devices were found in the driver's ResourceSlice).
    pub uuid: String,
    /// The effect on the server (or being written).
    pub effect: TaintEffect,
    /// The taint's value: the worst fault's reason (`NvidiaXID48Error`).
    pub reason: String,
    /// The devices fenced: the GPU and its MIG devices, as the ResourceSlice names them.
    pub devices: Vec<String>,
    /// Why the rules could not be written, if they could not: the node condition then
    /// carries this GPU's faults, as on a node without fencing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// What per-GPU fencing can do on this node, as the device-taints sink found it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fencing {
    /// The `resource.k8s.io` version serving DeviceTaintRules (`v1`, `v1beta2`).
    pub api_version: String,
    /// The GPUs (by UUID) the DRA driver publishes for this node: those that can be fenced.
    pub gpus: Vec<String>,
    /// The GPUs fenced now.
    pub fences: Vec<GpuFence>,
}

impl Fencing {
    /// The fence of GPU `uuid`, if it has one.
    pub fn fence(&self, uuid: &str) -> Option<&GpuFence> {
        self.fences.iter().find(|f| f.uuid == uuid)
    }

    /// Does a fence keep work off GPU `uuid`, so its fatal confined faults need not condemn
    /// the node: the driver publishes it and its rules are on the server (written or read
    /// back by the device-taints sink, not failed since) at `NoSchedule` or stronger. No
    /// fence yet, a fence still at `None`, or one that failed: the node condition carries
    /// the faults.
    pub fn covers(&self, uuid: &str) -> bool {
        self.gpus.iter().any(|g| g == uuid)
            && self
                .fence(uuid)
                .is_some_and(|f| f.failed.is_none() && f.effect >= TaintEffect::NoSchedule)
    }
}

impl Fault {
    /// Is what this fault needs confined to its GPU (restart the application, reset the GPU,
    /// that GPU's memory and NVLink), so fencing the GPU alone answers it? A GPU gone from
    /// the node, a reboot or replace verdict (escalations included), and every fault not of
    /// one GPU (NVSwitch, EFA, the node) are not.
    pub fn confined_to_gpu(&self) -> bool {
        use super::{Action, FaultCode as C};
        if !matches!(self.component, Component::Gpu { .. }) || self.code.is_gpu_gone() {
            return false;
        }
        let memory_or_link = matches!(
            self.code,
            C::EccUncorrectedVolatile
                | C::EccUncorrectedAggregate
                | C::RetiredPagesPending
                | C::RemapPending
                | C::RemapFailure
                | C::NvlinkDown
                | C::NvlinkInactive
                | C::NvlinkErrors
        );
        self.escalated.is_none() && (self.class.action <= Action::ResetGpu || memory_or_link)
    }
}
