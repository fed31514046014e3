//! The funnel: of the GPUs this node has (present), how many a pod holds (allocated), and
//! how many of those are busy, per GPU and per pod, with the GPU-seconds each pod spends in
//! each state, so GPU-hours per team are one PromQL expression and a price stays outside
//! the code. Which pod holds which GPU is the agent's own mapping (the kubelet's
//! pod-resources); busy is utilisation at or over `[nvml] busy_percent`.
//!
//! Every [`Settings::interval`] the sink reads the latest snapshot and the holders, sets
//! `gpu_agent_gpu_stage{gpu,stage}` (1 where the GPU is in the stage) and adds the time since
//! the last tick to `gpu_agent_pod_gpu_seconds_total{namespace,pod,state}` for each GPU a pod
//! holds (`allocated`) and is busy on (`busy`). Productive (tensor work, from GPM) is not yet
//! read: it is no stage here rather than a zero.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::model::{Assignments, HealthSnapshot};
use crate::shutdown::Shutdown;

/// What the sink needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How often the funnel is taken (`[metrics] funnel_interval`; each time asks the
    /// kubelet who holds which GPU).
    pub interval: Duration,
    /// Utilisation (percent) from which a GPU is busy.
    pub busy_percent: u32,
}

/// The stages of the funnel, widest first.
pub const STAGES: [&str; 3] = ["present", "allocated", "busy"];

/// Labels of a GPU's stage.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// GPU index (bus order).
    pub gpu: String,
    /// `present`, `allocated` or `busy`.
    pub stage: String,
}

/// Labels of a pod's GPU-seconds.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod.
    pub pod: String,
    /// `allocated` or `busy`.
    pub state: String,
}

/// The funnel's metrics.
#[derive(Debug, Clone, Default)]
pub struct FunnelMetrics {
    stage: Family<StageLabels, Gauge>,
    seconds: Family<PodLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
}

impl FunnelMetrics {
    /// Create and register.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "gpu_agent_gpu_stage",
            "Per GPU, 1 for each stage of the funnel it is in: present (NVML sees it), allocated (a pod holds it), busy (allocated, utilisation at or over [nvml] busy_percent).",
            m.stage.clone(),
        );
        registry.register(
            "gpu_agent_pod_gpu_seconds",
            "GPU-seconds each pod held GPUs (state=allocated) and kept them busy (state=busy).",
            m.seconds.clone(),
        );
        m
    }
}

/// One GPU's place in the funnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// GPU index.
    pub gpu: u32,
    /// The pods holding it (`(namespace, pod)`); empty: not allocated.
    pub pods: Vec<(String, String)>,
    /// Allocated and busy.
    pub busy: bool,
}

/// Each GPU NVML sees, with the pods holding it (from `assignments`) and whether it is busy.
pub fn stages(
    snapshot: &HealthSnapshot,
    assignments: Option<&Assignments>,
    busy_percent: u32,
) -> Vec<Stage> {
    snapshot
        .gpus
        .iter()
        .filter(|g| g.nvml.is_some())
        .map(|g| {
            let mut pods: Vec<(String, String)> = assignments
                .map(|a| a.holders(g.pci, &snapshot.gpus))
                .unwrap_or_default()
                .into_iter()
                .map(|h| (h.namespace, h.pod))
                .collect();
            pods.sort();
            pods.dedup();
            let busy = !pods.is_empty()
                && g.nvml
                    .as_ref()
                    .and_then(|n| n.telemetry.utilization_gpu)
                    .is_some_and(|u| u >= busy_percent);
            Stage {
                gpu: g.index,
                pods,
                busy,
            }
        })
        .collect()
}

impl FunnelMetrics {
    /// Record `stages`, `elapsed` after the last record.
    pub fn record(&self, stages: &[Stage], elapsed: Duration) {
        self.stage.clear();
        for s in stages {
            let allocated = !s.pods.is_empty();
            for (stage, on) in STAGES.iter().zip([true, allocated, s.busy]) {
                self.stage
                    .get_or_create(&StageLabels {
                        gpu: s.gpu.to_string(),
                        stage: (*stage).to_string(),
                    })
                    .set(i64::from(on));
            }
        }
        let mut per_pod: BTreeMap<(String, String, &str), f64> = BTreeMap::new();
        let seconds = elapsed.as_secs_f64();
        for s in stages {
            for (namespace, pod) in &s.pods {
                *per_pod
                    .entry((namespace.clone(), pod.clone(), "allocated"))
                    .or_default() += seconds;
                if s.busy {
                    *per_pod
                        .entry((namespace.clone(), pod.clone(), "busy"))
                        .or_default() += seconds;
                }
            }
        }
        for ((namespace, pod, state), value) in per_pod {
            self.seconds
                .get_or_create(&PodLabels {
                    namespace,
                    pod,
                    state: state.to_string(),
                })
                .inc_by(value);
        }
    }
}

/// Where the holders come from: the pod-resources lookup where it runs.
#[cfg(feature = "clients")]
pub type Holders = Option<super::pod_resources::Lookup>;
/// Where the holders come from: none in a build without the clients.
#[cfg(not(feature = "clients"))]
pub type Holders = Option<std::convert::Infallible>;

/// Take the funnel every interval until shutdown. A tick that lags (a suspended host) adds
/// at most two intervals.
pub async fn run(
    settings: Settings,
    metrics: FunnelMetrics,
    holders: Holders,
    snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    mut shutdown: Shutdown,
) {
    let mut last = Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep(settings.interval) => {}
            () = shutdown.wait() => return,
        }
        let snapshot = Arc::clone(&snapshots.borrow());
        if !snapshot.gpus.iter().any(|g| g.nvml.is_some()) {
            last = Instant::now();
            continue;
        }
        let assignments = assignments(&holders).await;
        let now = Instant::now();
        let elapsed = now.duration_since(last).min(settings.interval * 2);
        last = now;
        metrics.record(
            &stages(&snapshot, assignments.as_deref(), settings.busy_percent),
            elapsed,
        );
    }
}

/// The kubelet's assignments now, or `None` (no lookup, or it failed: nothing is allocated
/// that the agent can name).
async fn assignments(holders: &Holders) -> Option<Arc<Assignments>> {
    #[cfg(feature = "clients")]
    {
        holders.as_ref()?.assignments().await.ok()
    }
    #[cfg(not(feature = "clients"))]
    {
        let _ = holders;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::HealthModel;
    use crate::model::{
        Assignment, GpuIdentity, GpuTelemetry, Inventory, KmsgStats, Observation, SourceKind,
    };

    /// NVML's view of GPUs 0-3 with these utilisations.
    fn snapshot(utilization: [Option<u32>; 4]) -> HealthSnapshot {
        let mut m = HealthModel::for_test();
        let gpus = utilization
            .iter()
            .enumerate()
            .map(|(i, u)| GpuIdentity {
                pci: format!("0000:{:02x}:00.0", 0x18 + i).parse().ok(),
                uuid: Some(format!("GPU-{i}")),
                telemetry: GpuTelemetry {
                    utilization_gpu: *u,
                    ..GpuTelemetry::default()
                },
                ..GpuIdentity::default()
            })
            .collect();
        m.apply(Observation::Poll {
            source: SourceKind::Nvml,
            faults: Vec::new(),
            partial: Vec::new(),
            inventory: Inventory::Gpus {
                gpus,
                driver_version: None,
            },
        });
        m.snapshot(KmsgStats::default())
    }

    fn held(pod: &str, uuid: &str) -> Assignment {
        Assignment {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "trainer".into(),
            resource: "nvidia.com/gpu".into(),
            device_id: uuid.into(),
        }
    }

    #[test]
    fn the_funnel_narrows_and_the_pods_gpu_seconds_add_up() {
        let snapshot = snapshot([Some(97), Some(3), Some(99), None]);
        let assignments = Assignments {
            devices: vec![held("a", "GPU-0"), held("a", "GPU-1"), held("b", "GPU-3")],
            ..Assignments::default()
        };
        let stages = stages(&snapshot, Some(&assignments), 80);
        let count = |f: &dyn Fn(&Stage) -> bool| stages.iter().filter(|s| f(s)).count();
        let (present, allocated, busy) = (
            count(&|_| true),
            count(&|s| !s.pods.is_empty()),
            count(&|s| s.busy),
        );
        assert_eq!((present, allocated, busy), (4, 3, 1));
        assert!(
            !stages[2].busy,
            "busy but held by no pod: not in the funnel's busy"
        );
        assert!(!stages[3].busy, "utilisation unknown: not busy");

        let metrics = FunnelMetrics::default();
        for _ in 0..6 {
            metrics.record(&stages, Duration::from_secs(10));
        }
        let seconds = |pod: &str, state: &str| {
            metrics
                .seconds
                .get_or_create(&PodLabels {
                    namespace: "ml".into(),
                    pod: pod.into(),
                    state: state.into(),
                })
                .get()
        };
        // A minute of wall time: pod a held two GPUs (120 GPU-seconds), one of them busy.
        assert!((seconds("a", "allocated") - 120.0).abs() < 1e-9);
        assert!((seconds("a", "busy") - 60.0).abs() < 1e-9);
        assert!((seconds("b", "allocated") - 60.0).abs() < 1e-9);
        assert!(seconds("b", "busy").abs() < 1e-9);
        let stage = |gpu: u32, stage: &str| {
            metrics
                .stage
                .get_or_create(&StageLabels {
                    gpu: gpu.to_string(),
                    stage: stage.into(),
                })
                .get()
        };
        assert_eq!(
            (
                stage(0, "busy"),
                stage(1, "allocated"),
                stage(2, "allocated")
            ),
            (1, 1, 0)
        );
        assert_eq!(stage(1, "busy"), 0);
    }
}
