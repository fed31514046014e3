//! The scenario file: the devices the fake library reports.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use nvml_wrapper_sys::bindings::*;
use serde::Deserialize;

/// The whole host as NVML would see it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// `nvmlSystemGetDriverVersion`.
    #[serde(default = "driver_version")]
    pub driver_version: String,
    /// The GPUs, in NVML index order.
    #[serde(default, rename = "gpu")]
    pub gpus: Vec<Gpu>,
    /// While true, `nvmlDeviceGetCount` fails with `NVML_ERROR_UNKNOWN` (the driver could not
    /// enumerate: a call that fails once on a busy or recovering driver).
    #[serde(default)]
    pub count_fails: bool,
    /// Critical Xid events queued for `nvmlEventSetWait`, each delivered once (by position).
    #[serde(default, rename = "event")]
    pub events: Vec<Event>,
}

/// One critical Xid event.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// The GPU (NVML index among the visible ones).
    pub gpu: usize,
    /// The Xid.
    pub xid: u64,
}

fn driver_version() -> String {
    "570.133.20".into()
}

impl Scenario {
    /// GPUs NVML enumerates (a GPU marked `missing` is on the PCI bus but not in NVML).
    pub fn visible(&self) -> impl Iterator<Item = &Gpu> {
        self.gpus.iter().filter(|g| !g.missing)
    }
}

/// One GPU.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Gpu {
    /// PCI address, `dddd:bb:dd.f`.
    pub pci: String,
    pub uuid: String,
    pub name: String,
    pub serial: String,
    /// Not enumerated by NVML at all.
    pub missing: bool,
    /// Every call returns `NVML_ERROR_GPU_IS_LOST`.
    pub lost: bool,
    /// Every call returns `NVML_ERROR_RESET_REQUIRED`.
    pub reset_required: bool,
    /// API names that return `NVML_ERROR_NOT_SUPPORTED`: uuid, name, serial, pci_info,
    /// ecc_mode, total_ecc_errors, memory_error_counter, retired_pages_pending,
    /// remapped_rows, nvlink_state, nvlink_errors, pcie, pcie_replay, clock_events,
    /// utilization, clocks, power, mig, fabric.
    pub not_supported: Vec<String>,
    /// API names (as for `not_supported`) that fail with `NVML_ERROR_UNKNOWN`: a driver call
    /// failing on this GPU only.
    pub errors: Vec<String>,
    /// API names (as for `not_supported`) whose calls block until the scenario file no
    /// longer lists them: a driver hung on this GPU (seen after an Xid 79).
    pub hangs: Vec<String>,
    pub ecc: Ecc,
    pub remap: Remap,
    pub retired_pages_pending: bool,
    pub nvlink: Nvlink,
    pub pcie: Pcie,
    /// `nvmlClocksEventReasons` bit mask.
    pub clock_event_reasons: u64,
    /// `nvmlDeviceGetUtilizationRates`: percent of the last sample period a kernel ran
    /// (`gpu`) and the memory was read or written (`memory`).
    pub utilization: Utilization,
    /// The SM clock and its maximum (`clocks` in `not_supported` and friends).
    pub clocks: Clocks,
    /// The enforced and default power limits (`power`).
    pub power: Power,
    /// GPM (Hopper and later): the activity its metrics report between two samples, in
    /// percent. Absent: the GPU does not support GPM (`nvmlGpmQueryDeviceSupport` says
    /// so).
    pub gpm: Option<Gpm>,
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (field 230): the driver's required action (0
    /// none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset); absent: a driver
    /// older than R565 (the field is not supported).
    pub recovery_action: Option<u32>,
    /// UUIDs (`MIG-...`) of the MIG devices on this GPU; empty: MIG mode off.
    pub mig: Vec<String>,
    /// GPM figures of each MIG device's GPU instance (`nvmlGpmMigSampleGet`), in the order
    /// of `mig`; a MIG device without an entry: `NVML_ERROR_NOT_SUPPORTED`.
    pub mig_gpm: Vec<Gpm>,
    /// `nvmlDeviceGetGpuFabricInfoV`: the GPU's NVLink fabric registration (GB200/GB300
    /// NVL72 and HGX systems). Absent: the call is not supported (a PCIe GPU, an older
    /// driver).
    pub fabric: Option<Fabric>,
}

/// A GPU's NVLink fabric registration, as `nvmlGpuFabricInfo_v3_t` carries it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Fabric {
    /// `not-supported`, `not-started`, `in-progress` or `completed`.
    pub state: String,
    /// The registration's own result (an `nvmlReturn_t`; 0 success), valid once completed.
    pub status: u32,
    /// The clique (NVLink partition) the GPU belongs to.
    pub clique_id: u32,
    /// The fabric cluster's UUID, as `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub cluster_uuid: String,
    /// `NVML_GPU_FABRIC_HEALTH_MASK_*` bits.
    pub health_mask: u32,
    /// `NVML_GPU_FABRIC_HEALTH_SUMMARY_*`: 0 not supported, 1 healthy, 2 unhealthy, 3
    /// limited capacity (v3 only).
    pub health_summary: u8,
    /// The newest struct version this driver knows (2 or 3): a newer one is refused with
    /// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`, as by a driver older than the header.
    pub max_version: u32,
}

impl Default for Fabric {
    fn default() -> Self {
        Self {
            state: "completed".into(),
            status: 0,
            clique_id: 0,
            cluster_uuid: "00000000-0000-0000-0000-000000000000".into(),
            health_mask: 0,
            health_summary: 0,
            max_version: 3,
        }
    }
}

impl Gpu {
    /// (domain, bus, device) of `pci`.
    pub fn bdf(&self) -> (u32, u32, u32) {
        let mut parts = self.pci.split([':', '.']);
        let mut next = || {
            parts
                .next()
                .and_then(|p| u32::from_str_radix(p, 16).ok())
                .unwrap_or(0)
        };
        (next(), next(), next())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Ecc {
    pub enabled: bool,
    pub volatile_uncorrected: u64,
    pub aggregate_uncorrected: u64,
    pub volatile_corrected: u64,
    pub aggregate_corrected: u64,
    pub volatile_uncorrected_dram: u64,
    pub volatile_uncorrected_sram: u64,
    pub aggregate_uncorrected_dram: u64,
    pub aggregate_uncorrected_sram: u64,
}

impl Default for Ecc {
    fn default() -> Self {
        Self {
            enabled: true,
            volatile_uncorrected: 0,
            aggregate_uncorrected: 0,
            volatile_corrected: 0,
            aggregate_corrected: 0,
            volatile_uncorrected_dram: 0,
            volatile_uncorrected_sram: 0,
            aggregate_uncorrected_dram: 0,
            aggregate_uncorrected_sram: 0,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Remap {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Nvlink {
    /// One entry per link the GPU has: up or down.
    pub up: Vec<bool>,
    pub replay: u64,
    pub recovery: u64,
    pub crc: u64,
}

/// The GPM metrics a GPU reports between two samples, percent.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Gpm {
    /// `NVML_GPM_METRIC_SM_UTIL`.
    pub sm: f64,
    /// `NVML_GPM_METRIC_SM_OCCUPANCY`.
    pub occupancy: f64,
    /// `NVML_GPM_METRIC_ANY_TENSOR_UTIL`.
    pub tensor: f64,
    /// `NVML_GPM_METRIC_DRAM_BW_UTIL`.
    pub dram_bw: f64,
}

/// `nvmlUtilization_t`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Utilization {
    pub gpu: u32,
    pub memory: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Pcie {
    pub gen: u32,
    pub width: u32,
    /// The GPU's own highest generation.
    pub max_gen: u32,
    /// The bus's highest generation, where it is lower than the GPU's (a Gen6 GPU in a Gen5
    /// slot): `nvmlDeviceGetMaxPcieLinkGeneration` answers the lower of the two.
    pub bus_max_gen: Option<u32>,
    /// The widest the GPU and its slot allow together (`nvmlDeviceGetMaxPcieLinkWidth`).
    pub max_width: u32,
    /// `nvmlDeviceGetPcieReplayCounter`: link-level retransmissions since the driver loaded.
    pub replay: u32,
}

impl Default for Pcie {
    fn default() -> Self {
        Self {
            gen: 5,
            width: 16,
            max_gen: 5,
            bus_max_gen: None,
            max_width: 16,
            replay: 0,
        }
    }
}

/// The SM clock, MHz: `nvmlDeviceGetClockInfo` and `nvmlDeviceGetMaxClockInfo` for
/// `NVML_CLOCK_SM` (an H100 SXM's maximum by default).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Clocks {
    pub sm: u32,
    pub sm_max: u32,
}

impl Default for Clocks {
    fn default() -> Self {
        Self {
            sm: 1980,
            sm_max: 1980,
        }
    }
}

/// Power limits, mW: `nvmlDeviceGetEnforcedPowerLimit` and
/// `nvmlDeviceGetPowerManagementDefaultLimit` (an H100 SXM's 700 W by default).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Power {
    pub limit_mw: u32,
    pub default_limit_mw: u32,
}

impl Default for Power {
    fn default() -> Self {
        Self {
            limit_mw: 700_000,
            default_limit_mw: 700_000,
        }
    }
}

struct State {
    initialized: u32,
    loaded: Option<(PathBuf, Option<SystemTime>, Arc<Scenario>)>,
}

static STATE: Mutex<State> = Mutex::new(State {
    initialized: 0,
    loaded: None,
});

fn load() -> Option<(PathBuf, Option<SystemTime>, Arc<Scenario>)> {
    let path = PathBuf::from(std::env::var_os("FAKE_NVML_SCENARIO")?);
    let mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
    let text = std::fs::read_to_string(&path).ok()?;
    match toml::from_str(&text) {
        Ok(scenario) => Some((path, mtime, Arc::new(scenario))),
        Err(e) => {
            eprintln!("fake-nvml: {}: {e}", path.display());
            None
        }
    }
}

pub(crate) fn init() -> nvmlReturn_t {
    let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if state.loaded.is_none() {
        state.loaded = load();
    }
    if state.loaded.is_none() {
        return nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
    }
    state.initialized += 1;
    nvmlReturn_enum_NVML_SUCCESS
}

pub(crate) fn shutdown() -> nvmlReturn_t {
    let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if state.initialized == 0 {
        return nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
    }
    state.initialized -= 1;
    nvmlReturn_enum_NVML_SUCCESS
}

/// The scenario as last loaded; `None` before `nvmlInit`.
pub(crate) fn current() -> Option<Arc<Scenario>> {
    let state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if state.initialized == 0 {
        return None;
    }
    state.loaded.as_ref().map(|(_, _, s)| Arc::clone(s))
}

/// Re-read the scenario if its file changed (called where a poll starts: the device count),
/// then return it.
pub(crate) fn refreshed() -> Option<Arc<Scenario>> {
    {
        let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
        if state.initialized == 0 {
            return None;
        }
        if let Some((path, mtime, _)) = &state.loaded {
            let now = std::fs::metadata(path).and_then(|m| m.modified()).ok();
            if now != *mtime {
                if let Some(fresh) = load() {
                    state.loaded = Some(fresh);
                }
            }
        }
    }
    current()
}

/// Block until the scenario file's directory changes or `timeout` passes: in the kernel
/// (inotify), as the real library's event wait blocks, so the fake's own cost stays out of
/// the agent's measured idle CPU. Without inotify, a tenth of a second at most.
pub(crate) fn wait_for_change(timeout: std::time::Duration) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    static WATCH: std::sync::OnceLock<Option<rustix::fd::OwnedFd>> = std::sync::OnceLock::new();
    let watch = WATCH.get_or_init(|| {
        use rustix::fs::inotify;
        let path = PathBuf::from(std::env::var_os("FAKE_NVML_SCENARIO")?);
        let dir = path.parent()?;
        let fd =
            inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).ok()?;
        let changes = inotify::WatchFlags::MOVED_TO
            | inotify::WatchFlags::CLOSE_WRITE
            | inotify::WatchFlags::MODIFY
            | inotify::WatchFlags::CREATE;
        inotify::add_watch(&fd, dir, changes).ok()?;
        Some(fd)
    });
    let Some(fd) = watch else {
        std::thread::sleep(timeout.min(std::time::Duration::from_millis(100)));
        return;
    };
    let timeout = Timespec::try_from(timeout).unwrap_or(Timespec {
        tv_sec: 1,
        tv_nsec: 0,
    });
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let _ = poll(&mut fds, Some(&timeout));
    // Drain what woke us, if anything (the caller looks at the file itself), after every
    // wait (a read of an empty queue returns at once): the code runs from the
    // first wait on, like the rest of the library's steady state, and not first on a fault
    // path the agent's tests time page by page.
    let mut buf = [0u8; 4096];
    while rustix::io::read(fd, &mut buf).is_ok_and(|n| n > 0) {}
}
