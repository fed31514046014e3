//! Signalling one notice's targets, round by round: each target is signalled as soon as the
//! scan qualifies it, and the processes whose files did not answer are looked at again
//! [`RESCANS`] after the first round, so a slow procfs read (a trainer's memory-map lock held
//! in direct reclaim) delays that process's signal by a second, never skips it.

use std::collections::HashSet;
use std::time::Duration;

use super::targets::{Candidate, Scan, Selection};
use super::{send, CheckpointMetrics, KindLabels, SkipLabels};
use crate::model::signal::{name as signal_name, parse as parse_signal};
use crate::model::Notice;

/// When the processes still waiting are looked at again, counted from the first round; after
/// the last, one whose files still do not answer is skipped as stuck in the kernel.
pub const RESCANS: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(5)];

/// What one round did.
#[derive(Debug, Default)]
pub struct Round {
    /// The processes signalled in it.
    pub signalled: Vec<Candidate>,
    /// Why each process decided in it was not signalled (`pid N (name): why`).
    pub skipped: Vec<String>,
    /// The processes still waiting (`pid N (name): waiting: why`), looked at again.
    pub waiting: Vec<(i32, String)>,
}

/// One notice's signalling, between rounds.
#[derive(Debug)]
pub struct Delivery {
    scan: Scan,
    /// Processes signalled for the notice that covers this one (`(pid, start time)`).
    already: Vec<(i32, u64)>,
    /// Processes decided (signalled, skipped or found already signalled) in a round.
    decided: HashSet<(i32, u64)>,
    /// Rounds after the first done.
    rescans: usize,
}

impl Delivery {
    /// The first round: every process looked at, every target signalled. Blocking (procfs
    /// reads and syscalls).
    pub fn start(
        selection: &Selection,
        notice: &Notice,
        already: &[(i32, u64)],
        metrics: Option<&CheckpointMetrics>,
    ) -> (Self, Round) {
        let mut delivery = Self {
            scan: Scan::new(selection),
            already: already.to_vec(),
            decided: HashSet::new(),
            rescans: 0,
        };
        let round = delivery.round(notice, metrics);
        (delivery, round)
    }

    /// How long after the first round the next one is due; `None`: nothing waits.
    pub fn next(&self) -> Option<Duration> {
        self.scan
            .waiting()
            .then(|| RESCANS.get(self.rescans).copied())
            .flatten()
    }

    /// The next round: the waiting processes looked at again, those that now qualify
    /// signalled (after the last round nothing waits). Blocking.
    pub fn again(&mut self, notice: &Notice, metrics: Option<&CheckpointMetrics>) -> Round {
        self.rescans += 1;
        self.scan.again();
        self.round(notice, metrics)
    }

    fn round(&mut self, notice: &Notice, metrics: Option<&CheckpointMetrics>) -> Round {
        let last = self.rescans >= RESCANS.len();
        let mut round = Round::default();
        let decided = self.scan.decide(last);
        let selection = self.scan.selection();
        for c in decided {
            // Another pod's processes, while only some pods' declared leads are due.
            if let Some(only) = &selection.only_pods {
                if !c.pod_uid.as_ref().is_some_and(|uid| only.contains(uid)) {
                    continue;
                }
            }
            let id = (c.pid, c.start_time);
            if self.decided.contains(&id) {
                continue;
            }
            if c.waiting {
                round.waiting.push((
                    c.pid,
                    format!("pid {} ({}): waiting: {}", c.pid, c.name, c.why),
                ));
                continue;
            }
            self.decided.insert(id);
            if self.already.contains(&id) {
                tracing::info!(pid = c.pid, name = %c.name, trigger = %notice.kind, "Already signalled for this ending; not signalled again.");
                continue;
            }
            let Some(signal) = c.signal.as_deref().and_then(parse_signal) else {
                round
                    .skipped
                    .push(format!("pid {} ({}): {}", c.pid, c.name, c.why));
                if let Some(m) = metrics {
                    m.skipped
                        .get_or_create(&SkipLabels {
                            reason: c.why.label().into(),
                        })
                        .inc();
                }
                tracing::info!(pid = c.pid, name = %c.name, trigger = %notice.kind, why = %c.why, "Not signalled.");
                continue;
            };
            match send(&selection.procfs, c.pid, c.start_time, signal) {
                Ok(()) => {
                    if let Some(m) = metrics {
                        m.signalled
                            .get_or_create(&KindLabels {
                                kind: notice.kind.name().into(),
                            })
                            .inc();
                    }
                    tracing::warn!(
                        pid = c.pid,
                        name = %c.name,
                        signal = %signal_name(signal),
                        trigger = %notice.kind,
                        deadline = %crate::model::time::rfc3339(notice.deadline),
                        pod_uid = c.pod_uid.as_deref().unwrap_or("-"),
                        "Signalled to checkpoint."
                    );
                    round.signalled.push(c);
                }
                Err(e) => {
                    round
                        .skipped
                        .push(format!("pid {} ({}): not signalled: {e}", c.pid, c.name));
                    if let Some(m) = metrics {
                        m.skipped
                            .get_or_create(&SkipLabels {
                                reason: "gone".into(),
                            })
                            .inc();
                    }
                    tracing::info!(pid = c.pid, name = %c.name, error = %e, "Not signalled.");
                }
            }
        }
        round
    }
}

/// Signal every target for `notice` but those in `already` (`(pid, start time)`, signalled
/// for the notice that covers this one), every round included (blocking: it sleeps between
/// rounds). Returns the processes signalled, and why each other candidate was not
/// (`pid N (name): why`).
pub fn signal_targets(
    selection: &Selection,
    notice: &Notice,
    already: &[(i32, u64)],
    metrics: Option<&CheckpointMetrics>,
) -> (Vec<Candidate>, Vec<String>) {
    let started = std::time::Instant::now();
    let (mut delivery, mut round) = Delivery::start(selection, notice, already, metrics);
    let (mut signalled, mut skipped) = (Vec::new(), Vec::new());
    loop {
        signalled.append(&mut round.signalled);
        skipped.append(&mut round.skipped);
        let Some(at) = delivery.next() else { break };
        std::thread::sleep(at.saturating_sub(started.elapsed()));
        round = delivery.again(notice, metrics);
    }
    (signalled, skipped)
}
