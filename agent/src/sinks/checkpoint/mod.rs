//! The checkpoint sink: when the instance's end is known (Spot notice, scheduled maintenance,
//! Capacity Block end, host shutdown; rebalance and fatal faults when opted in), signal the
//! training processes to checkpoint, in time and once, and never a process that does not
//! handle the signal.
//!
//! The contract (docs/CHECKPOINT.md, "The contract"):
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
mod act;
mod declarations;
mod declared;
mod deliver;
#[cfg(feature = "clients")]
mod kube_report;
mod metrics;
mod notice_file;
mod proc_facts;
mod record;
mod send;
mod settle;
mod targets;
mod verdict;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, watch};

pub use crate::model::signal::{name as signal_name, parse as parse_signal};
pub use declared::{ByPod, Declared};
pub use deliver::signal_targets;
pub use metrics::{CheckpointMetrics, KindLabels, SkipLabels};
pub use record::{Record, Sent, Windows};
pub use send::{send, SendError};
pub use targets::{scan, Candidate, Selection, OPT_IN_VAR};

use crate::model::{HealthSnapshot, Notice, NoticeKind, Observation, Severity};
use crate::shutdown::Shutdown;
use act::{act, LateTargets, Scope};
use declarations::{Declarations, DECLARATIONS_FOR_ACTING, DECLARATIONS_WHILE_WAITING};

/// What the sink needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Who gets signalled.
    pub selection: Selection,
    /// Which notice kinds trigger a checkpoint.
    pub triggers: Vec<NoticeKind>,
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

/// How long a notice file left by an earlier run is kept while no ending is known (the
/// notice sources' first polls after a restart).
const INHERITED_NOTICE_GRACE: Duration = Duration::from_secs(10);

/// Run until shutdown.
pub async fn run(
    settings: Settings,
    metrics: CheckpointMetrics,
    mut snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    reports: mpsc::Sender<Observation>,
    mut shutdown: Shutdown,
) {
    let mut record = Record::load(&settings.state_file);
    let (saves, saver) = spawn_saver(
        settings.state_file.clone(),
        metrics.record_save_failures.clone(),
        reports.clone(),
    );
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
            // The core owns the lead (`[checkpoint.lead]`); the snapshot carries it.
            let configured = snapshot.lead(notice.kind);
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
            notice_file::update(
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
/// The record's line in `status` (a sink of its own: the record is the checkpoint sink's
/// memory across restarts).
pub const RECORD: &str = "checkpoint-record";

/// Save each record handed over, latest first, off the sink's loop. A failed save is
/// counted (`gpu_agent_checkpoint_record_save_failures`) and shown in `status` as the
/// record's state, `failed` with the reason, until a save succeeds again.
fn spawn_saver(
    path: std::path::PathBuf,
    failures: prometheus_client::metrics::counter::Counter,
    reports: mpsc::Sender<Observation>,
) -> (watch::Sender<Option<Record>>, tokio::task::JoinHandle<()>) {
    let (saves, mut latest) = watch::channel::<Option<Record>>(None);
    let saver = tokio::spawn(async move {
        let mut failing = false;
        while latest.changed().await.is_ok() {
            let Some(record) = latest.borrow_and_update().clone() else {
                continue;
            };
            let path = path.clone();
            let saved = tokio::task::spawn_blocking(move || record.save(&path))
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            let state = match saved {
                Ok(()) if !failing => continue,
                Ok(()) => crate::model::SourceState::On,
                Err(e) => {
                    failures.inc();
                    tracing::warn!(error = %e, "Cannot remember signalled notices; a restart may signal one again.");
                    crate::model::SourceState::Failed(format!(
                        "cannot save the record of signalled notices ({e}): a restart may signal a notice again"
                    ))
                }
            };
            failing = state != crate::model::SourceState::On;
            let _ = reports
                .send(Observation::Sink(crate::model::SinkStatus {
                    sink: RECORD.into(),
                    state,
                }))
                .await;
        }
    });
    (saves, saver)
}

/// The checkpoint fault path run once, with nothing sent: the scan for the processes a
/// notice would signal (their `SigCgt` read and judged), and the pidfd send path up to its
/// start-time check on this agent's own process, given a start time it cannot have, so it
/// stops before any signal (`host::resident` locks what this maps). The candidates found.
pub fn rehearse(selection: &Selection) -> usize {
    let candidates = scan(selection).len();
    // This process, in its own procfs (never `[procfs] root`, where the same PID may be
    // another process).
    let procfs = std::path::Path::new("/proc");
    let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    if let Some(stat) = proc_facts::stat(procfs, me) {
        // Never this process's start time: `send` finds the PID "reused" and sends nothing.
        let not_mine = stat.start_time.wrapping_add(1);
        let _ = send(procfs, me, not_mine, selection.signal);
        let _ = proc_facts::sigcgt(procfs, me)
            .map(|mask| crate::model::signal::caught(&mask, selection.signal));
    }
    candidates
}

/// The act on a notice run once, with nothing to signal and no one told: `settings` as the
/// sink runs with, but a procfs where no process lives, no Kubernetes, no notice or ack
/// file, and metrics, record and reports of its own; the act's bookkeeping, its log lines
/// and the watch of what it signalled (nothing) run as they would for `notice`.
pub async fn rehearse_act(mut settings: Settings, notice: &Notice, snapshot: &HealthSnapshot) {
    settings.selection.procfs = settings.state_file.with_file_name("no-procfs-here");
    settings.notice_file = None;
    settings.ack_dir = None;
    #[cfg(feature = "clients")]
    {
        settings.kubernetes = None;
        settings.pod_resources = None;
    }
    let metrics =
        CheckpointMetrics::register(&mut prometheus_client::registry::Registry::default());
    let (reports, _kept) = mpsc::channel(16);
    let (late, _late_kept) = mpsc::unbounded_channel();
    let mut record = Record::default();
    let scope = Scope {
        declared: &ByPod::default(),
        only_pods: None,
        early: Vec::new(),
        late: &late,
    };
    let sent = act(
        &settings, &metrics, &reports, &record, notice, snapshot, scope,
    )
    .await;
    record.remember(notice, sent);
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

    /// Review 2026-12-03b L7: a failed save of the record was only logged. It is counted
    /// and shown as the record's state until a save succeeds again.
    #[tokio::test]
    async fn a_failed_record_save_is_surfaced_until_one_succeeds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let blocker = dir.path().join("state");
        std::fs::write(&blocker, "a file where the state directory should be").expect("file");
        let failures = prometheus_client::metrics::counter::Counter::default();
        let (tx, mut rx) = mpsc::channel(8);
        let (saves, _saver) = spawn_saver(blocker.join("checkpoint.json"), failures.clone(), tx);
        let state = |o: Option<Observation>| match o {
            Some(Observation::Sink(s)) if s.sink == RECORD => s.state,
            other => panic!("{other:?}"),
        };
        saves.send_replace(Some(Record::default()));
        let failed = state(rx.recv().await);
        assert!(
            matches!(&failed, crate::model::SourceState::Failed(why) if why.contains("may signal a notice again")),
            "{failed:?}"
        );
        assert_eq!(failures.get(), 1);
        std::fs::remove_file(&blocker).expect("rm");
        std::fs::create_dir(&blocker).expect("dir");
        saves.send_replace(Some(Record::default()));
        assert_eq!(state(rx.recv().await), crate::model::SourceState::On);
        assert_eq!(failures.get(), 1);
    }
}
