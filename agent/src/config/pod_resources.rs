//! `[pod_resources]`: the kubelet's pod-resources API.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::duration::{MINUTE, MS};
use super::HumanDuration;

/// `[pod_resources]`: the kubelet's pod-resources API, asked when a GPU fault, a checkpoint
/// signal or `status` needs to know which pod holds a GPU (never polled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PodResourcesConfig {
    /// Ask the kubelet; post GPU faults on the pods holding the GPU (needs `[kubernetes]`).
    pub enabled: bool,
    /// The kubelet's pod-resources socket (gRPC `v1.PodResourcesLister`).
    pub socket: PathBuf,
    /// Time limit for connecting and for the `List` call (10ms to 1.5s: `status` answers
    /// within 2s, holders included).
    pub timeout: HumanDuration<{ 10 * MS }, { 1500 * MS }>,
    /// How long one answer is reused (a burst of faults costs one `List`).
    pub cache_for: HumanDuration<0, MINUTE>,
    /// Extended resources whose name starts with this are GPUs (`nvidia.com/gpu`,
    /// `nvidia.com/gpu.shared`, `nvidia.com/mig-1g.10gb`, ...).
    pub resource_prefix: String,
}

impl Default for PodResourcesConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            timeout: HumanDuration(std::time::Duration::from_secs(1)),
            cache_for: HumanDuration(std::time::Duration::from_secs(2)),
            resource_prefix: "nvidia.com/".into(),
        }
    }
}
