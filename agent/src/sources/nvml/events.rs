//! NVML's critical Xid events, on a thread of their own: an Xid reaches the agent even where
//! `/dev/kmsg` is unreadable (a container without `CAP_SYSLOG`, a kernel log that overran).
//! The same Xid seen in the kernel log too is one fault (the core merges the two paths'
//! reports of one occurrence).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use tokio::sync::mpsc;

use crate::catalog::{self, DriverBranch};
use crate::model::{Component, FaultCode, FaultReport, Observation, PciAddress, SourceKind};

/// The shortest wait (a poll interval of milliseconds waits this long).
const MIN_WAIT: Duration = Duration::from_millis(100);
/// After an error other than a timeout, wait this long before waiting again.
const AFTER_ERROR: Duration = Duration::from_secs(5);

/// The fault report for Xid `code` on `pci`, seen as an NVML event.
pub fn report(pci: PciAddress, code: u32, branch: DriverBranch, at: SystemTime) -> FaultReport {
    FaultReport::seen(
        SourceKind::Nvml,
        at,
        Component::Gpu { pci },
        FaultCode::Xid(code),
        catalog::classify_xid(code, "", branch),
        format!("NVML critical Xid event: Xid {code} on {pci}"),
    )
}

/// Start the events thread: register every GPU for critical Xid events and forward each one
/// as a fault until the core is gone. A driver or GPU that cannot register is logged once.
///
/// An event ends a wait at once; a wait's timeout only bounds how long the thread outlives
/// the core (nothing joins it), so each timeout is a wake-up for nothing: one per `every`,
/// the source's poll interval. That keeps them as far apart as the polls, and the timeout's
/// path runs as often as the poll's, within the fault-path watch (`host::resident`).
pub fn spawn(
    nvml: Arc<Nvml>,
    branch: DriverBranch,
    every: Duration,
    tx: mpsc::Sender<Observation>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let wait_ms = u32::try_from(every.max(MIN_WAIT).as_millis()).unwrap_or(u32::MAX);
    std::thread::Builder::new()
        .name("nvml-events".into())
        .spawn(move || follow(&nvml, branch, wait_ms, &tx))
}

fn follow(nvml: &Nvml, branch: DriverBranch, wait_ms: u32, tx: &mpsc::Sender<Observation>) {
    let set = match register(nvml) {
        Ok(set) => set,
        Err(reason) => {
            tracing::info!(%reason, "NVML Xid events are off; the kernel log and polls still report faults.");
            return;
        }
    };
    tracing::info!("Following NVML critical Xid events.");
    loop {
        if tx.is_closed() {
            return;
        }
        match set.wait(wait_ms) {
            Ok(event) => {
                let Some(XidError::Value(code)) = event.event_data else {
                    continue;
                };
                let Ok(code) = u32::try_from(code) else {
                    continue;
                };
                let pci = event
                    .device
                    .pci_info()
                    .ok()
                    .and_then(|p| p.bus_id.parse::<PciAddress>().ok());
                let Some(pci) = pci else {
                    tracing::warn!(
                        code,
                        "NVML Xid event for a GPU whose address cannot be read."
                    );
                    continue;
                };
                let fault = report(pci, code, branch, SystemTime::now());
                if tx.blocking_send(Observation::Fault(fault)).is_err() {
                    return;
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::debug!(error = %e, "NVML event wait failed.");
                std::thread::sleep(AFTER_ERROR);
            }
        }
    }
}

/// An event set with every GPU that supports critical Xid events registered.
fn register(nvml: &Nvml) -> Result<nvml_wrapper::EventSet<'_>, String> {
    let count = nvml
        .device_count()
        .map_err(|e| format!("nvmlDeviceGetCount: {e}"))?;
    let devices: Vec<_> = (0..count)
        .filter_map(|i| nvml.device_by_index(i).ok())
        .filter(|d| {
            d.supported_event_types()
                .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR))
        })
        .collect();
    if devices.is_empty() {
        return Err("no GPU supports critical Xid events".into());
    }
    let mut set = nvml
        .create_event_set()
        .map_err(|e| format!("nvmlEventSetCreate: {e}"))?;
    for device in &devices {
        // A failed registration releases the set: the whole feature is then off.
        set = device
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| format!("nvmlDeviceRegisterEvents: {}", e.error))?;
    }
    Ok(set)
}
