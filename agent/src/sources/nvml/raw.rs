//! The NVML calls nvml-wrapper 0.13 has no safe method for, wrapped safely:
//! `nvmlDeviceGetRemappedRows`, `nvmlDeviceGetGpuFabricInfoV` and
//! `nvmlDeviceGetGpuInstanceId`.
#![allow(unsafe_code)]

use std::os::raw::c_uint;

use nvml_wrapper::error::{nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};

use nvml_wrapper_sys::bindings::{
    nvmlGpuFabricInfoV_t, nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t,
    nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH, nvmlReturn_t,
};

use super::fabric::{FabricInfo, FabricState};
use super::probe::{Read, RemapRows, Unread};

/// Sort an NVML error into what the checks care about.
pub(super) fn classify(e: nvml_wrapper::error::NvmlError) -> Unread {
    use nvml_wrapper::error::NvmlError;
    match e {
        NvmlError::NotSupported
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::FunctionNotFound => Unread::NotSupported,
        NvmlError::GpuLost => Unread::Lost,
        NvmlError::ResetRequired => Unread::ResetRequired,
        other => Unread::Failed(other.to_string()),
    }
}

/// Row-remapping counters and flags (Ampere and later).
pub fn remapped_rows(nvml: &Nvml, device: &Device<'_>) -> Read<RemapRows> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref()).map_err(classify)?;
    let (mut corr, mut unc, mut pending, mut failure): (c_uint, c_uint, c_uint, c_uint) =
        (0, 0, 0, 0);
    // SAFETY: `device.handle()` is a live handle from the same library (its lifetime is tied
    // to `nvml`); the four out-pointers are valid, aligned, writable locals; the symbol has
    // the signature nvml-wrapper-sys generated from NVIDIA's header.
    unsafe {
        nvml_try(sym(
            device.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        ))
    }
    .map_err(classify)?;
    Ok(RemapRows {
        correctable: corr,
        uncorrectable: unc,
        pending: pending != 0,
        failure: failure != 0,
    })
}

/// The id of the GPU instance a MIG device belongs to (what `nvmlGpmMigSampleGet` takes).
pub fn gpu_instance_id(nvml: &Nvml, mig: &Device<'_>) -> Read<u32> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref()).map_err(classify)?;
    let mut id: c_uint = 0;
    // SAFETY: `mig.handle()` is a live handle from the same library; the out-pointer is a
    // valid, aligned, writable local; the signature is nvml-wrapper-sys's, from NVIDIA's
    // header.
    unsafe { nvml_try(sym(mig.handle(), &mut id)) }.map_err(classify)?;
    Ok(id)
}

/// `NVML_STRUCT_VERSION(GpuFabricInfo, version)`: the struct's size with the version in the
/// top byte, as NVIDIA's header computes it.
fn fabric_info_version(size: usize, version: u32) -> c_uint {
    c_uint::try_from(size).unwrap_or(0) | (version << 24)
}

/// The GPU's NVLink fabric registration. Asks for the v3 struct (with the health summary)
/// and, from a driver that knows only v2 (`NVML_ERROR_ARGUMENT_VERSION_MISMATCH`), v2: the
/// two share every field but the last.
pub fn gpu_fabric_info(nvml: &Nvml, device: &Device<'_>) -> Read<FabricInfo> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuFabricInfoV.as_ref()).map_err(classify)?;
    let versions = [
        (
            fabric_info_version(std::mem::size_of::<nvmlGpuFabricInfo_v3_t>(), 3),
            true,
        ),
        (
            fabric_info_version(std::mem::size_of::<nvmlGpuFabricInfo_v2_t>(), 2),
            false,
        ),
    ];
    for (version, has_summary) in versions {
        let mut info = nvmlGpuFabricInfoV_t {
            version,
            clusterUuid: [0; 16],
            status: 0,
            cliqueId: 0,
            state: 0,
            healthMask: 0,
            healthSummary: 0,
        };
        // SAFETY: live handle (as above); `info` is a valid, writable v3 struct, the largest
        // version asked for, with `version` naming the layout the library may fill.
        let code: nvmlReturn_t = unsafe { sym(device.handle(), &mut info) };
        if code == nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH {
            continue;
        }
        nvml_try(code).map_err(classify)?;
        return Ok(FabricInfo {
            state: FabricState::from_raw(info.state),
            status: info.status,
            clique_id: info.cliqueId,
            cluster_uuid: info.clusterUuid,
            health_mask: info.healthMask,
            health_summary: has_summary.then_some(info.healthSummary),
        });
    }
    Err(Unread::NotSupported)
}
