//! The logind source: host shutdown. It holds a systemd-logind *delay* inhibitor lock; on
//! `PrepareForShutdown(true)` it reports a shutdown notice and keeps the lock until the
//! checkpoint sink has signalled the targets for it (or `max_delay` passes, or logind's own
//! `InhibitDelayMaxSec`), so training processes get their signal before they are killed.

use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};

use crate::model::{HealthSnapshot, Notice, NoticeKind, Observation, SourceKind, SourceState};
use crate::shutdown::Shutdown;

/// The part of `org.freedesktop.login1.Manager` the agent uses.
#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
trait Manager {
    /// Take an inhibitor lock; it holds while the returned descriptor is open.
    fn inhibit(
        &self,
        what: &str,
        who: &str,
        why: &str,
        mode: &str,
    ) -> zbus::Result<zbus::zvariant::OwnedFd>;

    /// Sent before shutdown (`true`) and when a shutdown is cancelled (`false`).
    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;
}

/// What the source needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Bus address; `None`: the system bus.
    pub bus_address: Option<String>,
    /// Longest the shutdown is held.
    pub max_delay: Duration,
    /// Wait for the checkpoint sink's report before releasing (it acts on shutdown notices).
    pub wait_for_checkpoint: bool,
}

async fn inhibit(manager: &ManagerProxy<'_>) -> zbus::Result<zbus::zvariant::OwnedFd> {
    manager
        .inhibit(
            "shutdown",
            "gpu-agent",
            "Signal training processes to checkpoint before shutdown",
            "delay",
        )
        .await
}

/// Run until shutdown of the agent itself.
pub async fn run(
    settings: Settings,
    tx: mpsc::Sender<Observation>,
    mut snapshots: watch::Receiver<std::sync::Arc<HealthSnapshot>>,
    mut shutdown: Shutdown,
) {
    let state = |s| Observation::Source(SourceKind::Logind, s);
    let setup = async {
        let connection = super::dbus::connect(settings.bus_address.as_deref()).await?;
        let manager = ManagerProxy::new(&connection).await?;
        let signals = manager.receive_prepare_for_shutdown().await?;
        zbus::Result::Ok((connection, manager, signals))
    };
    let (_connection, manager, mut signals) = match setup.await {
        Ok(parts) => parts,
        Err(e) => {
            let reason = format!("systemd-logind not reachable: {e}");
            tracing::info!(%reason, "Logind source is off.");
            let _ = tx.send(state(SourceState::Off(reason))).await;
            return;
        }
    };
    let lock = match inhibit(&manager).await {
        Ok(lock) => lock,
        Err(e) => {
            // logind grants a delay lock to root, and to other users where polkit allows it
            // (the packages run the agent as the `gpu-agent` system user and ship the rule).
            let reason = format!(
                "systemd-logind refused the shutdown delay lock to uid {} \
                 (for a user other than root it asks polkit: is polkitd installed and running?): {e}",
                rustix::process::geteuid().as_raw()
            );
            tracing::error!(%reason, "A host shutdown will not wait for checkpoints.");
            let _ = tx.send(state(SourceState::Failed(reason))).await;
            return;
        }
    };
    let mut lock = Some(lock);
    let _ = tx.send(state(SourceState::On)).await;
    tracing::info!("Holding a shutdown delay lock from systemd-logind.");
    loop {
        let signal = tokio::select! {
            s = signals.next() => match s { Some(s) => s, None => return },
            () = shutdown.wait() => return,
        };
        let start = signal.args().map(|a| a.start).unwrap_or(true);
        if !start {
            tracing::info!("Shutdown cancelled.");
            let _ = tx
                .send(Observation::Notices {
                    source: SourceKind::Logind,
                    notices: Vec::new(),
                })
                .await;
            if lock.is_none() {
                lock = inhibit(&manager).await.ok();
            }
            continue;
        }
        let now = SystemTime::now();
        let notice = Notice {
            id: format!("shutdown:{}", crate::model::time::rfc3339(now)),
            kind: NoticeKind::Shutdown,
            deadline: now + settings.max_delay,
            detail: "systemd-logind PrepareForShutdown".into(),
            source: SourceKind::Logind,
        };
        tracing::warn!(
            "Host is shutting down; signalling checkpoint targets before releasing the delay lock."
        );
        let id = notice.id.clone();
        let _ = tx
            .send(Observation::Notices {
                source: SourceKind::Logind,
                notices: vec![notice],
            })
            .await;
        if settings.wait_for_checkpoint {
            // Until the signalled processes have finished (exited) or the checkpoint hold has
            // passed: time to write the checkpoint before the host goes down.
            let done = snapshots
                .wait_for(|s| s.checkpoints.iter().any(|c| c.notice_id == id && c.settled));
            if tokio::time::timeout(settings.max_delay, done)
                .await
                .is_err()
            {
                tracing::warn!(max_delay = ?settings.max_delay, "Checkpoint signalling did not finish in time; releasing the shutdown lock.");
            }
        }
        drop(lock.take());
        tracing::info!("Shutdown delay lock released.");
    }
}
