//! Watching signalled processes confirm their checkpoint: each confirms by writing its ack
//! file or by exiting. The report's `waiting_for` (processes still running) shrinks as they
//! exit, and it is `settled` once all have exited or the hold has passed: a host shutdown
//! waits for that (the logind source holds its delay lock until then). Confirmations are
//! awaited until the deadline; the last report counts them and names the unconfirmed.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;

use super::{ack, targets};
use crate::host::proc_read::{ProcReader, DEFAULT_DEADLINE};
use crate::model::{CheckpointReport, Observation};

/// How often the signalled processes are looked at while a shutdown may wait on them.
const POLL: Duration = Duration::from_millis(100);
/// How often after that, while confirmations are awaited until the deadline.
const POLL_AFTER_HOLD: Duration = Duration::from_secs(1);

/// Is the process `pid` that started at `start_time` still running (not gone, not a zombie)?
pub fn running(procfs: &std::path::Path, pid: i32, start_time: u64) -> bool {
    targets::stat(procfs, pid).is_some_and(|s| s.start_time == start_time && !s.zombie)
}

/// A signalled process to watch.
#[derive(Debug, Clone)]
pub struct Watched {
    /// PID.
    pub pid: i32,
    /// Start time (with the PID, its identity).
    pub start_time: u64,
    /// Where its ack appears, if acks are on.
    pub ack: Option<ack::AckFile>,
}

/// News from a later round of the signalling: processes signalled now, and those decided
/// that waited before.
#[derive(Debug, Clone, Default)]
pub struct Late {
    /// Signalled in that round: watched from now on.
    pub watched: Vec<Watched>,
    /// PIDs no longer waiting (signalled or skipped now).
    pub resolved: Vec<i32>,
    /// Why each process decided in that round was not signalled.
    pub skipped: Vec<String>,
}

/// How long to watch.
#[derive(Debug, Clone, Copy)]
pub struct Until {
    /// The hold: `settled` when it passes (or all exited).
    pub hold: Instant,
    /// The end of the watch: the deadline (at least the hold).
    pub confirm: Instant,
}

/// One look: which are still running, which confirmed (and with what words), and which
/// ack files were refused (and why).
#[derive(Debug, Clone, Default, PartialEq)]
struct Look {
    running: Vec<i32>,
    confirmed: Vec<(i32, String)>,
    refused: Vec<(i32, String)>,
}

/// Look at every target: whether it runs, and the ack of each not confirmed in `before` (a
/// confirmed target's file is never read again; its confirmation stands).
fn look(
    reader: &mut ProcReader,
    procfs: &std::path::Path,
    targets: &[Watched],
    since: SystemTime,
    before: &[(i32, String)],
) -> Look {
    let mut out = Look::default();
    for t in targets {
        let alive = running(procfs, t.pid, t.start_time);
        if alive {
            out.running.push(t.pid);
        }
        if let Some((_, words)) = before.iter().find(|(pid, _)| *pid == t.pid) {
            out.confirmed.push((t.pid, words.clone()));
            continue;
        }
        let acked = match t.ack.as_ref().map(|a| ack::read(reader, a, since)) {
            Some(ack::Ack::Fresh(words)) => Some(words),
            Some(ack::Ack::Refused(why)) => {
                out.refused.push((t.pid, why.to_string()));
                None
            }
            Some(ack::Ack::Absent) | None => None,
        };
        match (acked, alive) {
            (Some(words), _) => out.confirmed.push((t.pid, words)),
            (None, false) => out.confirmed.push((t.pid, "exited".into())),
            (None, true) => {}
        }
    }
    out
}

/// Report `base` as the `targets` confirm (ack or exit), until all have or `until.confirm`
/// passes; `settled` once all exited or `until.hold` passed. While `late` is open, later
/// rounds of the signalling may add targets: nothing is settled or done before it closes.
/// Returns the last report.
pub async fn watch(
    mut base: CheckpointReport,
    mut targets: Vec<Watched>,
    until: Until,
    procfs: PathBuf,
    reports: mpsc::Sender<Observation>,
    mut late: Option<mpsc::UnboundedReceiver<Late>>,
) -> CheckpointReport {
    let since = base.signalled_at.unwrap_or_else(SystemTime::now);
    let mut reader = Some(ProcReader::new(DEFAULT_DEADLINE));
    let mut refusals: Vec<i32> = Vec::new();
    // Confirmations stand once made: the previous look's are carried, never re-read.
    let mut before: Vec<(i32, String)> = Vec::new();
    loop {
        let mut news = false;
        while let Some(rx) = late.as_mut() {
            match rx.try_recv() {
                Ok(l) => {
                    news = true;
                    base.not_signalled.retain(|line| {
                        !l.resolved
                            .iter()
                            .any(|pid| line.starts_with(&format!("pid {pid} (")))
                    });
                    base.not_signalled.extend(l.skipped);
                    base.signalled = base
                        .signalled
                        .saturating_add(u32::try_from(l.watched.len()).unwrap_or(u32::MAX));
                    targets.extend(l.watched);
                    base.skipped = u32::try_from(base.not_signalled.len()).unwrap_or(u32::MAX);
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    news = true;
                    late = None;
                }
            }
        }
        let more_to_come = late.is_some();
        // Off the runtime thread: the reads are bounded, but each may wait its deadline.
        let (t, p, r, b) = (
            targets.clone(),
            procfs.clone(),
            reader.take(),
            before.clone(),
        );
        let (now_look, back) = tokio::task::spawn_blocking(move || {
            let mut r = r.unwrap_or_else(|| ProcReader::new(DEFAULT_DEADLINE));
            (look(&mut r, &p, &t, since, &b), r)
        })
        .await
        .unwrap_or_else(|_| (Look::default(), ProcReader::new(DEFAULT_DEADLINE)));
        reader = Some(back);
        for (pid, words) in &now_look.confirmed {
            if !before.iter().any(|(p, _)| p == pid) {
                tracing::info!(pid, notice = %base.notice_id, confirmed = %words, "Checkpoint confirmed.");
            }
        }
        before.clone_from(&now_look.confirmed);
        for (pid, why) in &now_look.refused {
            if !refusals.contains(pid) {
                tracing::warn!(pid, notice = %base.notice_id, "Checkpoint ack file not read: {why}; only a small regular file in the ack directory confirms.");
                refusals.push(*pid);
            }
        }
        let now = Instant::now();
        let all = now_look.confirmed.len() == targets.len();
        let settled = (now_look.running.is_empty() && !more_to_come) || now >= until.hold;
        let done = (all && !more_to_come) || now >= until.confirm;
        let confirmed = u32::try_from(now_look.confirmed.len()).unwrap_or(u32::MAX);
        let waiting_for = if settled {
            Vec::new()
        } else {
            now_look.running.clone()
        };
        let changed = news
            || waiting_for != base.waiting_for
            || settled != base.settled
            || confirmed != base.confirmed
            || done;
        if changed {
            if settled && !base.settled && !now_look.running.is_empty() {
                tracing::warn!(notice = %base.notice_id, still_running = ?now_look.running, "Checkpoint hold over; a shutdown waits no longer.");
            }
            base.waiting_for = waiting_for;
            base.settled = settled;
            base.confirmed = confirmed;
            if all && base.confirmed_in_ms.is_none() && !targets.is_empty() {
                let took = SystemTime::now().duration_since(since).unwrap_or_default();
                base.confirmed_in_ms = Some(u64::try_from(took.as_millis()).unwrap_or(u64::MAX));
            }
            if done {
                base.unconfirmed = targets
                    .iter()
                    .map(|t| t.pid)
                    .filter(|pid| !now_look.confirmed.iter().any(|(c, _)| c == pid))
                    .collect();
                summarise(&base);
            }
            if reports
                .send(Observation::Checkpoint(base.clone()))
                .await
                .is_err()
                || done
            {
                return base;
            }
        }
        tokio::time::sleep(if settled { POLL_AFTER_HOLD } else { POLL }).await;
    }
}

/// One journal line per notice: signalled N in M pods, K confirmed in T.
fn summarise(r: &CheckpointReport) {
    let took = r
        .confirmed_in_ms
        .map_or_else(String::new, |ms| format!(" in {:.1} s", ms as f64 / 1000.0));
    if r.unconfirmed.is_empty() {
        tracing::info!(notice = %r.notice_id, signalled = r.signalled, pods = r.pods, confirmed = r.confirmed, "Checkpoint: {} of {} signalled processes confirmed{took}.", r.confirmed, r.signalled);
    } else {
        tracing::warn!(notice = %r.notice_id, signalled = r.signalled, pods = r.pods, confirmed = r.confirmed, unconfirmed = ?r.unconfirmed, "Checkpoint: {} of {} signalled processes confirmed; unconfirmed at the deadline: {:?}.", r.confirmed, r.signalled, r.unconfirmed);
    }
}
