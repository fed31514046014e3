//! The snapshot the core publishes: GPUs in bus order with their faults, sources and sinks,
//! the pending end acted on first, the one-line summary.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::escalation::slot;
use super::HealthModel;
use crate::model::{
    Component, Fault, GpuStatus, Health, HealthSnapshot, KmsgStats, PciAddress, Severity,
    SourceKind, SourceState, SourceStatus,
};

impl HealthModel {
    /// Every GPU known, from sysfs or NVML, in bus order: the index is the position.
    pub(super) fn gpu_addresses(&self) -> Vec<PciAddress> {
        let mut all: Vec<PciAddress> = self.devices.gpus.iter().map(|d| d.pci).collect();
        for pci in self.nvml_gpus.iter().filter_map(|g| g.pci) {
            if !all.iter().any(|a| slot(*a) == slot(pci)) {
                all.push(pci);
            }
        }
        all.sort_by_key(|a| slot(*a));
        all
    }

    pub(super) fn gpu_index(addresses: &[PciAddress], component: Component) -> Option<u32> {
        let Component::Gpu { pci } = component else {
            return None;
        };
        addresses
            .iter()
            .position(|a| slot(*a) == slot(pci))
            .and_then(|i| u32::try_from(i).ok())
    }

    /// The earliest notice that ends the instance, with what was signalled for it.
    /// The end acted on first: the earliest act time (a Spot notice or a shutdown: now),
    /// then the earliest deadline. A far scheduled maintenance never hides a Spot notice.
    pub(super) fn pending_end(&self) -> Option<crate::model::PendingEnd> {
        // The node acts on the configured lead; a pod's longer declared lead moves only its
        // own processes' signal (said in `lead_from`).
        let lead_of =
            |n: &crate::model::Notice| self.leads.get(&n.kind).copied().unwrap_or_default();
        let n = self
            .notices
            .values()
            .flatten()
            .filter(|n| n.kind.ends_instance())
            .min_by_key(|n| {
                let act_at = n.act_at(lead_of(n)).unwrap_or(SystemTime::UNIX_EPOCH);
                (act_at, n.deadline)
            })?;
        let report = self.checkpoints.get(&n.id);
        let lead = lead_of(n);
        let lead_from = self
            .declared_lead
            .as_ref()
            .filter(|d| d.lead > lead)
            .and_then(|d| {
                let pod_at = n.act_at(crate::model::notice::pod_lead(lead, d.lead))?;
                Some(format!(
                    "pod {} declares a {} checkpoint: its own processes are signalled at {}",
                    d.pod,
                    humantime::format_duration(d.lead),
                    crate::model::time::rfc3339(pod_at)
                ))
            });
        Some(crate::model::PendingEnd {
            kind: n.kind.name().to_string(),
            deadline: n.deadline,
            detail: n.detail.clone(),
            signalled: report.map_or(0, |c| c.signalled),
            act_at: n.act_at(lead),
            lead_from,
            covered_by: report.and_then(|c| c.covered_by.clone()),
            waiting_for: report.map(|c| c.waiting_for.clone()).unwrap_or_default(),
        })
    }

    /// Everything a sink needs, worst fault first.
    pub fn snapshot(&self, kmsg: KmsgStats) -> HealthSnapshot {
        let addresses = self.gpu_addresses();
        let mut faults: Vec<Fault> = self.faults.values().cloned().collect();
        for fault in &mut faults {
            fault.gpu_index = Self::gpu_index(&addresses, fault.component);
        }
        faults.sort_by(|a, b| {
            (b.class.severity, b.class.action, b.last_seen).cmp(&(
                a.class.severity,
                a.class.action,
                a.last_seen,
            ))
        });
        let gpus: Vec<GpuStatus> = addresses
            .iter()
            .enumerate()
            .map(|(index, pci)| {
                let index = u32::try_from(index).unwrap_or(u32::MAX);
                let mine: Vec<&Fault> = faults
                    .iter()
                    .filter(|f| f.gpu_index == Some(index))
                    .collect();
                let nvml = self
                    .nvml_gpus
                    .iter()
                    .find(|g| g.pci.is_some_and(|p| slot(p) == slot(*pci)))
                    .cloned();
                let fence = self
                    .fencing
                    .as_ref()
                    .zip(nvml.as_ref().and_then(|n| n.uuid.as_deref()))
                    .and_then(|(fencing, uuid)| fencing.fence(uuid))
                    .cloned();
                GpuStatus {
                    index,
                    pci: *pci,
                    nvml,
                    fence,
                    health: Health::from_worst(mine.iter().map(|f| f.class.severity).max()),
                    faults: mine.iter().map(|f| f.code.to_string()).collect(),
                    holders: Vec::new(),
                }
            })
            .collect();
        let worst = faults.iter().map(|f| f.class.severity).max();
        let health = Health::from_worst(worst);
        let sources = self
            .sources
            .iter()
            .map(|(source, state)| SourceStatus {
                source: *source,
                state: state.clone(),
            })
            .collect();
        HealthSnapshot {
            version: env!("CARGO_PKG_VERSION").to_string(),
            node_name: self.node_name.name.clone(),
            node_name_source: self.node_name.source,
            boot_id: self.boot_id.clone(),
            health,
            summary: {
                let mut line = summary(addresses.len(), &faults, &self.sources);
                if let Some(end) = self.pending_end() {
                    line.push_str(&format!(
                        "; {} end at {} ({} signalled)",
                        end.kind,
                        crate::model::time::rfc3339(end.deadline),
                        end.signalled
                    ));
                }
                line
            },
            gpus,
            faults,
            sources,
            sinks: self
                .sinks
                .iter()
                .map(|(sink, state)| crate::model::SinkStatus {
                    sink: sink.clone(),
                    state: state.clone(),
                })
                .collect(),
            pending_end: self.pending_end(),
            checkpoints: {
                let mut all: Vec<crate::model::CheckpointReport> =
                    self.checkpoints.values().cloned().collect();
                all.sort_by(|a, b| a.notice_id.cmp(&b.notice_id));
                all
            },
            notices: {
                let mut all: Vec<crate::model::Notice> =
                    self.notices.values().flatten().cloned().collect();
                all.sort_by_key(|n| n.deadline);
                all
            },
            kmsg,
            driver_version: self.driver_version.clone(),
            efa: self.efa.clone(),
            imex: self.imex.clone(),
            conditions: self.conditions.clone(),
            held_idle: self.held_idle.clone(),
            fault_path_lock: self.fault_path_lock.clone(),
            fencing: self.fencing.clone(),
            holders: None,
            leads: self.leads.iter().map(|(k, v)| (*k, *v)).collect(),
            updated_at: SystemTime::now(),
        }
    }
}

/// `8 GPUs, 1 fatal: GPU 3 Xid 79 (reboot)`; `8 GPUs, healthy`.
pub(super) fn summary(
    gpu_count: usize,
    faults: &[Fault],
    sources: &BTreeMap<SourceKind, SourceState>,
) -> String {
    let gpus = match gpu_count {
        0 => "no GPUs".to_string(),
        1 => "1 GPU".to_string(),
        n => format!("{n} GPUs"),
    };
    let count = |s| faults.iter().filter(|f| f.class.severity == s).count();
    let (fatal, warning) = (count(Severity::Fatal), count(Severity::Warning));
    let mut line = match faults.first() {
        Some(worst) if worst.class.severity > Severity::Info => {
            let mut parts = Vec::new();
            if fatal > 0 {
                parts.push(format!("{fatal} fatal"));
            }
            if warning > 0 {
                parts.push(format!("{warning} warning"));
            }
            format!(
                "{gpus}, {}: {} ({})",
                parts.join(", "),
                worst.label(),
                worst.class.action
            )
        }
        _ => format!("{gpus}, healthy"),
    };
    for (source, state) in sources {
        if let SourceState::Failed(_) = state {
            line.push_str(&format!("; {source} failed"));
        }
    }
    line
}
