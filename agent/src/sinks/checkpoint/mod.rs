//! The checkpoint sink: when the instance's end is known (Spot notice, scheduled maintenance,
//! Capacity Block end, host shutdown; rebalance and fatal faults when opted in), signal the
//! training processes to checkpoint, in time and once, and never a process that does not
//! handle the signal.
//!
//! The contract (README, "Checkpoint signals"):
//! - Spot and shutdown notices are acted on at once; the others at `deadline - lead`.
//! - One ending, one signal: an ending already signalled covers a later ending of the
//!   instance within `ending_window` (the shutdown after a Spot notice); fatal faults within
//!   `incident_window` are one incident. A covered notice signals only processes that were
//!   not signalled for the covering one (a job started since).
//! - Each notice acted on is saved (`<state_dir>/checkpoint.json`, on the blocking pool) right
//!   after the signals, then reported; pod Events and cordon follow in the background.
//! - The signalled processes are then watched until they exit or `hold` passes: a host
//!   shutdown holds its logind lock until then, and `status` says what it waits for.
//! - The current ending is also written to `notice_file` for trainers that poll.
//! - What the workload declares (pod annotations, [`declared`]) is read from the API server
//!   when a notice arrives, refreshed while it waits and just before acting, each read
//!   time-limited (a hung API server falls back to what was read last, or the defaults).
//! - A signalled process confirms by writing its ack file (`<ack_dir>/<its pid>`, in its own
//!   mount namespace) or by exiting; the sink reports per notice how many confirmed and in
//!   how long, and names those unconfirmed at the deadline (journal, metric, pod Events).

mod ack;
mod declared;
mod deliver;
mod notice_file;
mod record;
mod send;
mod settle;
mod targets;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};

pub use crate::model::signal::{name as signal_name, parse as parse_signal};
pub use declared::{ByPod, Declared};
pub use deliver::signal_targets;
pub use record::{Record, Sent, Windows};
pub use send::{send, SendError};
pub use targets::{scan, Candidate, Selection, OPT_IN_VAR};

use crate::model::{CheckpointReport, HealthSnapshot, Notice, NoticeKind, Observation, Severity};
use crate::shutdown::Shutdown;

/// What the sink needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Who gets signalled.
    pub selection: Selection,
    /// Which notice kinds trigger a checkpoint.
    pub triggers: Vec<NoticeKind>,
    /// How long before the deadline each kind is signalled.
    pub lead: HashMap<NoticeKind, Duration>,
    /// `<state_dir>/checkpoint.json`.
    pub state_file: PathBuf,
    /// Where to post pod Events (and cordon); `None`: standalone.
    #[cfg(feature = "clients")]
    pub kubernetes: Option<super::kubernetes::Link>,
    /// Which GPUs each signalled container holds, for its pod Event; `None`: off.
    #[cfg(feature = "clients")]
    pub pod_resources: Option<super::pod_resources::Lookup>,
    /// Cordon the node on a notice (for clusters without a termination handler).
    pub cordon: bool,
    /// How long one signalling covers later notices.
    pub windows: Windows,
    /// How long signalled processes are watched finishing (a shutdown's hold).
    pub hold: Duration,
    /// `[checkpoint] notice_file`; `None`: off.
    pub notice_file: Option<PathBuf>,
    /// `[checkpoint] ack_dir`: where signalled processes confirm; `None`: only exits confirm.
    pub ack_dir: Option<PathBuf>,
}

/// Labels of the per-kind counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// Notice kind.
    pub kind: String,
}

/// Labels of skipped targets.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabels {
    /// Why (`no-handler`, `excluded`, `gone`, ...).
    pub reason: String,
}

/// The sink's metrics.
#[derive(Debug, Clone)]
pub struct CheckpointMetrics {
    notices: Family<KindLabels, Counter>,
    signalled: Family<KindLabels, Counter>,
    skipped: Family<SkipLabels, Counter>,
    latency: Histogram,
    confirmed: Family<KindLabels, Counter>,
    unconfirmed: Family<KindLabels, Counter>,
    confirm_time: Histogram,
}

impl CheckpointMetrics {
    /// Create and register.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            notices: Family::default(),
            signalled: Family::default(),
            skipped: Family::default(),
            latency: Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0]),
            confirmed: Family::default(),
            unconfirmed: Family::default(),
            confirm_time: Histogram::new([1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0]),
        };
        registry.register(
            "gpu_agent_notices",
            "Notices acted on, by kind.",
            m.notices.clone(),
        );
        registry.register(
            "gpu_agent_checkpoint_targets_signalled",
            "Processes signalled to checkpoint, by notice kind.",
            m.signalled.clone(),
        );
        registry.register(
            "gpu_agent_checkpoint_targets_skipped",
            "Processes holding a GPU that were not signalled, by reason.",
            m.skipped.clone(),
        );
        registry.register(
            "gpu_agent_checkpoint_signal_latency_seconds",
            "From the notice (or its lead time) to the signals sent.",
            m.latency.clone(),
        );
        registry.register(
            "gpu_agent_checkpoint_confirmed",
            "Signalled processes that confirmed their checkpoint (ack file or exit), by notice kind.",
            m.confirmed.clone(),
        );
        registry.register(
            "gpu_agent_checkpoint_unconfirmed",
            "Signalled processes that had not confirmed at the deadline, by notice kind.",
            m.unconfirmed.clone(),
        );
        registry.register(
            "gpu_agent_checkpoint_confirm_seconds",
            "From the signal to the last confirmation of a notice's processes.",
            m.confirm_time.clone(),
        );
        m
    }
}

/// Notices for fatal faults (only used when `fatal-fault` is a trigger).
fn fault_notices(snapshot: &HealthSnapshot) -> Vec<Notice> {
    snapshot
        .faults
        .iter()
        .filter(|f| f.class.severity == Severity::Fatal)
        .map(|f| Notice {
            id: f.notice_id(),
            kind: NoticeKind::FatalFault,
            deadline: f.first_seen,
            detail: format!("{}: {} ({})", f.label(), f.class.name, f.class.action),
            source: f.source,
        })
        .collect()
}

/// How long a read of the pods' declarations may take before the last one read (or the
/// defaults) is used: a hung API server never holds a signal long.
#[cfg(feature = "clients")]
const DECLARATIONS_LIMIT: Duration = Duration::from_secs(2);
/// While a notice waits for its time, the declarations are read again this often (pods
/// come and go).
const DECLARATIONS_WHILE_WAITING: Duration = Duration::from_secs(60);
/// How long a notice file left by an earlier run is kept while no ending is known (the
/// notice sources' first polls after a restart).
const INHERITED_NOTICE_GRACE: Duration = Duration::from_secs(10);
/// Declarations older than this are read again right before acting.
const DECLARATIONS_FOR_ACTING: Duration = Duration::from_secs(5);

/// What the pods on this node declare, as last read.
#[derive(Debug, Default)]
struct Declarations {
    by_pod: ByPod,
    /// The pods (UIDs) holding GPUs (every declaring pod, when the kubelet cannot say).
    gpu_pods: Vec<String>,
    /// The longest lead among the pods holding GPUs (read from Kubernetes: unused in a
    /// build without the clients).
    #[cfg_attr(not(feature = "clients"), allow(dead_code))]
    lead: Option<crate::model::DeclaredLead>,
    read_at: Option<Instant>,
}

impl Declarations {
    /// Read them again if older than `max_age` (bounded; on failure the last read stays),
    /// and tell the core the declared lead when it changed.
    async fn refresh(
        &mut self,
        settings: &Settings,
        max_age: Duration,
        reports: &mpsc::Sender<Observation>,
    ) {
        if self.read_at.is_some_and(|at| at.elapsed() < max_age) {
            return;
        }
        #[cfg(feature = "clients")]
        if let Some(link) = &settings.kubernetes {
            let read = tokio::time::timeout(
                DECLARATIONS_LIMIT,
                read_declarations(link, settings.pod_resources.as_ref()),
            )
            .await;
            match read {
                Ok(Ok((by_pod, gpu_pods, lead))) => {
                    for d in by_pod.values() {
                        for problem in &d.problems {
                            tracing::warn!(pod = %d.pod, %problem, "Pod annotation ignored; the default applies.");
                        }
                    }
                    self.by_pod = by_pod;
                    self.gpu_pods = gpu_pods;
                    if lead != self.lead {
                        let _ = reports.send(Observation::DeclaredLead(lead.clone())).await;
                        self.lead = lead;
                    }
                }
                Ok(Err(e)) => {
                    tracing::info!(error = %e, "Cannot read the pods' checkpoint declarations; using the last read.");
                }
                Err(_) => tracing::warn!(
                    limit = ?DECLARATIONS_LIMIT,
                    "The API server did not answer for the pods' checkpoint declarations in time; using the last read."
                ),
            }
        }
        #[cfg(not(feature = "clients"))]
        let _ = (settings, reports);
        self.read_at = Some(Instant::now());
    }
}

/// The declarations of the pods on this node, and the longest lead among those holding a
/// GPU (every pod's, when the kubelet cannot say which hold one).
#[cfg(feature = "clients")]
async fn read_declarations(
    link: &super::kubernetes::Link,
    lookup: Option<&super::pod_resources::Lookup>,
) -> Result<(ByPod, Vec<String>, Option<crate::model::DeclaredLead>), String> {
    let api = link.api().await.map_err(|e| e.to_string())?;
    let pods = api.pods_on_node().await.map_err(|e| e.to_string())?;
    let holders: Option<Vec<(String, String)>> = match lookup {
        Some(lookup) => lookup.assignments().await.ok().map(|a| {
            a.devices
                .iter()
                .map(|d| (d.namespace.clone(), d.pod.clone()))
                .chain(a.dra.iter().map(|d| (d.namespace.clone(), d.pod.clone())))
                .collect()
        }),
        None => None,
    };
    let mut by_pod = ByPod::new();
    let mut gpu_pods = ByPod::new();
    for pod in pods {
        let name = format!("{}/{}", pod.namespace, pod.name);
        if let Some(d) = Declared::from_annotations(&name, &pod.annotations) {
            let holds = holders.as_ref().is_none_or(|h| {
                h.iter()
                    .any(|(ns, p)| *ns == pod.namespace && *p == pod.name)
            });
            if holds {
                gpu_pods.insert(pod.uid.clone(), d.clone());
            }
            by_pod.insert(pod.uid, d);
        }
    }
    let lead = declared::longest_lead(&gpu_pods)
        .map(|(lead, pod)| crate::model::DeclaredLead { lead, pod });
    Ok((by_pod, gpu_pods.into_keys().collect(), lead))
}

/// Run until shutdown.
pub async fn run(
    settings: Settings,
    metrics: CheckpointMetrics,
    mut snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    reports: mpsc::Sender<Observation>,
    mut shutdown: Shutdown,
) {
    let mut record = Record::load(&settings.state_file);
    let (saves, saver) = spawn_saver(settings.state_file.clone());
    let mut first_seen: HashMap<String, Instant> = HashMap::new();
    // A notice file an earlier run left (the agent restarted during an ending) stays while
    // the notice sources take their first polls: the ending may well still be pending.
    let mut written: Option<String> = settings
        .notice_file
        .as_deref()
        .and_then(notice_file::key_on_disk);
    let mut inherited_until = written
        .as_ref()
        .map(|_| Instant::now() + INHERITED_NOTICE_GRACE);
    let mut declarations = Declarations::default();
    let (late_tx, mut late_rx) = mpsc::unbounded_channel::<LateTargets>();
    if let Some(dir) = &settings.ack_dir {
        let dir = dir.clone();
        let _ = tokio::task::spawn_blocking(move || ack::prepare(&dir)).await;
    }
    loop {
        let snapshot = Arc::clone(&snapshots.borrow_and_update());
        let mut notices: Vec<Notice> = snapshot.notices.clone();
        if settings.triggers.contains(&NoticeKind::FatalFault) {
            notices.extend(fault_notices(&snapshot));
        }
        notices.retain(|n| settings.triggers.contains(&n.kind) && !record.done(&n.id));
        if !notices.is_empty() {
            declarations
                .refresh(&settings, DECLARATIONS_WHILE_WAITING, &reports)
                .await;
        }
        let mut next: Option<Duration> = None;
        for notice in &notices {
            let now = SystemTime::now();
            let seen = *first_seen
                .entry(notice.id.clone())
                .or_insert_with(Instant::now);
            let configured = settings.lead.get(&notice.kind).copied().unwrap_or_default();
            let act_at = notice.act_at(configured);
            if let Some(wait) = act_at
                .and_then(|at| at.duration_since(now).ok())
                .filter(|w| !w.is_zero())
            {
                // Not the node's time yet; a pod that declares a longer checkpoint may be
                // due: its own processes, and only those, are signalled now.
                let (done, early) = record.early(&notice.id);
                let (due, later) = declared::due_early(
                    &declarations.by_pod,
                    &declarations.gpu_pods,
                    notice,
                    configured,
                    now,
                    done,
                );
                if !due.is_empty() {
                    let early = early.to_vec();
                    declarations
                        .refresh(&settings, DECLARATIONS_FOR_ACTING, &reports)
                        .await;
                    let scope = Scope {
                        declared: &declarations.by_pod,
                        only_pods: Some(due.clone()),
                        early: early.clone(),
                        late: &late_tx,
                    };
                    let sent = act(
                        &settings, &metrics, &reports, &record, notice, &snapshot, scope,
                    )
                    .await;
                    let new: Vec<(i32, u64)> = sent
                        .targets
                        .into_iter()
                        .filter(|t| !early.contains(t))
                        .collect();
                    record.remember_early(&notice.id, &due, &new);
                    saves.send_replace(Some(record.clone()));
                }
                let later = later.and_then(|at| at.duration_since(now).ok());
                let wait = later
                    .map_or(wait, |l| l.min(wait))
                    .min(DECLARATIONS_WHILE_WAITING);
                next = Some(next.map_or(wait, |n| n.min(wait)));
                continue;
            }
            declarations
                .refresh(&settings, DECLARATIONS_FOR_ACTING, &reports)
                .await;
            let scope = Scope {
                declared: &declarations.by_pod,
                only_pods: None,
                early: record.early(&notice.id).1.to_vec(),
                late: &late_tx,
            };
            let sent = act(
                &settings, &metrics, &reports, &record, notice, &snapshot, scope,
            )
            .await;
            // Remembered at once (the next notice's covering check reads it), saved in the
            // background: the notice file and the next signal never wait on the state disk.
            record.remember(notice, sent);
            saves.send_replace(Some(record.clone()));
            // Latency from when it was due: at once, or at deadline - lead.
            let due_since = act_at.map_or_else(
                || seen.elapsed(),
                |at| SystemTime::now().duration_since(at).unwrap_or_default(),
            );
            metrics.latency.observe(due_since.as_secs_f64());
        }
        if let Some(path) = &settings.notice_file {
            if inherited_until.is_some_and(|t| Instant::now() >= t) {
                inherited_until = None;
            }
            update_notice_file(
                path,
                &settings,
                &snapshot,
                &record,
                &mut written,
                inherited_until.is_some(),
            )
            .await;
            if let Some(t) = inherited_until {
                let wait = t.saturating_duration_since(Instant::now());
                next = Some(next.map_or(wait, |n| n.min(wait)));
            }
        }
        let sleep = next.unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() { break },
            Some(late) = late_rx.recv() => {
                record.remember_late(&late.notice, &late.sent, &late.targets);
                saves.send_replace(Some(record.clone()));
            }
            () = tokio::time::sleep(sleep) => {}
            () = shutdown.wait() => break,
        }
    }
    // The last save finishes, if the disk lets it.
    drop(saves);
    let _ = tokio::time::timeout(LAST_SAVE, saver).await;
}

/// How long a stopping agent waits for the record's last save.
const LAST_SAVE: Duration = Duration::from_secs(2);

/// The record's saver: the latest copy sent is written, one save at a time, on the blocking
/// pool. Nothing that signals or writes the notice file waits for it, so a slow or hung
/// state disk (a saturated EBS volume's journal commit) never delays either.
fn spawn_saver(
    path: std::path::PathBuf,
) -> (watch::Sender<Option<Record>>, tokio::task::JoinHandle<()>) {
    let (saves, mut latest) = watch::channel::<Option<Record>>(None);
    let saver = tokio::spawn(async move {
        while latest.changed().await.is_ok() {
            let Some(record) = latest.borrow_and_update().clone() else {
                continue;
            };
            let path = path.clone();
            let _ = tokio::task::spawn_blocking(move || record.save(&path)).await;
        }
    });
    (saves, saver)
}

/// Act on one due notice: signal (or find it covered), report, then watch the
/// signalled processes confirm and tell Kubernetes, both in the background.
/// Which processes one act signals.
struct Scope<'a> {
    /// What the pods declare.
    declared: &'a ByPod,
    /// Only these pods' processes (their declared lead is due before the node's); `None`:
    /// every process (the notice is acted on for the node).
    only_pods: Option<Vec<String>>,
    /// Processes already signalled ahead of this notice (its early pods').
    early: Vec<(i32, u64)>,
    /// Where processes signalled after the first round are told.
    late: &'a mpsc::UnboundedSender<LateTargets>,
}

async fn act(
    settings: &Settings,
    metrics: &CheckpointMetrics,
    reports: &mpsc::Sender<Observation>,
    record: &Record,
    notice: &Notice,
    snapshot: &HealthSnapshot,
    scope: Scope<'_>,
) -> Sent {
    let now = SystemTime::now();
    if scope.only_pods.is_none() {
        metrics
            .notices
            .get_or_create(&KindLabels {
                kind: notice.kind.name().into(),
            })
            .inc();
    }
    let covering = record.covering(notice, now, settings.windows).cloned();
    let mut already: Vec<(i32, u64)> = covering
        .as_ref()
        .map(|c| c.targets.clone())
        .unwrap_or_default();
    already.extend(scope.early.iter().copied());
    let mut selection = settings.selection.clone();
    selection.declared = scope.declared.clone();
    selection.only_pods = scope.only_pods.clone();
    let (n, m, skip) = (notice.clone(), metrics.clone(), already.clone());
    let first = tokio::task::spawn_blocking(move || {
        deliver::Delivery::start(&selection, &n, &skip, Some(&m))
    })
    .await
    .ok();
    let (delivery, first) = match first {
        Some((delivery, round)) => (Some(delivery), round),
        None => (None, deliver::Round::default()),
    };
    let targets = first.signalled;
    let waiting: Vec<i32> = first.waiting.iter().map(|(pid, _)| *pid).collect();
    let mut not_signalled = first.skipped;
    not_signalled.extend(first.waiting.into_iter().map(|(_, line)| line));
    let signalled = u32::try_from(targets.len()).unwrap_or(u32::MAX);
    let skipped = u32::try_from(not_signalled.len()).unwrap_or(u32::MAX);
    let new: Vec<(i32, u64)> = targets.iter().map(|c| (c.pid, c.start_time)).collect();
    let mut pods: Vec<&str> = targets
        .iter()
        .filter_map(|c| c.pod_uid.as_deref())
        .collect();
    pods.sort_unstable();
    pods.dedup();
    match &covering {
        Some(c) => {
            tracing::warn!(kind = %notice.kind, id = %notice.id, covered_by = %c.id, newly_signalled = signalled, "Notice covered by one already signalled: one ending, one signal.")
        }
        None => {
            tracing::warn!(kind = %notice.kind, id = %notice.id, signalled, pods = pods.len(), skipped, "Checkpoint signal sent for notice.")
        }
    }
    // Report at once (the caller remembers it); nothing here waits on Kubernetes.
    let sent = Sent {
        id: covering
            .as_ref()
            .map_or_else(|| notice.id.clone(), |c| c.id.clone()),
        at: covering.as_ref().map_or(now, |c| c.at),
        targets: already.iter().chain(&new).copied().collect(),
    };
    let report = CheckpointReport {
        notice_id: notice.id.clone(),
        signalled,
        skipped,
        covered_by: covering.map(|c| c.id),
        waiting_for: Vec::new(),
        settled: false,
        signalled_at: Some(sent.at),
        pods: u32::try_from(pods.len()).unwrap_or(u32::MAX),
        confirmed: 0,
        confirmed_in_ms: None,
        unconfirmed: Vec::new(),
        not_signalled,
    };
    // Watch the processes signalled now confirm (their ack or their exit): a shutdown is
    // held until they exit or the hold passes (counted from the first signal of this
    // ending); confirmations are awaited until the deadline.
    let elapsed = now.duration_since(sent.at).unwrap_or_default();
    let hold_until = Instant::now() + settings.hold.saturating_sub(elapsed);
    let to_deadline = notice.deadline.duration_since(now).unwrap_or_default();
    let watched: Vec<settle::Watched> = targets
        .iter()
        .map(|c| watched(c, &settings.selection.procfs, settings.ack_dir.as_ref()))
        .collect();
    // Processes whose files did not answer are looked at again in the background; those
    // signalled then join the watch and the record.
    let late = delivery.filter(|d| d.next().is_some()).map(|delivery| {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(later_rounds(
            delivery,
            settings.selection.procfs.clone(),
            notice.clone(),
            metrics.clone(),
            settings.ack_dir.clone(),
            tx,
            scope.late.clone(),
            (sent.id.clone(), waiting),
        ));
        rx
    });
    let watch = settle::watch(
        report,
        watched,
        settle::Until {
            hold: hold_until,
            confirm: (Instant::now() + to_deadline).max(hold_until),
        },
        settings.selection.procfs.clone(),
        reports.clone(),
        late,
    );
    let kind = notice.kind.name().to_string();
    let metrics = metrics.clone();
    #[cfg(feature = "clients")]
    let tell = settings
        .kubernetes
        .clone()
        .map(|link| (link, notice.clone(), targets.clone()));
    tokio::spawn(async move {
        let last = watch.await;
        let labels = KindLabels { kind };
        metrics
            .confirmed
            .get_or_create(&labels)
            .inc_by(u64::from(last.confirmed));
        metrics
            .unconfirmed
            .get_or_create(&labels)
            .inc_by(u64::try_from(last.unconfirmed.len()).unwrap_or(u64::MAX));
        if let Some(ms) = last.confirmed_in_ms {
            metrics
                .confirm_time
                .observe(Duration::from_millis(ms).as_secs_f64());
        }
        #[cfg(feature = "clients")]
        if let Some((link, notice, targets)) = tell {
            let limit = link.timeout() * KUBERNETES_CALLS;
            let work = confirmation_events(link, notice, targets, last);
            if tokio::time::timeout(limit, work).await.is_err() {
                tracing::warn!(?limit, "Checkpoint confirmation Events gave up: the API server did not answer in time.");
            }
        }
    });
    #[cfg(not(feature = "clients"))]
    let _ = snapshot;
    // Pod Events and cordon in the background, bounded: a hung API server never delays the
    // next notice's signal.
    #[cfg(feature = "clients")]
    if let Some(link) = &settings.kubernetes {
        let limit = link.timeout() * KUBERNETES_CALLS;
        let work = tell_kubernetes(
            link.clone(),
            settings.pod_resources.clone(),
            notice.clone(),
            targets,
            settings.cordon,
            snapshot.gpus.clone(),
        );
        tokio::spawn(async move {
            if tokio::time::timeout(limit, work).await.is_err() {
                tracing::warn!(
                    ?limit,
                    "Checkpoint pod Events/cordon gave up: the API server did not answer in time."
                );
            }
        });
    }
    sent
}

/// A signalled process to watch confirm.
fn watched(c: &Candidate, procfs: &std::path::Path, ack_dir: Option<&PathBuf>) -> settle::Watched {
    settle::Watched {
        pid: c.pid,
        start_time: c.start_time,
        ack: ack_dir.map(|dir| ack::AckFile {
            procfs: procfs.to_path_buf(),
            pid: c.pid,
            start_time: c.start_time,
            dir: dir.clone(),
            ns_pid: c.ns_pid,
        }),
    }
}

/// Processes signalled after the first round of a notice: the record (notice id, id of the
/// signalling they belong to) learns them, so a covering notice does not signal them again.
#[derive(Debug)]
struct LateTargets {
    notice: String,
    sent: String,
    targets: Vec<(i32, u64)>,
}

/// The rounds after the first, at [`deliver::RESCANS`]: each one's news goes to the watch
/// (new targets, decided processes) and its targets to the record.
#[allow(clippy::too_many_arguments)]
async fn later_rounds(
    mut delivery: deliver::Delivery,
    procfs: PathBuf,
    notice: Notice,
    metrics: CheckpointMetrics,
    ack_dir: Option<PathBuf>,
    watch: mpsc::UnboundedSender<settle::Late>,
    record: mpsc::UnboundedSender<LateTargets>,
    (sent, mut waiting): (String, Vec<i32>),
) {
    let started = Instant::now();
    while let Some(at) = delivery.next() {
        tokio::time::sleep(at.saturating_sub(started.elapsed())).await;
        let (n, m) = (notice.clone(), metrics.clone());
        let Ok((back, round)) = tokio::task::spawn_blocking(move || {
            let round = delivery.again(&n, Some(&m));
            (delivery, round)
        })
        .await
        else {
            return;
        };
        delivery = back;
        let now_waiting: Vec<i32> = round.waiting.iter().map(|(pid, _)| *pid).collect();
        let mut resolved: Vec<i32> = round.signalled.iter().map(|c| c.pid).collect();
        resolved.extend(
            waiting
                .iter()
                .copied()
                .filter(|pid| !now_waiting.contains(pid)),
        );
        waiting = now_waiting;
        let targets: Vec<(i32, u64)> = round
            .signalled
            .iter()
            .map(|c| (c.pid, c.start_time))
            .collect();
        if !targets.is_empty() {
            tracing::warn!(id = %notice.id, signalled = targets.len(), "Checkpoint signal sent to processes whose files answered late.");
            let _ = record.send(LateTargets {
                notice: notice.id.clone(),
                sent: sent.clone(),
                targets,
            });
        }
        let late = settle::Late {
            watched: round
                .signalled
                .iter()
                .map(|c| watched(c, &procfs, ack_dir.as_ref()))
                .collect(),
            resolved,
            skipped: round.skipped,
        };
        if watch.send(late).is_err() {
            return;
        }
    }
}

/// Keep `path` in line with the earliest ending acted on (absent when there is none; one an
/// earlier run left stays while `keep_inherited` and no ending is known).
async fn update_notice_file(
    path: &std::path::Path,
    settings: &Settings,
    snapshot: &HealthSnapshot,
    record: &Record,
    written: &mut Option<String>,
    keep_inherited: bool,
) {
    let ending = snapshot
        .notices
        .iter()
        .filter(|n| n.kind.ends_instance() && record.done(&n.id))
        .min_by_key(|n| n.deadline);
    let key = ending.map(|n| {
        let unix = n
            .deadline
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        format!("{}|{unix}", n.id)
    });
    if key == *written {
        return;
    }
    if key.is_none() && keep_inherited {
        return;
    }
    let contents = ending.map(|n| {
        notice_file::Contents::new(
            n,
            &signal_name(settings.selection.signal),
            settings.ack_dir.as_deref(),
            SystemTime::now(),
        )
    });
    let path = path.to_path_buf();
    let _ = tokio::task::spawn_blocking(move || notice_file::write(&path, contents.as_ref())).await;
    *written = key;
}

/// A one-off Event on `pod` (count 1, now), named from `key`.
#[cfg(feature = "clients")]
fn pod_event(
    pod: &super::kubernetes::NodePod,
    key: &str,
    (reason, type_): (&str, &str),
    message: &str,
    node: &str,
) -> serde_json::Value {
    let now = SystemTime::now();
    let event = super::kubernetes::PodEvent {
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
async fn confirmation_events(
    link: super::kubernetes::Link,
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
        if let Err(e) = api.create_event_in(&pod.namespace, &event).await {
            tracing::warn!(error = %e, pod = %pod.name, "Cannot post the checkpoint confirmation Event.");
        }
    }
}

/// At most this many calls' time limits for one notice's pod Events and cordon together.
#[cfg(feature = "clients")]
const KUBERNETES_CALLS: u32 = 6;

/// Post an Event on each signalled target's pod, naming its container and the GPUs that
/// container holds, and cordon when asked. Best effort: the signal already went out; a
/// failure here is logged.
#[cfg(feature = "clients")]
async fn tell_kubernetes(
    link: super::kubernetes::Link,
    lookup: Option<super::pod_resources::Lookup>,
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
        if let Err(e) = api.create_event_in(&pod.namespace, &event).await {
            tracing::warn!(error = %e, pod = %pod.name, "Cannot post the checkpoint Event on the pod.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::HealthModel;
    use crate::model::KmsgStats;

    #[test]
    fn fatal_faults_become_notices_with_stable_ids() {
        let mut model = HealthModel::for_test();
        model.apply_line(
            "NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception",
            SystemTime::UNIX_EPOCH,
        );
        model.apply_line(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
            SystemTime::UNIX_EPOCH,
        );
        let notices = fault_notices(&model.snapshot(KmsgStats::default()));
        assert_eq!(notices.len(), 1, "only the fatal fault");
        assert_eq!(notices[0].kind, NoticeKind::FatalFault);
        assert_eq!(
            notices[0].id,
            "fatal-fault:GPU 0000:3b:00.0 Xid 79:1970-01-01T00:00:00Z"
        );
        assert_eq!(
            fault_notices(&model.snapshot(KmsgStats::default()))[0].id,
            notices[0].id,
            "same fault, same id"
        );
    }
}
