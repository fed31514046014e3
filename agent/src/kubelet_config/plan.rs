//! From topology and settings to the kubelet fields to write, with the reasoning.

use std::collections::BTreeMap;

use serde::Serialize;

use super::cpuset::CpuSet;
use super::quantity::{format_mib, parse_mib};
use super::topology::Topology;
use crate::config::KubeletConfig;

/// Kubernetes' default maxPods, used when the instance type is unknown.
const DEFAULT_MAX_PODS: u64 = 110;

/// maxPods nodeadm derives for GPU instance types (ENIs × (IPv4 per ENI − 1) + 2).
const MAX_PODS: &[(&str, u64)] = &[
    ("p6-b200.48xlarge", 198),
    ("p5en.48xlarge", 198),
    ("p5e.48xlarge", 100),
    ("p5.48xlarge", 100),
    ("p5.4xlarge", 118),
    ("p4de.24xlarge", 737),
    ("p4d.24xlarge", 737),
    ("p3dn.24xlarge", 737),
    ("g6e.48xlarge", 492),
    ("g6e.xlarge", 58),
    ("g6.48xlarge", 737),
    ("g6.xlarge", 58),
    ("g5.48xlarge", 345),
    ("g5.xlarge", 58),
    ("g4dn.12xlarge", 234),
];

/// The KubeletConfiguration fields gpu-agent sets (and the validator checks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletFields {
    /// `static`.
    pub cpu_manager_policy: String,
    /// e.g. `full-pcpus-only: "true"`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cpu_manager_policy_options: BTreeMap<String, String>,
    /// Whole cores, spread across NUMA nodes.
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: String,
    /// Cleared: the kubelet refuses reservedSystemCPUs together with reserved cgroups.
    pub kube_reserved_cgroup: String,
    /// Cleared, as above.
    pub system_reserved_cgroup: String,
    /// `none`, `best-effort`, `restricted`, `single-numa-node`.
    pub topology_manager_policy: String,
    /// `container` or `pod`.
    pub topology_manager_scope: String,
    /// e.g. `max-allowable-numa-nodes`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub topology_manager_policy_options: BTreeMap<String, String>,
    /// `Static` or `None`.
    pub memory_manager_policy: String,
    /// Per NUMA node.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reserved_memory: Vec<ReservedMemory>,
    /// `memory` only: set explicitly so the reservedMemory sum holds whatever maxPods is.
    pub kube_reserved: BTreeMap<String, String>,
    /// `memory` only.
    pub system_reserved: BTreeMap<String, String>,
    /// `memory.available` only (maps merge key by key).
    pub eviction_hard: BTreeMap<String, String>,
    /// Feature gates the options need (none by default).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
}

/// One `reservedMemory` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReservedMemory {
    /// NUMA node.
    pub numa_node: u32,
    /// `{memory: 1455Mi}`.
    pub limits: BTreeMap<String, String>,
}

/// The plan: what to write and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The fields.
    pub kubelet: KubeletFields,
    /// Why each choice was made.
    pub reasoning: Vec<String>,
    /// What the operator should know.
    pub warnings: Vec<String>,
    /// The topology the plan was made for.
    pub topology: Topology,
}

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A `[kubelet]` value is not usable.
    #[error("[kubelet] {key}: {reason}")]
    Setting {
        /// The key.
        key: &'static str,
        /// Why.
        reason: String,
    },
}

/// Make the plan.
pub fn make_plan(
    topology: &Topology,
    settings: &KubeletConfig,
    instance_type: Option<&str>,
) -> Result<Plan, PlanError> {
    let mut reasoning = Vec::new();
    let mut warnings = Vec::new();
    let nodes = topology.nodes.len();
    let gpu_nodes = topology.nodes.iter().filter(|n| !n.gpus.is_empty()).count();
    // NUMA nodes with CPUs. On Grace with coherent driver memory mode off, GPU memory shows
    // as CPU-less NUMA nodes (8 per GPU, most of them memoryless): they hold no core to
    // reserve and no system memory to reserve from.
    let cpu_nodes = topology
        .nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .count()
        .max(1);
    let numa_words = if cpu_nodes == nodes {
        format!("{nodes} NUMA nodes")
    } else {
        format!("{cpu_nodes} of {nodes} NUMA nodes have CPUs")
    };

    // CPU Manager.
    let cores_wanted = if settings.reserved_cores > 0 {
        settings.reserved_cores as usize
    } else {
        let auto = topology
            .online
            .len()
            .div_ceil(32)
            .clamp(1, 8)
            .max(cpu_nodes);
        reasoning.push(format!(
            "Reserve {auto} physical cores for the system and kubelet: one per 32 CPUs (1 to 8), at least one per NUMA node ({} CPUs, {numa_words}).",
            topology.online.len()
        ));
        auto
    };
    let reserved = pick_cores(topology, cores_wanted);
    if reserved.len() >= topology.online.len() {
        return Err(PlanError::Setting {
            key: "reserved_cores",
            reason: format!("{cores_wanted} cores would reserve every CPU"),
        });
    }
    reasoning.push(format!(
        "reservedSystemCPUs {reserved}: whole cores (both SMT siblings) so no pod shares a core with system threads, spread across NUMA nodes."
    ));
    let mut cpu_options = BTreeMap::new();
    let full_pcpus = match settings.full_pcpus_only.as_str() {
        "auto" => topology.threads_per_core > 1,
        "true" => true,
        "false" => false,
        other => {
            return Err(PlanError::Setting {
                key: "full_pcpus_only",
                reason: format!("{other:?}: use \"auto\", \"true\" or \"false\""),
            })
        }
    };
    if full_pcpus {
        cpu_options.insert("full-pcpus-only".to_string(), "true".to_string());
        reasoning.push("cpuManagerPolicyOptions full-pcpus-only: Guaranteed pods get whole physical cores (no SMT sibling shared with another pod).".into());
    } else if topology.threads_per_core == 1 {
        reasoning.push("SMT is off: full-pcpus-only would change nothing and is left out.".into());
    }

    // Topology Manager.
    let (policy, why) = match settings.topology_policy.as_str() {
        "auto" if nodes <= 1 => ("single-numa-node", "one NUMA node: every pod fits it, so single-numa-node costs nothing".to_string()),
        "auto" if gpu_nodes > 1 => (
            "best-effort",
            format!(
                "GPUs span {gpu_nodes} NUMA nodes with at most {} on one: single-numa-node or restricted would reject any pod asking for more than {} GPUs (TopologyAffinityError; the pod is not rescheduled), so best-effort aligns CPUs, memory, GPUs and EFA when it can and never rejects",
                topology.max_gpus_per_node(),
                topology.max_gpus_per_node()
            ),
        ),
        "auto" => ("best-effort", format!("{nodes} NUMA nodes: best-effort aligns when it can and never rejects a pod")),
        p @ ("none" | "best-effort" | "restricted" | "single-numa-node") => (p, "set by [kubelet] topology_policy".to_string()),
        other => return Err(PlanError::Setting { key: "topology_policy", reason: format!("{other:?}: use auto, none, best-effort, restricted or single-numa-node") }),
    };
    reasoning.push(format!("topologyManagerPolicy {policy}: {why}."));
    if matches!(policy, "single-numa-node" | "restricted")
        && nodes > 1
        && topology.gpu_count() > topology.max_gpus_per_node()
    {
        warnings.push(format!(
            "topologyManagerPolicy {policy} on a host whose GPUs span NUMA nodes: pods asking for more than {} GPUs will fail with TopologyAffinityError.",
            topology.max_gpus_per_node()
        ));
    }
    let scope = settings.topology_scope.clone();
    if scope != "pod" && scope != "container" {
        return Err(PlanError::Setting {
            key: "topology_scope",
            reason: format!("{scope:?}: use pod or container"),
        });
    }
    reasoning.push(format!("topologyManagerScope {scope}: {}.", if scope == "pod" { "all containers of a pod are aligned together (a trainer and its sidecars share the GPUs' NUMA node)" } else { "containers are aligned one by one" }));
    let mut topo_options = BTreeMap::new();
    let mut policy = policy;
    if nodes > 8 && policy != "none" {
        let version = super::validate::Version::parse(&settings.kubelet_version);
        if version.is_some_and(|v| v >= super::validate::Version(1, 31)) {
            topo_options.insert("max-allowable-numa-nodes".to_string(), nodes.to_string());
            reasoning.push(format!("{nodes} NUMA nodes: max-allowable-numa-nodes, else the Topology Manager refuses to load on more than 8."));
        } else {
            reasoning.push(format!(
                "{nodes} NUMA nodes: the Topology Manager refuses to load on more than 8, and kubelet {} has no max-allowable-numa-nodes (1.31 and later), so topologyManagerPolicy is none (the kubelet would not start otherwise).",
                settings.kubelet_version
            ));
            warnings.push(format!("{nodes} NUMA nodes on kubelet {}: no Topology Manager alignment; kubelet 1.31 or later aligns with max-allowable-numa-nodes.", settings.kubelet_version));
            policy = "none";
        }
    }
    if !topology.unknown_numa_devices.is_empty() {
        warnings.push(format!(
            "{} GPU/EFA devices report numa_node -1 on a multi-NUMA host; the kubelet cannot align them.",
            topology.unknown_numa_devices.len()
        ));
    }

    // Memory Manager.
    let mib = |key: &'static str, text: &str| {
        parse_mib(text).ok_or_else(|| PlanError::Setting {
            key,
            reason: format!("{text:?} is not a quantity like 100Mi or 1Gi"),
        })
    };
    let max_pods = instance_type
        .and_then(|t| MAX_PODS.iter().find(|(n, _)| *n == t))
        .map(|(_, p)| *p);
    let kube_reserved = if settings.kube_reserved_memory == "auto" {
        let pods = max_pods.unwrap_or(DEFAULT_MAX_PODS);
        let value = 11 * pods + 255;
        reasoning.push(format!(
            "kubeReserved.memory {}: nodeadm's formula 11 × maxPods + 255 Mi with maxPods {pods} ({}), set explicitly so the reservedMemory sum holds whatever maxPods nodeadm derives.",
            format_mib(value),
            match (instance_type, max_pods) {
                (Some(t), Some(_)) => t.to_string(),
                (Some(t), None) => format!("{t} is not in the maxPods table: Kubernetes' default"),
                (None, _) => "instance type unknown: Kubernetes' default".to_string(),
            }
        ));
        value
    } else {
        mib("kube_reserved_memory", &settings.kube_reserved_memory)?
    };
    let system_reserved = mib("system_reserved_memory", &settings.system_reserved_memory)?;
    let eviction = mib("eviction_hard_memory", &settings.eviction_hard_memory)?;
    let (memory_policy, reserved_memory) = if settings.memory_manager {
        let total = kube_reserved + system_reserved + eviction;
        // The system's and kubelet's memory is reserved where their CPUs are: never from a
        // CPU-less node (GPU memory, or a memoryless MIG node that would fail validation).
        let mut hosts: Vec<_> = topology
            .nodes
            .iter()
            .filter(|n| !n.cpus.is_empty() && n.memory_mib > 0)
            .collect();
        if hosts.is_empty() {
            hosts = topology.nodes.iter().filter(|n| n.memory_mib > 0).collect();
        }
        let n = (hosts.len() as u64).max(1);
        let spread = if hosts.len() == nodes {
            format!("{nodes} NUMA nodes")
        } else {
            format!(
                "the {} NUMA nodes with CPUs (the {} CPU-less ones, GPU memory or memoryless, get none)",
                hosts.len(),
                nodes - hosts.len()
            )
        };
        let reserved_memory: Vec<ReservedMemory> = hosts
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let share = total / n + u64::from(i == 0) * (total % n);
                ReservedMemory {
                    numa_node: node.id,
                    limits: [("memory".to_string(), format_mib(share))].into(),
                }
            })
            .collect();
        reasoning.push(format!(
            "memoryManagerPolicy Static: guaranteed pods get memory from their CPUs' NUMA node. reservedMemory totals {} = kubeReserved {} + systemReserved {} + evictionHard {}, split evenly across {spread}, as the kubelet requires.",
            format_mib(total), format_mib(kube_reserved), format_mib(system_reserved), format_mib(eviction)
        ));
        ("Static", reserved_memory)
    } else {
        reasoning
            .push("memoryManagerPolicy None: disabled by [kubelet] memory_manager = false.".into());
        ("None", Vec::new())
    };

    let kubelet = KubeletFields {
        cpu_manager_policy: "static".into(),
        cpu_manager_policy_options: cpu_options,
        reserved_system_cpus: reserved.to_string(),
        kube_reserved_cgroup: String::new(),
        system_reserved_cgroup: String::new(),
        topology_manager_policy: policy.to_string(),
        topology_manager_scope: scope,
        topology_manager_policy_options: topo_options,
        memory_manager_policy: memory_policy.into(),
        reserved_memory,
        kube_reserved: [("memory".to_string(), format_mib(kube_reserved))].into(),
        system_reserved: [("memory".to_string(), format_mib(system_reserved))].into(),
        eviction_hard: [("memory.available".to_string(), format_mib(eviction))].into(),
        feature_gates: BTreeMap::new(),
    };
    reasoning.push("kubeReservedCgroup and systemReservedCgroup cleared: the kubelet rejects reservedSystemCPUs together with them, and nodeadm sets both (nodes then never register).".into());
    Ok(Plan {
        kubelet,
        reasoning,
        warnings,
        topology: topology.clone(),
    })
}

/// `count` whole cores, round-robin over NUMA nodes, lowest CPU ids first.
fn pick_cores(topology: &Topology, count: usize) -> CpuSet {
    let mut per_node: Vec<Vec<&CpuSet>> = topology
        .nodes
        .iter()
        .map(|n| {
            let mut cores: Vec<&CpuSet> = topology
                .cores
                .iter()
                .filter(|c| c.is_subset(&n.cpus))
                .collect();
            cores.sort_by_key(|c| c.0.iter().next().copied());
            cores
        })
        .collect();
    let mut picked = CpuSet::default();
    let mut taken = 0;
    'outer: while taken < count {
        let before = taken;
        for cores in &mut per_node {
            if taken == count {
                break 'outer;
            }
            if !cores.is_empty() {
                picked.0.extend(cores.remove(0).0.iter().copied());
                taken += 1;
            }
        }
        if taken == before {
            break;
        }
    }
    picked
}
