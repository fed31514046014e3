//! The EFA source: the Elastic Fabric Adapters that tie this node to the rest of the job.
//! Every poll reads each device's sysfs (`sysfs.rs`): how many there are against what this
//! launch has, the link of its network interface, and its counters, turned into rates over
//! a window (`rates.rs`) and judged (`checks.rs`). Each poll sends that poll's findings
//! ([`Observation::Poll`]) with the devices for `status` and metrics; the core confirms a
//! fatal one and clears a fault a whole window after its last sighting
//! (`core/health/condition.rs`).
//!
//! How many devices there should be: `[efa] expected_devices` where set, else this
//! instance's EFA interfaces as the EC2 API lists them (network interfaces of type `efa` or
//! `efa-only`: what this launch attached; learned by `sources/ec2.rs`), else as many as this
//! boot had once the start-up grace ended (raised when more appear; kept across agent
//! restarts in the state directory), where only a decrease is a fault. A launch template
//! may attach fewer EFA interfaces than the instance type allows: the type's maximum alone
//! condemns nothing. No EFA device on this host: the source is off with the reason, and
//! looks again every poll (devices may initialise late).
//!
//! [`Observation::Poll`]: crate::model::Observation::Poll

pub mod checks;
mod rates;
pub mod sysfs;

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;

pub use checks::Thresholds;

use crate::model::{EfaDevice, FaultReport, Inventory, Observation, SourceKind, SourceState};
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
    /// The window rates are taken over.
    pub window: Duration,
    /// From boot, how long missing devices are not judged (late initialisation).
    pub startup_grace: Duration,
    /// `[efa] expected_devices` (0: as many as this boot had once the grace ended).
    pub expected_devices: u32,
    /// Rate limits.
    pub thresholds: Thresholds,
    /// Where this boot's device count is kept across restarts
    /// (`<state_dir>/efa-baseline.json`), and this boot's id; `None`: in memory only.
    pub baseline: Option<(PathBuf, String)>,
    /// This instance's EFA interfaces as EC2 lists them, once known (`None` off EC2 or
    /// until learned).
    pub launch: Option<tokio::sync::watch::Receiver<Option<u32>>>,
}

/// The device count on disk: how many EFA devices this boot had once the grace ended.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SavedBaseline {
    boot_id: String,
    devices: u32,
}

/// A poller that remembers counters and recent findings between polls.
#[derive(Debug)]
pub struct Poller {
    settings: Settings,
    devices: sysfs::Devices,
    rates: rates::Rates,
    grace_ends: SystemTime,
    /// How many devices this boot had once the grace ended (the most seen since).
    baseline: Option<u32>,
    /// The source's state as last reported.
    state: Option<SourceState>,
}

impl Poller {
    /// A poller for `settings`.
    pub fn new(settings: Settings) -> Self {
        let boot = crate::host::boot_time(&settings.procfs_root).unwrap_or_else(SystemTime::now);
        let baseline = settings.baseline.as_ref().and_then(|(path, boot_id)| {
            std::fs::read(path)
                .ok()
                .and_then(|b| serde_json::from_slice::<SavedBaseline>(&b).ok())
                .filter(|s| s.boot_id == *boot_id)
                .map(|s| s.devices)
        });
        if let Some(devices) = baseline {
            tracing::info!(devices, "EFA device count of this boot restored.");
        }
        Self {
            devices: sysfs::Devices::new(&settings.sysfs_root),
            rates: rates::Rates::new(settings.window),
            grace_ends: boot + settings.startup_grace,
            baseline,
            state: None,
            settings,
        }
    }

    /// How many devices there should be, and from where; the baseline is taken (or raised)
    /// from `have` once `settled`.
    fn expected(&mut self, have: u32, settled: bool) -> Option<(u32, String)> {
        if self.settings.expected_devices > 0 {
            return Some((
                self.settings.expected_devices,
                "[efa] expected_devices".into(),
            ));
        }
        let launched = self
            .settings
            .launch
            .as_ref()
            .and_then(|l| *l.borrow())
            .filter(|n| *n > 0);
        if let Some(n) = launched {
            return Some((n, "this instance's EFA interfaces (EC2 API)".into()));
        }
        if settled && self.baseline.is_none_or(|b| have > b) {
            if self.baseline.is_none() {
                let allowed = crate::host::instance_types::efa_maximum(&self.settings.sysfs_root);
                tracing::info!(devices = have, type_allows = ?allowed, "EFA devices of this launch counted: fewer from now on is a fault.");
            }
            self.baseline = Some(have);
            self.save_baseline(have);
        }
        self.baseline.map(|b| {
            (
                b,
                "as many as this boot had after the start-up grace".into(),
            )
        })
    }

    fn save_baseline(&self, devices: u32) {
        let Some((path, boot_id)) = &self.settings.baseline else {
            return;
        };
        let saved = SavedBaseline {
            boot_id: boot_id.clone(),
            devices,
        };
        if let Err(e) = crate::fsutil::write_json(path, &saved, None) {
            tracing::warn!(error = %e, "Cannot keep the EFA device count; a restart counts again.");
        }
    }

    /// Read every device and turn what was read into observations: the source's state when
    /// it changed, then one [`Observation::Poll`] (none while the host has no EFA device).
    pub fn poll(&mut self, now: Instant) -> Vec<Observation> {
        let root = &self.settings.sysfs_root;
        let found = self.devices.read();
        let mut out = Vec::new();
        let state = if found.is_empty() && self.baseline.is_none_or(|b| b == 0) {
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
        let mut devices = Vec::with_capacity(found.len());
        for d in found {
            // A counter with no rate yet (its first reading) is left out: unknown, which
            // the checks take as no rise and the traffic judgement as not quiet.
            let rates = d
                .counters
                .iter()
                .filter_map(|(counter, value)| {
                    let rate = self.rates.observe(&d.name, counter, *value, now)?;
                    Some(((*counter).to_string(), rate))
                })
                .collect();
            devices.push(EfaDevice {
                name: d.name,
                pci: d.pci,
                numa_node: d.numa_node,
                netdevs: d.netdevs,
                link_up: d.link_up,
                gpus: d.gpus,
                rates,
                holders: Vec::new(),
            });
        }
        let settled = SystemTime::now() >= self.grace_ends;
        let have = u32::try_from(devices.len()).unwrap_or(u32::MAX);
        let expected = self.expected(have, settled);
        let findings = checks::evaluate(
            &devices,
            expected.as_ref(),
            settled,
            &self.settings.thresholds,
        );
        out.push(observation(findings, devices, SystemTime::now()));
        out
    }
}

/// One poll's findings and devices, as the core takes them.
fn observation(
    findings: Vec<checks::Finding>,
    devices: Vec<EfaDevice>,
    at: SystemTime,
) -> Observation {
    let faults = findings
        .into_iter()
        .map(|f| FaultReport::seen(SourceKind::Efa, at, f.component, f.code, f.class, f.detail))
        .collect();
    Observation::Poll {
        source: SourceKind::Efa,
        faults,
        partial: Vec::new(),
        inventory: Inventory::Efa(devices),
    }
}

/// For the rehearsal of the fault paths (`commands/rehearse.rs`): a made-up device at
/// `pci`, serving `gpus`, whose link is down and whose error counters rise past the fatal rate, judged as a
/// poll judges it (one device fewer than expected, too) into the poll's observation, sent
/// nowhere (`host::resident` locks what this maps).
pub fn rehearse(
    pci: crate::model::PciAddress,
    gpus: Vec<crate::model::PciAddress>,
    thresholds: &Thresholds,
) -> Observation {
    // Each counter one past its limit: the local errors the fatal one, the remote errors the
    // warning one, retransmissions theirs, and any admin command without a completion.
    let past = |limit: f64| limit + 1.0;
    let rates = checks::ERROR_COUNTERS
        .iter()
        .map(|c| (*c, past(thresholds.errors_fatal)))
        .chain(
            checks::REMOTE_COUNTERS
                .iter()
                .map(|c| (*c, past(thresholds.errors_warning))),
        )
        .chain([
            (checks::RETRANS, past(thresholds.retrans_warning)),
            (checks::NO_COMPLETION, past(0.0)),
        ])
        .map(|(c, rate)| (c.to_string(), rate))
        .collect();
    let device = EfaDevice {
        name: "rdmap0s0".to_string(),
        pci: Some(pci),
        numa_node: Some(0),
        netdevs: vec!["rehearsal0".to_string()],
        link_up: Some(false),
        gpus,
        rates,
        holders: Vec::new(),
    };
    let expected = (2, "rehearsal".to_string());
    let findings = checks::evaluate(
        std::slice::from_ref(&device),
        Some(&expected),
        true,
        thresholds,
    );
    observation(findings, vec![device], SystemTime::now())
}

/// Poll until shutdown; each poll's sysfs reads run on the blocking pool.
pub async fn run(settings: Settings, tx: mpsc::Sender<Observation>, mut shutdown: Shutdown) {
    let mut tick = crate::tick::Ticker::new(settings.poll_interval);
    let mut poller = Poller::new(settings);
    loop {
        tokio::select! {
            () = tick.tick() => {}
            () = shutdown.wait() => return,
        }
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::FaultCode;
    use std::path::Path;

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
            baseline: None,
            launch: None,
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
    fn the_rehearsal_judges_every_fatal_kind_on_its_made_up_device() {
        let pci: crate::model::PciAddress = "0000:fe:00.0".parse().expect("pci");
        let observation = rehearse(pci, Vec::new(), &settings(Path::new("/")).thresholds);
        let Observation::Poll {
            faults,
            inventory: Inventory::Efa(devices),
            ..
        } = &observation
        else {
            panic!("not an EFA poll: {observation:?}");
        };
        let mut fatal: Vec<FaultCode> = faults
            .iter()
            .filter(|f| f.class.severity == crate::model::Severity::Fatal)
            .map(|f| f.code)
            .collect();
        fatal.sort();
        let mut want = vec![
            FaultCode::EfaMissing,
            FaultCode::EfaLinkDown,
            FaultCode::EfaAdminErrors,
            FaultCode::EfaErrors,
        ];
        want.sort();
        assert_eq!(fatal, want);
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].pci, Some(pci));
    }

    #[test]
    fn off_without_devices_then_each_poll_reports_what_it_sees() {
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
            .join("class/infiniband/rdmap0s0/ports/1/hw_counters/rdma_write_wr_err");
        let second = p.poll(start + Duration::from_secs(1));
        assert!(matches!(
            second[0],
            Observation::Source(SourceKind::Efa, SourceState::On)
        ));
        assert_eq!(faults(&second), [FaultCode::EfaMissing], "1 of 2");
        sysfs::fake::device(root.path(), "rdmap1s0", "0000:11:00.0", 0).expect("device");
        std::fs::write(&counter, "700\n").expect("counter");
        let burst = faults(&p.poll(start + Duration::from_secs(2)));
        assert_eq!(burst, [FaultCode::EfaErrors]);
        // The rise stays in the window's rate until it leaves it; how long the fault
        // outlives it is the core's rule, not the source's.
        let later = faults(&p.poll(start + Duration::from_secs(40)));
        assert_eq!(later, [FaultCode::EfaErrors]);
        assert!(faults(&p.poll(start + Duration::from_secs(90))).is_empty());
    }

    #[test]
    fn a_counter_has_no_rate_until_its_second_reading() {
        let root = tempfile::tempdir().expect("tempdir");
        let mut p = Poller::new(settings(root.path()));
        sysfs::fake::device(root.path(), "rdmap0s0", "0000:10:00.0", 0).expect("device");
        let rates = |observations: &[Observation]| -> Vec<String> {
            observations
                .iter()
                .find_map(|o| match o {
                    Observation::Poll {
                        inventory: Inventory::Efa(devices),
                        ..
                    } => Some(devices[0].rates.keys().cloned().collect()),
                    _ => None,
                })
                .expect("a poll")
        };
        let start = Instant::now();
        // Unknown, not zero: no pod looks as if its devices moved no bytes.
        assert_eq!(rates(&p.poll(start)), Vec::<String>::new());
        let second = rates(&p.poll(start + Duration::from_secs(1)));
        assert!(second.iter().any(|c| c == "tx_bytes"), "{second:?}");
    }

    #[test]
    fn without_a_configured_count_only_fewer_than_this_boot_had_is_a_fault() {
        let root = tempfile::tempdir().expect("tempdir");
        let saved = root.path().join("efa-baseline.json");
        let settings = Settings {
            expected_devices: 0,
            baseline: Some((saved.clone(), "boot-1".into())),
            ..settings(root.path())
        };
        // A p5 launched with 2 EFA interfaces of the 32 its type allows: healthy.
        let dmi = root.path().join("class/dmi/id");
        std::fs::create_dir_all(&dmi).expect("dmi");
        std::fs::write(dmi.join("product_name"), "p5.48xlarge\n").expect("type");
        for (i, pci) in ["0000:10:00.0", "0000:11:00.0"].iter().enumerate() {
            sysfs::fake::device(root.path(), &format!("rdmap{i}s0"), pci, 0).expect("device");
        }
        let start = Instant::now();
        let mut p = Poller::new(settings.clone());
        assert!(faults(&p.poll(start)).is_empty(), "2 of the type's 32");
        // One goes: a fault, also after a restart of the agent in the same boot.
        std::fs::remove_dir_all(root.path().join("class/infiniband/rdmap1s0")).expect("rm");
        let found = p.poll(start + Duration::from_secs(1));
        assert_eq!(faults(&found), [FaultCode::EfaMissing]);
        let mut again = Poller::new(settings.clone());
        assert_eq!(faults(&again.poll(start)), [FaultCode::EfaMissing]);
        // Another boot counts afresh.
        let mut next_boot = Poller::new(Settings {
            baseline: Some((saved, "boot-2".into())),
            ..settings
        });
        assert!(faults(&next_boot.poll(start)).is_empty());
    }
}
