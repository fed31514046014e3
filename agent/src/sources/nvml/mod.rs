//! The NVML source: polls GPU health through NVML (nvml-wrapper; no DCGM), for the faults
//! that never reach the kernel log or reach it late: a GPU missing, lost or needing a reset,
//! uncorrectable ECC, row remapping pending or failed, NVLink down or erroring, a PCIe link
//! trained narrow, hardware clock slowdown.
//!
//! Each poll sends the complete set of current findings ([`Observation::Poll`]); the core
//! clears what is no longer reported. No driver (the library will not load): the source is
//! off with the reason and retries quietly every minute (the driver may load after us).
//!
//! [`Observation::Poll`]: crate::model::Observation::Poll

mod checks;
pub mod events;
mod fabric;
pub mod gpm;
mod probe;
mod raw;
pub mod slow;
mod watchdog;

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use nvml_wrapper::Nvml;
use tokio::sync::mpsc;

pub use crate::host::instance_types::expected_gpus;
pub use checks::{evaluate, Finding, Rates, NVLINK_ERRORS_PER_MINUTE};
pub use probe::{read_all, GpuReading};

use crate::host;
use crate::model::{
    FaultReport, GpuIdentity, GpuTelemetry, MigActivity, Observation, SourceKind, SourceState,
};

/// How often a missing driver is looked for again.
const RETRY_INIT: Duration = Duration::from_secs(60);

/// What the source needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The NVML library.
    pub library: PathBuf,
    /// Poll period.
    pub poll_interval: Duration,
    /// `[nvml] expected_gpus` (0 = derive).
    pub expected_gpus: u32,
    /// sysfs root (GPUs on the bus, DMI instance type).
    pub sysfs_root: PathBuf,
    /// procfs root (when this boot started).
    pub procfs_root: PathBuf,
    /// From boot, how long NVLinks that have not come up yet are not judged (Fabric Manager
    /// trains them after the agent starts).
    pub nvlink_boot_grace: Duration,
    /// Where the NVLink baseline is kept across restarts (`<state_dir>/nvlink-baseline.json`),
    /// and this boot's id; `None`: in memory only.
    pub baseline: Option<(PathBuf, String)>,
    /// When a busy GPU is slow.
    pub slow: slow::Limits,
}

/// The NVLink baseline on disk: which links of which GPU (by UUID, else PCI address) were up,
/// in which boot. A file of an earlier version (kept by NVML index) does not parse and is
/// not used.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SavedBaseline {
    boot_id: String,
    links_up: checks::Baseline,
}

/// Load NVML from `library`.
pub fn load(library: &std::path::Path) -> Result<Nvml, String> {
    Nvml::builder()
        .lib_path(library.as_os_str())
        .init()
        .map_err(|e| format!("NVIDIA driver not available ({}): {e}", library.display()))
}

/// A poller that remembers counters and NVLink state between polls.
#[derive(Debug)]
pub struct Poller {
    settings: Settings,
    rates: Rates,
    last: Option<Instant>,
    grace_ends: SystemTime,
    failing: bool,
    /// The baseline as last saved.
    saved: checks::Baseline,
    /// Each GPU's streak of busy polls held back.
    slow: slow::Slow,
}

impl Poller {
    /// A poller for `settings`.
    pub fn new(settings: Settings) -> Self {
        // Unknown boot time: the grace counts from now.
        let boot = host::boot_time(&settings.procfs_root).unwrap_or_else(SystemTime::now);
        let mut rates = Rates::default();
        // A link up earlier in this boot, before an agent restart, is still part of the
        // baseline: going down now is fatal, not "never up".
        if let Some((path, boot_id)) = &settings.baseline {
            let saved = std::fs::read(path)
                .ok()
                .and_then(|b| serde_json::from_slice::<SavedBaseline>(&b).ok())
                .filter(|s| s.boot_id == *boot_id);
            if let Some(saved) = saved {
                tracing::info!(
                    gpus = saved.links_up.len(),
                    "NVLink baseline of this boot restored."
                );
                rates.restore_baseline(saved.links_up);
            }
        }
        Self {
            grace_ends: boot + settings.nvlink_boot_grace,
            saved: rates.baseline().clone(),
            settings,
            rates,
            last: None,
            failing: false,
            slow: slow::Slow::default(),
        }
    }

    /// Save the NVLink baseline when a link came up for the first time this boot.
    fn save_baseline(&mut self) {
        let Some((path, boot_id)) = &self.settings.baseline else {
            return;
        };
        if *self.rates.baseline() == self.saved {
            return;
        }
        let saved = SavedBaseline {
            boot_id: boot_id.clone(),
            links_up: self.rates.baseline().clone(),
        };
        match crate::fsutil::write_json(path, &saved, None) {
            Ok(()) => self.saved = saved.links_up,
            Err(e) => {
                tracing::warn!(error = %e, "Cannot keep the NVLink baseline; a restart forgets it.")
            }
        }
    }

    /// Read every GPU and turn the readings into one [`Observation::Poll`] (with the source
    /// back `On` first if the previous poll failed). A poll that cannot enumerate the GPUs
    /// is the source failing, not the GPUs missing: it sends only the source's `Failed`
    /// state, and the core keeps this source's faults as they were.
    pub fn poll(&mut self, nvml: &Nvml) -> Vec<Observation> {
        self.poll_with(nvml, None)
    }

    /// [`Poller::poll`], with GPM's activity over the interval since the last poll where
    /// `gpm` keeps the samples (the daemon's loop).
    pub fn poll_with(&mut self, nvml: &Nvml, gpm: Option<&mut gpm::Gpm<'_>>) -> Vec<Observation> {
        let mut readings = match read_all(nvml) {
            Ok(readings) => readings,
            Err(reason) => {
                if !self.failing {
                    tracing::warn!(%reason, "NVML cannot enumerate the GPUs; keeping the faults already known.");
                }
                self.failing = true;
                return vec![Observation::Source(
                    SourceKind::Nvml,
                    SourceState::Failed(format!(
                        "cannot enumerate GPUs ({reason}); faults kept as they were"
                    )),
                )];
            }
        };
        if let Some(gpm) = gpm {
            gpm.read(&mut readings);
        }
        let mut out = Vec::with_capacity(2);
        if std::mem::take(&mut self.failing) {
            tracing::info!("NVML enumerates the GPUs again.");
            out.push(Observation::Source(SourceKind::Nvml, SourceState::On));
        }
        let now = Instant::now();
        let elapsed = self.last.map_or(Duration::ZERO, |t| now.duration_since(t));
        self.last = Some(now);
        let on_bus: Vec<_> = host::nvidia_devices(&self.settings.sysfs_root)
            .gpus
            .into_iter()
            .map(|d| d.pci)
            .collect();
        let (expected, _) = expected_gpus(
            self.settings.expected_gpus,
            &self.settings.sysfs_root,
            on_bus.len(),
        );
        let at = SystemTime::now();
        let booting = at < self.grace_ends;
        let partial = checks::partially_read(&readings, &on_bus);
        let mut findings = evaluate(
            &readings,
            expected,
            &on_bus,
            &mut self.rates,
            elapsed,
            booting,
        );
        findings.extend(checks::judge_slow(
            &readings,
            &on_bus,
            &mut self.slow,
            &self.settings.slow,
        ));
        let faults = findings
            .into_iter()
            .map(|f| {
                FaultReport::seen(SourceKind::Nvml, at, f.component, f.code, f.class, f.detail)
            })
            .collect();
        self.save_baseline();
        out.push(Observation::Poll {
            source: SourceKind::Nvml,
            faults,
            partial,
            inventory: crate::model::Inventory::Gpus {
                gpus: readings.iter().map(identity).collect(),
                driver_version: nvml.sys_driver_version().ok(),
            },
        });
        out
    }
}

fn identity(r: &GpuReading) -> GpuIdentity {
    let remap = r.remap.as_ref().ok();
    let nvlink = r.nvlink.as_ref().ok();
    let pcie = r.pcie.as_ref().ok();
    GpuIdentity {
        pci: r.pci.as_ref().ok().copied(),
        nvml_index: r.nvml_index,
        uuid: r.uuid.clone().ok(),
        name: r.name.clone().ok(),
        serial: r.serial.clone().ok(),
        mig_uuids: r.migs.iter().map(|m| m.uuid.clone()).collect(),
        fabric: r.fabric.as_ref().ok().and_then(fabric::FabricInfo::view),
        telemetry: GpuTelemetry {
            ecc_uncorrected_volatile: r.ecc_volatile.clone().ok(),
            ecc_uncorrected_aggregate: r.ecc_aggregate.clone().ok(),
            remapped_rows_correctable: remap.map(|m| m.correctable),
            remapped_rows_uncorrectable: remap.map(|m| m.uncorrectable),
            nvlink_up: nvlink.map(|n| {
                u32::try_from(n.links.values().filter(|u| **u).count()).unwrap_or(u32::MAX)
            }),
            nvlink_total: nvlink.map(|n| u32::try_from(n.links.len()).unwrap_or(u32::MAX)),
            nvlink_replay_errors: nvlink.map(|n| n.replay),
            nvlink_recovery_errors: nvlink.map(|n| n.recovery),
            nvlink_crc_errors: nvlink.map(|n| n.crc),
            pcie_gen: pcie.map(|p| p.gen),
            pcie_gen_max: pcie.and_then(|p| p.max_gen),
            pcie_width: pcie.map(|p| p.width),
            pcie_width_max: pcie.map(|p| p.max_width),
            recovery_action: r.recovery_action.as_ref().ok().copied(),
            utilization_gpu: r.utilization.as_ref().ok().map(|u| u.0),
            utilization_memory: r.utilization.as_ref().ok().map(|u| u.1),
            sm_clock_mhz: r.sm_clock.as_ref().ok().map(|c| c.0),
            sm_clock_max_mhz: r.sm_clock.as_ref().ok().map(|c| c.1),
            power_limit_mw: r.power_limit.as_ref().ok().map(|p| p.0),
            power_limit_default_mw: r.power_limit.as_ref().ok().map(|p| p.1),
            pcie_replay_errors: r.pcie_replay.as_ref().ok().copied(),
            sm_active_percent: r.gpm.as_ref().ok().map(|g| g.sm_active),
            sm_occupancy_percent: r.gpm.as_ref().ok().map(|g| g.sm_occupancy),
            tensor_active_percent: r.gpm.as_ref().ok().map(|g| g.tensor_active),
            dram_bw_percent: r.gpm.as_ref().ok().map(|g| g.dram_bw),
            mig_activity: r
                .migs
                .iter()
                .map(|m| {
                    let gpm = m.gpm.as_ref().ok();
                    MigActivity {
                        uuid: m.uuid.clone(),
                        sm_active_percent: gpm.map(|g| g.sm_active),
                        sm_occupancy_percent: gpm.map(|g| g.sm_occupancy),
                        tensor_active_percent: gpm.map(|g| g.tensor_active),
                        dram_bw_percent: gpm.map(|g| g.dram_bw),
                    }
                })
                .collect(),
        },
    }
}

/// Start polling on its own thread (NVML calls block, sometimes for seconds on a sick GPU).
/// The thread ends when the core is gone.
pub fn spawn(
    settings: Settings,
    tx: mpsc::Sender<Observation>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("nvml".into())
        .spawn(move || run(settings, &tx))
}

fn run(settings: Settings, tx: &mpsc::Sender<Observation>) {
    let send = |o| tx.blocking_send(o).is_ok();
    let mut reported_off = false;
    let nvml = loop {
        match load(&settings.library) {
            Ok(nvml) => break nvml,
            Err(reason) => {
                if !reported_off {
                    tracing::info!(%reason, "NVML source is off; retrying every minute.");
                    reported_off = true;
                    if !send(Observation::Source(
                        SourceKind::Nvml,
                        SourceState::Off(reason),
                    )) {
                        return;
                    }
                }
                std::thread::sleep(RETRY_INIT);
                if tx.is_closed() {
                    return;
                }
            }
        }
    };
    tracing::info!(library = %settings.library.display(), interval = ?settings.poll_interval, "Polling NVML.");
    if !send(Observation::Source(SourceKind::Nvml, SourceState::On)) {
        return;
    }
    let nvml = std::sync::Arc::new(nvml);
    let branch = host::driver_branch(&settings.sysfs_root);
    if let Err(e) = events::spawn(
        std::sync::Arc::clone(&nvml),
        branch,
        settings.poll_interval,
        tx.clone(),
    ) {
        tracing::warn!(error = %e, "Cannot start the NVML events thread.");
    }
    let watch = std::sync::Arc::new(watchdog::Watch::default());
    if let Err(e) = watchdog::spawn(
        std::sync::Arc::clone(&watch),
        settings.poll_interval,
        tx.clone(),
    ) {
        tracing::warn!(error = %e, "Cannot start the NVML watchdog thread; a hung poll will not show.");
    }
    let mut poller = Poller::new(settings.clone());
    let mut gpm = gpm::Gpm::new(&nvml);
    loop {
        watch.start();
        let observations = poller.poll_with(&nvml, Some(&mut gpm));
        if watch.end() {
            tracing::info!("The NVML poll returned; the source is back on.");
            if !send(Observation::Source(SourceKind::Nvml, SourceState::On)) {
                return;
            }
        }
        for observation in observations {
            if !send(observation) {
                return;
            }
        }
        std::thread::sleep(settings.poll_interval);
        if tx.is_closed() {
            return;
        }
    }
}
