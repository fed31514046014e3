//! The EFA source: the Elastic Fabric Adapters that tie this node to the rest of the job.
//! Every poll reads each device's sysfs (`sysfs.rs`): how many there are against what the
//! instance type has, the link of its network interface, and its counters, turned into
//! rates over a window (`rates.rs`) and judged (`checks.rs`). Each poll sends the complete
//! set of findings ([`Observation::Poll`]) with the devices for `status` and metrics.
//!
//! A fault clears on evidence, not at the first good poll: a finding is reported until a
//! whole window has passed without it (a link back up and the rates under the limits for a
//! window), or at a new boot, or on `clear`. No EFA device on this host: the source is off
//! with the reason, and looks again every poll (devices may initialise late).
//!
//! [`Observation::Poll`]: crate::model::Observation::Poll

pub mod checks;
mod rates;
pub mod sysfs;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;

pub use checks::Thresholds;

use crate::model::{
    Component, EfaDevice, FaultCode, FaultReport, Inventory, Observation, SourceKind, SourceState,
};
use crate::shutdown::Shutdown;

/// What the source needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// sysfs root.
    pub sysfs_root: PathBuf,
    /// procfs root (when this boot started).
    pub procfs_root: PathBuf,
    /// Poll period.
    pub poll_interval: Duration,
    /// The window rates are taken over, and a fault outlives its evidence by.
    pub window: Duration,
    /// From boot, how long missing devices are not judged (late initialisation).
    pub startup_grace: Duration,
    /// `[efa] expected_devices` (0: from the instance type).
    pub expected_devices: u32,
    /// Rate limits.
    pub thresholds: Thresholds,
}

/// A poller that remembers counters and recent findings between polls.
#[derive(Debug)]
pub struct Poller {
    settings: Settings,
    devices: sysfs::Devices,
    rates: rates::Rates,
    grace_ends: SystemTime,
    /// Each finding's latest sighting: reported until a window passes without it.
    recent: BTreeMap<(Component, FaultCode), (Instant, checks::Finding)>,
    /// The source's state as last reported.
    state: Option<SourceState>,
}

impl Poller {
    /// A poller for `settings`.
    pub fn new(settings: Settings) -> Self {
        let boot = crate::host::boot_time(&settings.procfs_root).unwrap_or_else(SystemTime::now);
        Self {
            devices: sysfs::Devices::new(&settings.sysfs_root),
            rates: rates::Rates::new(settings.window),
            grace_ends: boot + settings.startup_grace,
            recent: BTreeMap::new(),
            state: None,
            settings,
        }
    }

    /// Read every device and turn what was read into observations: the source's state when
    /// it changed, then one [`Observation::Poll`] (none while the host has no EFA device).
    pub fn poll(&mut self, now: Instant) -> Vec<Observation> {
        let root = &self.settings.sysfs_root;
        let found = self.devices.read();
        let mut out = Vec::new();
        let state = if found.is_empty() && self.recent.is_empty() {
            SourceState::Off(format!(
                "no EFA device (vendor 0x1d0f, driver efa) under {}",
                root.join("class/infiniband").display()
            ))
        } else {
            SourceState::On
        };
        if self.state.as_ref() != Some(&state) {
            if let SourceState::Off(reason) = &state {
                tracing::info!(%reason, "EFA source is off; looking again every poll.");
            } else {
                tracing::info!(devices = found.len(), "Watching the EFA devices.");
            }
            out.push(Observation::Source(SourceKind::Efa, state.clone()));
            self.state = Some(state);
        }
        if self.state != Some(SourceState::On) {
            return out;
        }
        let names: Vec<&str> = found.iter().map(|d| d.name.as_str()).collect();
        self.rates.retain(&names);
        let mut seen = Vec::with_capacity(found.len());
        let mut devices = Vec::with_capacity(found.len());
        for d in &found {
            let rates: BTreeMap<String, f64> = d
                .counters
                .iter()
                .map(|(counter, value)| {
                    let rate = self.rates.observe(&d.name, counter, *value, now);
                    (counter.clone(), rate)
                })
                .collect();
            let component = d.pci.map_or(Component::Node, |pci| Component::Efa { pci });
            seen.push(checks::Seen {
                name: d.name.clone(),
                component,
                link_up: d.link_up,
                rates: rates.clone(),
            });
            devices.push(EfaDevice {
                name: d.name.clone(),
                pci: d.pci,
                numa_node: d.numa_node,
                netdevs: d.netdevs.clone(),
                link_up: d.link_up,
                gpus: d.gpus.clone(),
                rates,
                holders: Vec::new(),
            });
        }
        let expected =
            crate::host::instance_types::expected_efa(self.settings.expected_devices, root);
        let settled = SystemTime::now() >= self.grace_ends;
        for f in checks::evaluate(&seen, expected.as_ref(), settled, &self.settings.thresholds) {
            self.recent.insert((f.component, f.code), (now, f));
        }
        let window = self.settings.window;
        self.recent
            .retain(|_, (at, _)| now.saturating_duration_since(*at) <= window);
        let at = SystemTime::now();
        let faults = self
            .recent
            .values()
            .map(|(_, f)| FaultReport {
                component: f.component,
                code: f.code,
                class: f.class.clone(),
                source: SourceKind::Efa,
                at,
                detail: f.detail.clone(),
                cursor: None,
                drill: false,
            })
            .collect();
        out.push(Observation::Poll {
            source: SourceKind::Efa,
            faults,
            partial: Vec::new(),
            inventory: Inventory::Efa(devices),
        });
        out
    }
}

/// Poll until shutdown; each poll's sysfs reads run on the blocking pool.
pub async fn run(settings: Settings, tx: mpsc::Sender<Observation>, mut shutdown: Shutdown) {
    let interval = settings.poll_interval;
    let mut poller = Poller::new(settings);
    loop {
        let polled = tokio::task::spawn_blocking(move || {
            let observations = poller.poll(Instant::now());
            (poller, observations)
        })
        .await;
        let Ok((back, observations)) = polled else {
            tracing::error!("The EFA poll panicked; the source stops.");
            let _ = tx
                .send(Observation::Source(
                    SourceKind::Efa,
                    SourceState::Failed("the poll panicked".into()),
                ))
                .await;
            return;
        };
        poller = back;
        for observation in observations {
            if tx.send(observation).await.is_err() {
                return;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = shutdown.wait() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(root: &std::path::Path) -> Settings {
        Settings {
            sysfs_root: root.to_path_buf(),
            procfs_root: root.join("no-proc"),
            poll_interval: Duration::from_secs(1),
            window: Duration::from_secs(60),
            startup_grace: Duration::ZERO,
            expected_devices: 2,
            thresholds: Thresholds {
                errors_warning: 60.0,
                errors_fatal: 600.0,
                retrans_warning: 60_000.0,
            },
        }
    }

    fn faults(observations: &[Observation]) -> Vec<FaultCode> {
        observations
            .iter()
            .find_map(|o| match o {
                Observation::Poll { faults, .. } => Some(faults.iter().map(|f| f.code).collect()),
                _ => None,
            })
            .unwrap_or_default()
    }

    #[test]
    fn off_without_devices_and_a_fault_outlives_its_evidence_by_a_window() {
        let root = tempfile::tempdir().expect("tempdir");
        let mut p = Poller::new(settings(root.path()));
        let start = Instant::now();
        let first = p.poll(start);
        assert!(matches!(
            first.as_slice(),
            [Observation::Source(SourceKind::Efa, SourceState::Off(_))]
        ));
        sysfs::fake::device(root.path(), "rdmap0s0", "0000:10:00.0", 0).expect("device");
        let counter = root
            .path()
            .join("class/infiniband/rdmap0s0/ports/1/hw_counters/rx_drops");
        let second = p.poll(start + Duration::from_secs(1));
        assert!(matches!(
            second[0],
            Observation::Source(SourceKind::Efa, SourceState::On)
        ));
        assert_eq!(faults(&second), [FaultCode::EfaMissing], "1 of 2");
        sysfs::fake::device(root.path(), "rdmap1s0", "0000:11:00.0", 0).expect("device");
        std::fs::write(&counter, "700\n").expect("counter");
        let burst = faults(&p.poll(start + Duration::from_secs(2)));
        assert!(burst.contains(&FaultCode::EfaErrors), "{burst:?}");
        // The counter stops rising, the missing device is there: each fault stays until a
        // whole window has passed without its evidence, then clears.
        let later = faults(&p.poll(start + Duration::from_secs(40)));
        assert_eq!(later, [FaultCode::EfaErrors, FaultCode::EfaMissing]);
        let later = faults(&p.poll(start + Duration::from_secs(90)));
        assert_eq!(
            later,
            [FaultCode::EfaErrors],
            "the rise left the window at 62 s"
        );
        assert!(faults(&p.poll(start + Duration::from_secs(101))).is_empty());
    }
}
