//! Collectives that may not be using EFA: a pod that asked for EFA devices
//! (`vpc.amazonaws.com/efa`) and keeps every GPU it holds busy, while those devices move no
//! bytes at all (`tx_bytes` and `rx_bytes` flat over the EFA source's window), for
//! `[metrics] held_idle_after`. NCCL falls back to TCP sockets without a word when its EFA
//! plugin fails to load; the job then runs, slower, and nothing on AWS says so. The
//! funnel's tick judges it (pure, here) and posts one Pod Event per episode. It is
//! information for the job's owners, never a fault: a job that asked for EFA and talks to no
//! other node is told the same, hence "may".

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Assignments, EfaDevice, EFA_TRAFFIC_COUNTERS as TRAFFIC};

use super::funnel::Stage;

/// A pod busy on its GPUs whose EFA devices move nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quiet {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod.
    pub pod: String,
    /// The GPUs it holds (bus index), all busy.
    pub gpus: Vec<u32>,
    /// The EFA devices it holds, none moving a byte.
    pub devices: Vec<String>,
}

/// This tick's pods busy on every GPU they hold (at least one) while every EFA device they
/// hold moved no bytes over the window. A device whose byte rates are unknown (not read
/// yet, or not in this driver) never counts as quiet.
pub fn quiet(
    stages: &[Stage],
    assignments: Option<&Assignments>,
    devices: &[EfaDevice],
) -> Vec<Quiet> {
    let Some(assignments) = assignments else {
        return Vec::new();
    };
    let by_name: BTreeMap<&str, &EfaDevice> =
        devices.iter().map(|d| (d.name.as_str(), d)).collect();
    // One pass over the assignments: an ID that names no device found here (a device
    // plugin's own IDs) holds them all, as `efa_holders` takes it.
    let mut held: BTreeMap<(String, String), BTreeSet<&str>> = BTreeMap::new();
    for h in assignments.efa_holders(None, devices) {
        let names = held.entry((h.namespace, h.pod)).or_default();
        match by_name.get_key_value(h.device_id.as_str()) {
            Some((name, _)) => {
                names.insert(name);
            }
            None => names.extend(by_name.keys().copied()),
        }
    }
    let flat = |name: &str| {
        by_name.get(name).is_some_and(|d| {
            TRAFFIC
                .iter()
                .all(|c| d.rates.get(*c).is_some_and(|r| *r == 0.0))
        })
    };
    held.into_iter()
        .filter(|(_, names)| names.iter().all(|n| flat(n)))
        .filter_map(|((namespace, pod), names)| {
            let uses: Vec<(u32, bool)> = stages
                .iter()
                .flat_map(|s| {
                    s.pods
                        .iter()
                        .filter(|u| u.namespace == namespace && u.pod == pod)
                        .map(move |u| (s.gpu, u.busy))
                })
                .collect();
            (!uses.is_empty() && uses.iter().all(|(_, busy)| *busy)).then(|| Quiet {
                gpus: uses.iter().map(|(g, _)| *g).collect(),
                devices: names.iter().map(|n| (*n).to_string()).collect(),
                namespace,
                pod,
            })
        })
        .collect()
}

/// The Pod Event's message for `quiet`, quiet for `after`.
pub fn message(quiet: &Quiet, after: std::time::Duration) -> String {
    let gpus: Vec<String> = quiet.gpus.iter().map(|g| format!("GPU {g}")).collect();
    format!(
        "{} busy for {} while this pod's EFA devices ({}) moved no bytes: its collectives may \
         not be using EFA (NCCL falls back to TCP sockets when its EFA plugin does not load; \
         check NCCL_DEBUG=INFO for \"NET/OFI\")",
        gpus.join(", "),
        humantime::format_duration(after),
        quiet.devices.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Assignment;

    fn device(name: &str, bytes: Option<f64>) -> EfaDevice {
        EfaDevice {
            name: name.into(),
            pci: None,
            numa_node: None,
            netdevs: Vec::new(),
            link_up: None,
            gpus: Vec::new(),
            rates: bytes
                .map(|b| TRAFFIC.iter().map(|c| ((*c).to_string(), b)).collect())
                .unwrap_or_default(),
            holders: Vec::new(),
        }
    }

    fn efa(pod: &str, device: &str) -> Assignment {
        Assignment {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "rank".into(),
            resource: "vpc.amazonaws.com/efa".into(),
            device_id: device.into(),
        }
    }

    #[test]
    fn only_a_busy_pod_whose_every_efa_device_is_flat_is_quiet() {
        let devices = [
            device("rdmap0s0", Some(0.0)),
            device("rdmap1s0", Some(0.0)),
            device("rdmap2s0", Some(9e9)),
            device("rdmap3s0", None),
            device("rdmap4s0", Some(0.0)),
        ];
        let assignments = Assignments {
            efa: vec![
                efa("quiet", "rdmap0s0"),
                efa("quiet", "rdmap1s0"),
                efa("talking", "rdmap2s0"),
                efa("unknown", "rdmap3s0"),
                efa("idle", "rdmap4s0"),
                // A device plugin's own ID: taken as holding every device, one of which
                // talks.
                efa("plugin-ids", "efa-7"),
            ],
            ..Assignments::default()
        };
        let stages = [
            Stage::held_by(0, "quiet", true),
            Stage::held_by(1, "quiet", true),
            Stage::held_by(2, "talking", true),
            Stage::held_by(3, "unknown", true),
            Stage::held_by(4, "idle", false),
            Stage::held_by(5, "no-efa", true),
            Stage::held_by(6, "plugin-ids", true),
        ];
        let found = quiet(&stages, Some(&assignments), &devices);
        assert_eq!(
            found,
            [Quiet {
                namespace: "ml".into(),
                pod: "quiet".into(),
                gpus: vec![0, 1],
                devices: vec!["rdmap0s0".into(), "rdmap1s0".into()],
            }]
        );
        let text = message(&found[0], std::time::Duration::from_secs(1200));
        assert!(
            text.starts_with("GPU 0, GPU 1 busy for 20m while this pod's EFA devices (rdmap0s0, rdmap1s0) moved no bytes"),
            "{text}"
        );
        assert!(quiet(&stages, None, &devices).is_empty(), "no assignments");
    }
}
