//! systemd integration: `READY=1`, `STATUS=` (the line `systemctl status` shows), watchdog
//! pings and `STOPPING=1`. Without `NOTIFY_SOCKET` every call is a quiet no-op.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::sync::watch;

use crate::core::CoreHandle;
use crate::model::{FaultPathLock, HealthSnapshot};
use crate::shutdown::Shutdown;

fn notify(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::debug!(error = %e, "sd_notify failed.");
    }
}

/// A message for the notify socket, owned so it can cross to the blocking pool.
enum Message {
    Status(String),
    Watchdog,
}

/// Send off the runtime thread: a datagram send blocks while the receiver's queue is full,
/// and the daemon must keep serving while systemd is slow to read.
async fn send(message: Message) {
    let _ = tokio::task::spawn_blocking(move || match message {
        Message::Status(status) => notify(&[NotifyState::Status(&status)]),
        Message::Watchdog => notify(&[NotifyState::Watchdog]),
    })
    .await;
}

/// Tell systemd the daemon is up (sources and sinks are running).
pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tell systemd the daemon is stopping.
pub fn stopping() {
    notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// The watchdog interval systemd asked for, if any.
pub fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0;
    sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec))
}

/// Keep `STATUS=` in step with the snapshot's summary, and ping the watchdog while the core
/// answers, until shutdown.
pub async fn run(
    mut snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    core: CoreHandle,
    mut shutdown: Shutdown,
) {
    let watchdog = watchdog_interval();
    let period = watchdog.map_or(Duration::from_secs(3600), |w| w / 2);
    let mut tick = crate::tick::Ticker::new(period);
    let mut last = snapshots.borrow().summary.clone();
    let mut watching = snapshots.borrow().fault_path_lock == FaultPathLock::Watching;
    loop {
        tokio::select! {
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
                let (summary, now_watching) = {
                    let snapshot = snapshots.borrow_and_update();
                    let watching = snapshot.fault_path_lock == FaultPathLock::Watching;
                    (snapshot.summary.clone(), watching)
                };
                // The fault path's lock starts watching what the daemon maps: the same
                // status once more, so a fault's STATUS= runs on locked pages too.
                let rehearse = now_watching && !std::mem::replace(&mut watching, now_watching);
                if summary != last || rehearse {
                    send(Message::Status(summary.clone())).await;
                    last = summary;
                }
            }
            () = tick.tick(), if watchdog.is_some() => {
                // Only a core whose loop is turning keeps the watchdog fed.
                if core.ping(period).await {
                    send(Message::Watchdog).await;
                } else {
                    tracing::error!("Core did not answer the watchdog ping.");
                }
            }
            () = shutdown.wait() => return,
        }
    }
}
