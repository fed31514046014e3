//! A fake NVML library for tests on machines without a GPU.
//!
//! Built as a `cdylib` (`libfake_nvml.so`), it exports the NVML C functions gpu-agent calls,
//! with the real signatures (types from `nvml-wrapper-sys`), and answers from a scenario file
//! named by `FAKE_NVML_SCENARIO`. The file is re-read, when it changed, at the start of each
//! poll (`nvmlDeviceGetCount_v2`), so a test can turn
//! a fault on and off while the agent polls. Return codes behave like the real library's:
//! `NVML_ERROR_GPU_IS_LOST` from every call on a lost GPU, `NVML_ERROR_NOT_SUPPORTED` for an
//! API the scenario marks unsupported, `NVML_ERROR_INVALID_ARGUMENT` for a link that does not
//! exist, `NVML_ERROR_UNINITIALIZED` before `nvmlInit`.
#![allow(
    unsafe_code,
    missing_docs,
    clippy::missing_safety_doc,
    nonstandard_style
)]

mod scenario;

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::*;

pub use scenario::{Fabric, Gpu, Scenario};

const OK: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;
const INVALID: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const LOST: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
const RESET_REQUIRED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED;
const UNINITIALIZED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
const INSUFFICIENT: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const UNKNOWN: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_UNKNOWN;
const NOT_FOUND: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;

/// MIG device handles: this bit, the parent's handle shifted by 8, the MIG index.
const MIG_HANDLE: usize = 1 << 24;
/// Instances an H100/H200 can be split into (what `nvmlDeviceGetMaxMigDeviceCount` says).
const MAX_MIG_DEVICES: c_uint = 7;

/// The GPU instance id of MIG device `index` (`nvmlDeviceGetGpuInstanceId`): not its index,
/// as on a real GPU, where instance ids follow the placement of the profile.
const fn gpu_instance_id(index: usize) -> c_uint {
    3 + 2 * index as c_uint
}

/// `(parent handle, MIG index)` of a MIG device handle.
fn mig_handle(device: nvmlDevice_t) -> Option<(nvmlDevice_t, usize)> {
    let raw = device as usize;
    (raw & MIG_HANDLE != 0).then_some((((raw & !MIG_HANDLE) >> 8) as nvmlDevice_t, raw & 0xff))
}

/// Run `f` on GPU `device` for API `api`, translating the scenario's failure modes.
fn with_gpu(device: nvmlDevice_t, api: &str, f: impl FnOnce(&Gpu) -> nvmlReturn_t) -> nvmlReturn_t {
    let index = (device as usize).wrapping_sub(1);
    let mut scenario = scenario::current();
    // A hung call returns only once the test takes the hang out of the scenario.
    while scenario
        .as_ref()
        .and_then(|s| s.visible().nth(index))
        .is_some_and(|g| g.hangs.iter().any(|a| a == api))
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
        scenario = scenario::refreshed();
    }
    let Some(scenario) = scenario else {
        return UNINITIALIZED;
    };
    let Some(gpu) = scenario.visible().nth(index) else {
        return INVALID;
    };
    if gpu.lost {
        return LOST;
    }
    if gpu.reset_required {
        return RESET_REQUIRED;
    }
    if gpu.not_supported.iter().any(|a| a == api) {
        return NOT_SUPPORTED;
    }
    if gpu.errors.iter().any(|a| a == api) {
        return UNKNOWN;
    }
    f(gpu)
}

unsafe fn write_str(dst: *mut c_char, len: c_uint, text: &str) -> nvmlReturn_t {
    if dst.is_null() {
        return INVALID;
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > len as usize {
        return INSUFFICIENT;
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), dst, bytes.len());
    *dst.add(bytes.len()) = 0;
    OK
}

unsafe fn put<T>(dst: *mut T, value: T) -> nvmlReturn_t {
    if dst.is_null() {
        return INVALID;
    }
    *dst = value;
    OK
}

fn enabled(on: bool) -> nvmlEnableState_t {
    if on {
        nvmlEnableState_enum_NVML_FEATURE_ENABLED
    } else {
        nvmlEnableState_enum_NVML_FEATURE_DISABLED
    }
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    scenario::init()
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    scenario::init()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    scenario::shutdown()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    match scenario::current() {
        Some(s) => write_str(version, len, &s.driver_version),
        None => UNINITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    match scenario::refreshed() {
        Some(s) if s.count_fails => UNKNOWN,
        Some(s) => put(count, s.visible().count() as c_uint),
        None => UNINITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let Some(s) = scenario::current() else {
        return UNINITIALIZED;
    };
    let lost = s.visible().nth(index as usize).map(|g| g.lost);
    match lost {
        Some(true) => LOST,
        Some(false) => put(device, (index as usize + 1) as nvmlDevice_t),
        None => INVALID,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    if let Some((parent, mig)) = mig_handle(device) {
        return with_gpu(parent, "uuid", |g| match g.mig.get(mig) {
            Some(id) => write_str(uuid, len, id),
            None => INVALID,
        });
    }
    with_gpu(device, "uuid", |g| write_str(uuid, len, &g.uuid))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "mig", |g| {
        let mode = c_uint::from(!g.mig.is_empty());
        match put(current, mode) {
            OK => put(pending, mode),
            err => err,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "mig", |g| {
        put(count, if g.mig.is_empty() { 0 } else { MAX_MIG_DEVICES })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_gpu(device, "mig", |g| {
        if g.mig.is_empty() {
            return INVALID;
        }
        if index as usize >= g.mig.len() {
            // A free slot: no MIG device there (the real library's answer).
            return NOT_FOUND;
        }
        put(
            mig,
            (MIG_HANDLE | ((device as usize) << 8) | index as usize) as nvmlDevice_t,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    let Some((parent, mig)) = mig_handle(device) else {
        // The real library's answer for a handle that is not a MIG device's.
        return with_gpu(device, "mig", |_| NOT_SUPPORTED);
    };
    with_gpu(parent, "mig", |g| {
        if mig < g.mig.len() {
            put(id, gpu_instance_id(mig))
        } else {
            INVALID
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "name", |g| write_str(name, len, &g.name))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: nvmlDevice_t,
    serial: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "serial", |g| write_str(serial, len, &g.serial))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    with_gpu(device, "pci_info", |g| {
        if pci.is_null() {
            return INVALID;
        }
        let (domain, bus, dev) = g.bdf();
        let mut info: nvmlPciInfo_t = std::mem::zeroed();
        info.domain = domain;
        info.bus = bus;
        info.device = dev;
        info.pciDeviceId = 0x2330_10de;
        let legacy = format!("{:04X}:{bus:02X}:{dev:02X}.0", domain & 0xffff);
        let full = format!("{domain:08X}:{bus:02X}:{dev:02X}.0");
        write_str(info.busIdLegacy.as_mut_ptr(), 16, &legacy);
        write_str(info.busId.as_mut_ptr(), 32, &full);
        *pci = info;
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: nvmlDevice_t,
    current: *mut nvmlEnableState_t,
    pending: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    with_gpu(device, "ecc_mode", |g| {
        let r = put(current, enabled(g.ecc.enabled));
        if r != OK {
            return r;
        }
        put(pending, enabled(g.ecc.enabled))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_gpu(device, "total_ecc_errors", |g| {
        let volatile = counter == nvmlEccCounterType_enum_NVML_VOLATILE_ECC;
        let value = match (
            error_type == nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            volatile,
        ) {
            (true, true) => g.ecc.volatile_uncorrected,
            (true, false) => g.ecc.aggregate_uncorrected,
            (false, true) => g.ecc.volatile_corrected,
            (false, false) => g.ecc.aggregate_corrected,
        };
        put(count, value)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(
    device: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
    location: nvmlMemoryLocation_t,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_gpu(device, "memory_error_counter", |g| {
        if error_type != nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED {
            return put(count, 0);
        }
        let volatile = counter == nvmlEccCounterType_enum_NVML_VOLATILE_ECC;
        let (dram, sram) = if volatile {
            (
                g.ecc.volatile_uncorrected_dram,
                g.ecc.volatile_uncorrected_sram,
            )
        } else {
            (
                g.ecc.aggregate_uncorrected_dram,
                g.ecc.aggregate_uncorrected_sram,
            )
        };
        match location {
            nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_DRAM => put(count, dram),
            nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_SRAM => put(count, sram),
            _ => NOT_SUPPORTED,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: nvmlDevice_t,
    pending: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    with_gpu(device, "retired_pages_pending", |g| {
        put(pending, enabled(g.retired_pages_pending))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failure: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "remapped_rows", |g| {
        let r = &g.remap;
        for (dst, value) in [
            (corr, r.correctable),
            (unc, r.uncorrectable),
            (pending, u32::from(r.pending)),
            (failure, u32::from(r.failure)),
        ] {
            if put(dst, value) != OK {
                return INVALID;
            }
        }
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    with_gpu(device, "nvlink_state", |g| {
        match g.nvlink.up.get(link as usize) {
            Some(up) => put(active, enabled(*up)),
            None if link < NVML_NVLINK_MAX_LINKS => NOT_SUPPORTED,
            None => INVALID,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    device: nvmlDevice_t,
    link: c_uint,
    counter: nvmlNvLinkErrorCounter_t,
    value: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_gpu(device, "nvlink_errors", |g| {
        if link as usize >= g.nvlink.up.len() {
            return NOT_SUPPORTED;
        }
        // Per-link counters: the scenario gives totals on link 0.
        let on_link = |v: u64| if link == 0 { v } else { 0 };
        let v = match counter {
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_REPLAY => on_link(g.nvlink.replay),
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_RECOVERY => on_link(g.nvlink.recovery),
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_FLIT => on_link(g.nvlink.crc),
            _ => 0,
        };
        put(value, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    device: nvmlDevice_t,
    gen: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "pcie", |g| put(gen, g.pcie.gen))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    device: nvmlDevice_t,
    width: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "pcie", |g| put(width, g.pcie.width))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    device: nvmlDevice_t,
    gen: *mut c_uint,
) -> nvmlReturn_t {
    // As the real library: the highest the GPU and its bus reach together.
    with_gpu(device, "pcie", |g| {
        put(
            gen,
            g.pcie.max_gen.min(g.pcie.bus_max_gen.unwrap_or(u32::MAX)),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    device: nvmlDevice_t,
    width: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "pcie", |g| put(width, g.pcie.max_width))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_gpu(device, "clock_events", |g| {
        put(reasons, g.clock_event_reasons)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nvmlDevice_t,
    support: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    if support.is_null() {
        return INVALID;
    }
    with_gpu(device, "gpm", |g| {
        (*support).isSupportedDevice = c_uint::from(g.gpm.is_some());
        OK
    })
}

/// A GPM sample: the GPU it was taken on (its index among the visible ones) and, for a
/// MIG sample, the MIG device's index on it, once taken.
struct GpmSample {
    device: Option<(usize, Option<usize>)>,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    put(
        sample,
        Box::into_raw(Box::new(GpmSample { device: None })).cast(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    if sample.is_null() {
        return INVALID;
    }
    drop(Box::from_raw(sample.cast::<GpmSample>()));
    OK
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleGet(
    device: nvmlDevice_t,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    take_sample(device, None, sample)
}

/// A sample of one GPU instance of a GPU in MIG mode, by the instance's id.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: nvmlDevice_t,
    gpu_instance: c_uint,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    take_sample(device, Some(gpu_instance), sample)
}

/// Mark `sample` as taken on `device` (with `gpu_instance`: on that GPU instance of it).
unsafe fn take_sample(
    device: nvmlDevice_t,
    gpu_instance: Option<c_uint>,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    if sample.is_null() {
        return INVALID;
    }
    with_gpu(device, "gpm", |g| {
        if g.gpm.is_none() {
            return NOT_SUPPORTED;
        }
        let mig = match gpu_instance {
            None => None,
            Some(id) => match (0..g.mig.len()).find(|i| gpu_instance_id(*i) == id) {
                None => return INVALID,
                Some(mig) if mig >= g.mig_gpm.len() => return NOT_SUPPORTED,
                Some(mig) => Some(mig),
            },
        };
        (*sample.cast::<GpmSample>()).device = Some(((device as usize).wrapping_sub(1), mig));
        OK
    })
}

/// The metrics between two samples of one GPU: its scenario's GPM figures.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    if request.is_null() {
        return INVALID;
    }
    let request = &mut *request;
    let (Some(first), Some(second)) = (
        request.sample1.cast::<GpmSample>().as_ref(),
        request.sample2.cast::<GpmSample>().as_ref(),
    ) else {
        return INVALID;
    };
    let (Some(device), true) = (first.device, first.device == second.device) else {
        return INVALID;
    };
    let (device, mig) = device;
    with_gpu((device + 1) as nvmlDevice_t, "gpm", |g| {
        let gpm = match mig {
            Some(mig) => g.mig_gpm.get(mig).copied(),
            None => g.gpm,
        };
        let Some(gpm) = gpm else {
            return NOT_SUPPORTED;
        };
        let count = (request.numMetrics as usize).min(request.metrics.len());
        for metric in &mut request.metrics[..count] {
            let value = match metric.metricId {
                nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => Some(gpm.sm),
                nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => Some(gpm.occupancy),
                nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL => Some(gpm.tensor),
                nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL => Some(gpm.dram_bw),
                _ => None,
            };
            match value {
                Some(v) => {
                    metric.value = v;
                    metric.nvmlReturn = OK;
                }
                None => metric.nvmlReturn = NOT_SUPPORTED,
            }
        }
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "pcie_replay", |g| put(value, g.pcie.replay))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock: nvmlClockType_t,
    mhz: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "clocks", |g| match clock {
        nvmlClockType_enum_NVML_CLOCK_SM => put(mhz, g.clocks.sm),
        _ => NOT_SUPPORTED,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    clock: nvmlClockType_t,
    mhz: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "clocks", |g| match clock {
        nvmlClockType_enum_NVML_CLOCK_SM => put(mhz, g.clocks.sm_max),
        _ => NOT_SUPPORTED,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "power", |g| put(limit, g.power.limit_mw))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, "power", |g| put(limit, g.power.default_limit_mw))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    with_gpu(device, "utilization", |g| {
        put(
            utilization,
            nvmlUtilization_t {
                gpu: g.utilization.gpu,
                memory: g.utilization.memory,
            },
        )
    })
}

/// `NVML_STRUCT_VERSION(GpuFabricInfo, v)`: the struct's size, with the version in the top byte.
const fn fabric_info_version(size: usize, version: u32) -> c_uint {
    size as c_uint | (version << 24)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: nvmlDevice_t,
    info: *mut nvmlGpuFabricInfoV_t,
) -> nvmlReturn_t {
    if info.is_null() {
        return INVALID;
    }
    with_gpu(device, "fabric", |g| {
        let Some(fabric) = &g.fabric else {
            return NOT_SUPPORTED;
        };
        let v2 = fabric_info_version(std::mem::size_of::<nvmlGpuFabricInfo_v2_t>(), 2);
        let v3 = fabric_info_version(std::mem::size_of::<nvmlGpuFabricInfo_v3_t>(), 3);
        let version = (*info).version;
        let known = (version == v2 && fabric.max_version >= 2)
            || (version == v3 && fabric.max_version >= 3);
        if !known {
            return nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let out = &mut *info;
        out.state = match fabric.state.as_str() {
            "not-started" => NVML_GPU_FABRIC_STATE_NOT_STARTED,
            "in-progress" => NVML_GPU_FABRIC_STATE_IN_PROGRESS,
            "completed" => NVML_GPU_FABRIC_STATE_COMPLETED,
            _ => NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
        } as nvmlGpuFabricState_t;
        out.status = fabric.status;
        out.cliqueId = fabric.clique_id;
        let hex: String = fabric.cluster_uuid.chars().filter(|c| *c != '-').collect();
        for (i, byte) in out.clusterUuid.iter_mut().enumerate() {
            *byte = hex
                .get(2 * i..2 * i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .unwrap_or(0);
        }
        out.healthMask = fabric.health_mask;
        if version == v3 {
            out.healthSummary = fabric.health_summary;
        }
        OK
    })
}

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`.
const FIELD_RECOVERY_ACTION: c_uint = 230;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    if values.is_null() || count <= 0 {
        return INVALID;
    }
    with_gpu(device, "field_values", |g| {
        for i in 0..count as usize {
            let v = &mut *values.add(i);
            match (v.fieldId, g.recovery_action) {
                (FIELD_RECOVERY_ACTION, Some(action)) => {
                    v.nvmlReturn = OK;
                    v.valueType = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
                    v.value.uiVal = action;
                }
                _ => v.nvmlReturn = NOT_SUPPORTED,
            }
        }
        OK
    })
}

/// Events delivered so far, by position in the scenario's list.
static DELIVERED: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    put(set, 1usize as nvmlEventSet_t)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_gpu(device, "events", |_| {
        put(types, c_ulonglong::from(nvmlEventTypeXidCriticalError))
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    _types: c_ulonglong,
    _set: nvmlEventSet_t,
) -> nvmlReturn_t {
    with_gpu(device, "events", |_| OK)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    _set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    if data.is_null() {
        return INVALID;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms.into());
    loop {
        let Some(s) = scenario::refreshed() else {
            return UNINITIALIZED;
        };
        let next = {
            let mut delivered = DELIVERED.lock().unwrap_or_else(|e| e.into_inner());
            let found = (0..s.events.len()).find(|i| !delivered.contains(i));
            if let Some(i) = found {
                delivered.push(i);
            }
            found.map(|i| s.events[i].clone())
        };
        if let Some(e) = next {
            let mut out: nvmlEventData_t = std::mem::zeroed();
            out.device = (e.gpu + 1) as nvmlDevice_t;
            out.eventType = c_ulonglong::from(nvmlEventTypeXidCriticalError);
            out.eventData = e.xid;
            out.gpuInstanceId = u32::MAX;
            out.computeInstanceId = u32::MAX;
            *data = out;
            return OK;
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return nvmlReturn_enum_NVML_ERROR_TIMEOUT;
        }
        // The real library blocks in the kernel until an event; so does this, until the
        // scenario changes.
        scenario::wait_for_change(deadline - now);
    }
}

#[no_mangle]
pub extern "C" fn nvmlEventSetFree(_set: nvmlEventSet_t) -> nvmlReturn_t {
    OK
}
