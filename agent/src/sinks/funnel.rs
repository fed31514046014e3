//! The funnel: of the GPUs this node has (present), how many a pod holds (allocated), and
//! how many of those are busy, per GPU and per pod, with the GPU-seconds each pod spends in
//! each state, so GPU-hours per team are one PromQL expression and a price stays outside
//! the code. Which pod holds which GPU is the agent's own mapping (the kubelet's
//! pod-resources); busy is utilisation at or over `[nvml] busy_percent` (or tensor work);
//! productive is GPM's tensor activity at or over `[nvml] productive_percent`, unknown (no
//! stage rather than a zero) where GPM is. A GPU in MIG mode has no utilisation: each pod
//! holding MIG devices on it is judged by its own GPU instances' GPM (SM activity for busy).
//!
//! Every [`Settings::interval`] the sink reads the latest snapshot and the holders, sets
//! `gpu_agent_gpu_stage{gpu,stage}` (1 where the GPU is in the stage) and adds the time since
//! the last tick to `gpu_agent_pod_gpu_seconds_total{namespace,pod,state}` for each GPU a pod
//! holds (`allocated`), is busy on (`busy`) and productive on (`productive`).
//!
//! **Held but idle**: a pod that holds GPUs and has kept none of them busy for
//! [`Settings::held_idle_after`] (20 minutes) is reported once per episode: a Pod Event
//! (`GPUHeldIdle`, type Normal), `gpu_agent_pod_held_idle{namespace,pod}` and a line in
//! `status`. It is information for the job's owners: never a signal, a condition or a fence.
//! The episode ends when one of its GPUs is busy again, or the pod holds none.
//!
//! **Collectives that may not be using EFA** (`super::efa_traffic`): a pod busy on every
//! GPU it holds while the EFA devices it asked for move no bytes, for the same window, gets
//! one Pod Event per episode (`CollectivesMayNotUseEFA`, type Normal).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};

use crate::model::{Assignments, HealthSnapshot, HeldIdle, Observation};
use crate::shutdown::Shutdown;

/// What the sink needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How often the funnel is taken (`[metrics] funnel_interval`; each time asks the
    /// kubelet who holds which GPU).
    pub interval: Duration,
    /// Utilisation (percent) from which a GPU is busy.
    pub busy_percent: u32,
    /// GPM tensor activity (percent) from which a busy GPU is productive.
    pub productive_percent: u32,
    /// How long a pod holds GPUs and keeps none busy before it is reported held but idle.
    pub held_idle_after: Duration,
}

/// The stages of the funnel, widest first (`productive` only where GPM says).
pub const STAGES: [&str; 4] = ["present", "allocated", "busy", "productive"];

/// Labels of a GPU's stage.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// GPU index (bus order).
    pub gpu: String,
    /// `present`, `allocated`, `busy` or `productive`.
    pub stage: String,
}

/// Labels of a pod's GPU-seconds.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod.
    pub pod: String,
    /// `allocated`, `busy` or `productive`.
    pub state: String,
}

/// The funnel's metrics.
#[derive(Debug, Clone, Default)]
pub struct FunnelMetrics {
    stage: Family<StageLabels, Gauge>,
    seconds: Family<PodLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    held_idle: Family<IdleLabels, Gauge>,
}

/// Labels of a pod held but idle.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IdleLabels {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod.
    pub pod: String,
}

impl FunnelMetrics {
    /// Create and register.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "gpu_agent_gpu_stage",
            "Per GPU, 1 for each stage of the funnel it is in: present (NVML sees it), allocated (a pod holds it), busy (allocated, utilisation at or over [nvml] busy_percent; in MIG mode a held instance's SM activity), productive (busy, tensor activity at or over [nvml] productive_percent; absent where GPM is unknown)",
            m.stage.clone(),
        );
        registry.register(
            "gpu_agent_pod_gpu_seconds",
            "GPU-seconds each pod held GPUs (state=allocated), kept them busy (state=busy) and productive (state=productive)",
            m.seconds.clone(),
        );
        registry.register(
            "gpu_agent_pod_held_idle",
            "1 while a pod holds GPUs and has kept none of them busy for [metrics] held_idle_after",
            m.held_idle.clone(),
        );
        m
    }
}

/// One pod's use of one GPU: of the whole GPU, or in MIG mode of the MIG devices it holds
/// there (each judged by its own GPU instance's GPM activity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod.
    pub pod: String,
    /// Busy: utilisation (in MIG mode, its instances' SM activity) at or over the busy
    /// threshold, or tensor work at or over the productive one.
    pub busy: bool,
    /// Whether busy is known: where NVML gives neither utilisation nor the instances' GPM
    /// (a GPU in MIG mode before Hopper, an old driver), it is unknown, and never judged
    /// idle.
    pub busy_known: bool,
    /// Busy with tensor work at or over the threshold; `None`: unknown (no GPM).
    pub productive: Option<bool>,
}

impl Use {
    /// Doing work, as far as the agent can tell: busy, and not known to be without tensor
    /// work.
    pub fn working(&self) -> bool {
        !self.busy_known || (self.busy && self.productive != Some(false))
    }
}

/// One GPU's place in the funnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// GPU index.
    pub gpu: u32,
    /// The pods holding it, and their use of it; empty: not allocated.
    pub pods: Vec<Use>,
    /// Allocated and busy (a pod's use of it is).
    pub busy: bool,
    /// Whether busy is known (for every pod holding it; a GPU no pod holds is not busy).
    pub busy_known: bool,
    /// Busy with tensor work (a pod's use is); `None`: unknown (no GPM).
    pub productive: Option<bool>,
}

impl Stage {
    /// GPU `gpu` held by pod `ml/<pod>` alone, busy or not, productive unknown (tests).
    #[cfg(test)]
    pub fn held_by(gpu: u32, pod: &str, busy: bool) -> Self {
        Self {
            gpu,
            pods: vec![Use {
                namespace: "ml".to_string(),
                pod: pod.to_string(),
                busy,
                busy_known: true,
                productive: None,
            }],
            busy,
            busy_known: true,
            productive: None,
        }
    }
}

/// What one part of a GPU a pod uses did: its busy figure (utilisation, or a MIG
/// instance's SM activity) and its tensor activity, each `None` where unknown.
type Part = (Option<u32>, Option<u32>);

/// A pod's use of a GPU from the parts it uses (the GPU, or its MIG instances).
fn judge(parts: &[Part], busy_percent: u32, productive_percent: u32) -> (bool, bool, Option<bool>) {
    let tensor_work = |p: &Part| p.1.is_some_and(|t| t >= productive_percent);
    let busy_part = |p: &Part| p.0.is_some_and(|u| u >= busy_percent) || tensor_work(p);
    let busy = parts.iter().any(busy_part);
    let busy_known = busy || parts.iter().all(|p| p.0.is_some());
    let productive = any_of_known(parts.iter().map(|p| p.1.map(|t| t >= productive_percent)));
    (busy, busy_known, productive)
}

/// Whether any of `flags` is true: `Some(true)` if one is, `Some(false)` if every one is
/// known false (and there is one), else unknown.
fn any_of_known(flags: impl Iterator<Item = Option<bool>>) -> Option<bool> {
    let mut seen = false;
    let mut unknown = false;
    for flag in flags {
        match flag {
            Some(true) => return Some(true),
            Some(false) => seen = true,
            None => unknown = true,
        }
    }
    (seen && !unknown).then_some(false)
}

/// The parts of the GPU `telemetry` describes that a pod holding `ids` uses: the MIG
/// instances among them NVML samples, else the whole GPU.
fn parts(telemetry: Option<&crate::model::GpuTelemetry>, ids: &[&str]) -> Vec<Part> {
    let Some(t) = telemetry else {
        return vec![(None, None)];
    };
    let held: Vec<Part> = t
        .mig_activity
        .iter()
        .filter(|m| ids.iter().any(|id| id.eq_ignore_ascii_case(&m.uuid)))
        .map(|m| (m.sm_active_percent, m.tensor_active_percent))
        .collect();
    if held.is_empty() {
        vec![(t.utilization_gpu, t.tensor_active_percent)]
    } else {
        held
    }
}

/// Each GPU NVML sees, with the pods holding it (from `assignments`) and their use of it.
pub fn stages(
    snapshot: &HealthSnapshot,
    assignments: Option<&Assignments>,
    busy_percent: u32,
    productive_percent: u32,
) -> Vec<Stage> {
    snapshot
        .gpus
        .iter()
        .filter(|g| g.nvml.is_some())
        .map(|g| {
            let telemetry = g.nvml.as_ref().map(|n| &n.telemetry);
            let holders = assignments
                .map(|a| a.holders(g.pci, &snapshot.gpus))
                .unwrap_or_default();
            let mut by_pod: BTreeMap<(String, String), Vec<&str>> = BTreeMap::new();
            for h in &holders {
                by_pod
                    .entry((h.namespace.clone(), h.pod.clone()))
                    .or_default()
                    .push(&h.device_id);
            }
            let pods: Vec<Use> = by_pod
                .into_iter()
                .map(|((namespace, pod), ids)| {
                    let (busy, busy_known, productive) =
                        judge(&parts(telemetry, &ids), busy_percent, productive_percent);
                    Use {
                        namespace,
                        pod,
                        busy,
                        busy_known,
                        productive,
                    }
                })
                .collect();
            let productive = if pods.is_empty() {
                telemetry
                    .and_then(|t| t.tensor_active_percent)
                    .map(|_| false)
            } else {
                any_of_known(pods.iter().map(|u| u.productive))
            };
            Stage {
                gpu: g.index,
                busy: pods.iter().any(|u| u.busy),
                busy_known: pods.iter().all(|u| u.busy_known),
                productive,
                pods,
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
            let known = [
                Some(true),
                Some(allocated),
                s.busy_known.then_some(s.busy),
                s.productive,
            ];
            for (stage, on) in STAGES.iter().zip(known) {
                let Some(on) = on else { continue };
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
            for u in &s.pods {
                for (state, on) in [
                    ("allocated", true),
                    ("busy", u.busy),
                    ("productive", u.productive == Some(true)),
                ] {
                    if on {
                        *per_pod
                            .entry((u.namespace.clone(), u.pod.clone(), state))
                            .or_default() += seconds;
                    }
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

/// Pods in some state tick after tick: since when each has been in it, and which episodes
/// were told.
#[derive(Debug, Default)]
pub struct Episodes {
    since: BTreeMap<(String, String), (Instant, SystemTime)>,
    reported: BTreeSet<(String, String)>,
}

impl Episodes {
    /// Follow the pods in the state at `now` (`wall` on the clock): each one in it for
    /// `after` or longer, with when its episode began and whether it has just become due
    /// (once per episode). A pod out of the state ends its episode.
    pub fn follow(
        &mut self,
        pods: &BTreeSet<(String, String)>,
        after: Duration,
        now: Instant,
        wall: SystemTime,
    ) -> Vec<((String, String), SystemTime, bool)> {
        self.since.retain(|pod, _| pods.contains(pod));
        self.reported.retain(|pod| pods.contains(pod));
        let mut out = Vec::new();
        for pod in pods {
            let (at, since) = *self.since.entry(pod.clone()).or_insert((now, wall));
            if now.duration_since(at) >= after {
                let begun = self.reported.insert(pod.clone());
                out.push((pod.clone(), since, begun));
            }
        }
        out
    }
}

/// The pods that hold GPUs and keep none busy, and since when, tick after tick.
#[derive(Debug, Default)]
pub struct Idle {
    episodes: Episodes,
}

impl Idle {
    /// Follow one tick's `stages` at `now` (`wall` on the clock): the pods in an episode
    /// now, and those whose episode has just begun.
    pub fn follow(
        &mut self,
        stages: &[Stage],
        after: Duration,
        now: Instant,
        wall: SystemTime,
    ) -> (Vec<HeldIdle>, Vec<HeldIdle>) {
        // Per pod: its GPUs, whether one works, whether one is busy (without tensor work).
        let mut pods: BTreeMap<(String, String), (Vec<u32>, bool, bool)> = BTreeMap::new();
        for s in stages {
            for u in &s.pods {
                let entry = pods
                    .entry((u.namespace.clone(), u.pod.clone()))
                    .or_default();
                entry.0.push(s.gpu);
                entry.1 |= u.working();
                entry.2 |= u.busy;
            }
        }
        pods.retain(|_, (_, working, _)| !*working);
        let idle: BTreeSet<(String, String)> = pods.keys().cloned().collect();
        let mut now_idle = Vec::new();
        let mut begun = Vec::new();
        for (pod, since, new) in self.episodes.follow(&idle, after, now, wall) {
            let Some((gpus, _, busy)) = pods.get(&pod) else {
                continue;
            };
            let held = HeldIdle {
                namespace: pod.0,
                pod: pod.1,
                gpus: gpus.clone(),
                since,
                busy_without_tensor_work: *busy,
            };
            if new {
                begun.push(held.clone());
            }
            now_idle.push(held);
        }
        (now_idle, begun)
    }
}

impl FunnelMetrics {
    /// Set the held-but-idle gauge to the pods in an episode now.
    pub fn record_idle(&self, pods: &[HeldIdle]) {
        self.held_idle.clear();
        for p in pods {
            self.held_idle
                .get_or_create(&IdleLabels {
                    namespace: p.namespace.clone(),
                    pod: p.pod.clone(),
                })
                .set(1);
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
    events: Events,
    snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    report: mpsc::Sender<Observation>,
    mut shutdown: Shutdown,
) {
    let mut last = Instant::now();
    let mut idle = Idle::default();
    let mut quiet_fabric = Episodes::default();
    let mut reported: Vec<HeldIdle> = Vec::new();
    let mut tick = crate::tick::Ticker::new(settings.interval);
    // The first tick is at once; the first look is one interval after start.
    tick.tick().await;
    loop {
        tokio::select! {
            () = tick.tick() => {}
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
        let stages = stages(
            &snapshot,
            assignments.as_deref(),
            settings.busy_percent,
            settings.productive_percent,
        );
        metrics.record(&stages, elapsed);
        let (held, begun) = idle.follow(&stages, settings.held_idle_after, now, SystemTime::now());
        metrics.record_idle(&held);
        for pod in &begun {
            tracing::info!(namespace = %pod.namespace, pod = %pod.pod, gpus = ?pod.gpus, "A pod has held GPUs and kept none busy for the window.");
            post_held_idle(&events, pod, &settings).await;
        }
        if held != reported {
            let _ = report.send(Observation::HeldIdle(held.clone())).await;
            reported = held;
        }
        let quiet = super::efa_traffic::quiet(&stages, assignments.as_deref(), &snapshot.efa);
        let pods: BTreeSet<(String, String)> = quiet
            .iter()
            .map(|q| (q.namespace.clone(), q.pod.clone()))
            .collect();
        let after = settings.held_idle_after;
        let due = quiet_fabric.follow(&pods, after, now, SystemTime::now());
        for ((namespace, pod), since, _) in due.into_iter().filter(|(_, _, begun)| *begun) {
            let Some(q) = quiet
                .iter()
                .find(|q| q.namespace == namespace && q.pod == pod)
            else {
                continue;
            };
            tracing::info!(%namespace, %pod, gpus = ?q.gpus, devices = ?q.devices, "A pod busy on its GPUs has moved no bytes on its EFA devices for the window: its collectives may not be using EFA.");
            let episode = Episode {
                namespace: &namespace,
                pod: &pod,
                since,
                kind: "efa-quiet",
            };
            let message = super::efa_traffic::message(q, after);
            post_pod_event(&events, &episode, "CollectivesMayNotUseEFA", &message).await;
        }
    }
}

/// Where the held-but-idle Pod Events go: the Kubernetes link where it runs.
#[cfg(feature = "clients")]
pub type Events = Option<super::kubernetes::Link>;
/// Where the held-but-idle Pod Events go: nowhere in a build without the clients.
#[cfg(not(feature = "clients"))]
pub type Events = Option<std::convert::Infallible>;

/// The Pod Event of a held-but-idle episode (once; a failure is logged, not retried: the
/// metric and `status` still say it). It says what was measured, thresholds included: a
/// GPU under the busy threshold may still do some work, and work without tensor cores is
/// work, so neither is called "no work".
async fn post_held_idle(events: &Events, pod: &HeldIdle, settings: &Settings) {
    let gpus: Vec<String> = pod.gpus.iter().map(|g| format!("GPU {g}")).collect();
    let (reason, how) = if pod.busy_without_tensor_work {
        (
            "GPUHeldNotProductive",
            format!(
                "busy but with no tensor work (tensor activity under {} %; waiting in a collective for a peer?)",
                settings.productive_percent
            ),
        )
    } else {
        (
            "GPUHeldIdle",
            format!(
                "none of them busy (utilisation, or on MIG its instances' SM activity, under {} %)",
                settings.busy_percent
            ),
        )
    };
    let message = format!(
        "{} held by this pod and {how} for {}.",
        gpus.join(", "),
        humantime::format_duration(settings.held_idle_after)
    );
    let episode = Episode {
        namespace: &pod.namespace,
        pod: &pod.pod,
        since: pod.since,
        kind: "held-idle",
    };
    post_pod_event(events, &episode, reason, &message).await;
}

/// One pod's episode, as its Pod Event names it.
pub struct Episode<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod.
    pub pod: &'a str,
    /// When the episode began.
    pub since: SystemTime,
    /// What kind of episode (part of the Event's name: one Event per pod, kind and start).
    pub kind: &'a str,
}

/// Post one Normal Pod Event for `episode` (once; a failure is logged, not retried).
pub async fn post_pod_event(events: &Events, episode: &Episode<'_>, reason: &str, message: &str) {
    #[cfg(feature = "clients")]
    {
        use super::kubernetes::events::EventWrite;
        use super::kubernetes::EventText;
        let Some(link) = events else {
            return;
        };
        let posted = async {
            let api = link.api().await?;
            let pods = api.pods_on_node().await?;
            let Some(target) = pods
                .iter()
                .find(|p| p.namespace == episode.namespace && p.name == episode.pod)
            else {
                return Ok(());
            };
            let since = episode
                .since
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            let name = target.event_name(&format!("{}|{}|{since}", episode.kind, target.uid));
            let body = target.event(
                &name,
                &EventText {
                    reason,
                    type_: "Normal",
                    message,
                    count: 1,
                    first: episode.since,
                    last: SystemTime::now(),
                },
                api.node(),
            );
            api.write_event(episode.namespace, &EventWrite::create(body, 1))
                .await
        };
        let result: Result<(), super::kubernetes::ApiError> = posted.await;
        if let Err(e) = result {
            tracing::warn!(namespace = %episode.namespace, pod = %episode.pod, reason, error = %e, "Cannot post the Pod Event.");
        }
    }
    #[cfg(not(feature = "clients"))]
    {
        let _ = (events, episode, reason, message);
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

    #[test]
    fn one_true_is_enough_false_needs_every_one_known() {
        let of = |flags: &[Option<bool>]| any_of_known(flags.iter().copied());
        assert_eq!(of(&[None, Some(true)]), Some(true));
        assert_eq!(of(&[Some(false), Some(false)]), Some(false));
        assert_eq!(of(&[Some(false), None]), None);
        assert_eq!(of(&[]), None);
    }

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

    /// Pod `pod`'s GPU-seconds in `state` so far.
    fn seconds(metrics: &FunnelMetrics, pod: &str, state: &str) -> f64 {
        metrics
            .seconds
            .get_or_create(&PodLabels {
                namespace: "ml".into(),
                pod: pod.into(),
                state: state.into(),
            })
            .get()
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
        let stages = stages(&snapshot, Some(&assignments), 80, 10);
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
        assert!(
            !stages[3].busy && !stages[3].busy_known,
            "utilisation unknown: not busy, not known idle"
        );
        assert!(stages[3].pods[0].working(), "unknown is never judged idle");

        let metrics = FunnelMetrics::default();
        for _ in 0..6 {
            metrics.record(&stages, Duration::from_secs(10));
        }
        let seconds = |pod: &str, state: &str| seconds(&metrics, pod, state);
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

    #[test]
    fn a_pod_idle_for_the_window_is_one_episode_until_a_gpu_is_busy_again() {
        let stage = Stage::held_by;
        let after = Duration::from_secs(60);
        let start = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut idle = Idle::default();
        // Pod a: two GPUs, neither busy. Pod b: one of its two busy.
        let ticks = |busy_a: bool| {
            vec![
                stage(0, "a", false),
                stage(1, "a", busy_a),
                stage(2, "b", true),
                stage(3, "b", false),
            ]
        };
        let at = |s: u64| start + Duration::from_secs(s);
        let (held, begun) = idle.follow(&ticks(false), after, at(0), wall);
        assert!(
            held.is_empty() && begun.is_empty(),
            "not for the window yet"
        );
        let (held, begun) = idle.follow(&ticks(false), after, at(60), wall);
        assert_eq!(begun.len(), 1);
        assert_eq!(held.len(), 1);
        assert_eq!(
            (held[0].pod.as_str(), held[0].gpus.clone()),
            ("a", vec![0, 1])
        );
        assert_eq!(held[0].since, wall, "since the first idle tick");
        let (held, begun) = idle.follow(&ticks(false), after, at(90), wall);
        assert_eq!((held.len(), begun.len()), (1, 0), "one Event per episode");
        // A GPU of a is busy: the episode ends; idle again, a new window.
        let (held, _) = idle.follow(&ticks(true), after, at(100), wall);
        assert!(held.is_empty());
        let (held, begun) = idle.follow(&ticks(false), after, at(110), wall);
        assert!(held.is_empty() && begun.is_empty());
        let (_, begun) = idle.follow(&ticks(false), after, at(170), wall);
        assert_eq!(begun.len(), 1, "a new episode");
    }

    #[test]
    fn busy_with_no_tensor_work_is_not_working_and_told_apart_from_idle() {
        let mut snapshot = snapshot([Some(97), Some(97), Some(97), None]);
        let tensor = [Some(60), Some(2), None];
        for (g, t) in snapshot.gpus.iter_mut().zip(tensor) {
            if let Some(n) = g.nvml.as_mut() {
                n.telemetry.tensor_active_percent = t;
            }
        }
        let assignments = Assignments {
            devices: vec![held("a", "GPU-0"), held("b", "GPU-1"), held("c", "GPU-2")],
            ..Assignments::default()
        };
        let stages = stages(&snapshot, Some(&assignments), 80, 10);
        assert_eq!(
            stages.iter().map(|s| s.productive).collect::<Vec<_>>(),
            [Some(true), Some(false), None, None],
            "unknown where GPM is: never false"
        );
        let working = |i: usize| stages[i].pods[0].working();
        assert!(working(0) && !working(1) && working(2));
        let metrics = FunnelMetrics::default();
        metrics.record(&stages, Duration::from_secs(10));
        let productive = |pod: &str| seconds(&metrics, pod, "productive");
        assert!((productive("a") - 10.0).abs() < 1e-9 && productive("b").abs() < 1e-9);
        let mut idle = Idle::default();
        let now = Instant::now();
        let wall = SystemTime::UNIX_EPOCH;
        idle.follow(&stages, Duration::from_secs(60), now, wall);
        let (held, _) = idle.follow(
            &stages,
            Duration::from_secs(60),
            now + Duration::from_secs(60),
            wall,
        );
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[0].pod, "b");
        assert!(held[0].busy_without_tensor_work);
    }

    /// In MIG mode NVML gives no utilisation: each pod is judged by the GPU instances of
    /// the MIG devices it holds, not by its neighbours on the same GPU.
    #[test]
    fn pods_on_one_gpu_in_mig_mode_are_judged_by_their_own_instances() {
        let mut snapshot = snapshot([None, Some(97), Some(97), Some(97)]);
        let mig = |uuid: &str, sm: Option<u32>, tensor: Option<u32>| crate::model::MigActivity {
            uuid: uuid.into(),
            sm_active_percent: sm,
            sm_occupancy_percent: sm,
            tensor_active_percent: tensor,
            dram_bw_percent: sm,
        };
        if let Some(n) = snapshot.gpus[0].nvml.as_mut() {
            n.mig_uuids = vec![
                "MIG-a".into(),
                "MIG-b".into(),
                "MIG-c".into(),
                "MIG-d".into(),
            ];
            n.telemetry.mig_activity = vec![
                mig("MIG-a", Some(90), Some(40)),
                mig("MIG-b", Some(95), Some(0)),
                mig("MIG-c", Some(0), Some(0)),
                mig("MIG-d", None, None),
            ];
        }
        let assignments = Assignments {
            devices: vec![
                held("working", "MIG-a"),
                held("waiting", "MIG-b"),
                held("idle", "MIG-c"),
                held("unknown", "MIG-d"),
            ],
            ..Assignments::default()
        };
        let stages = stages(&snapshot, Some(&assignments), 80, 10);
        let of = |pod: &str| {
            stages[0]
                .pods
                .iter()
                .find(|u| u.pod == pod)
                .map(|u| (u.busy, u.busy_known, u.productive))
        };
        assert_eq!(of("working"), Some((true, true, Some(true))));
        assert_eq!(of("waiting"), Some((true, true, Some(false))));
        assert_eq!(of("idle"), Some((false, true, Some(false))));
        assert_eq!(
            of("unknown"),
            Some((false, false, None)),
            "never judged idle"
        );
        assert!(stages[0].busy && stages[0].productive == Some(true));

        let metrics = FunnelMetrics::default();
        metrics.record(&stages, Duration::from_secs(10));
        let seconds = |pod: &str, state: &str| seconds(&metrics, pod, state);
        assert!((seconds("working", "productive") - 10.0).abs() < 1e-9);
        assert!(seconds("waiting", "productive").abs() < 1e-9);
        assert!((seconds("waiting", "busy") - 10.0).abs() < 1e-9);
        assert!(seconds("idle", "busy").abs() < 1e-9);

        let mut idle = Idle::default();
        let now = Instant::now();
        let after = Duration::from_secs(60);
        idle.follow(&stages, after, now, SystemTime::UNIX_EPOCH);
        let (held, _) = idle.follow(&stages, after, now + after, SystemTime::UNIX_EPOCH);
        let told: Vec<(&str, bool)> = held
            .iter()
            .map(|h| (h.pod.as_str(), h.busy_without_tensor_work))
            .collect();
        assert_eq!(told, [("idle", false), ("waiting", true)]);
    }
}
