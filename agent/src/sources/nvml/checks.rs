//! From NVML readings to faults. Pure functions: no NVML, no clock, so every rule is
//! unit-tested.
//!
//! | check | fault | severity | action |
//! |---|---|---|---|
//! | fewer GPUs than expected (NVML and sysfs compared, the missing address named) | `gpu-missing` | fatal | reboot |
//! | a call says `GPU_IS_LOST` | `gpu-lost` | fatal | reboot |
//! | a call says `RESET_REQUIRED` | `reset-required` | fatal | reset-gpu |
//! | volatile uncorrected ECC > 0 (DRAM/SRAM split where reported) | `ecc-uncorrected-volatile` | fatal | reset-gpu |
//! | aggregate uncorrected ECC > 0, volatile 0 | `ecc-uncorrected-aggregate` | warning | none |
//! | ECC disabled | `ecc-disabled` | warning | none |
//! | retired pages pending (pre-Ampere) | `retired-pages-pending` | fatal | reset-gpu |
//! | row remap pending | `remap-pending` | fatal | reset-gpu |
//! | row remap failure | `remap-failure` | fatal | replace |
//! | an NVLink link that was up in this boot is down | `nvlink-down` | fatal | reset-gpu |
//! | an NVLink link never up in this boot, past the boot grace | `nvlink-inactive` | warning | none |
//! | NVLink replay/recovery/CRC counters rising faster than [`NVLINK_ERRORS_PER_MINUTE`] | `nvlink-errors` | warning | none |
//! | PCIe width below the widest this GPU and its slot allow | `pcie-degraded` | warning | none |
//! | busy and held back, sustained over polls (see [`super::slow`]) | `gpu-slow` | warning | none |
//! | the driver's recovery action (R565+): GPU reset / drain and reset | `recovery-action` | fatal | reset-gpu |
//! | the driver's recovery action: node reboot | `recovery-action` | fatal | reboot |
//! | the driver's recovery action: drain P2P | `recovery-action` | warning | restart-app |
//! | NVLink fabric registration and health (GB200/GB300 NVL72): see [`super::fabric`] | `fabric-*` | | |
//!
//! PCIe *generation* below maximum is not a fault: GPUs lower it at idle to save power. It is
//! exported as a metric.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use super::probe::{GpuReading, Unread};
use crate::model::{Action, Classification, Component, FaultCode, PciAddress, Severity};

/// NVLink error counters rising faster than this (per minute, all links) is a warning.
pub const NVLINK_ERRORS_PER_MINUTE: f64 = 10.0;

/// One fault found by a poll.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// Where.
    pub component: Component,
    /// What.
    pub code: FaultCode,
    /// Our verdict.
    pub class: Classification,
    /// The evidence.
    pub detail: String,
}

fn finding(
    component: Component,
    code: FaultCode,
    severity: Severity,
    action: Action,
    name: &str,
    detail: String,
) -> Finding {
    Finding {
        component,
        code,
        class: Classification {
            name: name.to_string(),
            description: detail.clone(),
            nvidia_action: String::new(),
            severity,
            action,
        },
        detail,
    }
}

/// What earlier polls of this boot saw: NVLink counter totals (to turn counters into rates)
/// and which links have been up (the baseline a link going down is judged against), each
/// by the GPU's [`gpu_key`].
#[derive(Debug, Default)]
pub struct Rates {
    previous: HashMap<String, u64>,
    links_up: Baseline,
}

/// Which NVLinks (by link number) of each GPU (by [`gpu_key`]) have been up in this boot.
pub type Baseline = BTreeMap<String, BTreeSet<u32>>;

/// What a GPU's history is kept under: its UUID, else its PCI address. Never its NVML
/// index, which shifts when a GPU before it drops out of enumeration.
pub fn gpu_key(r: &GpuReading) -> String {
    match (&r.uuid, &r.pci) {
        (Ok(uuid), _) => uuid.clone(),
        (Err(_), Ok(pci)) => pci.to_string(),
        (Err(_), Err(_)) => format!("nvml#{}", r.nvml_index),
    }
}

impl Rates {
    /// The NVLink baseline, to keep across an agent restart in the same boot.
    pub fn baseline(&self) -> &Baseline {
        &self.links_up
    }

    /// Take over a baseline an earlier run of this boot kept.
    pub fn restore_baseline(&mut self, baseline: Baseline) {
        self.links_up = baseline;
    }
}

/// Evaluate one poll. `expected` is how many GPUs the node should have; `on_bus` are the
/// NVIDIA GPUs sysfs lists; `elapsed` is the time since the previous poll; `booting` is true
/// within the boot grace period, while Fabric Manager may still be training NVLinks.
///
/// NVLinks are judged against this boot's baseline: a link that was up and goes down is
/// fatal at once; a link that has never been up is not a fault while booting (on HGX hosts
/// links train only once nvidia-fabricmanager has run) and a warning after (a link never up
/// can be NVLink disabled on purpose: it must not make the node be replaced).
pub fn evaluate(
    readings: &[GpuReading],
    expected: u32,
    on_bus: &[PciAddress],
    rates: &mut Rates,
    elapsed: Duration,
    booting: bool,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let addresses = addresses(readings, on_bus);
    gpu_count(readings, &addresses, expected, on_bus, &mut out);
    for (r, pci) in readings.iter().zip(&addresses) {
        let component = match pci {
            Some(pci) => Component::Gpu { pci: *pci },
            // Without an address the fault is the node's, named by NVML index.
            None => Component::Node,
        };
        per_gpu(r, component, rates, elapsed, booting, &mut out);
    }
    out
}

/// The faults that could not be judged this poll because the call they come from failed
/// (not merely unsupported): the core keeps them as they were, neither cleared nor newly
/// judged absent. Only those: a call that fails on every poll (a permission, a memory
/// location this GPU has not) never pins the faults the other calls judge.
pub fn partially_read(
    readings: &[GpuReading],
    on_bus: &[PciAddress],
) -> Vec<(Component, FaultCode)> {
    fn failed<T>(read: &Result<T, Unread>) -> bool {
        matches!(read, Err(Unread::Failed(_)))
    }
    let mut out = Vec::new();
    for (r, pci) in readings.iter().zip(addresses(readings, on_bus)) {
        let component = pci.map_or(Component::Node, |pci| Component::Gpu { pci });
        let nvlink_unread =
            failed(&r.nvlink) || r.nvlink.as_ref().is_ok_and(|n| !n.unread.is_empty());
        // Each call, with the faults judged from it (the DRAM/SRAM split is detail only).
        let calls: [(bool, &[FaultCode]); 10] = [
            (failed(&r.ecc_enabled), &[FaultCode::EccDisabled]),
            (
                failed(&r.ecc_volatile),
                // The lifetime count is a fault only when the volatile one is not.
                &[
                    FaultCode::EccUncorrectedVolatile,
                    FaultCode::EccUncorrectedAggregate,
                ],
            ),
            (
                failed(&r.ecc_aggregate),
                &[FaultCode::EccUncorrectedAggregate],
            ),
            (
                failed(&r.retired_pending),
                &[FaultCode::RetiredPagesPending],
            ),
            (
                failed(&r.remap),
                &[FaultCode::RemapFailure, FaultCode::RemapPending],
            ),
            (
                nvlink_unread,
                &[
                    FaultCode::NvlinkDown,
                    FaultCode::NvlinkInactive,
                    FaultCode::NvlinkErrors,
                ],
            ),
            (failed(&r.pcie), &[FaultCode::PcieDegraded]),
            (
                failed(&r.utilization) || failed(&r.clock_events),
                &[FaultCode::GpuSlow],
            ),
            (failed(&r.recovery_action), &[FaultCode::RecoveryAction]),
            (
                failed(&r.fabric),
                &[
                    FaultCode::FabricUnregistered,
                    FaultCode::FabricRegistrationFailed,
                    FaultCode::FabricUnhealthy,
                    FaultCode::FabricDegraded,
                ],
            ),
        ];
        for (_, codes) in calls.iter().filter(|(failed, _)| *failed) {
            for code in *codes {
                if !out.contains(&(component, *code)) {
                    out.push((component, *code));
                }
            }
        }
    }
    out
}

fn same(a: &PciAddress, b: &PciAddress) -> bool {
    (a.domain, a.bus, a.device) == (b.domain, b.bus, b.device)
}

/// Each reading's PCI address. A lost GPU cannot tell NVML its address; it is one of the
/// bus's GPUs no other reading claimed. NVML enumerates in bus order, so the unclaimed
/// addresses are handed to the address-less readings in order.
fn addresses(readings: &[GpuReading], on_bus: &[PciAddress]) -> Vec<Option<PciAddress>> {
    let seen: Vec<PciAddress> = readings
        .iter()
        .filter_map(|r| r.pci.as_ref().ok().copied())
        .collect();
    let mut unclaimed = on_bus.iter().filter(|b| !seen.iter().any(|s| same(s, b)));
    readings
        .iter()
        .map(|r| match &r.pci {
            Ok(pci) => Some(*pci),
            Err(_) => unclaimed.next().copied(),
        })
        .collect()
}

fn gpu_count(
    readings: &[GpuReading],
    addresses: &[Option<PciAddress>],
    expected: u32,
    on_bus: &[PciAddress],
    out: &mut Vec<Finding>,
) {
    let seen: Vec<PciAddress> = addresses.iter().flatten().copied().collect();
    let mut named = 0usize;
    for pci in on_bus.iter().filter(|b| !seen.iter().any(|s| same(s, b))) {
        named += 1;
        out.push(finding(
            Component::Gpu { pci: *pci },
            FaultCode::GpuMissing,
            Severity::Fatal,
            Action::Reboot,
            "GPU_MISSING",
            format!(
                "GPU {pci} is on the PCI bus but NVML does not see it ({} of {} GPUs visible)",
                readings.len(),
                on_bus.len().max(expected as usize)
            ),
        ));
    }
    let visible = u32::try_from(readings.len()).unwrap_or(u32::MAX);
    let on_bus_count = u32::try_from(on_bus.len()).unwrap_or(u32::MAX);
    if named == 0 && (visible < expected || on_bus_count < expected) {
        out.push(finding(
            Component::Node,
            FaultCode::GpuMissing,
            Severity::Fatal,
            Action::Reboot,
            "GPU_MISSING",
            format!(
                "expected {expected} GPUs: NVML sees {visible}, the PCI bus has {on_bus_count}"
            ),
        ));
    }
}

fn per_gpu(
    r: &GpuReading,
    component: Component,
    rates: &mut Rates,
    elapsed: Duration,
    booting: bool,
    out: &mut Vec<Finding>,
) {
    let gpu = format!(
        "GPU {}",
        r.pci
            .as_ref()
            .map_or_else(|_| format!("nvml#{}", r.nvml_index), ToString::to_string)
    );
    let mut push = |code, severity, action, name: &str, detail: String| {
        out.push(finding(
            component,
            code,
            severity,
            action,
            name,
            format!("{gpu}: {detail}"),
        ));
    };
    if r.says(&Unread::Lost) {
        push(
            FaultCode::GpuLost,
            Severity::Fatal,
            Action::Reboot,
            "GPU_IS_LOST",
            "NVML reports the GPU lost (NVML_ERROR_GPU_IS_LOST)".into(),
        );
        return;
    }
    if r.says(&Unread::ResetRequired) {
        push(
            FaultCode::ResetRequired,
            Severity::Fatal,
            Action::ResetGpu,
            "RESET_REQUIRED",
            "NVML reports the GPU needs a reset (NVML_ERROR_RESET_REQUIRED)".into(),
        );
    }
    if r.ecc_enabled == Ok(false) {
        push(
            FaultCode::EccDisabled,
            Severity::Warning,
            Action::None,
            "ECC_DISABLED",
            "ECC is disabled".into(),
        );
    }
    match (&r.ecc_volatile, &r.ecc_aggregate) {
        (Ok(v), _) if *v > 0 => {
            let split = match (&r.ecc_volatile_dram, &r.ecc_volatile_sram) {
                (Ok(d), Ok(s)) => format!(" (DRAM {d}, SRAM {s})"),
                _ => String::new(),
            };
            push(
                FaultCode::EccUncorrectedVolatile,
                Severity::Fatal,
                Action::ResetGpu,
                "ECC_UNCORRECTED",
                format!("{v} uncorrectable ECC errors since the last reset{split}"),
            );
        }
        (_, Ok(a)) if *a > 0 => {
            push(
                FaultCode::EccUncorrectedAggregate,
                Severity::Warning,
                Action::None,
                "ECC_UNCORRECTED_HISTORY",
                format!("{a} uncorrectable ECC errors over the GPU's life"),
            );
        }
        _ => {}
    }
    if r.retired_pending == Ok(true) {
        push(
            FaultCode::RetiredPagesPending,
            Severity::Fatal,
            Action::ResetGpu,
            "RETIRED_PAGES_PENDING",
            "retired pages wait for a GPU reset".into(),
        );
    }
    if let Ok(remap) = &r.remap {
        if remap.failure {
            push(
                FaultCode::RemapFailure,
                Severity::Fatal,
                Action::Replace,
                "ROW_REMAP_FAILURE",
                format!(
                    "row remapping failed ({} rows remapped for uncorrectable errors)",
                    remap.uncorrectable
                ),
            );
        } else if remap.pending {
            push(
                FaultCode::RemapPending,
                Severity::Fatal,
                Action::ResetGpu,
                "ROW_REMAP_PENDING",
                "a row remap waits for a GPU reset".into(),
            );
        }
    }
    if let Ok(nv) = &r.nvlink {
        let seen = rates.links_up.entry(gpu_key(r)).or_default();
        let (mut lost, mut never) = (Vec::new(), Vec::new());
        for (&link, &up) in &nv.links {
            if up {
                seen.insert(link);
            } else if seen.contains(&link) {
                lost.push(link.to_string());
            } else {
                never.push(link.to_string());
            }
        }
        let up = nv.links.values().filter(|u| **u).count();
        if !lost.is_empty() {
            push(
                FaultCode::NvlinkDown,
                Severity::Fatal,
                Action::ResetGpu,
                "NVLINK_DOWN",
                format!(
                    "NVLink {} down after being up in this boot ({up} of {} up)",
                    lost.join(","),
                    nv.links.len()
                ),
            );
        }
        if !never.is_empty() && !booting {
            push(
                FaultCode::NvlinkInactive,
                Severity::Warning,
                Action::None,
                "NVLINK_INACTIVE",
                format!(
                    "NVLink {} not up since boot ({up} of {} up): Fabric Manager has not \
                     trained them, or NVLink is disabled on this host",
                    never.join(","),
                    nv.links.len()
                ),
            );
        }
        let total = nv.replay + nv.recovery + nv.crc;
        if let Some(before) = rates.previous.insert(gpu_key(r), total) {
            let minutes = elapsed.as_secs_f64() / 60.0;
            let per_minute = if minutes > 0.0 {
                total.saturating_sub(before) as f64 / minutes
            } else {
                0.0
            };
            if per_minute > NVLINK_ERRORS_PER_MINUTE {
                push(FaultCode::NvlinkErrors, Severity::Warning, Action::None, "NVLINK_ERRORS", format!("NVLink errors rising at {per_minute:.0}/min (replay {}, recovery {}, CRC {})", nv.replay, nv.recovery, nv.crc));
            }
        }
    }
    if let Ok(p) = &r.pcie {
        if p.width < p.max_width {
            push(
                FaultCode::PcieDegraded,
                Severity::Warning,
                Action::None,
                "PCIE_LINK_DEGRADED",
                format!(
                    "PCIe link trained at x{} of x{} (Gen{})",
                    p.width, p.max_width, p.gen
                ),
            );
        }
    }
    if let Ok(action) = r.recovery_action {
        // The driver's own verdict: no Xid table to keep current.
        let verdict = match action {
            0 => None,
            1 => Some((Severity::Fatal, Action::ResetGpu, "GPU_RESET")),
            2 => Some((Severity::Fatal, Action::Reboot, "NODE_REBOOT")),
            3 => Some((Severity::Warning, Action::RestartApp, "DRAIN_P2P")),
            4 => Some((Severity::Fatal, Action::ResetGpu, "DRAIN_AND_RESET")),
            _ => Some((Severity::Warning, Action::None, "UNKNOWN")),
        };
        if let Some((severity, what, name)) = verdict {
            push(
                FaultCode::RecoveryAction,
                severity,
                what,
                &format!("GPU_RECOVERY_ACTION_{name}"),
                format!("the driver requires recovery action {name} ({action}) for this GPU"),
            );
        }
    }
    if let Some((code, severity, action, name, detail)) = r
        .fabric
        .as_ref()
        .ok()
        .and_then(|fabric| fabric.judge(booting))
    {
        push(code, severity, action, name, detail);
    }
}

/// The slow verdicts of one poll ([`super::slow`]), as findings on each GPU.
pub fn judge_slow(
    readings: &[GpuReading],
    on_bus: &[PciAddress],
    slow: &mut super::slow::Slow,
    limits: &super::slow::Limits,
) -> Vec<Finding> {
    let verdicts = slow.judge(readings, limits);
    addresses(readings, on_bus)
        .into_iter()
        .zip(verdicts)
        .filter_map(|(pci, verdict)| {
            let evidence = verdict?;
            let component = pci.map_or(Component::Node, |pci| Component::Gpu { pci });
            let gpu = pci.map_or_else(|| "GPU".to_string(), |p| format!("GPU {p}"));
            Some(finding(
                component,
                FaultCode::GpuSlow,
                Severity::Warning,
                Action::None,
                "GPU_SLOW",
                format!("{gpu}: slow while busy: {evidence}"),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::probe::{NvlinkState, PcieLink, RemapRows};
    use super::*;

    fn pci(i: u8) -> PciAddress {
        PciAddress {
            domain: 0,
            bus: 0x10 + i,
            device: 0,
            function: 0,
        }
    }

    fn healthy(i: u8) -> GpuReading {
        GpuReading {
            nvml_index: u32::from(i),
            handle: Ok(()),
            pci: Ok(pci(i)),
            uuid: Ok(format!("GPU-{i}")),
            name: Ok("NVIDIA H100 80GB HBM3".into()),
            serial: Ok("1".into()),
            ecc_enabled: Ok(true),
            ecc_volatile: Ok(0),
            ecc_aggregate: Ok(0),
            ecc_volatile_dram: Ok(0),
            ecc_volatile_sram: Ok(0),
            retired_pending: Err(Unread::NotSupported),
            remap: Ok(RemapRows {
                correctable: 0,
                uncorrectable: 0,
                pending: false,
                failure: false,
            }),
            nvlink: Ok(NvlinkState {
                links: (0..18).map(|l| (l, true)).collect(),
                ..NvlinkState::default()
            }),
            pcie: Ok(PcieLink {
                gen: 5,
                max_gen: Some(5),
                width: 16,
                max_width: 16,
            }),
            clock_events: Ok(0),
            utilization: Ok((0, 0)),
            sm_clock: Ok((1980, 1980)),
            power_limit: Ok((700_000, 700_000)),
            pcie_replay: Ok(0),
            gpm: Err(Unread::NotSupported),
            recovery_action: Err(Unread::NotSupported),
            migs: Vec::new(),
            fabric: Err(Unread::NotSupported),
        }
    }

    fn codes(
        readings: &[GpuReading],
        expected: u32,
        bus: &[PciAddress],
    ) -> Vec<(FaultCode, Severity, Action)> {
        evaluate(
            readings,
            expected,
            bus,
            &mut Rates::default(),
            Duration::from_secs(10),
            false,
        )
        .into_iter()
        .map(|f| (f.code, f.class.severity, f.class.action))
        .collect()
    }

    #[test]
    fn healthy_host_has_no_findings_and_unsupported_is_not_a_fault() {
        let mut gpus: Vec<_> = (0..8).map(healthy).collect();
        gpus[2].remap = Err(Unread::NotSupported);
        gpus[2].nvlink = Err(Unread::NotSupported);
        gpus[2].pcie = Err(Unread::Failed("boom".into()));
        let bus: Vec<_> = (0..8).map(pci).collect();
        assert!(codes(&gpus, 8, &bus).is_empty());
    }

    #[test]
    fn missing_gpu_is_named_by_address() {
        let gpus: Vec<_> = (0..7).map(healthy).collect();
        let bus: Vec<_> = (0..8).map(pci).collect();
        let found = evaluate(&gpus, 8, &bus, &mut Rates::default(), Duration::ZERO, false);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].component, Component::Gpu { pci: pci(7) });
        assert_eq!(found[0].code, FaultCode::GpuMissing);
        // Missing from the bus too: the node is short, no address to name.
        let found = codes(&gpus, 8, &bus[..7]);
        assert_eq!(
            found,
            [(FaultCode::GpuMissing, Severity::Fatal, Action::Reboot)]
        );
    }

    #[test]
    fn each_rule() {
        let bus: Vec<_> = (0..1).map(pci).collect();
        let mut g = healthy(0);
        g.ecc_volatile = Ok(2);
        assert_eq!(
            codes(&[g], 1, &bus),
            [(
                FaultCode::EccUncorrectedVolatile,
                Severity::Fatal,
                Action::ResetGpu
            )]
        );
        let mut g = healthy(0);
        g.ecc_aggregate = Ok(2);
        assert_eq!(
            codes(&[g], 1, &bus),
            [(
                FaultCode::EccUncorrectedAggregate,
                Severity::Warning,
                Action::None
            )]
        );
        let mut g = healthy(0);
        g.remap = Ok(RemapRows {
            correctable: 0,
            uncorrectable: 1,
            pending: true,
            failure: false,
        });
        assert_eq!(
            codes(&[g], 1, &bus),
            [(FaultCode::RemapPending, Severity::Fatal, Action::ResetGpu)]
        );
        let mut g = healthy(0);
        g.remap = Ok(RemapRows {
            correctable: 0,
            uncorrectable: 9,
            pending: true,
            failure: true,
        });
        assert_eq!(
            codes(&[g], 1, &bus),
            [(FaultCode::RemapFailure, Severity::Fatal, Action::Replace)]
        );
        // Link 4 never up in this boot, past the grace: a warning, never a replacement.
        let mut g = healthy(0);
        if let Ok(nv) = &mut g.nvlink {
            nv.links.insert(4, false);
        }
        assert_eq!(
            codes(&[g], 1, &bus),
            [(FaultCode::NvlinkInactive, Severity::Warning, Action::None)]
        );
        let mut g = healthy(0);
        g.pcie = Ok(PcieLink {
            gen: 5,
            max_gen: Some(5),
            width: 8,
            max_width: 16,
        });
        assert_eq!(
            codes(&[g], 1, &bus),
            [(FaultCode::PcieDegraded, Severity::Warning, Action::None)]
        );
        let mut g = healthy(0);
        g.pcie = Ok(PcieLink {
            gen: 1,
            max_gen: Some(5),
            width: 16,
            max_width: 16,
        });
        assert!(
            codes(&[g], 1, &bus).is_empty(),
            "idle Gen1 is power saving, not a fault"
        );
        // A thermal slowdown is the slow verdict's evidence (`slow.rs`), judged only while
        // busy and over polls: one reading alone is no finding.
        let mut g = healthy(0);
        g.clock_events = Ok(0x40);
        assert!(codes(&[g], 1, &bus).is_empty());
        let mut g = healthy(0);
        g.ecc_enabled = Ok(false);
        assert_eq!(
            codes(&[g], 1, &bus),
            [(FaultCode::EccDisabled, Severity::Warning, Action::None)]
        );
    }

    #[test]
    fn lost_gpu_is_one_finding_others_unaffected() {
        let mut gpus: Vec<_> = (0..3).map(healthy).collect();
        gpus[1] = GpuReading {
            pci: Ok(pci(1)),
            ..GpuReading::unreachable_for_test(1, Unread::Lost)
        };
        let bus: Vec<_> = (0..3).map(pci).collect();
        let found = evaluate(&gpus, 3, &bus, &mut Rates::default(), Duration::ZERO, false);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].component, found[0].code),
            (Component::Gpu { pci: pci(1) }, FaultCode::GpuLost)
        );
        // A lost GPU cannot report its address: it takes the bus address no one claimed,
        // and is not also reported missing.
        gpus[1] = GpuReading::unreachable_for_test(1, Unread::Lost);
        let found = evaluate(&gpus, 3, &bus, &mut Rates::default(), Duration::ZERO, false);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].component, found[0].code),
            (Component::Gpu { pci: pci(1) }, FaultCode::GpuLost)
        );
    }

    #[test]
    fn nvlink_errors_are_rates() {
        let bus = [pci(0)];
        let mut rates = Rates::default();
        let with = |n| {
            let mut g = healthy(0);
            if let Ok(nv) = &mut g.nvlink {
                nv.replay = n;
            }
            g
        };
        let minute = Duration::from_secs(60);
        assert!(
            evaluate(&[with(1_000)], 1, &bus, &mut rates, minute, false).is_empty(),
            "first poll has no rate"
        );
        assert!(evaluate(&[with(1_005)], 1, &bus, &mut rates, minute, false).is_empty());
        let found = evaluate(&[with(1_100)], 1, &bus, &mut rates, minute, false);
        assert_eq!(found[0].code, FaultCode::NvlinkErrors);
    }

    #[test]
    fn nvlinks_are_judged_against_this_boots_baseline() {
        let bus = [pci(0)];
        let mut rates = Rates::default();
        let mut untrained = healthy(0);
        if let Ok(nv) = &mut untrained.nvlink {
            nv.links.values_mut().for_each(|up| *up = false);
        }
        let poll = |g: &GpuReading, rates: &mut Rates, booting| {
            evaluate(
                std::slice::from_ref(g),
                1,
                &bus,
                rates,
                Duration::ZERO,
                booting,
            )
            .into_iter()
            .map(|f| (f.code, f.class.severity))
            .collect::<Vec<_>>()
        };
        // Booting, Fabric Manager not done: links down are no fault.
        assert!(poll(&untrained, &mut rates, true).is_empty());
        // Trained: all up.
        assert!(poll(&healthy(0), &mut rates, true).is_empty());
        // A link that was up goes down: fatal at once, grace or not.
        let mut one_down = healthy(0);
        if let Ok(nv) = &mut one_down.nvlink {
            nv.links.insert(7, false);
        }
        assert_eq!(
            poll(&one_down, &mut rates, true),
            [(FaultCode::NvlinkDown, Severity::Fatal)]
        );
        // A host whose links never came up: after the grace, a warning only.
        let mut fresh = Rates::default();
        assert_eq!(
            poll(&untrained, &mut fresh, false),
            [(FaultCode::NvlinkInactive, Severity::Warning)]
        );
    }

    /// Review 2026-12-03b L9 (old and new): a failed read of one link shifted the numbers of
    /// the links after it, and the baseline was kept by NVML index, so a GPU was judged
    /// against another's links after one dropped out of enumeration.
    #[test]
    fn a_failed_link_read_moves_no_link_and_the_baseline_follows_the_gpu() {
        let bus = [pci(0), pci(1)];
        let mut rates = Rates::default();
        let poll = |gs: &[GpuReading], rates: &mut Rates| {
            evaluate(gs, 2, &bus, rates, Duration::ZERO, false)
                .into_iter()
                .map(|f| (f.component, f.code))
                .collect::<Vec<_>>()
        };
        // GPU 1's link 17 never trains (disabled on this host): a warning.
        let mut second = healthy(1);
        if let Ok(nv) = &mut second.nvlink {
            nv.links.insert(17, false);
        }
        let inactive = (Component::Gpu { pci: pci(1) }, FaultCode::NvlinkInactive);
        assert_eq!(poll(&[healthy(0), second.clone()], &mut rates), [inactive]);
        // Link 3 cannot be read this poll: no link is judged down, and the GPU is partial
        // (its faults stay as they were).
        let mut flaky = second.clone();
        if let Ok(nv) = &mut flaky.nvlink {
            nv.links.remove(&3);
            nv.unread.push(3);
        }
        assert_eq!(poll(&[healthy(0), flaky.clone()], &mut rates), [inactive]);
        let gpu1 = Component::Gpu { pci: pci(1) };
        assert_eq!(
            partially_read(&[healthy(0), flaky], &bus),
            [
                (gpu1, FaultCode::NvlinkDown),
                (gpu1, FaultCode::NvlinkInactive),
                (gpu1, FaultCode::NvlinkErrors)
            ]
        );
        // GPU 0 drops out of enumeration (an agent restart: GPU 1 is NVML index 0 now):
        // GPU 1 is judged against its own links, not GPU 0's.
        second.nvml_index = 0;
        let found = poll(&[second], &mut rates);
        assert!(found.contains(&inactive), "{found:?}");
        assert!(
            !found.iter().any(|(_, code)| *code == FaultCode::NvlinkDown),
            "{found:?}"
        );
    }

    #[test]
    fn the_drivers_recovery_action_is_a_fault_and_old_drivers_are_not() {
        let bus = [pci(0)];
        for (action, want) in [
            (1, Some((Severity::Fatal, Action::ResetGpu))),
            (2, Some((Severity::Fatal, Action::Reboot))),
            (3, Some((Severity::Warning, Action::RestartApp))),
            (4, Some((Severity::Fatal, Action::ResetGpu))),
            (0, None),
        ] {
            let mut g = healthy(0);
            g.recovery_action = Ok(action);
            let found = codes(&[g], 1, &bus);
            assert_eq!(
                found.first().map(|(_, s, a)| (*s, *a)),
                want,
                "action {action}: {found:?}"
            );
        }
        // Not supported (before R565): no fault (healthy() reads it so).
        assert!(codes(&[healthy(0)], 1, &bus).is_empty());
    }
}
