//! GPU Performance Monitoring (GPM, Hopper and later): what a busy GPU actually does, from
//! two samples a poll apart: SM activity, SM occupancy, any-tensor activity and DRAM
//! bandwidth, in percent of the interval. Utilisation says a kernel was resident; the
//! tensor figure says whether it did the work training does (a rank waiting in a collective
//! keeps a kernel resident with no tensor work). A GPU in MIG mode is also sampled per GPU
//! instance (`nvmlGpmMigSampleGet`), so a pod holding one MIG device is judged by its own
//! instance's work.
//!
//! GPM reads a GPU subsystem of its own, not the performance monitors DCGM's profiling and
//! Nsight hold exclusively (NVIDIA's DCGM maintainers, NVIDIA/DCGM#62): sampling here takes
//! nothing from a dcgm-exporter on the same GPU. It is unknown (never zero) where the GPU
//! does not support it (before Hopper: `nvmlGpmQueryDeviceSupport` says no), in a vGPU guest
//! (a fractional GPU, g6f: the virtualisation mode keeps GPM from sampling), and on the
//! first poll (one sample is no interval).

use std::collections::HashMap;

use nvml_wrapper::enum_wrappers::device::GpuVirtualizationMode;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::gpm::{gpm_metrics_get, GpmSample};
use nvml_wrapper::Nvml;

use super::probe::{GpuReading, Unread};

/// What GPM measured over one poll interval, percent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activity {
    /// Share of the SMs busy (`NVML_GPM_METRIC_SM_UTIL`).
    pub sm_active: u32,
    /// Warps resident against the SMs' capacity (`NVML_GPM_METRIC_SM_OCCUPANCY`).
    pub sm_occupancy: u32,
    /// Any tensor pipe busy (`NVML_GPM_METRIC_ANY_TENSOR_UTIL`).
    pub tensor_active: u32,
    /// DRAM bandwidth in use (`NVML_GPM_METRIC_DRAM_BW_UTIL`).
    pub dram_bw: u32,
}

const METRICS: [GpmMetricId; 4] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
];

/// Each GPU's last sample (by GPU key), kept from one poll to the next.
pub struct Gpm<'n> {
    nvml: &'n Nvml,
    last: HashMap<String, GpmSample<'n>>,
}

impl std::fmt::Debug for Gpm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpm")
            .field("gpus", &self.last.len())
            .finish_non_exhaustive()
    }
}

impl<'n> Gpm<'n> {
    /// No sample yet.
    pub fn new(nvml: &'n Nvml) -> Self {
        Self {
            nvml,
            last: HashMap::new(),
        }
    }

    /// Take this poll's sample of each GPU in `readings`, and of each GPU instance of one
    /// in MIG mode, and set its `gpm` from the interval since the last one.
    pub fn read(&mut self, readings: &mut [GpuReading]) {
        let mut next = HashMap::new();
        for r in readings.iter_mut() {
            let key = super::checks::gpu_key(r);
            let device = self.device(r.nvml_index);
            let sample = device
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|d| d.gpm_sample().map_err(unread));
            r.gpm = self.interval(key, sample, &mut next);
            for mig in &mut r.migs {
                let sample = match (&device, mig.gpu_instance) {
                    (Ok(d), Some(instance)) => d.gpm_mig_sample(instance).map_err(unread),
                    (Ok(_), None) => Err(Unread::NotSupported),
                    (Err(why), _) => Err(why.clone()),
                };
                mig.gpm = self.interval(mig.uuid.clone(), sample, &mut next);
            }
        }
        // GPUs and instances gone since: their samples are freed with the map.
        self.last = next;
    }

    /// The activity from the last sample under `key` to `sample`, which is kept in `next`
    /// (unknown on the first).
    fn interval(
        &mut self,
        key: String,
        sample: Result<GpmSample<'n>, Unread>,
        next: &mut HashMap<String, GpmSample<'n>>,
    ) -> Result<Activity, Unread> {
        match (sample, self.last.remove(&key)) {
            (Ok(now), Some(before)) => {
                let activity = self.activity(&before, &now);
                next.insert(key, now);
                activity
            }
            (Ok(now), None) => {
                next.insert(key, now);
                Err(Unread::NotSupported)
            }
            (Err(why), _) => Err(why),
        }
    }

    /// GPU `index`, where GPM can sample it.
    fn device(&self, index: u32) -> Result<nvml_wrapper::Device<'n>, Unread> {
        let device = self.nvml.device_by_index(index).map_err(unread)?;
        if !device.gpm_support().map_err(unread)? {
            return Err(Unread::NotSupported);
        }
        if matches!(
            device.virtualization_mode(),
            Ok(GpuVirtualizationMode::Vgpu)
        ) {
            return Err(Unread::NotSupported);
        }
        Ok(device)
    }

    fn activity(&self, before: &GpmSample<'n>, now: &GpmSample<'n>) -> Result<Activity, Unread> {
        let results = gpm_metrics_get(self.nvml, before, now, &METRICS).map_err(unread)?;
        let value = |i: usize| -> Result<u32, Unread> {
            let v = results
                .get(i)
                .ok_or(Unread::NotSupported)?
                .as_ref()
                .map_err(|e| match e {
                    nvml_wrapper::error::NvmlError::NotSupported => Unread::NotSupported,
                    other => Unread::Failed(other.to_string()),
                })?
                .value;
            // A percentage, rounded; NaN or out of range reads as unknown.
            (v.is_finite() && (0.0..=100.5).contains(&v))
                .then(|| v.round().clamp(0.0, 100.0) as u32)
                .ok_or(Unread::NotSupported)
        };
        Ok(Activity {
            sm_active: value(0)?,
            sm_occupancy: value(1)?,
            tensor_active: value(2)?,
            dram_bw: value(3)?,
        })
    }
}

fn unread(e: nvml_wrapper::error::NvmlError) -> Unread {
    super::raw::classify(e)
}
