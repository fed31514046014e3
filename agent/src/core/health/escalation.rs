//! Escalation: a fault that recurs across boots (a reboot does not fix it) becomes
//! `replace`; repeated episodes in one boot escalate a reset to a reboot; which GPU a slot
//! holds, so a new GPU never inherits the old one's history.

use std::time::{Duration, SystemTime};

use super::{HealthModel, Key};
use crate::core::persist::BootSighting;
use crate::model::{Action, Component, Fault, GpuIdentity, PciAddress, Severity};

/// Boots remembered per fault for recurrence.
pub(super) const RECURRENCE_BOOTS: usize = 8;

/// An episode of a fault ends after this long without a line of it: a burst, or a storm of
/// any length, with no quiet gap this long is one episode.
pub(super) const EPISODE_GAP: Duration = Duration::from_secs(60);

/// The episodes of one fault in this boot.
#[derive(Debug, Default)]
pub(super) struct Episodes {
    /// When each episode within the window began.
    pub(super) starts: Vec<SystemTime>,
    /// The latest occurrence: the current episode ends [`EPISODE_GAP`] after it.
    pub(super) last: Option<SystemTime>,
}

impl Episodes {
    /// Count an occurrence at `at`; `true` when it begins a new episode.
    pub(super) fn occur(&mut self, at: SystemTime) -> bool {
        let new = self
            .last
            .is_none_or(|last| at.duration_since(last).is_ok_and(|gap| gap >= EPISODE_GAP));
        self.last = Some(self.last.map_or(at, |last| last.max(at)));
        if new {
            self.starts.push(at);
        }
        new
    }
}

/// Whether `then` lies within `window` before (or after) `at`.
pub(super) fn within(at: SystemTime, then: SystemTime, window: Duration) -> bool {
    at.duration_since(then).map_or(true, |age| age <= window)
}

pub(super) fn recurrence_key(key: &Key) -> String {
    serde_json::to_string(key).unwrap_or_default()
}

/// GPUs compare by domain, bus and device; kernel-log lines omit the function.
pub(super) fn slot(pci: PciAddress) -> (u32, u8, u8) {
    (pci.domain, pci.bus, pci.device)
}

/// A slot as the state file names it (`0000:18:00`).
pub(super) fn slot_name(pci: PciAddress) -> String {
    format!("{:04x}:{:02x}:{:02x}", pci.domain, pci.bus, pci.device)
}

impl HealthModel {
    /// Count an occurrence at `at` of a fatal fault fixed by a reset or reboot. Seen in
    /// `escalate_after_boots` boots within the window, a reboot evidently does not fix it:
    /// the action becomes replace. Within one boot, repeated episodes escalate a reset to a
    /// reboot, never further.
    pub(super) fn track_recurrence(&mut self, key: Key, at: SystemTime) {
        let Some(fault) = self.faults.get_mut(&key) else {
            return;
        };
        if fault.drill
            || fault.class.severity != Severity::Fatal
            || !matches!(fault.class.action, Action::ResetGpu | Action::Reboot)
        {
            return;
        }
        let window = self.escalate_window;
        let boots = self.recurrence.entry(recurrence_key(&key)).or_default();
        if !boots.iter().any(|b| b.boot_id == self.boot_id) {
            boots.push(BootSighting {
                boot_id: self.boot_id.clone(),
                at,
            });
            if boots.len() > RECURRENCE_BOOTS {
                boots.remove(0);
            }
        }
        let recent = boots.iter().filter(|b| within(at, b.at, window)).count();
        if recent >= self.escalate_after_boots {
            fault.class.action = Action::Replace;
            fault.escalated = Some(format!(
                "recurred in {recent} boots within {}: a reset or reboot does not fix it",
                humantime::format_duration(window)
            ));
            return;
        }
        let episodes = self.episodes.entry(key).or_default();
        episodes.occur(at);
        episodes.starts.retain(|t| within(at, *t, window));
        if fault.class.action == Action::ResetGpu
            && episodes.starts.len() >= self.escalate_after_repeats
        {
            fault.class.action = Action::Reboot;
            fault.escalated = Some(format!(
                "{} episodes within {} in this boot: a GPU reset does not fix it",
                episodes.starts.len(),
                humantime::format_duration(window)
            ));
        }
    }

    /// Whether an escalated replace has its evidence: the fault was seen in enough boots
    /// (when it escalated they lay within the window; a storm in one boot never qualifies).
    pub(super) fn replace_is_evidenced(&self, fault: &Fault) -> bool {
        let key = (fault.component, fault.code);
        self.recurrence
            .get(&recurrence_key(&key))
            .map_or(0, Vec::len)
            >= self.escalate_after_boots
    }

    /// Note which GPU NVML sees in each slot. Where a slot holds another GPU than it did (an
    /// EC2 stop/start onto new hardware, a GPU swapped in repair), what earlier boots learnt
    /// of the old one goes: its faults kept across the reboot (a `replace`) and its boot
    /// sightings. What this boot saw in that slot is the new GPU's and stays. Returns whether
    /// a fault went.
    pub(super) fn follow_hardware(&mut self, gpus: &[GpuIdentity]) -> bool {
        let mut changed = false;
        for gpu in gpus {
            let (Some(pci), Some(id)) = (gpu.pci, gpu.uuid.as_ref().or(gpu.serial.as_ref())) else {
                continue;
            };
            let place = slot_name(pci);
            match self.hardware.insert(place.clone(), id.clone()) {
                Some(old) if old != *id => {
                    tracing::warn!(slot = %place, was = %old, now = %id, "Another GPU in this slot: the old GPU's history is dropped.");
                    changed |= self.forget_earlier_boots(pci);
                }
                _ => {}
            }
        }
        changed
    }

    /// Drop what earlier boots recorded for the GPU in `pci`'s slot. Returns whether a fault
    /// went or changed.
    pub(super) fn forget_earlier_boots(&mut self, pci: PciAddress) -> bool {
        let here = |component: &Component| matches!(component, Component::Gpu { pci: p } if slot(*p) == slot(pci));
        let before = self.faults.len();
        let boot_id = self.boot_id.clone();
        self.faults.retain(|key, fault| {
            let old = here(&key.0) && fault.boot_id != boot_id;
            if old {
                tracing::warn!(fault = %fault.label(), "Fault of the GPU that was in this slot dropped.");
            }
            !old
        });
        self.recurrence.retain(|key, boots| {
            if serde_json::from_str::<Key>(key).is_ok_and(|k| here(&k.0)) {
                boots.retain(|b| b.boot_id == boot_id);
            }
            !boots.is_empty()
        });
        let mut changed = self.faults.len() != before;
        // A fault of this boot that the old GPU's sightings escalated to replace (only
        // recurrence across boots escalates that far) goes back to its own verdict.
        for (key, fault) in self.faults.iter_mut().filter(|(k, _)| here(&k.0)) {
            if fault.class.action == Action::Replace && fault.escalated.is_some() {
                fault.class.action = self
                    .occurrences
                    .get(key)
                    .map_or(Action::Reboot, |o| o.class.action);
                fault.escalated = None;
                changed = true;
            }
        }
        changed
    }
}
