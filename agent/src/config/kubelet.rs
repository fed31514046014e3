//! `[kubelet]`: the one-shot kubelet placement config.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[kubelet]`: overrides for `gpu-agent kubelet-config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeletConfig {
    /// Physical cores reserved for the system and kubelet; 0 = one per 32 CPUs (1 to 8), at
    /// least one per NUMA node.
    pub reserved_cores: u32,
    /// `auto` (single-numa-node on one NUMA node, else best-effort), `none`, `best-effort`,
    /// `restricted` or `single-numa-node`.
    pub topology_policy: String,
    /// `pod` or `container`.
    pub topology_scope: String,
    /// `full-pcpus-only`: `auto` (on when SMT is on), `true` or `false`.
    pub full_pcpus_only: String,
    /// Memory Manager `Static` (with per-NUMA `reservedMemory`).
    pub memory_manager: bool,
    /// `kubeReserved.memory`: `auto` (nodeadm's 11 × maxPods + 255 Mi for the instance type)
    /// or a quantity such as `2Gi`.
    pub kube_reserved_memory: String,
    /// `systemReserved.memory`.
    pub system_reserved_memory: String,
    /// `evictionHard["memory.available"]`.
    pub eviction_hard_memory: String,
    /// `auto` (nodeadm when its drop-in directory exists, else the kubelet drop-in),
    /// `nodeadm` or `kubelet-drop-in`.
    pub target: String,
    /// nodeadm's NodeConfig drop-in directory.
    pub nodeadm_dir: PathBuf,
    /// The kubelet's `--config-dir`.
    pub kubelet_config_dir: PathBuf,
    /// The kubelet's root directory (checkpoints).
    pub kubelet_root: PathBuf,
    /// Kubelet version the options are checked against (`MAJOR.MINOR`).
    pub kubelet_version: String,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            reserved_cores: 0,
            topology_policy: "auto".into(),
            topology_scope: "pod".into(),
            full_pcpus_only: "auto".into(),
            memory_manager: true,
            kube_reserved_memory: "auto".into(),
            system_reserved_memory: "1Gi".into(),
            eviction_hard_memory: "100Mi".into(),
            target: "auto".into(),
            nodeadm_dir: PathBuf::from("/etc/eks/nodeadm.d"),
            kubelet_config_dir: PathBuf::from("/etc/kubernetes/kubelet/config.json.d"),
            kubelet_root: PathBuf::from("/var/lib/kubelet"),
            kubelet_version: "1.33".into(),
        }
    }
}
