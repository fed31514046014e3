//! The pod-Events sink: a warning or fatal fault on a GPU becomes an Event on each pod
//! holding that GPU (every time-sliced replica's pod, the MIG devices' pods), and one on an
//! EFA device on each pod holding EFA devices (`vpc.amazonaws.com/efa`), next to the Node
//! Event it belongs to. The job's owners see why in `kubectl describe pod`.
//!
//! Nothing is asked while nothing happens: the kubelet (pod-resources `List`) and the API
//! server (the pods' uids) are asked only when a GPU fault is new or its count grew. One
//! Event per pod and fault, with a deterministic name, updated with the count at most every
//! [`UPDATE_EVERY`](crate::sinks::kubernetes::events::UPDATE_EVERY); no Event on a pod that holds no GPU, none for a GPU nobody holds.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::kubernetes::events::{event_name, fault_key, EventWrite, UPDATE_EVERY};
use super::kubernetes::{ApiError, Link, NodeApi, NodePod};
use super::pod_resources::Lookup;
use crate::model::{Assignments, Component, Fault, GpuHolder, GpuStatus, HealthSnapshot, Severity};
use crate::shutdown::Shutdown;

/// What was last posted for one fault: its count and when.
type Posted = HashMap<String, (u64, Instant)>;

/// The containers holding a GPU, by pod `(namespace, name)`.
type ByPod = BTreeMap<(String, String), Vec<GpuHolder>>;

/// GPU and EFA faults that need their pod Events created or updated: on a GPU or an EFA
/// device of this node's inventory (no other can be held by a pod here, so no other asks
/// the kubelet), or of the node's EFA as a whole.
fn due<'a>(
    faults: &'a [Fault],
    snapshot: &HealthSnapshot,
    posted: &Posted,
    now: Instant,
) -> Vec<&'a Fault> {
    faults
        .iter()
        .filter(|f| match f.component {
            Component::Gpu { pci } => snapshot.gpus.iter().any(|g| g.pci == pci),
            Component::Efa { pci } => snapshot.efa.iter().any(|d| d.pci == Some(pci)),
            Component::Node => f.code.is_network(),
            Component::Nvswitch { .. } => false,
        })
        .filter(|f| f.class.severity >= Severity::Warning)
        .filter(|f| match posted.get(&fault_key(f)) {
            None => true,
            Some((count, at)) => f.count > *count && now.duration_since(*at) >= UPDATE_EVERY,
        })
        .collect()
}

/// The Event for `fault` on one pod, holding the GPU through `holders` (its containers).
fn pod_event(
    node: &str,
    fault: &Fault,
    gpu: Option<&GpuStatus>,
    pod: &NodePod,
    holders: &[GpuHolder],
) -> (String, serde_json::Value) {
    let name = pod.event_name(&format!("{}|{}", fault_key(fault), pod.uid));
    let what = match fault.component {
        Component::Gpu { pci } => {
            let index = gpu.map_or_else(|| "?".to_string(), |g| g.index.to_string());
            let uuid = gpu
                .and_then(|g| g.nvml.as_ref())
                .and_then(|n| n.uuid.as_deref())
                .unwrap_or("uuid unknown");
            format!("GPU {index} ({pci}, {uuid})")
        }
        Component::Efa { pci } => format!("EFA {pci}"),
        _ => "EFA".to_string(),
    };
    let containers: Vec<String> = holders
        .iter()
        .map(|h| format!("{} ({})", h.container, h.device_id))
        .collect();
    let message = format!(
        "{what} held by container {}: {} {} ({}), action {}: {}; Node Event default/{}",
        containers.join(", "),
        fault.code,
        fault.class.name,
        fault.class.severity,
        fault.class.action,
        fault.detail,
        event_name(node, fault),
    );
    let body = pod.event(
        &name,
        &super::kubernetes::EventText {
            reason: &fault.reason(),
            type_: "Warning",
            message: &message,
            count: fault.count,
            first: fault.first_seen,
            last: fault.last_seen,
        },
        node,
    );
    (name, body)
}

struct Poster {
    link: Link,
    lookup: Lookup,
    posted: Posted,
    /// Pods by `(namespace, name)`, from the last LIST (their uids).
    pods: HashMap<(String, String), NodePod>,
}

impl Poster {
    /// Post the Events `faults` need; `Ok` marks them done.
    async fn post(&mut self, faults: &[&Fault], snapshot: &HealthSnapshot) -> Result<(), String> {
        let assignments: Arc<Assignments> =
            self.lookup.assignments().await.map_err(|e| e.to_string())?;
        let mut work: Vec<(&Fault, ByPod)> = Vec::new();
        for f in faults {
            let holders = match f.component {
                Component::Gpu { pci } => assignments.holders(pci, &snapshot.gpus),
                Component::Efa { pci } => {
                    let Some(device) = snapshot.efa.iter().find(|d| d.pci == Some(pci)) else {
                        continue;
                    };
                    assignments.efa_holders(Some(&device.name), &snapshot.efa)
                }
                _ if f.code.is_network() => assignments.efa_holders(None, &snapshot.efa),
                _ => continue,
            };
            let mut by_pod = ByPod::new();
            for h in holders {
                by_pod
                    .entry((h.namespace.clone(), h.pod.clone()))
                    .or_default()
                    .push(h);
            }
            work.push((f, by_pod));
        }
        if work.iter().any(|(_, pods)| !pods.is_empty()) {
            let api = self.link.api().await.map_err(|e| e.to_string())?;
            let result = self.post_with(&api, &work, snapshot).await;
            if let Err(e) = &result {
                self.link.after_error(e);
            }
            result.map_err(|e| e.to_string())?;
        }
        let now = Instant::now();
        for f in faults {
            self.posted.insert(fault_key(f), (f.count, now));
        }
        Ok(())
    }

    async fn post_with(
        &mut self,
        api: &NodeApi,
        work: &[(&Fault, ByPod)],
        snapshot: &HealthSnapshot,
    ) -> Result<(), ApiError> {
        let wanted = work.iter().flat_map(|(_, pods)| pods.keys());
        if wanted.clone().any(|key| !self.pods.contains_key(key)) {
            self.pods = api
                .pods_on_node()
                .await?
                .into_iter()
                .map(|p| ((p.namespace.clone(), p.name.clone()), p))
                .collect();
        }
        let node = api.node().to_string();
        for (fault, pods) in work {
            let gpu = match fault.component {
                Component::Gpu { pci } => snapshot.gpus.iter().find(|g| g.pci == pci),
                _ => None,
            };
            for (key, holders) in pods {
                let Some(pod) = self.pods.get(key) else {
                    tracing::info!(namespace = %key.0, pod = %key.1, "Pod holding a faulty device is gone from the API server; no Event.");
                    continue;
                };
                let (name, body) = pod_event(&node, fault, gpu, pod, holders);
                // Create; one already there (an earlier count, a restarted agent) is updated.
                let count = fault.count;
                api.write_event(&pod.namespace, &EventWrite::Create { name, body, count })
                    .await?;
                tracing::warn!(namespace = %pod.namespace, pod = %pod.name, fault = %fault.label(), "Fault posted on the pod holding the device.");
            }
        }
        Ok(())
    }
}

/// Run until shutdown.
pub async fn run(
    link: Link,
    lookup: Lookup,
    mut snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    mut shutdown: Shutdown,
) {
    let mut poster = Poster {
        link,
        lookup,
        posted: Posted::new(),
        pods: HashMap::new(),
    };
    let mut last_error: Option<String> = None;
    // A failed post is tried again on a timer, not only at the next change: a fault that
    // stays the same would otherwise never reach its pods after one API error.
    let mut retry = Retry::default();
    loop {
        let snapshot = Arc::clone(&snapshots.borrow_and_update());
        // Forget faults that are gone (cleared): a new occurrence is a new Event.
        let live: std::collections::HashSet<String> =
            snapshot.faults.iter().map(fault_key).collect();
        poster.posted.retain(|key, _| live.contains(key));
        let faults = due(&snapshot.faults, &snapshot, &poster.posted, Instant::now());
        if faults.is_empty() {
            retry.succeeded();
        } else {
            match poster.post(&faults, &snapshot).await {
                Ok(()) => {
                    last_error = None;
                    retry.succeeded();
                }
                Err(e) => {
                    let after = retry.failed(Instant::now());
                    // Logged once per distinct reason.
                    if last_error.as_deref() != Some(&e) {
                        tracing::warn!(error = %e, retry_in = ?after, "Cannot post GPU faults on the pods holding the GPU; retrying.");
                        last_error = Some(e);
                    }
                }
            }
        }
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() { return },
            () = retry.wait() => {}
            () = shutdown.wait() => return,
        }
    }
}

/// When a failed post is tried again: 200 ms after the first failure, doubling to 30 s.
#[derive(Debug, Default)]
struct Retry {
    at: Option<Instant>,
    backoff: Duration,
}

impl Retry {
    const MIN: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(30);

    /// A post failed at `now`: the next try is due after the returned wait.
    fn failed(&mut self, now: Instant) -> Duration {
        self.backoff = (self.backoff * 2).clamp(Self::MIN, Self::MAX);
        self.at = Some(now + self.backoff);
        self.backoff
    }

    /// Nothing is left to post.
    fn succeeded(&mut self) {
        self.at = None;
        self.backoff = Duration::ZERO;
    }

    /// Until the next try is due; forever when none is.
    async fn wait(&self) {
        match self.at {
            Some(at) => tokio::time::sleep_until(at.into()).await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::HealthModel;
    use crate::model::{EfaDevice, Inventory, KmsgStats, Observation, SourceKind};

    /// An EFA fault is posted only for a device of this node: the kernel log is shared (a
    /// line naming another host's device, or a test's, must not reach this node's pods).
    #[test]
    fn an_efa_fault_is_due_only_for_a_device_of_this_node() {
        let mut m = HealthModel::for_test();
        let at = std::time::SystemTime::now();
        m.apply_line("efa 0000:10:1c.0: Admin queue is closed", at);
        let snapshot = m.snapshot(KmsgStats::default());
        assert_eq!(snapshot.faults.len(), 1);
        assert!(due(&snapshot.faults, &snapshot, &Posted::new(), Instant::now()).is_empty());
        m.apply(Observation::Poll {
            source: SourceKind::Efa,
            faults: Vec::new(),
            partial: Vec::new(),
            inventory: Inventory::Efa(vec![EfaDevice {
                name: "rdmap16s28".into(),
                pci: "0000:10:1c.0".parse().ok(),
                ..EfaDevice::default()
            }]),
        });
        let snapshot = m.snapshot(KmsgStats::default());
        assert_eq!(
            due(&snapshot.faults, &snapshot, &Posted::new(), Instant::now()).len(),
            1
        );
    }

    #[test]
    fn a_failed_post_is_retried_sooner_then_later_and_a_success_stops_it() {
        let now = Instant::now();
        let mut retry = Retry::default();
        assert_eq!(retry.failed(now), Duration::from_millis(200));
        assert_eq!(retry.failed(now), Duration::from_millis(400));
        for _ in 0..20 {
            retry.failed(now);
        }
        assert_eq!(retry.failed(now), Duration::from_secs(30), "capped");
        assert_eq!(retry.at, Some(now + Duration::from_secs(30)));
        retry.succeeded();
        assert_eq!(retry.at, None);
        assert_eq!(retry.failed(now), Duration::from_millis(200), "afresh");
    }
}
