//! The kubelet's own rules, checked before anything is written: a config the kubelet
//! rejects leaves a node that never registers.

use super::cpuset::CpuSet;
use super::plan::KubeletFields;
use super::quantity::parse_mib;
use super::topology::Topology;

/// A `major.minor` kubelet version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32);

impl Version {
    /// Parse `1.33`, `v1.33.2`.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().trim_start_matches('v').split('.');
        Some(Self(
            parts.next()?.parse().ok()?,
            parts.next()?.parse().ok()?,
        ))
    }
}

/// (option, minimum version, feature gate it needs when alpha).
const CPU_OPTIONS: &[(&str, Version, Option<&str>)] = &[
    ("full-pcpus-only", Version(1, 23), None),
    ("distribute-cpus-across-numa", Version(1, 31), None),
    ("strict-cpu-reservation", Version(1, 32), None),
    ("prefer-align-cpus-by-uncorecache", Version(1, 34), None),
    (
        "align-by-socket",
        Version(1, 25),
        Some("CPUManagerPolicyAlphaOptions"),
    ),
    (
        "distribute-cpus-across-cores",
        Version(1, 31),
        Some("CPUManagerPolicyAlphaOptions"),
    ),
];
const TOPOLOGY_OPTIONS: &[(&str, Version)] = &[
    ("prefer-closest-numa-nodes", Version(1, 28)),
    ("max-allowable-numa-nodes", Version(1, 31)),
];

/// Every rule `fields` breaks on `topology` for kubelet `version`; empty when valid.
pub fn validate(fields: &KubeletFields, topology: &Topology, version: Version) -> Vec<String> {
    let mut out = Vec::new();
    let reserved = match CpuSet::parse(&fields.reserved_system_cpus) {
        Ok(set) => set,
        Err(e) => {
            out.push(format!("reservedSystemCPUs: {e}"));
            CpuSet::default()
        }
    };
    if fields.cpu_manager_policy == "static" && reserved.is_empty() {
        out.push("cpuManagerPolicy static needs a CPU reservation greater than zero (reservedSystemCPUs)".into());
    }
    if !["static", "none"].contains(&fields.cpu_manager_policy.as_str()) {
        out.push(format!(
            "cpuManagerPolicy {:?}: must be static or none",
            fields.cpu_manager_policy
        ));
    }
    let missing: CpuSet = reserved
        .0
        .iter()
        .copied()
        .filter(|c| !topology.online.contains(*c))
        .collect();
    if !missing.is_empty() {
        out.push(format!(
            "reservedSystemCPUs {}: CPUs {missing} do not exist or are offline (online: {})",
            fields.reserved_system_cpus, topology.online
        ));
    }
    if !reserved.is_empty()
        && (!fields.kube_reserved_cgroup.is_empty() || !fields.system_reserved_cgroup.is_empty())
    {
        out.push("invalid configuration: can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup (--kube-reserved-cgroup)".into());
    }
    let full_pcpus = fields
        .cpu_manager_policy_options
        .contains_key("full-pcpus-only");
    if full_pcpus
        && !topology
            .cores
            .iter()
            .filter(|c| c.0.iter().any(|cpu| reserved.contains(*cpu)))
            .all(|c| c.is_subset(&reserved))
    {
        out.push(format!(
            "reservedSystemCPUs {}: full-pcpus-only needs whole physical cores (every SMT sibling)",
            fields.reserved_system_cpus
        ));
    }
    for (option, value) in &fields.cpu_manager_policy_options {
        match CPU_OPTIONS.iter().find(|(name, ..)| name == option) {
            None => out.push(format!("cpuManagerPolicyOptions {option}: unknown option")),
            Some((_, min, gate)) => {
                if version < *min {
                    out.push(format!("cpuManagerPolicyOptions {option}: needs kubelet {}.{} or later (this is {}.{})", min.0, min.1, version.0, version.1));
                }
                if let Some(gate) = gate {
                    if fields.feature_gates.get(*gate) != Some(&true) {
                        out.push(format!("cpuManagerPolicyOptions {option}: alpha, needs feature gate {gate}=true"));
                    }
                }
            }
        }
        if value != "true" && value != "false" {
            out.push(format!(
                "cpuManagerPolicyOptions {option}: value {value:?} must be \"true\" or \"false\""
            ));
        }
    }
    let opt = |o: &str| {
        fields
            .cpu_manager_policy_options
            .get(o)
            .is_some_and(|v| v == "true")
    };
    if opt("align-by-socket") && fields.topology_manager_policy == "single-numa-node" {
        out.push("cpuManagerPolicyOptions align-by-socket is incompatible with topologyManagerPolicy single-numa-node".into());
    }
    if opt("distribute-cpus-across-cores")
        && (opt("full-pcpus-only") || opt("distribute-cpus-across-numa"))
    {
        out.push("cpuManagerPolicyOptions distribute-cpus-across-cores cannot be combined with full-pcpus-only or distribute-cpus-across-numa".into());
    }

    if !["none", "best-effort", "restricted", "single-numa-node"]
        .contains(&fields.topology_manager_policy.as_str())
    {
        out.push(format!(
            "topologyManagerPolicy {:?}: must be none, best-effort, restricted or single-numa-node",
            fields.topology_manager_policy
        ));
    }
    if !["container", "pod"].contains(&fields.topology_manager_scope.as_str()) {
        out.push(format!(
            "topologyManagerScope {:?}: must be container or pod",
            fields.topology_manager_scope
        ));
    }
    for option in fields.topology_manager_policy_options.keys() {
        match TOPOLOGY_OPTIONS.iter().find(|(name, _)| name == option) {
            None => out.push(format!(
                "topologyManagerPolicyOptions {option}: unknown option"
            )),
            Some((_, min)) if version < *min => out.push(format!(
                "topologyManagerPolicyOptions {option}: needs kubelet {}.{} or later",
                min.0, min.1
            )),
            Some(_) => {}
        }
    }
    if topology.nodes.len() > 8
        && fields.topology_manager_policy != "none"
        && !fields
            .topology_manager_policy_options
            .contains_key("max-allowable-numa-nodes")
    {
        out.push(format!("{} NUMA nodes: the Topology Manager refuses to load on more than 8 without max-allowable-numa-nodes", topology.nodes.len()));
    }

    match fields.memory_manager_policy.as_str() {
        "None" => {}
        "Static" => {
            let total = |m: &std::collections::BTreeMap<String, String>, key: &str| m.get(key).and_then(|v| parse_mib(v)).unwrap_or(0);
            let want = total(&fields.kube_reserved, "memory") + total(&fields.system_reserved, "memory") + total(&fields.eviction_hard, "memory.available");
            let mut sum = 0;
            let mut seen = Vec::new();
            for r in &fields.reserved_memory {
                let Some(node) = topology.nodes.iter().find(|n| n.id == r.numa_node) else {
                    out.push(format!("reservedMemory numaNode {}: no such NUMA node", r.numa_node));
                    continue;
                };
                if seen.contains(&r.numa_node) {
                    out.push(format!("reservedMemory numaNode {}: listed twice", r.numa_node));
                }
                seen.push(r.numa_node);
                let mib = r.limits.get("memory").and_then(|v| parse_mib(v)).unwrap_or(0);
                if mib > node.memory_mib {
                    out.push(format!("reservedMemory numaNode {}: {mib}Mi is more than the node's {}Mi", r.numa_node, node.memory_mib));
                }
                sum += mib;
            }
            if sum != want {
                out.push(format!("the total amount \"{sum}Mi\" of type \"memory\" is not equal to the value \"{want}Mi\" determined by Node Allocatable feature (kubeReserved + systemReserved + evictionHard memory.available)"));
            }
            if version < Version(1, 22) {
                out.push("memoryManagerPolicy Static needs kubelet 1.22 or later".into());
            }
        }
        other => out.push(format!("memoryManagerPolicy {other:?}: must be Static or None (capitalised, unlike the CPU Manager's)")),
    }
    out
}
