//! Watching signalled processes finish their checkpoint: the report's `waiting_for` shrinks
//! as they exit, and it is `settled` once all have exited or the hold has passed. A host
//! shutdown waits for that (the logind source holds its delay lock until then).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::targets;
use crate::model::{CheckpointReport, Observation};

/// How often the signalled processes are looked at.
const POLL: Duration = Duration::from_millis(100);

/// Is the process `pid` that started at `start_time` still running (not gone, not a zombie)?
pub fn running(procfs: &std::path::Path, pid: i32, start_time: u64) -> bool {
    targets::stat(procfs, pid).is_some_and(|s| s.start_time == start_time && !s.zombie)
}

/// Report `base` with `waiting_for` narrowing to the `targets` still running, until none is
/// or `until` passes; the last report is `settled`.
pub async fn watch(
    mut base: CheckpointReport,
    targets: Vec<(i32, u64)>,
    until: Instant,
    procfs: PathBuf,
    reports: mpsc::Sender<Observation>,
) {
    loop {
        let alive: Vec<i32> = targets
            .iter()
            .filter(|(pid, start)| running(&procfs, *pid, *start))
            .map(|(pid, _)| *pid)
            .collect();
        let settled = alive.is_empty() || Instant::now() >= until;
        if alive != base.waiting_for || settled {
            if settled && !alive.is_empty() {
                tracing::warn!(notice = %base.notice_id, still_running = ?alive, "Checkpoint hold over; not waiting for these any longer.");
            }
            base.waiting_for = if settled { Vec::new() } else { alive };
            base.settled = settled;
            if reports
                .send(Observation::Checkpoint(base.clone()))
                .await
                .is_err()
                || settled
            {
                return;
            }
        }
        tokio::time::sleep(POLL).await;
    }
}
