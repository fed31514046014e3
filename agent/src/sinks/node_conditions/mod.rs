//! The node-conditions sink: sets the Node conditions gpu-agent owns
//! (`AcceleratedHardwareReady`, `InterruptionPending`) on the EKS node monitoring agent's
//! contract, and records every warning and fatal fault as a Node Event.
//!
//! The first change after a quiet window is written at once; changes that follow within
//! the window are coalesced into the next PATCH (a burst costs one PATCH per window); a
//! heartbeat refreshes `lastHeartbeatTime`. When the API server is down, slow or
//! hung (every call is time-limited by the shared [`Link`]) the desired state is kept (only
//! the latest matters, so memory is bounded) and retried with backoff until it converges,
//! and the sink shows as `failed` with the reason. No kubeconfig and not in a pod: `off`,
//! and the kubeconfig is looked for again (nodeadm writes it after the agent starts). A 403
//! or 404 makes the link resolve the node name again; a new name starts afresh.

mod conditions;
mod events;
mod lifecycle;
mod metrics;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, watch};

pub use conditions::{desired, next_change, ConditionTypes, Desired};
pub use metrics::SinkMetrics;

use super::kubernetes::events::EventWrite;
use super::kubernetes::{annotation_patch, ApiError, Link, NodeApi};
use crate::model::{HealthSnapshot, Observation, SinkStatus, SourceState};
use crate::shutdown::Shutdown;

/// Slowest retry when the API server keeps failing.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
const MIN_BACKOFF: Duration = Duration::from_millis(200);

/// What the sink needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Condition type names.
    pub types: ConditionTypes,
    /// How long a burst of changes is gathered before one PATCH.
    pub debounce: Duration,
    /// How often `lastHeartbeatTime` is refreshed with no change.
    pub heartbeat: Duration,
    /// Post Node Events.
    pub events: bool,
    /// The device-taints sink runs: the first write waits (at most [`FENCING_WAIT`]) for its
    /// first report, so a GPU it fences is never first written as the node's fault (a
    /// restarted agent with a fenced GPU would flap `AcceleratedHardwareReady`).
    pub await_fencing: bool,
}

/// The sink's fault path run once, with no request: the conditions `snapshot` calls for,
/// their PATCH, and the Node Events of its faults, built and dropped (`host::resident`
/// locks what this maps). The bytes built.
pub fn rehearse(snapshot: &HealthSnapshot, types: &ConditionTypes) -> usize {
    let now = SystemTime::now();
    let wanted: Vec<(Desired, SystemTime)> = desired(snapshot, types, now)
        .into_iter()
        .map(|d| (d, now))
        .collect();
    let patch = conditions::patch(&wanted, now).to_string();
    let events = events::Posted::default().pending(
        &snapshot.node_name,
        "rehearsal",
        &snapshot.faults,
        Instant::now(),
    );
    let deadline = lifecycle::deadline(snapshot, types.lifecycle_rebalance);
    let annotation =
        annotation_patch(lifecycle::DEADLINE_ANNOTATION, deadline.as_deref()).to_string();
    annotated(deadline.as_deref());
    patch.len() + events.len() + annotation.len()
}

/// The maintenance deadline annotation written (`None`: removed): one log line, as text
/// (a Spot notice's path; the rehearsal runs it too).
fn annotated(deadline: Option<&str>) {
    tracing::info!(
        annotation = lifecycle::DEADLINE_ANNOTATION,
        deadline = deadline.unwrap_or("none"),
        "Node maintenance deadline annotated."
    );
}

/// The longest the first write waits for the device-taints sink's first report.
pub const FENCING_WAIT: Duration = Duration::from_secs(2);

/// What the server is known to hold for one owned condition.
#[derive(Debug, Clone, PartialEq)]
struct Known {
    desired: Desired,
    transition: SystemTime,
}

struct Writer {
    link: Link,
    /// The node written to; `None` before the first connection.
    node: Option<String>,
    settings: Settings,
    metrics: SinkMetrics,
    node_uid: Option<String>,
    known: HashMap<String, Known>,
    posted: events::Posted,
    /// The lifecycle deadline annotation as last written (`Some(None)`: removed); `None`:
    /// not written to this node yet.
    annotated: Option<Option<String>>,
    /// The last annotation write failed (said once).
    annotate_failing: bool,
}

impl Writer {
    /// Learn what the server holds for our conditions (their transition times).
    async fn refresh(&mut self, api: &NodeApi) -> Result<(), ApiError> {
        let (uid, conditions) = api.get().await?;
        self.node_uid = Some(uid);
        self.known.clear();
        for c in conditions {
            let type_ = c["type"].as_str().unwrap_or_default().to_string();
            if !self.settings.types.owns(&type_) {
                continue;
            }
            let transition = c["lastTransitionTime"]
                .as_str()
                .and_then(|t| humantime::parse_rfc3339_weak(t.trim_end_matches('Z')).ok())
                .unwrap_or_else(SystemTime::now);
            let status = if c["status"] == "True" {
                "True"
            } else {
                "False"
            };
            let desired = Desired {
                type_: type_.clone(),
                status,
                reason: c["reason"].as_str().unwrap_or_default().to_string(),
                message: c["message"].as_str().unwrap_or_default().to_string(),
            };
            self.known.insert(
                type_,
                Known {
                    desired,
                    transition,
                },
            );
        }
        Ok(())
    }

    /// Does the server hold `type_` as `True` with one of this agent's lifecycle reasons (as
    /// last read or written)?
    fn ours_true(&self, type_: &str) -> bool {
        self.known
            .get(type_)
            .is_some_and(|k| k.desired.status == "True" && lifecycle::is_ours(&k.desired.reason))
    }

    /// Bring the server in line with `snapshot`. `heartbeat` forces a PATCH.
    async fn sync(&mut self, snapshot: &HealthSnapshot, heartbeat: bool) -> Result<(), ApiError> {
        let api = self.link.api().await?;
        if self.node.as_deref() != Some(api.node()) {
            // First connection, or the node name was resolved anew: nothing is known of it.
            tracing::info!(node = %api.node(), "Writing node conditions.");
            self.node_uid = None;
            self.known.clear();
            self.posted = events::Posted::default();
            self.annotated = None;
            self.node = Some(api.node().to_string());
        }
        if self.node_uid.is_none() {
            self.refresh(&api).await?;
        }
        let now = SystemTime::now();
        let mut want = desired(snapshot, &self.settings.types, now);
        // A lifecycle condition is shared with other writers: False only to take back this
        // agent's own True, as the server has it now.
        let releases = want.iter().any(|d| {
            lifecycle::is_lifecycle(&d.type_) && d.status == "False" && self.ours_true(&d.type_)
        });
        if releases {
            self.refresh(&api).await?;
        }
        want.retain(|d| {
            !lifecycle::is_lifecycle(&d.type_) || d.status == "True" || self.ours_true(&d.type_)
        });
        let changed = want
            .iter()
            .any(|d| self.known.get(&d.type_).map(|k| &k.desired) != Some(d));
        if changed || heartbeat {
            let with_times: Vec<(Desired, SystemTime)> = want
                .iter()
                .map(|d| {
                    let transition = match self.known.get(&d.type_) {
                        Some(k) if k.desired.status == d.status => k.transition,
                        _ => now,
                    };
                    (d.clone(), transition)
                })
                .collect();
            let started = Instant::now();
            let result = api.patch_status(&conditions::patch(&with_times, now)).await;
            self.metrics
                .patch_seconds
                .observe(started.elapsed().as_secs_f64());
            if let Err(e) = result {
                // Re-read the server's state before the next attempt.
                self.node_uid = None;
                return Err(e);
            }
            for (d, transition) in with_times {
                for status in ["True", "False"] {
                    let labels = metrics::ConditionLabels {
                        r#type: d.type_.clone(),
                        status: status.to_string(),
                    };
                    self.metrics
                        .condition
                        .get_or_create(&labels)
                        .set(i64::from(d.status == status));
                }
                if self.known.get(&d.type_).map(|k| &k.desired) != Some(&d) {
                    tracing::info!(condition = %d.type_, status = d.status, reason = %d.reason, "Node condition set.");
                }
                self.known.insert(
                    d.type_.clone(),
                    Known {
                        desired: d,
                        transition,
                    },
                );
            }
        }
        if self.settings.types.lifecycle {
            let deadline = lifecycle::deadline(snapshot, self.settings.types.lifecycle_rebalance);
            if self.annotated.as_ref() != Some(&deadline) {
                // Never in the way of the conditions and Events: a refused annotation is
                // said once and tried again at the next write.
                match api
                    .annotate(lifecycle::DEADLINE_ANNOTATION, deadline.as_deref())
                    .await
                {
                    Ok(()) => {
                        annotated(deadline.as_deref());
                        self.annotated = Some(deadline);
                        self.annotate_failing = false;
                    }
                    Err(e) => {
                        if !std::mem::replace(&mut self.annotate_failing, true) {
                            tracing::warn!(error = %e, annotation = lifecycle::DEADLINE_ANNOTATION, "Cannot annotate the node with the maintenance deadline; the conditions still carry it.");
                        }
                    }
                }
            }
        }
        if self.settings.events {
            self.write_events(&api, snapshot).await?;
        }
        Ok(())
    }

    /// The owned conditions as the server holds them, sorted by type (for `status`).
    fn written(&self) -> Vec<crate::model::NodeCondition> {
        let mut out: Vec<crate::model::NodeCondition> = self
            .known
            .values()
            .map(|k| crate::model::NodeCondition {
                type_: k.desired.type_.clone(),
                status: k.desired.status.to_string(),
                reason: k.desired.reason.clone(),
            })
            .collect();
        out.sort_by(|a, b| a.type_.cmp(&b.type_));
        out
    }

    async fn write_events(
        &mut self,
        api: &NodeApi,
        snapshot: &HealthSnapshot,
    ) -> Result<(), ApiError> {
        let node = api.node().to_string();
        let uid = self.node_uid.clone().unwrap_or_default();
        let now = Instant::now();
        self.posted.retain(&node, &snapshot.faults);
        for write in self.posted.pending(&node, &uid, &snapshot.faults, now) {
            let result = api.write_event("default", &write).await;
            result?;
            let count = match &write {
                EventWrite::Create { count, .. } | EventWrite::Update { count, .. } => *count,
            };
            self.posted.sent(write.name(), count, now);
        }
        Ok(())
    }
}

/// Run until shutdown. `status` carries the sink's state to the core (shown by `status`).
pub async fn run(
    settings: Settings,
    link: Link,
    metrics: SinkMetrics,
    mut snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    status: mpsc::Sender<Observation>,
    mut shutdown: Shutdown,
) {
    let report = |state: SourceState| {
        let status = status.clone();
        async move {
            let _ = status
                .send(Observation::Sink(SinkStatus {
                    sink: "kubernetes".into(),
                    state,
                }))
                .await;
        }
    };
    let mut writer = Writer {
        link,
        node: None,
        settings: settings.clone(),
        metrics,
        node_uid: None,
        known: HashMap::new(),
        posted: events::Posted::default(),
        annotated: None,
        annotate_failing: false,
    };
    if settings.await_fencing {
        let until = Instant::now() + FENCING_WAIT;
        let reported = |s: &HealthSnapshot| {
            s.sinks
                .iter()
                .any(|x| x.sink == crate::sinks::device_taints::SINK)
        };
        while !reported(&snapshots.borrow()) && Instant::now() < until {
            tokio::select! {
                changed = snapshots.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(until.into()) => {}
                () = shutdown.wait() => return,
            }
        }
    }
    let mut due: Option<Instant> = Some(Instant::now());
    let mut next_heartbeat = Instant::now() + settings.heartbeat;
    let mut backoff = MIN_BACKOFF;
    let mut last_error: Option<String> = None;
    let mut reported_on = false;
    let mut last_write: Option<Instant> = None;
    let mut reported_conditions = Vec::new();
    loop {
        let wake = due.map_or(next_heartbeat, |d| d.min(next_heartbeat));
        tokio::select! {
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
                // The first change after a quiet window is written at once; changes within
                // the window after a write join the next one (a flood costs one PATCH per
                // window, the first fault none of it). A write already planned later (a known
                // end becoming due hours from now) never holds a change back.
                let now = Instant::now();
                let soon = last_write.map_or(now, |at| (at + settings.debounce).max(now));
                due = Some(due.map_or(soon, |d| d.min(soon)));
                continue;
            }
            () = tokio::time::sleep_until(wake.into()) => {}
            () = shutdown.wait() => return,
        }
        let now = Instant::now();
        let heartbeat = now >= next_heartbeat;
        if !heartbeat && due.is_some_and(|d| d > now) {
            continue;
        }
        let snapshot = Arc::clone(&snapshots.borrow_and_update());
        last_write = Some(now);
        match writer.sync(&snapshot, heartbeat).await {
            Ok(()) => {
                let written = writer.written();
                if written != reported_conditions {
                    let _ = status.send(Observation::Conditions(written.clone())).await;
                    reported_conditions = written;
                }
                // A known end that becomes due with time alone (deadline - lead) is written
                // when it does, not at the next heartbeat.
                let wall = SystemTime::now();
                due = next_change(&snapshot, wall)
                    .map(|at| now + at.duration_since(wall).unwrap_or_default());
                backoff = MIN_BACKOFF;
                if heartbeat {
                    next_heartbeat = now + settings.heartbeat;
                }
                if last_error.take().is_some() || !reported_on {
                    report(SourceState::On).await;
                    reported_on = true;
                }
            }
            Err(e) => {
                // No kubeconfig (standalone) is the sink being off, not a failed API call.
                if !matches!(e, ApiError::NotConfigured { .. }) {
                    let (verb, code) = e.labels();
                    writer
                        .metrics
                        .errors
                        .get_or_create(&metrics::ErrorLabels {
                            verb: verb.into(),
                            code,
                        })
                        .inc();
                }
                writer.link.after_error(&e);
                let message = e.to_string();
                if last_error.as_deref() != Some(&message) {
                    if matches!(e, ApiError::NotConfigured { .. }) {
                        tracing::info!(reason = %message, "Kubernetes sink is off; looking for the kubeconfig again from time to time.");
                        report(SourceState::Off(message.clone())).await;
                    } else {
                        tracing::warn!(error = %message, retry_in = ?backoff, "Cannot update the node; keeping the desired state and retrying.");
                        report(SourceState::Failed(message.clone())).await;
                    }
                    last_error = Some(message);
                }
                due = Some(now + backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
                if heartbeat {
                    next_heartbeat = now + settings.heartbeat;
                }
            }
        }
    }
}
