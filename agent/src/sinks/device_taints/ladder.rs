//! What each GPU's fence should be, and the DeviceTaintRules that say it. Pure: the ladder
//! and the rule objects are unit-tested without an API server.

use std::collections::BTreeMap;

use crate::model::{HealthSnapshot, Severity, TaintEffect, TAINT_KEY};
use crate::sinks::kubernetes::dra::{NodeOwner, SliceDevice, DRIVER, GROUP, INSTANCE_LABEL};

/// The annotation naming the GPU (UUID) a rule fences.
pub const GPU_ANNOTATION: &str = "gpu-agent.io/gpu-uuid";

/// The annotation listing the faults behind a rule.
pub const FAULTS_ANNOTATION: &str = "gpu-agent.io/faults";

/// What one GPU's fence should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// The effect the faults call for.
    pub effect: TaintEffect,
    /// The worst fault's reason (the taint's value).
    pub reason: String,
    /// The faults behind it (`Xid 48 (reset-gpu)`).
    pub faults: Vec<String>,
}

/// The fence each GPU (by UUID) should have for `snapshot` at `now`: from the faults
/// confined to one GPU (see [`crate::model::Fault::confined_to_gpu`]), a warning `None`, a
/// fatal fault `NoSchedule`, and `NoExecute` when `no_execute` or once the checkpoint its
/// fault raised (trigger `fatal-fault`) has settled: the processes had their chance to
/// save. A slow GPU (`gpu-slow`, a warning) is `NoSchedule` once it has lasted `slow_after`
/// (`None`: never), and never `NoExecute`: no new claim gets it, its job runs on.
pub fn wanted(
    snapshot: &HealthSnapshot,
    no_execute: bool,
    slow_after: Option<std::time::Duration>,
    now: std::time::SystemTime,
) -> BTreeMap<String, Want> {
    let mut out: BTreeMap<String, Want> = BTreeMap::new();
    // Worst first: the first fault of a GPU names its fence.
    for fault in &snapshot.faults {
        if fault.class.severity < Severity::Warning || !fault.confined_to_gpu() {
            continue;
        }
        let Some(uuid) = snapshot.gpu_uuid(fault) else {
            continue;
        };
        let lasted = now.duration_since(fault.first_seen).unwrap_or_default();
        let effect = if fault.code == crate::model::FaultCode::GpuSlow
            && slow_after.is_some_and(|after| lasted >= after)
        {
            TaintEffect::NoSchedule
        } else if fault.class.severity == Severity::Warning {
            TaintEffect::None
        } else if no_execute || checkpointed(snapshot, &fault.notice_id()) {
            TaintEffect::NoExecute
        } else {
            TaintEffect::NoSchedule
        };
        let label = format!("{} ({})", fault.code, fault.class.action);
        let want = out.entry(uuid.to_string()).or_insert_with(|| Want {
            effect,
            reason: fault.reason(),
            faults: Vec::new(),
        });
        want.effect = want.effect.max(effect);
        want.faults.push(label);
    }
    out
}

/// Has the checkpoint of notice `id` settled (its processes signalled, then exited or held
/// for the hold)?
fn checkpointed(snapshot: &HealthSnapshot, id: &str) -> bool {
    snapshot
        .checkpoints
        .iter()
        .any(|r| r.notice_id == id && r.settled && r.signalled > 0)
}

/// The devices fencing GPU `uuid` covers, as the driver's slice names them: the GPU (its
/// `uuid` attribute) and its MIG devices (`parentUUID` the GPU's, a UUID NVML lists among
/// the GPU's MIG devices, or named after the GPU's device). Empty: the driver does not
/// publish this GPU.
pub fn devices_of<'a>(uuid: &str, migs: &[String], slice: &'a [SliceDevice]) -> Vec<&'a str> {
    let Some(gpu) = slice.iter().find(|d| d.uuid.as_deref() == Some(uuid)) else {
        return Vec::new();
    };
    let prefix = format!("{}-mig-", gpu.name);
    let mut out = vec![gpu.name.as_str()];
    out.extend(
        slice
            .iter()
            .filter(|d| {
                d.parent_uuid.as_deref() == Some(uuid)
                    || d.uuid.as_ref().is_some_and(|u| migs.contains(u))
                    || d.name.starts_with(&prefix)
            })
            .map(|d| d.name.as_str()),
    );
    out.sort_unstable();
    out.dedup();
    out
}

/// The rule's name: unique per node and device across the cluster (rules are
/// cluster-scoped), `gpu-agent.<node>.<device>`; a hash where that would pass 253 characters.
pub fn rule_name(node: &str, device: &str) -> String {
    let name = format!("gpu-agent.{node}.{device}").to_ascii_lowercase();
    if name.len() <= 253 {
        name
    } else {
        format!(
            "gpu-agent.{:016x}",
            crate::model::stable_hash(&format!("{node}/{device}"))
        )
    }
}

/// A taint value (a label value: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends).
pub fn taint_value(reason: &str) -> String {
    let kept: String = reason
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(63)
        .collect();
    kept.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The rule's metadata that ties it to this node: this agent's label, the instance's, and
/// the Node as its owner, so garbage collection removes it with the Node.
fn owned_metadata(owner: &NodeOwner) -> serde_json::Value {
    let mut labels = serde_json::json!({ "app.kubernetes.io/managed-by": "gpu-agent" });
    if let Some(instance) = &owner.instance {
        labels[INSTANCE_LABEL] = serde_json::json!(instance);
    }
    serde_json::json!({
        "labels": labels,
        "ownerReferences": [{
            "apiVersion": "v1", "kind": "Node", "name": owner.name, "uid": owner.uid,
        }],
    })
}

/// The DeviceTaintRule fencing `device` of `owner`'s pool for GPU `uuid`.
pub fn rule(
    version: &str,
    owner: &NodeOwner,
    device: &str,
    uuid: &str,
    effect: TaintEffect,
    want: &Want,
) -> serde_json::Value {
    let node = &owner.name;
    let mut metadata = owned_metadata(owner);
    metadata["name"] = serde_json::json!(rule_name(node, device));
    metadata["annotations"] = serde_json::json!({
        GPU_ANNOTATION: uuid,
        FAULTS_ANNOTATION: want.faults.join(", "),
    });
    serde_json::json!({
        "apiVersion": format!("{GROUP}/{version}"),
        "kind": "DeviceTaintRule",
        "metadata": metadata,
        "spec": {
            "deviceSelector": { "driver": DRIVER, "pool": node, "device": device },
            "taint": { "key": TAINT_KEY, "value": taint_value(&want.reason), "effect": effect.name() },
        },
    })
}

/// The merge patch that moves rule of GPU `uuid` to `effect` and `want`'s value and faults
/// (and marks it this agent's and this Node's, should it have been written without).
pub fn patch(owner: &NodeOwner, uuid: &str, effect: TaintEffect, want: &Want) -> serde_json::Value {
    let mut metadata = owned_metadata(owner);
    metadata["annotations"] =
        serde_json::json!({ GPU_ANNOTATION: uuid, FAULTS_ANNOTATION: want.faults.join(", ") });
    serde_json::json!({
        "metadata": metadata,
        "spec": { "taint": { "key": TAINT_KEY, "value": taint_value(&want.reason), "effect": effect.name() } },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, uuid: &str, parent: Option<&str>) -> SliceDevice {
        SliceDevice {
            name: name.into(),
            uuid: Some(uuid.into()),
            parent_uuid: parent.map(str::to_string),
        }
    }

    #[test]
    fn a_gpu_brings_its_mig_devices_and_nothing_else() {
        let slice = [
            device("gpu-2", "GPU-b", None),
            device("gpu-3", "GPU-a", None),
            device("gpu-3-mig-1g12gb-19-0", "MIG-1", Some("GPU-a")),
            device("gpu-3-mig-1g12gb-19-1", "MIG-2", None),
            device("gpu-30", "GPU-c", None),
            device("gpu-2-mig-1g12gb-19-0", "MIG-3", Some("GPU-b")),
        ];
        assert_eq!(
            devices_of("GPU-a", &[], &slice),
            ["gpu-3", "gpu-3-mig-1g12gb-19-0", "gpu-3-mig-1g12gb-19-1"]
        );
        assert_eq!(
            devices_of("GPU-b", &["MIG-3".into()], &slice),
            ["gpu-2", "gpu-2-mig-1g12gb-19-0"]
        );
        assert!(devices_of("GPU-z", &[], &slice).is_empty(), "never guessed");
    }

    #[test]
    fn names_are_per_node_and_device_and_fit() {
        assert_eq!(
            rule_name("ip-10-0-1-2.ec2.internal", "gpu-3"),
            "gpu-agent.ip-10-0-1-2.ec2.internal.gpu-3"
        );
        let long = "n".repeat(250);
        let a = rule_name(&long, "gpu-3");
        assert!(a.len() <= 253 && a != rule_name(&long, "gpu-4"));
        assert_eq!(taint_value("NvidiaXID48Error"), "NvidiaXID48Error");
        assert_eq!(taint_value("-a b/c-"), "abc");
    }

    #[test]
    fn the_rule_selects_one_device_of_this_pool() {
        let want = Want {
            effect: TaintEffect::NoSchedule,
            reason: "NvidiaXID48Error".into(),
            faults: vec!["Xid 48 (reset-gpu)".into()],
        };
        let owner = NodeOwner {
            name: "node-a".into(),
            uid: "uid-a".into(),
            instance: Some("i-0abc".into()),
        };
        let r = rule("v1", &owner, "gpu-3", "GPU-a", want.effect, &want);
        assert_eq!(r["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(
            r["metadata"]["ownerReferences"],
            serde_json::json!([{ "apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-a" }]),
            "garbage-collected with its Node"
        );
        assert_eq!(r["metadata"]["labels"][INSTANCE_LABEL], "i-0abc");
        assert_eq!(
            patch(&owner, "GPU-a", want.effect, &want)["metadata"]["ownerReferences"][0]["uid"],
            "uid-a"
        );
        assert_eq!(
            r["spec"]["deviceSelector"],
            serde_json::json!({ "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-3" })
        );
        assert_eq!(r["spec"]["taint"]["effect"], "NoSchedule");
        assert!(
            r["spec"]["taint"].get("timeAdded").is_none(),
            "set by the server"
        );
        assert_eq!(r["metadata"]["annotations"][GPU_ANNOTATION], "GPU-a");
    }
}
