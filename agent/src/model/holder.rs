//! Who holds which GPU: the kubelet's device assignments (pod-resources `List`) resolved to
//! the GPUs the agent knows (by bus order, UUID or MIG UUID).

use serde::{Deserialize, Serialize};

use super::{GpuStatus, PciAddress};

/// One device ID a device plugin assigned to one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The extended resource (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, ...).
    pub resource: String,
    /// The ID the device plugin handed out (`GPU-<uuid>`, `GPU-<uuid>::<n>`, `MIG-<uuid>`,
    /// `3`, ...).
    pub device_id: String,
}

/// A container holding GPUs through Dynamic Resource Allocation (not mapped to GPUs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraClaim {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The DRA driver (`gpu.nvidia.com`).
    pub driver: String,
    /// The device's name in the driver's pool.
    pub device: String,
}

/// Everything the kubelet says is assigned on this node that concerns NVIDIA GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignments {
    /// Device-plugin assignments of NVIDIA resources.
    pub devices: Vec<Assignment>,
    /// DRA claims of NVIDIA drivers.
    pub dra: Vec<DraClaim>,
    /// Device-plugin assignments of EFA devices (`vpc.amazonaws.com/efa`).
    #[serde(default)]
    pub efa: Vec<Assignment>,
}

/// A pod container holding a GPU, as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHolder {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The device ID it holds (a replica or MIG device of this GPU, or the GPU).
    pub device_id: String,
}

impl std::fmt::Display for GpuHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.pod, self.container)
    }
}

/// Where the pod-resources lookup stands, for `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderView {
    /// Why holders are not shown (`None`: they are).
    pub unavailable: Option<String>,
    /// Device IDs that name no GPU the agent knows (with why).
    pub unresolved: Vec<String>,
    /// Containers holding GPUs through DRA, which are not mapped to GPUs.
    pub dra: Vec<DraClaim>,
}

/// The GPU a device ID names, by its PCI address.
///
/// Accepted shapes (the NVIDIA device plugin's): `GPU-<uuid>` (default), `<uuid-id>::<n>`
/// (time-slicing replica `n` of that GPU), `MIG-<uuid>` (a MIG device: its parent, through
/// NVML's MIG UUIDs), `MIG-GPU-<uuid>/<gi>/<ci>` (older drivers: the parent's UUID is in
/// it), `<index>` and `<index>:<mig>` (`--device-id-strategy=index`: bus order, which is
/// NVML's order).
pub fn resolve(device_id: &str, gpus: &[GpuStatus]) -> Result<PciAddress, String> {
    let id = device_id.split_once("::").map_or(device_id, |(id, _)| id);
    let by_uuid = |uuid: &str| {
        gpus.iter().find(|g| {
            g.nvml
                .as_ref()
                .and_then(|n| n.uuid.as_deref())
                .is_some_and(|u| u.eq_ignore_ascii_case(uuid))
        })
    };
    let found = if let Some(rest) = id.strip_prefix("MIG-GPU-") {
        let parent = rest.split('/').next().unwrap_or_default();
        by_uuid(&format!("GPU-{parent}"))
    } else if id.starts_with("MIG-") {
        gpus.iter().find(|g| {
            g.nvml
                .as_ref()
                .is_some_and(|n| n.mig_uuids.iter().any(|m| m.eq_ignore_ascii_case(id)))
        })
    } else if id.starts_with("GPU-") {
        by_uuid(id)
    } else {
        let index = id.split_once(':').map_or(id, |(gpu, _)| gpu);
        match index.parse::<u32>() {
            Ok(i) => gpus.iter().find(|g| g.index == i),
            Err(_) => return Err(format!("{device_id}: not a GPU, MIG or index ID")),
        }
    };
    found.map(|g| g.pci).ok_or_else(|| {
        if id.starts_with("MIG-") || id.starts_with("GPU-") {
            format!("{device_id}: no GPU with that UUID (NVML off or not reporting it)")
        } else {
            format!("{device_id}: no GPU with that index")
        }
    })
}

impl Assignments {
    /// The containers holding the GPU at `pci` (every replica and MIG device of it).
    pub fn holders(&self, pci: PciAddress, gpus: &[GpuStatus]) -> Vec<GpuHolder> {
        self.devices
            .iter()
            .filter(|a| resolve(&a.device_id, gpus) == Ok(pci))
            .map(|a| GpuHolder {
                namespace: a.namespace.clone(),
                pod: a.pod.clone(),
                container: a.container.clone(),
                device_id: a.device_id.clone(),
            })
            .collect()
    }

    /// The containers holding EFA device `name` (`None`: a fault of the node's EFA as a
    /// whole, such as a device missing). An ID that names no device this node has (the
    /// device plugin's IDs are its own) cannot say which device it is: such a holder is
    /// taken to use them all, as NCCL jobs on these nodes do.
    pub fn efa_holders(&self, name: Option<&str>, devices: &[super::EfaDevice]) -> Vec<GpuHolder> {
        let known = |id: &str| devices.iter().any(|d| d.name == id);
        self.efa
            .iter()
            .filter(|a| match name {
                Some(name) => a.device_id == name || !known(&a.device_id),
                None => true,
            })
            .map(|a| GpuHolder {
                namespace: a.namespace.clone(),
                pod: a.pod.clone(),
                container: a.container.clone(),
                device_id: a.device_id.clone(),
            })
            .collect()
    }

    /// Device IDs that name no known GPU, with why.
    pub fn unresolved(&self, gpus: &[GpuStatus]) -> Vec<String> {
        self.devices
            .iter()
            .filter_map(|a| resolve(&a.device_id, gpus).err())
            .collect()
    }

    /// The GPUs (bus index and address) one container holds.
    pub fn gpus_of(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        gpus: &[GpuStatus],
    ) -> Vec<(u32, PciAddress)> {
        let mut out: Vec<(u32, PciAddress)> = self
            .devices
            .iter()
            .filter(|a| a.namespace == namespace && a.pod == pod && a.container == container)
            .filter_map(|a| resolve(&a.device_id, gpus).ok())
            .filter_map(|pci| gpus.iter().find(|g| g.pci == pci).map(|g| (g.index, pci)))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuIdentity, Health};

    fn gpus() -> Vec<GpuStatus> {
        (0..4u8)
            .map(|i| GpuStatus {
                index: u32::from(i),
                pci: format!("0000:{:02x}:00.0", 0x10 + i).parse().expect("pci"),
                nvml: Some(GpuIdentity {
                    uuid: Some(format!("GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd")),
                    mig_uuids: vec![format!("MIG-1111111{i}-aaaa-bbbb-cccc-dddddddddddd")],
                    ..GpuIdentity::default()
                }),
                health: Health::Healthy,
                faults: vec![],
                holders: vec![],
                fence: None,
            })
            .collect()
    }

    #[test]
    fn every_device_plugin_id_shape_resolves_to_its_gpu() {
        let gpus = gpus();
        let pci = |i: usize| Ok(gpus[i].pci);
        let uuid3 = "GPU-00000003-aaaa-bbbb-cccc-dddddddddddd";
        assert_eq!(resolve(uuid3, &gpus), pci(3));
        assert_eq!(
            resolve(&uuid3.replace("aaaa", "AAAA"), &gpus),
            pci(3),
            "hex case"
        );
        assert_eq!(
            resolve(&format!("{uuid3}::7"), &gpus),
            pci(3),
            "time-slicing replica"
        );
        assert_eq!(
            resolve("MIG-11111112-aaaa-bbbb-cccc-dddddddddddd", &gpus),
            pci(2),
            "MIG UUID through NVML"
        );
        assert_eq!(
            resolve("MIG-GPU-00000001-aaaa-bbbb-cccc-dddddddddddd/3/0", &gpus),
            pci(1),
            "old MIG ID names its parent"
        );
        assert_eq!(resolve("2", &gpus), pci(2), "index strategy");
        assert_eq!(resolve("2::1", &gpus), pci(2), "index replica");
        assert_eq!(resolve("1:0", &gpus), pci(1), "index strategy, MIG");
        assert!(resolve("9", &gpus).is_err());
        assert!(resolve("GPU-ffffffff", &gpus).is_err());
        assert!(resolve("nvme0", &gpus).is_err());
    }

    #[test]
    fn holders_are_every_replica_of_a_gpu_and_nothing_else() {
        let gpus = gpus();
        let uuid = |i: u8| format!("GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd");
        let assign = |pod: &str, id: String| Assignment {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "trainer".into(),
            resource: "nvidia.com/gpu".into(),
            device_id: id,
        };
        let all = Assignments {
            devices: vec![
                assign("a", format!("{}::0", uuid(3))),
                assign("b", format!("{}::1", uuid(3))),
                assign("c", uuid(1)),
                assign("d", "GPU-unknown".into()),
            ],
            dra: vec![],
            efa: vec![],
        };
        let holders: Vec<String> = all
            .holders(gpus[3].pci, &gpus)
            .iter()
            .map(|h| h.pod.clone())
            .collect();
        assert_eq!(holders, ["a", "b"]);
        assert!(all.holders(gpus[0].pci, &gpus).is_empty());
        assert_eq!(all.unresolved(&gpus).len(), 1);
        assert_eq!(all.gpus_of("ml", "c", "trainer", &gpus), [(1, gpus[1].pci)]);
    }

    #[test]
    fn efa_holders_by_device_name_or_all_when_the_ids_name_none() {
        let efa = |pod: &str, id: &str| Assignment {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "c".into(),
            resource: "vpc.amazonaws.com/efa".into(),
            device_id: id.into(),
        };
        let devices: Vec<crate::model::EfaDevice> = ["rdmap0s0", "rdmap1s0"]
            .iter()
            .map(|n| crate::model::EfaDevice {
                name: (*n).into(),
                ..Default::default()
            })
            .collect();
        let named = Assignments {
            efa: vec![efa("a", "rdmap0s0"), efa("b", "rdmap1s0")],
            ..Assignments::default()
        };
        let pods = |h: Vec<GpuHolder>| h.into_iter().map(|h| h.pod).collect::<Vec<_>>();
        assert_eq!(pods(named.efa_holders(Some("rdmap1s0"), &devices)), ["b"]);
        assert_eq!(pods(named.efa_holders(None, &devices)), ["a", "b"]);
        // The plugin's own IDs: which device is unknown, so the holder counts for each.
        let opaque = Assignments {
            efa: vec![efa("a", "efa0")],
            ..Assignments::default()
        };
        assert_eq!(pods(opaque.efa_holders(Some("rdmap1s0"), &devices)), ["a"]);
    }
}
