//! The core: one task owns the node's health model. Sources send it observations; it merges
//! them, persists what must survive a restart, and publishes a snapshot that every sink
//! reads. Nothing else mutates health state.
//!
//! Saving runs on the blocking pool, one save at a time: a slow or stuck disk (fsync taking
//! seconds) delays only the save, never the merging, the status socket or the watchdog.

mod health;
mod persist;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

pub use health::{condition, HealthModel, MAX_FAULTS};
pub use persist::{PersistError, PersistedState, StateStore};

use crate::model::{HealthSnapshot, KmsgCounters, Observation};
use crate::shutdown::Shutdown;

/// How soon dirty state is written (the first change at once, later ones at most this
/// often). Nothing ticks while nothing is dirty: an idle agent is asleep.
const TICK: Duration = Duration::from_secs(1);
/// The most observations merged before a snapshot is published, so a flood still shows up.
const MAX_BATCH: usize = 4096;

/// Requests other tasks can make of the core.
#[derive(Debug)]
pub enum Request {
    /// Liveness check for the systemd watchdog: answered when the core's loop is turning.
    Ping(oneshot::Sender<()>),
    /// An operator declares faults repaired (`gpu-agent clear`): those the selector matches,
    /// or all. Answered with the labels of the faults removed.
    Clear(Option<String>, oneshot::Sender<Vec<String>>),
}

/// A cheap handle to send requests to the core.
#[derive(Debug, Clone)]
pub struct CoreHandle(mpsc::Sender<Request>);

impl CoreHandle {
    /// `true` if the core answered within `timeout`.
    pub async fn ping(&self, timeout: Duration) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.0.send(Request::Ping(tx)).await.is_err() {
            return false;
        }
        matches!(tokio::time::timeout(timeout, rx).await, Ok(Ok(())))
    }

    /// Clear faults (see [`Request::Clear`]); `None` if the core is gone.
    pub async fn clear(&self, selector: Option<String>) -> Option<Vec<String>> {
        let (tx, rx) = oneshot::channel();
        self.0.send(Request::Clear(selector, tx)).await.ok()?;
        rx.await.ok()
    }
}

/// The core task's state.
#[derive(Debug)]
pub struct Core {
    model: HealthModel,
    store: Option<StateStore>,
    counters: Arc<KmsgCounters>,
    snapshots: watch::Sender<Arc<HealthSnapshot>>,
    requests: mpsc::Receiver<Request>,
    last_persist_error: Option<String>,
}

impl Core {
    /// A core over `model`, persisting to `store` (none: in memory only). Returns the core,
    /// a handle for requests and the snapshot channel sinks subscribe to.
    pub fn new(
        model: HealthModel,
        store: Option<StateStore>,
        counters: Arc<KmsgCounters>,
    ) -> (Self, CoreHandle, watch::Receiver<Arc<HealthSnapshot>>) {
        let (snapshots, snapshot_rx) = watch::channel(Arc::new(model.snapshot(counters.stats())));
        let (request_tx, requests) = mpsc::channel(16);
        let core = Self {
            model,
            store,
            counters,
            snapshots,
            requests,
            last_persist_error: None,
        };
        (core, CoreHandle(request_tx), snapshot_rx)
    }

    /// Run until shutdown, then persist once more.
    pub async fn run(
        mut self,
        mut observations: mpsc::Receiver<Observation>,
        mut shutdown: Shutdown,
    ) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut dirty = false;
        let mut saving: Option<JoinHandle<Result<(), String>>> = None;
        let mut sources_open = true;
        loop {
            tokio::select! {
                observation = observations.recv(), if sources_open => {
                    let Some(observation) = observation else {
                        sources_open = false;
                        continue;
                    };
                    let mut changed = self.model.apply(observation);
                    for _ in 0..MAX_BATCH {
                        match observations.try_recv() {
                            Ok(observation) => changed |= self.model.apply(observation),
                            Err(_) => break,
                        }
                    }
                    if changed {
                        dirty = true;
                        self.publish();
                    }
                }
                Some(request) = self.requests.recv() => match request {
                    Request::Ping(reply) => {
                        let _ = reply.send(());
                    }
                    Request::Clear(selector, reply) => {
                        let cleared = self.model.clear(selector.as_deref());
                        if !cleared.is_empty() {
                            self.publish();
                            dirty = true;
                        }
                        let _ = reply.send(cleared);
                    }
                },
                result = async {
                    match saving.as_mut() {
                        Some(save) => save.await,
                        None => std::future::pending().await,
                    }
                }, if saving.is_some() => {
                    saving = None;
                    // A failed save (disk full, read-only) stays dirty: retried next tick.
                    dirty |= !self.saved(result.unwrap_or_else(|e| Err(e.to_string())));
                }
                // Only while something waits to be saved; the kernel-log counters are read
                // live by `status` and `/metrics`, so they need no republishing.
                _ = tick.tick(), if dirty && saving.is_none() => {
                    saving = self.start_save();
                    dirty = false;
                }
                () = shutdown.wait() => break,
            }
        }
        // Merge whatever is already queued so nothing read is lost, then save. Records read
        // that held no fault move the cursor too: taken before the queue is drained, every
        // fault record read before them is in it.
        let quiet_through = self
            .counters
            .quiet_through
            .load(std::sync::atomic::Ordering::Acquire);
        while let Ok(observation) = observations.try_recv() {
            dirty |= self.model.apply(observation);
        }
        if let Some(seq) = quiet_through.checked_sub(1) {
            dirty |= self.model.advance_kmsg_cursor(seq);
        }
        if let Some(save) = saving.take() {
            dirty |= !self.saved(save.await.unwrap_or_else(|e| Err(e.to_string())));
        }
        if dirty {
            if let Some(save) = self.start_save() {
                self.saved(save.await.unwrap_or_else(|e| Err(e.to_string())));
            }
        }
    }

    fn publish(&self) {
        self.snapshots
            .send_replace(Arc::new(self.model.snapshot(self.counters.stats())));
    }

    /// Start saving the current state on the blocking pool; `None` without a store.
    fn start_save(&self) -> Option<JoinHandle<Result<(), String>>> {
        let store = self.store.clone()?;
        let state = self.model.persisted();
        Some(tokio::task::spawn_blocking(move || {
            store.save(&state).map_err(|e| e.to_string())
        }))
    }

    /// Log a save's outcome once per change; `false` if it failed (kept in memory, retried).
    fn saved(&mut self, result: Result<(), String>) -> bool {
        match result {
            Ok(()) => {
                if self.last_persist_error.take().is_some() {
                    tracing::info!("State saved again.");
                }
                true
            }
            Err(message) => {
                if self.last_persist_error.as_deref() != Some(message.as_str()) {
                    tracing::warn!(error = %message, "Cannot save state; it is kept in memory and retried.");
                    self.last_persist_error = Some(message);
                }
                false
            }
        }
    }
}
