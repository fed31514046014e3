//! Reading one GPU through nvml-wrapper. Every call is independent: one failing or
//! unsupported call never stops the others.

use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, MemoryLocation};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use std::collections::BTreeMap;

use super::fabric::FabricInfo;
use super::raw;
use crate::model::PciAddress;

/// `NVML_NVLINK_MAX_LINKS`: links are numbered below this.
const NVLINK_MAX_LINKS: u32 = 18;

/// Why a value could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unread {
    /// The GPU, driver or library does not support this call (a missing symbol included).
    NotSupported,
    /// `NVML_ERROR_GPU_IS_LOST`.
    Lost,
    /// `NVML_ERROR_RESET_REQUIRED`.
    ResetRequired,
    /// Any other error.
    Failed(String),
}

/// A value NVML may or may not give.
pub type Read<T> = Result<T, Unread>;

fn read<T>(result: Result<T, NvmlError>) -> Read<T> {
    result.map_err(raw::classify)
}

/// Row-remapping state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemapRows {
    /// Rows remapped for correctable errors.
    pub correctable: u32,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u32,
    /// A remap waits for a GPU reset.
    pub pending: bool,
    /// A remap failed.
    pub failure: bool,
}

/// PCIe link state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcieLink {
    /// Current generation.
    pub gen: u32,
    /// The highest generation this GPU and its slot can train to together (a Gen6 GPU on
    /// a Gen5 bus: 5), not the GPU's own maximum: a link is low only against what this
    /// host allows.
    pub max_gen: Option<u32>,
    /// Current width.
    pub width: u32,
    /// The widest this GPU and its slot allow together.
    pub max_width: u32,
}

/// NVLink state summed over the GPU's links.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NvlinkState {
    /// Up (true) or down (false) for each link the GPU has, by link number.
    pub links: BTreeMap<u32, bool>,
    /// Links whose state could not be read this poll (a call failed): neither up nor down,
    /// and the numbers of the others do not move.
    pub unread: Vec<u32>,
    /// Replay errors, all links.
    pub replay: u64,
    /// Recovery errors, all links.
    pub recovery: u64,
    /// CRC (flit) errors, all links.
    pub crc: u64,
}

/// Everything read from one GPU in one poll.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    /// NVML index.
    pub nvml_index: u32,
    /// The device handle itself could not be had.
    pub handle: Read<()>,
    /// PCI address.
    pub pci: Read<PciAddress>,
    /// UUID.
    pub uuid: Read<String>,
    /// Product name.
    pub name: Read<String>,
    /// Board serial.
    pub serial: Read<String>,
    /// ECC currently enabled.
    pub ecc_enabled: Read<bool>,
    /// Volatile uncorrected ECC errors.
    pub ecc_volatile: Read<u64>,
    /// Aggregate uncorrected ECC errors.
    pub ecc_aggregate: Read<u64>,
    /// Volatile uncorrected errors in DRAM.
    pub ecc_volatile_dram: Read<u64>,
    /// Volatile uncorrected errors in SRAM.
    pub ecc_volatile_sram: Read<u64>,
    /// Retired pages pending (pre-Ampere).
    pub retired_pending: Read<bool>,
    /// Row remapping (Ampere and later).
    pub remap: Read<RemapRows>,
    /// NVLink.
    pub nvlink: Read<NvlinkState>,
    /// PCIe link.
    pub pcie: Read<PcieLink>,
    /// Clock-event (throttle) reason bits.
    pub clock_events: Read<u64>,
    /// Percent of the driver's last sample period a kernel ran on the GPU, and its memory
    /// was read or written (`nvmlDeviceGetUtilizationRates`).
    pub utilization: Read<(u32, u32)>,
    /// The SM clock and its maximum, MHz.
    pub sm_clock: Read<(u32, u32)>,
    /// The enforced power limit and the default one, mW (a limit someone lowered).
    pub power_limit: Read<(u32, u32)>,
    /// PCIe link-level retransmissions since the driver loaded.
    pub pcie_replay: Read<u32>,
    /// GPM's activity over the last poll interval (Hopper and later; set by
    /// [`super::gpm::Gpm::read`], unknown until then).
    pub gpm: Read<super::gpm::Activity>,
    /// The driver's own required recovery action (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`,
    /// R565+): 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset.
    pub recovery_action: Read<u32>,
    /// Its MIG devices (empty when MIG is off or not supported).
    pub migs: Vec<MigReading>,
    /// NVLink fabric registration (`nvmlDeviceGetGpuFabricInfoV`).
    pub fabric: Read<FabricInfo>,
}

/// One MIG device of a GPU in MIG mode.
#[derive(Debug, Clone, PartialEq)]
pub struct MigReading {
    /// Its UUID (`MIG-...`): what the device plugin hands out.
    pub uuid: String,
    /// The GPU instance it belongs to (`None`: unread).
    pub gpu_instance: Option<u32>,
    /// GPM's activity of its GPU instance over the last poll interval (set by
    /// [`super::gpm::Gpm::read`], unknown until then).
    pub gpm: Read<super::gpm::Activity>,
}

impl GpuReading {
    fn unreachable(nvml_index: u32, why: Unread) -> Self {
        Self {
            nvml_index,
            handle: Err(why.clone()),
            pci: Err(why.clone()),
            uuid: Err(why.clone()),
            name: Err(why.clone()),
            serial: Err(why.clone()),
            ecc_enabled: Err(why.clone()),
            ecc_volatile: Err(why.clone()),
            ecc_aggregate: Err(why.clone()),
            ecc_volatile_dram: Err(why.clone()),
            ecc_volatile_sram: Err(why.clone()),
            retired_pending: Err(why.clone()),
            remap: Err(why.clone()),
            nvlink: Err(why.clone()),
            pcie: Err(why.clone()),
            clock_events: Err(why.clone()),
            utilization: Err(why.clone()),
            sm_clock: Err(why.clone()),
            power_limit: Err(why.clone()),
            pcie_replay: Err(why.clone()),
            gpm: Err(why.clone()),
            recovery_action: Err(why.clone()),
            migs: Vec::new(),
            fabric: Err(why),
        }
    }

    /// A reading whose every call failed the same way (tests).
    #[cfg(test)]
    pub fn unreachable_for_test(nvml_index: u32, why: Unread) -> Self {
        Self::unreachable(nvml_index, why)
    }

    /// Did any call say the GPU is lost / needs a reset?
    pub fn says(&self, what: &Unread) -> bool {
        let errs = [
            self.handle.as_ref().err(),
            self.pci.as_ref().err(),
            self.uuid.as_ref().err(),
            self.ecc_volatile.as_ref().err(),
            self.remap.as_ref().err(),
            self.nvlink.as_ref().err(),
            self.pcie.as_ref().err(),
        ];
        errs.into_iter().flatten().any(|e| e == what)
    }
}

/// Read every GPU NVML enumerates. `Err` only when the count itself cannot be read.
pub fn read_all(nvml: &Nvml) -> Result<Vec<GpuReading>, String> {
    let count = nvml
        .device_count()
        .map_err(|e| format!("nvmlDeviceGetCount: {e}"))?;
    Ok((0..count)
        .map(|i| match read(nvml.device_by_index(i)) {
            Ok(device) => read_gpu(nvml, i, &device),
            Err(why) => GpuReading::unreachable(i, why),
        })
        .collect())
}

fn read_gpu(nvml: &Nvml, nvml_index: u32, device: &Device<'_>) -> GpuReading {
    let pci = read(device.pci_info()).and_then(|info| {
        info.bus_id
            .parse::<PciAddress>()
            .map_err(|e| Unread::Failed(e.to_string()))
    });
    let remap = raw::remapped_rows(nvml, device);
    let max_gen = device.max_pcie_link_gen().ok();
    let pcie = read(device.current_pcie_link_gen()).and_then(|gen| {
        Ok(PcieLink {
            gen,
            max_gen,
            width: read(device.current_pcie_link_width())?,
            max_width: read(device.max_pcie_link_width())?,
        })
    });
    GpuReading {
        nvml_index,
        handle: Ok(()),
        pci,
        uuid: read(device.uuid()),
        name: read(device.name()),
        serial: read(device.serial()),
        ecc_enabled: read(device.is_ecc_enabled()).map(|m| m.currently_enabled),
        ecc_volatile: read(device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)),
        ecc_aggregate: read(
            device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate),
        ),
        ecc_volatile_dram: read(device.memory_error_counter(
            MemoryError::Uncorrected,
            EccCounter::Volatile,
            MemoryLocation::Device,
        )),
        ecc_volatile_sram: read(device.memory_error_counter(
            MemoryError::Uncorrected,
            EccCounter::Volatile,
            MemoryLocation::SRAM,
        )),
        retired_pending: read(device.are_pages_pending_retired()),
        remap,
        nvlink: nvlink(device),
        pcie,
        clock_events: read(device.current_throttle_reasons()).map(|r| r.bits()),
        utilization: read(device.utilization_rates()).map(|u| (u.gpu, u.memory)),
        sm_clock: read(device.clock_info(Clock::SM))
            .and_then(|now| Ok((now, read(device.max_clock_info(Clock::SM))?))),
        power_limit: read(device.enforced_power_limit())
            .and_then(|now| Ok((now, read(device.power_management_limit_default())?))),
        pcie_replay: read(device.pcie_replay_counter()),
        gpm: Err(Unread::NotSupported),
        recovery_action: recovery_action(device),
        migs: migs(nvml, device),
        fabric: raw::gpu_fabric_info(nvml, device),
    }
}

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (field 230). Drivers before R565 answer "not
/// supported" for the field: no fault.
const FIELD_RECOVERY_ACTION: u32 = 230;

fn recovery_action(device: &Device<'_>) -> Read<u32> {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    let sample = read(device.field_values_for(&[FieldId(FIELD_RECOVERY_ACTION)]))?
        .into_iter()
        .next()
        .ok_or(Unread::NotSupported)?;
    match read(sample)?.value {
        Ok(SampleValue::U32(v)) => Ok(v),
        Ok(SampleValue::U64(v)) => u32::try_from(v).map_err(|_| Unread::NotSupported),
        Ok(_) => Err(Unread::NotSupported),
        Err(e) => Err(raw::classify(e)),
    }
}

fn nvlink(device: &Device<'_>) -> Read<NvlinkState> {
    let mut state = NvlinkState::default();
    for link in 0..NVLINK_MAX_LINKS {
        let wrapper = device.link_wrapper_for(link);
        match wrapper.is_active() {
            Ok(up) => {
                state.links.insert(link, up);
            }
            // A link number the GPU does not have (NVML answers "invalid argument").
            Err(NvmlError::InvalidArg) => continue,
            Err(e) => match raw::classify(e) {
                Unread::NotSupported => continue,
                Unread::Failed(_) => {
                    state.unread.push(link);
                    continue;
                }
                other => return Err(other),
            },
        }
        let count = |c| read(wrapper.error_counter(c)).unwrap_or(0);
        state.replay += count(ErrorCounter::DlReplay);
        state.recovery += count(ErrorCounter::DlRecovery);
        state.crc += count(ErrorCounter::DlCrcFlit);
    }
    if state.links.is_empty() && state.unread.is_empty() {
        return Err(Unread::NotSupported);
    }
    Ok(state)
}

/// The GPU's MIG devices; none when MIG is off (one call on a GPU without MIG).
fn migs(nvml: &Nvml, device: &Device) -> Vec<MigReading> {
    if !device.mig_mode().is_ok_and(|m| m.current == 1) {
        return Vec::new();
    }
    let count = device.mig_device_count().unwrap_or(0);
    (0..count)
        .filter_map(|i| device.mig_device_by_index(i).ok())
        .filter_map(|mig| {
            Some(MigReading {
                uuid: mig.uuid().ok()?,
                gpu_instance: raw::gpu_instance_id(nvml, &mig).ok(),
                gpm: Err(Unread::NotSupported),
            })
        })
        .collect()
}
