//! The two NVML calls nvml-wrapper 0.13 has no safe method for, wrapped safely:
//! `nvmlDeviceGetRemappedRows` and `nvmlDeviceGetGpuMaxPcieLinkGeneration`.
#![allow(unsafe_code)]

use std::os::raw::c_uint;

use nvml_wrapper::error::{nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};

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

/// The GPU's own maximum PCIe generation (not the slot's).
pub fn gpu_max_pcie_gen(nvml: &Nvml, device: &Device<'_>) -> Read<u32> {
    let sym =
        nvml_sym(nvml.lib().nvmlDeviceGetGpuMaxPcieLinkGeneration.as_ref()).map_err(classify)?;
    let mut gen: c_uint = 0;
    // SAFETY: as above: live handle, valid out-pointer, generated signature.
    unsafe { nvml_try(sym(device.handle(), &mut gen)) }.map_err(classify)?;
    Ok(gen)
}
