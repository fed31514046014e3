//! `[kubernetes]`: node conditions, Events and cordon.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::duration::{DAY, MINUTE, MS, SECOND};
use super::HumanDuration;

/// `[kubernetes]`: node conditions and events for EKS node auto repair and Karpenter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// Write conditions and events.
    pub enabled: bool,
    /// Kubeconfig (the kubelet's, exec credential plugin included). If absent and running in
    /// a pod, the in-cluster config is used; otherwise the sink is off (standalone).
    pub kubeconfig: PathBuf,
    /// Condition type for GPU health.
    pub hardware_condition: String,
    /// Condition type for a pending end of the instance.
    pub interruption_condition: String,
    /// Condition type for the network fabric (EFA): `NetworkingReady`, which EKS node auto
    /// repair acts on (replace after 30 min).
    pub network_condition: String,
    /// The first change after a quiet window is written at once; changes within this long
    /// of a write are gathered into the next PATCH (at most 1s: changes must reach the API
    /// server within a second).
    pub debounce: HumanDuration<0, SECOND>,
    /// `lastHeartbeatTime` is refreshed this often with no change.
    pub heartbeat_interval: HumanDuration<SECOND, DAY>,
    /// Record warning and fatal faults as Node Events.
    pub events: bool,
    /// Write the node lifecycle conditions (KEP-5683) `MaintenancePlanned` (a known end is
    /// coming: Spot, scheduled maintenance, a Capacity Block's end, shutdown) and
    /// `MaintenanceInProgress` (it is acted on now), with the deadline in the annotation
    /// `gpu-agent.io/maintenance-deadline`. Plain conditions: harmless where nothing reads
    /// them.
    pub lifecycle_conditions: bool,
    /// A rebalance recommendation also sets `MaintenancePlanned` (off: it is only a hint
    /// that a Spot interruption may follow).
    pub lifecycle_rebalance: bool,
    /// Fence one GPU instead of the node where the NVIDIA DRA driver publishes this node's
    /// GPUs (ResourceSlices of driver `gpu.nvidia.com`, pool = this node) and the API server
    /// serves `DeviceTaintRule` (`resource.k8s.io/v1`, else `v1beta2`): a fault confined to
    /// one GPU becomes a rule tainting it and its MIG devices (effect `None` for a warning,
    /// `NoSchedule` for a fatal fault), deleted when the fault clears on evidence. Elsewhere
    /// (device-plugin nodes, older clusters) the node condition carries it, as it did.
    pub device_taints: bool,
    /// A fault fatal for one GPU taints it `NoExecute` at once (its pods are evicted); off:
    /// `NoSchedule`, and `NoExecute` only once the checkpoint of its processes (trigger
    /// `fatal-fault`) has settled.
    pub device_taint_no_execute: bool,
    /// On DRA nodes, a slow GPU (`gpu-slow`: busy and held back) is fenced `NoSchedule`
    /// (never `NoExecute`: its job runs on) once it has been slow this long; 0: never (its
    /// fence stays at effect `None`, visible only).
    pub slow_gpu_taint_after: HumanDuration<0, DAY>,
    /// Time limit for every API call: connecting, each read and write, and the whole call. A
    /// server that accepts and never answers shows as the sink `failed` after this. Building
    /// the client (the kubeconfig's exec credential plugin included) gets three times this.
    pub timeout: HumanDuration<{ 100 * MS }, { 5 * MINUTE }>,
    /// nodeadm's kubelet environment file, whose `NODEADM_KUBELET_ARGS` carries the
    /// kubelet's `--hostname-override` before the kubelet runs (a hint: the running kubelet's
    /// command line wins).
    pub kubelet_environment: PathBuf,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            kubeconfig: PathBuf::from("/var/lib/kubelet/kubeconfig"),
            hardware_condition: "AcceleratedHardwareReady".into(),
            interruption_condition: "InterruptionPending".into(),
            network_condition: "NetworkingReady".into(),
            debounce: HumanDuration(std::time::Duration::from_millis(100)),
            heartbeat_interval: HumanDuration(std::time::Duration::from_secs(60)),
            events: true,
            lifecycle_conditions: true,
            lifecycle_rebalance: false,
            device_taints: true,
            device_taint_no_execute: false,
            slow_gpu_taint_after: HumanDuration(std::time::Duration::ZERO),
            timeout: HumanDuration(std::time::Duration::from_secs(10)),
            kubelet_environment: PathBuf::from("/etc/eks/kubelet/environment"),
        }
    }
}
