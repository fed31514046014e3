//! The host's NUMA, CPU, GPU and EFA topology, read from sysfs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::cpuset::CpuSet;
use crate::model::PciAddress;

/// Why the topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A file that must exist could not be read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A file held something unexpected.
    #[error("{path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    /// Node id.
    pub id: u32,
    /// Its CPUs.
    #[serde(serialize_with = "as_string")]
    pub cpus: CpuSet,
    /// Its memory, MiB.
    pub memory_mib: u64,
    /// NVIDIA GPUs attached.
    pub gpus: Vec<PciAddress>,
    /// EFA devices attached.
    pub efa: Vec<PciAddress>,
}

fn as_string<S: serde::Serializer>(set: &CpuSet, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(set)
}

/// The host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    /// NUMA nodes by id.
    pub nodes: Vec<NumaNode>,
    /// Online CPUs.
    #[serde(serialize_with = "as_string")]
    pub online: CpuSet,
    /// Physical cores: each entry is the set of hardware threads of one core.
    #[serde(skip)]
    pub cores: Vec<CpuSet>,
    /// Threads per core (1: SMT off).
    pub threads_per_core: usize,
    /// Devices whose `numa_node` is -1 (the firmware did not say).
    pub unknown_numa_devices: Vec<PciAddress>,
}

impl Topology {
    /// GPUs on the host.
    pub fn gpu_count(&self) -> usize {
        self.nodes.iter().map(|n| n.gpus.len()).sum::<usize>()
    }

    /// The most GPUs any one NUMA node holds.
    pub fn max_gpus_per_node(&self) -> usize {
        self.nodes.iter().map(|n| n.gpus.len()).max().unwrap_or(0)
    }
}

fn read(path: &Path) -> Result<String, TopologyError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| TopologyError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

fn cpulist(path: &Path) -> Result<CpuSet, TopologyError> {
    CpuSet::parse(&read(path)?).map_err(|e| TopologyError::Parse {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Read the topology under `sysfs_root`.
pub fn read_topology(sysfs_root: &Path) -> Result<Topology, TopologyError> {
    let cpu_dir = sysfs_root.join("devices/system/cpu");
    let online = cpulist(&cpu_dir.join("online"))?;

    // NUMA nodes; a kernel without NUMA exposes none: one node with every CPU.
    let node_dir = sysfs_root.join("devices/system/node");
    let mut nodes = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&node_dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name
                .strip_prefix("node")
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let cpus = cpulist(&entry.path().join("cpulist"))?;
            let meminfo_path = entry.path().join("meminfo");
            let meminfo = read(&meminfo_path)?;
            let kb = meminfo
                .lines()
                .find(|l| l.contains("MemTotal:"))
                .and_then(|l| l.split_whitespace().rev().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| TopologyError::Parse {
                    path: meminfo_path.clone(),
                    reason: "no MemTotal line".into(),
                })?;
            nodes.push(NumaNode {
                id,
                cpus,
                memory_mib: kb / 1024,
                gpus: Vec::new(),
                efa: Vec::new(),
            });
        }
    }
    if nodes.is_empty() {
        let meminfo = read(&sysfs_root.join("../proc/meminfo")).unwrap_or_default();
        let kb = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        nodes.push(NumaNode {
            id: 0,
            cpus: online.clone(),
            memory_mib: kb / 1024,
            gpus: Vec::new(),
            efa: Vec::new(),
        });
    }
    nodes.sort_by_key(|n| n.id);

    // Physical cores from thread siblings.
    let mut cores: Vec<CpuSet> = Vec::new();
    for cpu in &online.0 {
        let path = cpu_dir.join(format!("cpu{cpu}/topology/thread_siblings_list"));
        let siblings = match cpulist(&path) {
            Ok(s) => s,
            Err(_) => [*cpu].into_iter().collect(),
        };
        let siblings: CpuSet = siblings
            .0
            .into_iter()
            .filter(|c| online.contains(*c))
            .collect();
        if !cores.contains(&siblings) {
            cores.push(siblings);
        }
    }
    let threads_per_core = cores.iter().map(CpuSet::len).max().unwrap_or(1);

    // GPUs and EFA devices with their NUMA node.
    let mut unknown = Vec::new();
    let pci_dir = sysfs_root.join("bus/pci/devices");
    let mut by_node: BTreeMap<u32, (Vec<PciAddress>, Vec<PciAddress>)> = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(&pci_dir) {
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let Ok(pci) = entry.file_name().to_string_lossy().parse::<PciAddress>() else {
                continue;
            };
            let field = |f: &str| {
                std::fs::read_to_string(entry.path().join(f))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default()
            };
            let (vendor, device, class) = (field("vendor"), field("device"), field("class"));
            let is_gpu =
                vendor == "0x10de" && (class.starts_with("0x0300") || class.starts_with("0x0302"));
            let is_efa = vendor == "0x1d0f" && device.starts_with("0xefa");
            if !is_gpu && !is_efa {
                continue;
            }
            let node = field("numa_node")
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .and_then(|n| u32::try_from(n).ok());
            // numa_node -1 on a single-node host can only mean node 0.
            let node = node.or_else(|| (nodes.len() == 1).then_some(nodes[0].id));
            match node {
                Some(n) => {
                    let slot = by_node.entry(n).or_default();
                    if is_gpu {
                        slot.0.push(pci)
                    } else {
                        slot.1.push(pci)
                    }
                }
                None => unknown.push(pci),
            }
        }
    }
    for node in &mut nodes {
        if let Some((gpus, efa)) = by_node.remove(&node.id) {
            node.gpus = gpus;
            node.efa = efa;
        }
    }
    Ok(Topology {
        nodes,
        online,
        cores,
        threads_per_core,
        unknown_numa_devices: unknown,
    })
}
