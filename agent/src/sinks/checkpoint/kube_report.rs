//! Telling Kubernetes what the checkpoint sink did: an Event on each signalled process's pod
//! (naming its container and GPUs), confirmation Events, and cordon when asked. Best effort:
//! the signal already went out.

use std::time::{Duration, SystemTime};

use super::Candidate;
use crate::model::{CheckpointReport, Notice};
use crate::sinks::kubernetes::events::EventWrite;

/// A one-off Event on `pod` (count 1, now), named from `key`.
#[cfg(feature = "clients")]
pub(super) fn pod_event(
    pod: &crate::sinks::kubernetes::NodePod,
    key: &str,
    (reason, type_): (&str, &str),
    message: &str,
    node: &str,
) -> serde_json::Value {
    let now = SystemTime::now();
    let event = crate::sinks::kubernetes::EventText {
        reason,
        type_,
        message,
        count: 1,
        first: now,
        last: now,
    };
    pod.event(&pod.event_name(key), &event, node)
}

/// One Event per pod whose processes were signalled, when the watch ends: Normal
/// `CheckpointConfirmed` when all of its processes confirmed, else Warning
/// `CheckpointUnconfirmed` naming those that did not by the deadline.
#[cfg(feature = "clients")]
pub(super) async fn confirmation_events(
    link: crate::sinks::kubernetes::Link,
    notice: Notice,
    targets: Vec<Candidate>,
    last: CheckpointReport,
) {
    if targets.iter().all(|c| c.pod_uid.is_none()) {
        return;
    }
    let api = match link.api().await {
        Ok(api) => api,
        Err(e) => {
            tracing::info!(error = %e, "No checkpoint confirmation Events: Kubernetes not reachable.");
            return;
        }
    };
    let pods = match api.pods_on_node().await {
        Ok(pods) => pods,
        Err(e) => {
            tracing::warn!(error = %e, "Cannot list this node's pods for checkpoint confirmation Events.");
            return;
        }
    };
    let node = api.node().to_string();
    for pod in &pods {
        let mine: Vec<&Candidate> = targets
            .iter()
            .filter(|c| c.pod_uid.as_deref() == Some(pod.uid.as_str()))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let missing: Vec<String> = mine
            .iter()
            .filter(|c| last.unconfirmed.contains(&c.pid))
            .map(|c| format!("pid {} ({})", c.pid, c.name))
            .collect();
        let (kind, message) = if missing.is_empty() {
            let took = last.confirmed_in_ms.map_or_else(String::new, |ms| {
                format!(" within {:.1} s", Duration::from_millis(ms).as_secs_f64())
            });
            (
                ("CheckpointConfirmed", "Normal"),
                format!(
                    "gpu-agent: all {} signalled processes confirmed their checkpoint{took} ({} notice)",
                    mine.len(),
                    notice.kind
                ),
            )
        } else {
            (
                ("CheckpointUnconfirmed", "Warning"),
                format!(
                    "gpu-agent: {} of {} signalled processes did not confirm their checkpoint by {} ({} notice): {}",
                    missing.len(),
                    mine.len(),
                    crate::model::time::rfc3339(notice.deadline),
                    notice.kind,
                    missing.join(", ")
                ),
            )
        };
        let event = pod_event(
            pod,
            &format!("{}|confirm", notice.id),
            kind,
            &message,
            &node,
        );
        // A one-off Event (count 1); one already there (a restarted agent acting again) is
        // updated.
        if let Err(e) = api
            .write_event(&pod.namespace, &EventWrite::create(event, 1))
            .await
        {
            tracing::warn!(error = %e, pod = %pod.name, "Cannot post the checkpoint confirmation Event.");
        }
    }
}

/// At most this many calls' time limits for one notice's pod Events and cordon together.
#[cfg(feature = "clients")]
pub(super) const KUBERNETES_CALLS: u32 = 6;

/// Post an Event on each signalled target's pod, naming its container and the GPUs that
/// container holds, and cordon when asked. Best effort: the signal already went out; a
/// failure here is logged.
#[cfg(feature = "clients")]
pub(super) async fn tell_kubernetes(
    link: crate::sinks::kubernetes::Link,
    lookup: Option<crate::sinks::pod_resources::Lookup>,
    notice: Notice,
    targets: Vec<Candidate>,
    cordon: bool,
    gpus: Vec<crate::model::GpuStatus>,
) {
    let notice = &notice;
    let in_pods: Vec<&Candidate> = targets.iter().filter(|c| c.pod_uid.is_some()).collect();
    if in_pods.is_empty() && !cordon {
        return;
    }
    let api = match link.api().await {
        Ok(api) => api,
        Err(e) => {
            tracing::info!(error = %e, "No pod Events or cordon: Kubernetes not reachable.");
            return;
        }
    };
    let node = api.node().to_string();
    let node = node.as_str();
    if cordon {
        match api.cordon().await {
            Ok(()) => {
                tracing::warn!(node, kind = %notice.kind, "Node cordoned ([checkpoint] cordon = true).")
            }
            Err(e) => tracing::warn!(error = %e, "Cannot cordon the node."),
        }
    }
    if in_pods.is_empty() {
        return;
    }
    let pods = match api.pods_on_node().await {
        Ok(pods) => pods,
        Err(e) => {
            tracing::warn!(error = %e, "Cannot list this node's pods for checkpoint Events.");
            return;
        }
    };
    let assignments = match &lookup {
        Some(lookup) => lookup.assignments().await.ok(),
        None => None,
    };
    for c in in_pods {
        let Some(pod) = pods.iter().find(|p| Some(&p.uid) == c.pod_uid.as_ref()) else {
            continue;
        };
        let container = c.container_id.as_ref().and_then(|id| {
            pod.containers
                .iter()
                .find(|(_, cid)| cid == id)
                .map(|(name, _)| name.as_str())
        });
        let held = match (container, &assignments) {
            (Some(container), Some(a)) => {
                let held = a.gpus_of(&pod.namespace, &pod.name, container, &gpus);
                if held.is_empty() {
                    String::new()
                } else {
                    let list: Vec<String> = held
                        .iter()
                        .map(|(i, pci)| format!("GPU {i} ({pci})"))
                        .collect();
                    format!(", holding {}", list.join(", "))
                }
            }
            _ => String::new(),
        };
        let event = pod_event(
            pod,
            &format!("{}|{}", notice.id, c.pid),
            ("CheckpointSignal", "Warning"),
            &format!(
                "gpu-agent sent {} to pid {} ({}) in container {}{held}: {} notice, instance ends at {}",
                c.signal.as_deref().unwrap_or("-"), c.pid, c.name, container.unwrap_or("?"), notice.kind,
                crate::model::time::rfc3339(notice.deadline)
            ),
            node,
        );
        // A one-off Event (count 1); one already there (a restarted agent acting again) is
        // updated.
        if let Err(e) = api
            .write_event(&pod.namespace, &EventWrite::create(event, 1))
            .await
        {
            tracing::warn!(error = %e, pod = %pod.name, "Cannot post the checkpoint Event on the pod.");
        }
    }
}
