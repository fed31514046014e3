//! The NVML poll's watchdog. NVML calls block in the driver, and a driver in trouble (a GPU
//! fallen off the bus, a hung GSP) can keep one from returning for minutes or for ever: the
//! poll thread then sends nothing, and without this the source would stay `on` in `status`
//! with faults that are no longer looked at. A poll that has not returned in time shows the
//! source `failed`, naming how long it has been stuck; the faults NVML saw last are kept.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::model::{Observation, SourceKind, SourceState};

/// A poll still running after this many poll intervals is hung...
const HUNG_POLLS: u32 = 3;
/// ...and after at least this long (a poll of eight healthy GPUs takes milliseconds).
const HUNG_FLOOR: Duration = Duration::from_secs(5);

/// How long a poll at `interval` may run before it counts as hung.
pub fn limit(interval: Duration) -> Duration {
    interval.saturating_mul(HUNG_POLLS).max(HUNG_FLOOR)
}

/// The poll in progress, as the poll thread reports it and the watchdog sees it.
#[derive(Debug, Default)]
pub struct Watch {
    /// When the poll in progress started; `None` between polls.
    started: Mutex<Option<Instant>>,
    /// The watchdog has reported the poll in progress hung.
    hung: AtomicBool,
}

impl Watch {
    /// A poll starts.
    pub fn start(&self) {
        *self.started.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// The poll returned. Returns whether it had been reported hung (the source is back on).
    pub fn end(&self) -> bool {
        *self.started.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.hung.swap(false, Ordering::AcqRel)
    }

    /// How long the poll in progress has run, if it passed `limit` and was not reported yet
    /// (it is then marked reported).
    fn newly_hung(&self, limit: Duration) -> Option<Duration> {
        let started = *self.started.lock().unwrap_or_else(PoisonError::into_inner);
        let running = started?.elapsed();
        (running >= limit && !self.hung.swap(true, Ordering::AcqRel)).then_some(running)
    }
}

/// Start the watchdog thread for polls at `interval`; it ends when the core is gone.
pub fn spawn(
    watch: Arc<Watch>,
    interval: Duration,
    tx: mpsc::Sender<Observation>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let limit = limit(interval);
    std::thread::Builder::new()
        .name("nvml-watchdog".into())
        .spawn(move || loop {
            std::thread::sleep(limit / 4);
            if tx.is_closed() {
                return;
            }
            if let Some(running) = watch.newly_hung(limit) {
                let reason = format!(
                    "an NVML poll has not returned for {}s: the driver is not answering (a GPU \
                     fallen off the bus, a hung GSP?); faults kept as they were",
                    running.as_secs()
                );
                tracing::error!(%reason, "NVML poll hung.");
                let failed = Observation::Source(SourceKind::Nvml, SourceState::Failed(reason));
                if tx.blocking_send(failed).is_err() {
                    return;
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_past_its_limit_is_reported_once_and_its_end_brings_the_source_back() {
        assert_eq!(limit(Duration::from_millis(100)), HUNG_FLOOR);
        assert_eq!(limit(Duration::from_secs(10)), Duration::from_secs(30));
        let watch = Watch::default();
        assert_eq!(watch.newly_hung(Duration::ZERO), None, "no poll running");
        watch.start();
        assert_eq!(watch.newly_hung(Duration::from_secs(60)), None, "in time");
        assert!(watch.newly_hung(Duration::ZERO).is_some(), "hung");
        assert_eq!(watch.newly_hung(Duration::ZERO), None, "reported once");
        assert!(watch.end(), "back on");
        watch.start();
        assert!(!watch.end(), "a poll in time");
    }
}
