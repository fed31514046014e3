//! The IMEX source: on GB200/GB300 NVL72 nodes multi-node NVLink goes through IMEX, the
//! daemon that lets the GPUs of one NVLink domain import each other's memory. Where IMEX is
//! the host's job (the `nvidia-imex` unit is enabled), a unit that failed, or is not active
//! after the start-up grace, leaves multi-node jobs unable to share memory; so does a running
//! daemon with no channel device for workloads to open.
//!
//! Every anchor gets this wrong in one direction or the other (IMEX flagged on p5, on idle
//! GB300 with no ComputeDomain, or ignored everywhere), so the scope is decided first:
//! - a type known to have no NVLink domain (p5, p6-b200...): off, never a fault;
//! - the host unit not installed or not enabled: off (IMEX then runs per workload, started by
//!   the NVIDIA DRA driver's ComputeDomains, which report on themselves);
//! - otherwise (the unit enabled, on an NVL72 type or a type not in the table): watched.
//!
//! Its faults are the node's (the NVLink domain's), never one GPU's, and warnings: IMEX is a
//! daemon to restart, not hardware to repair.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use crate::model::{
    Action, Classification, Component, FaultCode, FaultReport, ImexState, Inventory, Observation,
    Severity, SourceKind, SourceState,
};
use crate::shutdown::Shutdown;

/// The part of `org.freedesktop.systemd1.Manager` the source uses.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Manager {
    /// `enabled`, `disabled`, `static`, `masked`, ...; an error where no such unit file is.
    fn get_unit_file_state(&self, name: &str) -> zbus::Result<String>;

    /// The unit's object (loading it if needed).
    fn load_unit(&self, name: &str) -> zbus::Result<zbus::zvariant::OwnedObjectPath>;
}

/// The part of `org.freedesktop.systemd1.Unit` the source uses.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1"
)]
trait Unit {
    /// `active`, `reloading`, `inactive`, `failed`, `activating`, `deactivating`.
    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;
}

/// What the source needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Bus address; `None`: the system bus.
    pub bus_address: Option<String>,
    /// The host's IMEX unit.
    pub unit: String,
    /// Where the channel devices are.
    pub channels_dir: PathBuf,
    /// How often to look.
    pub poll_interval: Duration,
    /// Until when (from boot) a unit not active yet is no fault.
    pub grace_ends: SystemTime,
    /// Whether the instance type has an NVLink domain, and the type; `None`: not known.
    pub nvlink_domain: Option<(bool, String)>,
}

/// IMEX channel devices (`channel0`, ...) under `dir`.
fn channels(dir: &Path) -> u32 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        let count = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("channel"))
            .count();
        u32::try_from(count).unwrap_or(u32::MAX)
    })
}

/// The faults `state` is, at `now` (pure: unit-tested).
pub fn judge(state: &ImexState, now: SystemTime, grace_ends: SystemTime) -> Vec<FaultReport> {
    let fault = |code, name: &str, detail: String| {
        let class = Classification {
            name: name.to_string(),
            description: detail.clone(),
            nvidia_action: String::new(),
            severity: Severity::Warning,
            action: Action::None,
        };
        FaultReport::seen(SourceKind::Imex, now, Component::Node, code, class, detail)
    };
    let booting = now < grace_ends;
    match state.active_state.as_str() {
        "active" | "reloading" if state.channels == 0 => vec![fault(
            FaultCode::ImexNoChannels,
            "IMEX_NO_CHANNELS",
            format!(
                "{} runs but no IMEX channel device exists: workloads cannot import memory across the NVLink domain",
                state.unit
            ),
        )],
        "active" | "reloading" => Vec::new(),
        "activating" | "inactive" | "deactivating" if booting => Vec::new(),
        other => vec![fault(
            FaultCode::ImexDown,
            "IMEX_DOWN",
            format!(
                "{} is enabled but {other}: multi-node NVLink jobs cannot share memory across the NVLink domain",
                state.unit
            ),
        )],
    }
}

/// Why IMEX is not this host's to watch, if it is not; `None`: watch it.
async fn out_of_scope(settings: &Settings, manager: &ManagerProxy<'_>) -> Option<String> {
    if let Some((false, instance_type)) = &settings.nvlink_domain {
        return Some(format!(
            "{instance_type} has no multi-node NVLink domain: IMEX is not checked"
        ));
    }
    match manager.get_unit_file_state(&settings.unit).await {
        Ok(state) if state == "enabled" => None,
        Ok(state) => Some(format!(
            "{} is {state}, not enabled: IMEX runs per workload (the NVIDIA DRA driver's ComputeDomains) or not at all",
            settings.unit
        )),
        Err(e) => Some(format!("{} is not installed ({e})", settings.unit)),
    }
}

/// The unit's `ActiveState`. Its object is looked up once (`LoadUnit`, kept in `unit`), then
/// only the property is read, fresh each time: no property cache or signal match to keep.
async fn active_state<'a>(
    connection: &'a zbus::Connection,
    manager: &ManagerProxy<'_>,
    name: &str,
    unit: &mut Option<UnitProxy<'a>>,
) -> zbus::Result<String> {
    let proxy = match unit {
        Some(proxy) => proxy,
        None => {
            let path = manager.load_unit(name).await?;
            unit.insert(
                UnitProxy::builder(connection)
                    .path(path)?
                    .cache_properties(zbus::proxy::CacheProperties::No)
                    .build()
                    .await?,
            )
        }
    };
    proxy.active_state().await
}

/// Run until shutdown of the agent itself.
pub async fn run(settings: Settings, tx: mpsc::Sender<Observation>, mut shutdown: Shutdown) {
    let state = |s| Observation::Source(SourceKind::Imex, s);
    let setup = async {
        let connection = super::dbus::connect(settings.bus_address.as_deref()).await?;
        let manager = ManagerProxy::new(&connection).await?;
        zbus::Result::Ok((connection, manager))
    };
    let (connection, manager) = match setup.await {
        Ok(parts) => parts,
        Err(e) => {
            let reason = format!("systemd not reachable over D-Bus: {e}");
            tracing::info!(%reason, "IMEX source is off.");
            let _ = tx.send(state(SourceState::Off(reason))).await;
            return;
        }
    };
    if let Some(reason) = out_of_scope(&settings, &manager).await {
        tracing::info!(%reason, "IMEX source is off.");
        let _ = tx.send(state(SourceState::Off(reason))).await;
        return;
    }
    let _ = tx.send(state(SourceState::On)).await;
    tracing::info!(unit = %settings.unit, "Watching the host's IMEX daemon.");
    let mut failing = false;
    let mut unit = None;
    let mut tick = crate::tick::Ticker::new(settings.poll_interval);
    loop {
        tokio::select! {
            () = tick.tick() => {}
            () = shutdown.wait() => return,
        }
        let active_state = match active_state(&connection, &manager, &settings.unit, &mut unit)
            .await
        {
            Ok(active) => active,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "Cannot read the IMEX unit's state; keeping its faults as they were.");
                    let _ = tx
                        .send(state(SourceState::Failed(format!(
                            "cannot read {}: {e}",
                            settings.unit
                        ))))
                        .await;
                }
                failing = true;
                continue;
            }
        };
        if std::mem::take(&mut failing) {
            let _ = tx.send(state(SourceState::On)).await;
        }
        let imex = ImexState {
            unit: settings.unit.clone(),
            active_state,
            channels: channels(&settings.channels_dir),
        };
        let faults = judge(&imex, SystemTime::now(), settings.grace_ends);
        let poll = Observation::Poll {
            source: SourceKind::Imex,
            faults,
            partial: Vec::new(),
            inventory: Inventory::Imex(imex),
        };
        if tx.send(poll).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(active: &str, channels: u32) -> ImexState {
        ImexState {
            unit: "nvidia-imex.service".into(),
            active_state: active.into(),
            channels,
        }
    }

    #[test]
    fn active_with_a_channel_is_healthy() {
        let now = SystemTime::now();
        assert!(judge(&state("active", 1), now, now).is_empty());
    }

    #[test]
    fn failed_is_a_node_warning_at_once_and_not_active_only_after_the_grace() {
        let now = SystemTime::now();
        let later = now + Duration::from_secs(60);
        let failed = judge(&state("failed", 1), now, later);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].code, FaultCode::ImexDown);
        assert_eq!(failed[0].component, Component::Node);
        assert_eq!(failed[0].class.severity, Severity::Warning);
        assert!(failed[0].detail.contains("failed"), "{}", failed[0].detail);
        for starting in ["activating", "inactive"] {
            assert!(
                judge(&state(starting, 0), now, later).is_empty(),
                "{starting} within the grace"
            );
            assert_eq!(
                judge(&state(starting, 0), later, now)[0].code,
                FaultCode::ImexDown,
                "{starting} after the grace"
            );
        }
    }

    #[test]
    fn running_without_a_channel_is_a_warning() {
        let now = SystemTime::now();
        let faults = judge(&state("active", 0), now, now);
        assert_eq!(faults.len(), 1);
        assert_eq!(faults[0].code, FaultCode::ImexNoChannels);
    }

    #[test]
    fn channels_are_counted_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(channels(dir.path()), 0);
        assert_eq!(channels(&dir.path().join("missing")), 0);
        for name in ["channel0", "channel1", "other"] {
            std::fs::write(dir.path().join(name), "").expect("write");
        }
        assert_eq!(channels(dir.path()), 2);
    }
}
