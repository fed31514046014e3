//! The conditions gpu-agent owns on its Node, computed from a health snapshot. Pure: no
//! Kubernetes types, so the contract is unit-tested.

use std::time::SystemTime;

use crate::model::{Fault, HealthSnapshot, Severity};

/// Longest condition message written (the API server accepts more; `kubectl describe`
/// readers do not).
const MAX_MESSAGE: usize = 1024;

/// Names of the conditions this agent owns (configurable, to run beside the EKS agent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionTypes {
    /// GPU health: `AcceleratedHardwareReady`.
    pub hardware: String,
    /// A pending end of the instance: `InterruptionPending`.
    pub interruption: String,
    /// The network fabric (EFA): `NetworkingReady`.
    pub network: String,
    /// Also write the node lifecycle conditions `MaintenancePlanned` and
    /// `MaintenanceInProgress` (and the deadline annotation).
    pub lifecycle: bool,
    /// A rebalance recommendation plans maintenance too.
    pub lifecycle_rebalance: bool,
}

impl ConditionTypes {
    /// Is `type_` one this agent writes?
    pub fn owns(&self, type_: &str) -> bool {
        type_ == self.hardware
            || type_ == self.interruption
            || type_ == self.network
            || (self.lifecycle
                && (type_ == super::lifecycle::PLANNED || type_ == super::lifecycle::IN_PROGRESS))
    }
}

/// One condition as gpu-agent wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Condition type.
    pub type_: String,
    /// `"True"` or `"False"`.
    pub status: &'static str,
    /// Reason (CamelCase).
    pub reason: String,
    /// Human message.
    pub message: String,
}

/// The conditions for `snapshot` at `now`.
pub fn desired(snapshot: &HealthSnapshot, types: &ConditionTypes, now: SystemTime) -> Vec<Desired> {
    let mut out = vec![
        hardware(snapshot, &types.hardware),
        interruption(snapshot, &types.interruption, now),
    ];
    out.extend(network(snapshot, &types.network));
    if types.lifecycle {
        out.extend(super::lifecycle::desired(
            snapshot,
            types.lifecycle_rebalance,
            now,
        ));
    }
    out
}

/// When the conditions for `snapshot` change with time alone: a known end becoming due.
pub fn next_change(snapshot: &HealthSnapshot, now: SystemTime) -> Option<SystemTime> {
    snapshot
        .pending_end
        .as_ref()
        .and_then(|end| end.act_at)
        .filter(|at| *at > now)
}

fn describe(f: &Fault) -> String {
    let place = match (f.gpu_index, f.component) {
        (Some(i), crate::model::Component::Gpu { pci }) => format!("GPU {i} ({pci})"),
        (_, crate::model::Component::Gpu { pci }) => format!("GPU {pci}"),
        (_, crate::model::Component::Nvswitch { pci }) => format!("NVSwitch {pci}"),
        (_, crate::model::Component::Efa { pci }) => format!("EFA {pci}"),
        (_, crate::model::Component::Node) => "node".to_string(),
    };
    let why = f
        .escalated
        .as_ref()
        .map_or_else(String::new, |e| format!(" (escalated: {e})"));
    format!(
        "{place}: {} {}, action {}{why}",
        f.code, f.class.name, f.class.action
    )
}

fn hardware(snapshot: &HealthSnapshot, type_: &str) -> Desired {
    // A fault confined to a GPU that is fenced on its own (a DRA DeviceTaintRule) takes
    // that GPU out, not the node.
    let fatal: Vec<&Fault> = snapshot
        .faults
        .iter()
        .filter(|f| {
            f.class.severity == Severity::Fatal
                && !f.code.is_network()
                && !snapshot.fenced_instead(f)
        })
        .collect();
    match fatal.first() {
        Some(worst) => {
            let mut message = fatal
                .iter()
                .map(|f| describe(f))
                .collect::<Vec<_>>()
                .join("; ");
            // Said before the list can be cut: why the node, not one GPU, goes.
            if fatal.iter().any(|f| f.code.is_gpu_gone()) {
                message = format!("{}: {message}", crate::model::WHOLE_NODE);
            }
            Desired {
                type_: type_.to_string(),
                status: "False",
                reason: worst.reason(),
                message: truncate(&message),
            }
        }
        None => Desired {
            type_: type_.to_string(),
            status: "True",
            reason: "NvidiaGPUIsReady".into(),
            message: truncate(&format!(
                "{} GPUs, no fatal fault{}",
                snapshot.gpus.len(),
                fenced(snapshot)
            )),
        },
    }
}

/// `; fenced on their own: GPU 3 (NoSchedule, NvidiaXID48Error)`, or nothing.
fn fenced(snapshot: &HealthSnapshot) -> String {
    let fenced: Vec<String> = snapshot
        .gpus
        .iter()
        .filter_map(|g| {
            let fence = g.fence.as_ref().filter(|f| f.failed.is_none())?;
            Some(format!(
                "GPU {} ({}, {})",
                g.index, fence.effect, fence.reason
            ))
        })
        .collect();
    if fenced.is_empty() {
        String::new()
    } else {
        format!(" for the node; fenced on their own: {}", fenced.join(", "))
    }
}

/// False on a fatal fault of the fabric (an EFA device missing, its link down, its admin
/// queue failing, errors past the fatal rate); True otherwise, naming the devices watched.
/// Written only on a node with EFA devices (or a fault of them): elsewhere the condition is
/// not the agent's, and a True here would overwrite another writer's False (the EKS node
/// monitoring agent's network checks).
fn network(snapshot: &HealthSnapshot, type_: &str) -> Option<Desired> {
    let fatal: Vec<&Fault> = snapshot
        .faults
        .iter()
        .filter(|f| f.class.severity == Severity::Fatal && f.code.is_network())
        .collect();
    if snapshot.efa.is_empty() && !snapshot.faults.iter().any(|f| f.code.is_network()) {
        return None;
    }
    Some(match fatal.first() {
        Some(worst) => Desired {
            type_: type_.to_string(),
            status: "False",
            reason: worst.reason(),
            message: truncate(
                &fatal
                    .iter()
                    .map(|f| format!("{}: {}", describe(f), f.detail))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        },
        None => Desired {
            type_: type_.to_string(),
            status: "True",
            reason: "EFAIsReady".into(),
            message: format!("{} EFA devices, no fatal fault", snapshot.efa.len()),
        },
    })
}

/// True only when the end is acted on: a Spot notice or a shutdown at once, scheduled
/// maintenance and a Capacity Block end from `deadline - lead` (when the checkpoint signal
/// fires). Before that the condition is False and names the known end.
fn interruption(snapshot: &HealthSnapshot, type_: &str, now: SystemTime) -> Desired {
    match &snapshot.pending_end {
        Some(end) if !end.due(now) => Desired {
            type_: type_.to_string(),
            status: "False",
            reason: camel(&end.kind) + "Scheduled",
            message: truncate(&format!(
                "{} ends at {}; pending from {} (checkpoint lead{}): {}",
                end.kind,
                crate::model::time::rfc3339(end.deadline),
                end.act_at
                    .map_or_else(String::new, crate::model::time::rfc3339),
                end.lead_from
                    .as_ref()
                    .map_or_else(String::new, |why| format!(": {why}")),
                end.detail
            )),
        },
        Some(end) => Desired {
            type_: type_.to_string(),
            status: "True",
            reason: camel(&end.kind) + "Pending",
            message: ends_at(end),
        },
        None => Desired {
            type_: type_.to_string(),
            status: "False",
            reason: "NoInterruptionPending".into(),
            message:
                "no Spot notice, scheduled maintenance, Capacity Block end or shutdown pending"
                    .into(),
        },
    }
}

/// `<kind> ends at <deadline>: <detail>`, the message of an end being acted on.
pub(super) fn ends_at(end: &crate::model::PendingEnd) -> String {
    truncate(&format!(
        "{} ends at {}: {}",
        end.kind,
        crate::model::time::rfc3339(end.deadline),
        end.detail
    ))
}

/// `capacity-block` -> `CapacityBlock`.
fn camel(kebab: &str) -> String {
    kebab
        .split(['-', '_'])
        .map(|w| {
            let mut c = w.chars();
            c.next().map_or(String::new(), |f| {
                f.to_uppercase().collect::<String>() + c.as_str()
            })
        })
        .collect()
}

/// `text` cut to [`MAX_MESSAGE`] bytes (on a character boundary).
pub(super) fn truncate(text: &str) -> String {
    if text.len() <= MAX_MESSAGE {
        return text.to_string();
    }
    let mut end = MAX_MESSAGE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The strategic-merge patch of `status.conditions` for `conditions` (merged by `type` on
/// the server, so conditions we do not own are untouched). `transition` gives each
/// condition's `lastTransitionTime`.
pub fn patch(conditions: &[(Desired, SystemTime)], now: SystemTime) -> serde_json::Value {
    let now = crate::model::time::rfc3339(now);
    let list: Vec<serde_json::Value> = conditions
        .iter()
        .map(|(c, transition)| {
            serde_json::json!({
                "type": c.type_,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": crate::model::time::rfc3339(*transition),
            })
        })
        .collect();
    serde_json::json!({ "status": { "conditions": list } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::HealthModel;
    use crate::model::{KmsgStats, PendingEnd};
    use std::time::Duration;

    fn types() -> ConditionTypes {
        ConditionTypes {
            hardware: "AcceleratedHardwareReady".into(),
            interruption: "InterruptionPending".into(),
            network: "NetworkingReady".into(),
            lifecycle: false,
            lifecycle_rebalance: false,
        }
    }

    #[test]
    fn healthy_then_fatal() {
        let mut model = HealthModel::for_test();
        let d = desired(
            &model.snapshot(KmsgStats::default()),
            &types(),
            SystemTime::now(),
        );
        assert_eq!(
            (d[0].status, d[0].reason.as_str()),
            ("True", "NvidiaGPUIsReady")
        );
        assert_eq!(
            (d[1].status, d[1].reason.as_str()),
            ("False", "NoInterruptionPending")
        );
        model.apply_line(
            "NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception",
            SystemTime::now(),
        );
        model.apply_line(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
            SystemTime::now(),
        );
        let d = desired(
            &model.snapshot(KmsgStats::default()),
            &types(),
            SystemTime::now(),
        );
        assert_eq!(
            (d[0].status, d[0].reason.as_str()),
            ("False", "NvidiaXID79Error")
        );
        assert_eq!(
            d[0].message,
            format!(
                "{}: GPU 0000:3b:00.0: Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, action reboot",
                crate::model::WHOLE_NODE
            )
        );
    }

    #[test]
    fn interruption_is_pending_only_from_deadline_minus_lead() {
        let model = HealthModel::for_test();
        let mut s = model.snapshot(KmsgStats::default());
        let deadline = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let act_at = deadline - Duration::from_secs(900);
        s.pending_end = Some(PendingEnd {
            kind: "capacity-block".into(),
            deadline,
            detail: "cr-123".into(),
            signalled: 0,
            act_at: Some(act_at),
            lead_from: None,
            covered_by: None,
            waiting_for: Vec::new(),
        });
        // Weeks ahead: known, not pending.
        let early = act_at - Duration::from_secs(86_400 * 14);
        let d = desired(&s, &types(), early);
        assert_eq!(
            (d[1].status, d[1].reason.as_str()),
            ("False", "CapacityBlockScheduled")
        );
        assert!(
            d[1].message.contains("2027-01-15T08:00:00Z"),
            "{}",
            d[1].message
        );
        assert_eq!(next_change(&s, early), Some(act_at));
        // From deadline - lead: pending.
        let d = desired(&s, &types(), act_at);
        assert_eq!(
            (d[1].status, d[1].reason.as_str()),
            ("True", "CapacityBlockPending")
        );
        assert_eq!(next_change(&s, act_at), None);
        // A Spot notice: at once.
        if let Some(end) = &mut s.pending_end {
            end.kind = "spot".into();
            end.act_at = None;
        }
        assert_eq!(desired(&s, &types(), early)[1].status, "True");
    }
}
