//! Acting on one due notice: signal (or find it covered), report, then watch the signalled
//! processes confirm and tell Kubernetes, both in the background.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;

#[cfg(feature = "clients")]
use super::kube_report::{confirmation_events, tell_kubernetes, KUBERNETES_CALLS};
use super::{
    ack, deliver, settle, ByPod, Candidate, CheckpointMetrics, KindLabels, Record, Sent, Settings,
};
use crate::model::{CheckpointReport, HealthSnapshot, Notice, Observation};

/// Which processes one act signals.
pub(super) struct Scope<'a> {
    /// What the pods declare.
    pub(super) declared: &'a ByPod,
    /// Only these pods' processes (their declared lead is due before the node's); `None`:
    /// every process (the notice is acted on for the node).
    pub(super) only_pods: Option<Vec<String>>,
    /// Processes already signalled ahead of this notice (its early pods').
    pub(super) early: Vec<(i32, u64)>,
    /// Where processes signalled after the first round are told.
    pub(super) late: &'a mpsc::UnboundedSender<LateTargets>,
}

/// Act on one due notice: signal (or find it covered), report, then watch the
/// signalled processes confirm and tell Kubernetes, both in the background.
pub(super) async fn act(
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
pub(super) fn watched(
    c: &Candidate,
    procfs: &std::path::Path,
    ack_dir: Option<&PathBuf>,
) -> settle::Watched {
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
pub(super) struct LateTargets {
    pub(super) notice: String,
    pub(super) sent: String,
    pub(super) targets: Vec<(i32, u64)>,
}

/// The rounds after the first, at [`deliver::RESCANS`]: each one's news goes to the watch
/// (new targets, decided processes) and its targets to the record.
#[allow(clippy::too_many_arguments)]
pub(super) async fn later_rounds(
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
