//! The node's health model: faults merged from every source, keyed by component and code.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

pub mod condition;
mod escalation;
mod occurrence;
mod snapshot;

use escalation::{recurrence_key, Episodes};
use occurrence::{latch, Occurrence, SAME_OCCURRENCE};

use super::persist::{BootSighting, PersistedState};
use crate::host::NvidiaDevices;
use crate::model::{
    Action, Component, Fault, FaultCode, FaultReport, GpuIdentity, NodeName, Observation, Severity,
    SourceKind, SourceState,
};

/// The most distinct faults kept; past this the least severe, oldest one is dropped, so a
/// flood of garbage addresses cannot grow memory.
pub const MAX_FAULTS: usize = 1024;

pub(super) type Key = (Component, FaultCode);

/// When a repeating fault was last written to the log.
#[derive(Debug, Clone, Copy)]
struct Logged {
    at: Instant,
    count: u64,
}

/// The health model the core owns.
#[derive(Debug)]
pub struct HealthModel {
    node_name: NodeName,
    boot_id: String,
    devices: NvidiaDevices,
    faults: BTreeMap<Key, Fault>,
    sources: BTreeMap<SourceKind, SourceState>,
    kmsg_cursor: Option<u64>,
    repeat_log_interval: Duration,
    logged: HashMap<Key, Logged>,
    nvml_gpus: Vec<GpuIdentity>,
    driver_version: Option<String>,
    sinks: BTreeMap<String, SourceState>,
    notices: BTreeMap<SourceKind, Vec<crate::model::Notice>>,
    checkpoints: HashMap<String, crate::model::CheckpointReport>,
    recurrence: BTreeMap<String, Vec<BootSighting>>,
    escalate_after_boots: usize,
    escalate_after_repeats: usize,
    escalate_window: Duration,
    /// Episodes of each fatal fault in this boot.
    episodes: HashMap<Key, Episodes>,
    leads: HashMap<crate::model::NoticeKind, Duration>,
    declared_lead: Option<crate::model::DeclaredLead>,
    /// The latest occurrence of each fault: who reported it and what it said.
    occurrences: HashMap<Key, Occurrence>,
    /// Which GPU (UUID, else serial) NVML last saw in each slot, this boot or an earlier one:
    /// history stays with the hardware, not the slot.
    hardware: BTreeMap<String, String>,
    /// The EFA devices as the `efa` source last found them.
    efa: Vec<crate::model::EfaDevice>,
    imex: Option<crate::model::ImexState>,
    /// Per-GPU fencing as the device-taints sink last reported it.
    fencing: Option<crate::model::Fencing>,
    /// The Node conditions as last written.
    conditions: Vec<crate::model::NodeCondition>,
    /// Pods holding GPUs and keeping none busy, as the funnel last reported them.
    held_idle: Vec<crate::model::HeldIdle>,
    fault_path_lock: crate::model::FaultPathLock,
    /// How each polling source's conditions are set and cleared.
    rules: condition::Rules,
    /// Fatal sightings not yet confirmed: who saw each, and since when it has been seen on
    /// every poll.
    pending: HashMap<Key, (SourceKind, SystemTime)>,
    /// Polled faults' last confirmed fatal sighting: a milder one lowers the verdict only a
    /// whole hold after it.
    last_fatal: HashMap<Key, SystemTime>,
}

impl HealthModel {
    /// An empty model for this boot.
    pub fn new(
        node_name: &NodeName,
        boot_id: &str,
        devices: NvidiaDevices,
        repeat_log_interval: Duration,
    ) -> Self {
        Self {
            node_name: node_name.clone(),
            boot_id: boot_id.to_string(),
            devices,
            faults: BTreeMap::new(),
            sources: BTreeMap::new(),
            kmsg_cursor: None,
            repeat_log_interval,
            logged: HashMap::new(),
            nvml_gpus: Vec::new(),
            driver_version: None,
            sinks: BTreeMap::new(),
            notices: BTreeMap::new(),
            checkpoints: HashMap::new(),
            recurrence: BTreeMap::new(),
            escalate_after_boots: 3,
            escalate_after_repeats: 5,
            escalate_window: Duration::from_secs(24 * 3600),
            episodes: HashMap::new(),
            leads: HashMap::new(),
            declared_lead: None,
            occurrences: HashMap::new(),
            hardware: BTreeMap::new(),
            efa: Vec::new(),
            imex: None,
            fencing: None,
            conditions: Vec::new(),
            held_idle: Vec::new(),
            fault_path_lock: crate::model::FaultPathLock::default(),
            rules: condition::Rules::default(),
            pending: HashMap::new(),
            last_fatal: HashMap::new(),
        }
    }

    /// How each polling source's conditions are set and cleared (default: at once, and at
    /// the first poll without them).
    pub fn set_condition_rules(&mut self, rules: condition::Rules) {
        self.rules = rules;
    }

    /// How long before its deadline each kind of notice is acted on (`[checkpoint.lead]`).
    pub fn set_leads(&mut self, leads: HashMap<crate::model::NoticeKind, Duration>) {
        self.leads = leads;
    }

    /// A fatal reset or reboot fault seen in `boots` boots within `window` escalates to
    /// replace; a fatal reset fault in `repeats` separate episodes within `window` in one boot
    /// escalates to reboot (a reset evidently does not fix it; only a reboot shows whether
    /// the hardware is at fault, so repetition within a boot never condemns the node).
    pub fn set_escalation(&mut self, boots: u32, repeats: u32, window: Duration) {
        self.escalate_after_boots = usize::try_from(boots.max(1)).unwrap_or(usize::MAX);
        self.escalate_after_repeats = usize::try_from(repeats.max(2)).unwrap_or(usize::MAX);
        self.escalate_window = window;
    }

    /// Remove faults an operator declares repaired: those `selector` matches (reason, code
    /// or label), or all with `None`. Their recurrence history goes too. Returns their labels.
    pub fn clear(&mut self, selector: Option<&str>) -> Vec<String> {
        let keys: Vec<Key> = self
            .faults
            .iter()
            .filter(|(_, f)| selector.is_none_or(|s| f.matches(s)))
            .map(|(k, _)| *k)
            .collect();
        let mut cleared = Vec::new();
        for key in keys {
            if let Some(fault) = self.faults.remove(&key) {
                tracing::warn!(fault = %fault.label(), reason = %fault.reason(), "Fault cleared by an operator.");
                cleared.push(fault.label());
            }
            self.logged.remove(&key);
            self.episodes.remove(&key);
            self.pending.remove(&key);
            self.last_fatal.remove(&key);
            self.recurrence.remove(&recurrence_key(&key));
        }
        if selector.is_none() {
            // The whole node declared repaired: faults a reboot already dropped lose their
            // history too.
            self.recurrence.clear();
            self.episodes.clear();
        }
        cleared
    }

    /// Take over a persisted state. Same boot: everything, including the kernel-log cursor.
    /// New boot: the cursor restarts; faults whose action is `replace` stay (a reboot does not
    /// fix hardware that needs replacing), the others were for the previous boot and go. A
    /// replace that was escalated stays only while its recurrence across boots still holds
    /// (a state written before that rule may carry a replace a storm escalated).
    pub fn restore(&mut self, state: PersistedState) {
        let same_boot = state.boot_id == self.boot_id;
        if same_boot {
            self.kmsg_cursor = state.kmsg_cursor;
        }
        self.recurrence = state.recurrence;
        self.hardware = state.gpus;
        for fault in state.faults {
            let keep = same_boot
                || (fault.class.action == Action::Replace
                    && !fault.drill
                    && (fault.escalated.is_none() || self.replace_is_evidenced(&fault)));
            if keep {
                self.faults.insert((fault.component, fault.code), fault);
            } else if !same_boot && fault.class.action == Action::Replace {
                tracing::warn!(fault = %fault.label(), escalated = ?fault.escalated, "A replace escalated without recurrence across boots is dropped at the new boot.");
            }
        }
        if !same_boot {
            tracing::info!(previous_boot = %state.boot_id, kept = self.faults.len(), "New boot: kernel-log cursor reset.");
        }
    }

    /// The state to persist.
    pub fn persisted(&self) -> PersistedState {
        PersistedState {
            kmsg_cursor: self.kmsg_cursor,
            faults: self.faults.values().cloned().collect(),
            recurrence: self.recurrence.clone(),
            gpus: self.hardware.clone(),
            ..PersistedState::empty(&self.boot_id)
        }
    }

    /// The kernel-log cursor (sequence number of the last merged record).
    pub fn kmsg_cursor(&self) -> Option<u64> {
        self.kmsg_cursor
    }

    /// Move the cursor past records read that held no fault (at a clean stop, once every
    /// report read before them is merged): a restart then resumes there instead of counting
    /// the records since the last fault as lost. Returns whether it moved.
    pub fn advance_kmsg_cursor(&mut self, seq: u64) -> bool {
        if self.kmsg_cursor.is_some_and(|c| c >= seq) {
            return false;
        }
        self.kmsg_cursor = Some(seq);
        true
    }

    /// Merge an observation. Returns `true` if the model changed.
    pub fn apply(&mut self, observation: Observation) -> bool {
        self.apply_at(observation, SystemTime::now())
    }

    /// Merge an observation at `now` (when a polled condition's hold is judged).
    pub fn apply_at(&mut self, observation: Observation, now: SystemTime) -> bool {
        match observation {
            Observation::Fault(report) => {
                self.merge(report);
                true
            }
            Observation::Source(source, state) => {
                let changed = self.sources.get(&source) != Some(&state);
                self.sources.insert(source, state);
                changed
            }
            Observation::Notices { source, notices } => {
                let changed = self.notices.get(&source) != Some(&notices);
                if changed {
                    for n in &notices {
                        if !self.notices.values().flatten().any(|old| old.id == n.id) {
                            tracing::warn!(kind = %n.kind, deadline = %crate::model::time::rfc3339(n.deadline), id = %n.id, detail = %n.detail, "Notice received.");
                        }
                    }
                    self.notices.insert(source, notices);
                    let live: Vec<String> = self
                        .notices
                        .values()
                        .flatten()
                        .map(|n| n.id.clone())
                        .collect();
                    self.checkpoints.retain(|id, _| live.contains(id));
                }
                changed
            }
            Observation::Checkpoint(report) => {
                let changed = self.checkpoints.get(&report.notice_id) != Some(&report);
                self.checkpoints.insert(report.notice_id.clone(), report);
                changed
            }
            Observation::DeclaredLead(lead) => {
                let changed = self.declared_lead != lead;
                self.declared_lead = lead;
                changed
            }
            Observation::NodeName(name) => {
                let changed = self.node_name != name;
                if changed {
                    tracing::info!(node = %name.name, from = %name.source, "Node name resolved.");
                }
                self.node_name = name;
                changed
            }
            Observation::Conditions(conditions) => {
                let changed = self.conditions != conditions;
                self.conditions = conditions;
                changed
            }
            Observation::FaultPathLock(lock) => {
                let changed = self.fault_path_lock != lock;
                self.fault_path_lock = lock;
                changed
            }
            Observation::HeldIdle(pods) => {
                let changed = self.held_idle != pods;
                self.held_idle = pods;
                changed
            }
            Observation::Fencing(fencing) => {
                let changed = self.fencing != fencing;
                self.fencing = fencing;
                changed
            }
            Observation::Sink(status) => {
                let changed = self.sinks.get(&status.sink) != Some(&status.state);
                self.sinks.insert(status.sink, status.state);
                changed
            }
            Observation::Poll {
                source,
                faults,
                partial,
                inventory,
            } => {
                let mut changed = match inventory {
                    crate::model::Inventory::Gpus {
                        gpus,
                        driver_version,
                    } => {
                        let mut changed =
                            gpus != self.nvml_gpus || driver_version != self.driver_version;
                        changed |= self.follow_hardware(&gpus);
                        self.nvml_gpus = gpus;
                        self.driver_version = driver_version;
                        changed
                    }
                    crate::model::Inventory::Efa(devices) => {
                        let changed = devices != self.efa;
                        self.efa = devices;
                        changed
                    }
                    crate::model::Inventory::Imex(state) => {
                        let changed = self.imex.as_ref() != Some(&state);
                        self.imex = Some(state);
                        changed
                    }
                };
                changed |= self.replace_conditions(source, faults, &partial, now);
                changed
            }
        }
    }

    /// A polling source's faults are conditions, set and cleared by the source's rule
    /// (`condition.rs`): a fatal sighting is fatal once confirmed, a verdict gets milder
    /// only a whole hold after its worse evidence, and a fault clears its hold after its
    /// last sighting. A
    /// condition seen again is not a new occurrence. A fault the source could not judge this
    /// time (`partial`: the call it comes from failed) is kept as it was.
    fn replace_conditions(
        &mut self,
        source: SourceKind,
        reports: Vec<FaultReport>,
        partial: &[Key],
        now: SystemTime,
    ) -> bool {
        let keys: Vec<Key> = reports.iter().map(|r| (r.component, r.code)).collect();
        let absent: Vec<(Key, SystemTime)> = self
            .faults
            .iter()
            // Events (an Xid the source also reports as it happens) are occurrences, latched
            // like the kernel log's; only conditions clear when a poll no longer sees them.
            .filter(|(k, f)| f.source == source && !keys.contains(k) && !k.1.is_event())
            .filter(|(k, _)| !partial.contains(k))
            .map(|(k, f)| (*k, f.last_seen))
            .collect();
        // A fatal sighting not seen again this poll starts its confirmation afresh.
        self.pending
            .retain(|k, (from, _)| *from != source || keys.contains(k) || partial.contains(k));
        let mut changed = false;
        for (key, last_seen) in absent {
            let rule = self.rules.get(source, key.1);
            if !condition::expired(last_seen, now, rule.hold) {
                continue;
            }
            changed = true;
            if let Some(fault) = self.faults.remove(&key) {
                tracing::info!(fault = %fault.label(), "Fault cleared.");
            }
            self.logged.remove(&key);
            self.last_fatal.remove(&key);
            if key.1 == FaultCode::RecoveryAction && self.recovery_is_none(key.0) {
                self.recovered(key.0);
            }
        }
        for mut report in reports {
            let key = (report.component, report.code);
            let rule = self.rules.get(source, key.1);
            let latched_fatal = self
                .faults
                .get(&key)
                .is_some_and(|f| f.source == source && f.class.severity == Severity::Fatal);
            if report.class.severity == Severity::Fatal {
                let (_, since) = *self.pending.entry(key).or_insert((source, report.at));
                if latched_fatal || condition::confirmed(since, report.at, rule.confirm) {
                    self.last_fatal.insert(key, report.at);
                } else {
                    (report.class, report.detail) =
                        condition::provisional(&report.class, &report.detail, rule.confirm);
                }
            } else {
                self.pending.remove(&key);
            }
            match self.faults.get_mut(&key) {
                Some(fault) if fault.source == source => {
                    fault.last_seen = report.at;
                    // A milder sighting lowers the verdict only a whole hold after the last
                    // sighting of the worse one; until then the verdict and its evidence
                    // stay as they are.
                    let milder = occurrence::worse(&fault.class, &report.class);
                    let lower = milder
                        && fault.escalated.is_none()
                        && condition::expired(
                            *self.last_fatal.entry(key).or_insert(report.at),
                            report.at,
                            rule.hold,
                        );
                    if milder && !lower {
                        continue;
                    }
                    let class = if lower {
                        self.last_fatal.remove(&key);
                        tracing::info!(fault = %fault.label(), severity = %report.class.severity, "Fault milder: its worse evidence is a whole hold old.");
                        report.class
                    } else {
                        latch(Some(&fault.class), &report.class)
                    };
                    fault.detail = report.detail;
                    if fault.class != class {
                        let was = fault.class.severity;
                        fault.class = class;
                        if fault.class.severity > was {
                            log_new(fault);
                        }
                        changed = true;
                    }
                }
                _ => {
                    self.merge(report);
                    changed = true;
                }
            }
        }
        changed
    }

    /// Did NVML's last poll read the driver's recovery action for `component` as None
    /// (an explicit read, not a GPU gone or a field it could not read)?
    fn recovery_is_none(&self, component: Component) -> bool {
        let Component::Gpu { pci } = component else {
            return false;
        };
        self.nvml_gpus
            .iter()
            .any(|g| g.pci == Some(pci) && g.telemetry.recovery_action == Some(0))
    }

    /// The driver's recovery action for `component` went back to None after it asked for one
    /// (NVML's poll, or Xid 154 "to 0x0 (None)"): the driver's own word that the GPU needs
    /// nothing more. The occurrences latched on it whose remedy is confined to the GPU
    /// (restart the application, reset the GPU) end with it; a GPU gone, a reboot or replace
    /// verdict and escalations stay until a boot or `clear`.
    fn recovered(&mut self, component: Component) {
        let ended: Vec<Key> = self
            .faults
            .iter()
            .filter(|(k, f)| k.0 == component && k.1.is_event() && f.confined_to_gpu())
            .map(|(k, _)| *k)
            .collect();
        for key in ended {
            if let Some(fault) = self.faults.remove(&key) {
                tracing::info!(fault = %fault.label(), "Fault cleared: the driver's recovery action for its GPU is now None.");
            }
            self.logged.remove(&key);
        }
    }

    fn merge(&mut self, report: FaultReport) {
        if let Some(cursor) = report.cursor {
            if report.source == SourceKind::Kmsg {
                self.kmsg_cursor = Some(self.kmsg_cursor.map_or(cursor, |c| c.max(cursor)));
            }
        }
        // A fault the driver reports the end of clears without an operator.
        if let FaultCode::Xid(code) = report.code {
            if let Some(cleared) = crate::catalog::clears(code) {
                if let Some(gone) = self
                    .faults
                    .remove(&(report.component, FaultCode::Xid(cleared)))
                {
                    tracing::info!(fault = %gone.label(), by = %report.code, "Fault cleared by the driver's own all-clear.");
                }
            }
        }
        let key = (report.component, report.code);
        if crate::catalog::is_all_clear(report.code, &report.class) {
            // Xid 154 "to 0x0 (None)": the driver needs no recovery action any more. Its
            // earlier verdicts (reset, reboot) end here, explicitly; the NVML event of this
            // same line, whichever path comes second, is part of it.
            if let Some(gone) = self.faults.remove(&key) {
                tracing::info!(fault = %gone.label(), "Fault cleared: the driver's recovery action is now None.");
            }
            self.recovered(report.component);
            self.occurrences
                .insert(key, Occurrence::of(&report, None, true));
            return;
        }
        // The latest occurrence, if this report is the other path's sighting of it.
        let same = self.occurrences.get_mut(&key).filter(|o| {
            o.source != report.source
                && report
                    .at
                    .duration_since(o.at)
                    .unwrap_or_else(|e| e.duration())
                    <= SAME_OCCURRENCE
        });
        if same.as_ref().is_some_and(|o| o.all_clear) {
            return;
        }
        if let Some(fault) = self.faults.get_mut(&key) {
            // One occurrence seen by two paths (the kernel log and NVML's Xid events) is one.
            // NVML's event carries only the code; the kernel log's line is decoded (NVLink5
            // unit and severity, Xid 154's recovery action): for this occurrence its verdict
            // replaces the event's, whichever path came first. What earlier occurrences
            // latched stays: an occurrence only ever makes the fault worse.
            if let Some(o) = same {
                if report.source != SourceKind::Kmsg {
                    return;
                }
                // The kernel log has spoken for this occurrence: its next line is another.
                o.source = report.source;
                if o.class != report.class {
                    o.class = report.class;
                    let was = fault.class.severity;
                    let escalated = fault.escalated.is_some().then_some(fault.class.action);
                    fault.class = latch(o.before.as_ref(), &o.class);
                    if let Some(action) = escalated {
                        fault.class.action = fault.class.action.max(action);
                    }
                    fault.detail = report.detail;
                    if fault.class.severity > was {
                        log_new(fault);
                    }
                    self.track_recurrence(key, report.at);
                }
                return;
            }
            self.occurrences.insert(
                key,
                Occurrence::of(&report, Some(fault.class.clone()), false),
            );
            fault.count += 1;
            fault.last_seen = fault.last_seen.max(report.at);
            fault.detail = report.detail;
            // One real occurrence makes it real.
            fault.drill &= report.drill;
            fault.boot_id.clone_from(&self.boot_id);
            let was = fault.class.severity;
            fault.class = latch(Some(&fault.class), &report.class);
            if fault.class.severity > was {
                log_new(fault);
            } else {
                self.log_repeat(key);
            }
            self.track_recurrence(key, report.at);
            return;
        }
        if self.occurrences.len() >= 2 * MAX_FAULTS {
            let faults = &self.faults;
            self.occurrences.retain(|k, _| faults.contains_key(k));
        }
        self.occurrences
            .insert(key, Occurrence::of(&report, None, false));
        if self.faults.len() >= MAX_FAULTS {
            self.evict_one();
        }
        let fault = Fault {
            component: report.component,
            gpu_index: Self::gpu_index(&self.gpu_addresses(), report.component),
            code: report.code,
            source: report.source,
            class: report.class,
            first_seen: report.at,
            last_seen: report.at,
            count: 1,
            detail: report.detail,
            boot_id: self.boot_id.clone(),
            escalated: None,
            drill: report.drill,
        };
        let at = fault.first_seen;
        self.faults.insert(key, fault);
        self.track_recurrence(key, at);
        if let Some(fault) = self.faults.get(&key) {
            log_new(fault);
        }
        self.logged.insert(
            key,
            Logged {
                at: Instant::now(),
                count: 1,
            },
        );
    }

    fn evict_one(&mut self) {
        let victim = self
            .faults
            .iter()
            .min_by_key(|(_, f)| (f.class.severity, f.last_seen))
            .map(|(k, _)| *k);
        if let Some(key) = victim {
            self.faults.remove(&key);
            self.logged.remove(&key);
            self.last_fatal.remove(&key);
        }
    }

    /// A fault that keeps repeating is summarised at most once per interval, so a flood of
    /// identical lines cannot flood the journal.
    fn log_repeat(&mut self, key: Key) {
        let Some(fault) = self.faults.get(&key) else {
            return;
        };
        let now = Instant::now();
        let logged = self.logged.entry(key).or_insert(Logged {
            at: now,
            count: fault.count,
        });
        if now.duration_since(logged.at) < self.repeat_log_interval {
            return;
        }
        tracing::info!(
            fault = %fault.label(),
            repeats = fault.count - logged.count,
            total = fault.count,
            "Fault repeated."
        );
        *logged = Logged {
            at: now,
            count: fault.count,
        };
    }
}

fn log_new(fault: &Fault) {
    let gpu = fault
        .gpu_index
        .map_or_else(|| "-".to_string(), |i| i.to_string());
    macro_rules! emit {
        ($level:expr) => {
            tracing::event!(
                $level,
                fault = %fault.label(),
                gpu = %gpu,
                code = %fault.code,
                name = %fault.class.name,
                severity = %fault.class.severity,
                action = %fault.class.action,
                nvidia_action = %fault.class.nvidia_action,
                detail = %fault.detail,
                "GPU fault detected."
            )
        };
    }
    match fault.class.severity {
        Severity::Fatal => emit!(tracing::Level::ERROR),
        Severity::Warning => emit!(tracing::Level::WARN),
        Severity::Info => emit!(tracing::Level::INFO),
    }
}

#[cfg(test)]
impl HealthModel {
    /// An empty model with no GPUs (tests).
    pub fn for_test() -> Self {
        Self::new(
            &NodeName {
                name: "n".into(),
                source: crate::model::NameSource::Config,
            },
            "b",
            NvidiaDevices::default(),
            Duration::from_secs(60),
        )
    }

    /// Merge a kernel-log fault line seen at `at` (tests).
    pub fn apply_line(&mut self, line: &str, at: std::time::SystemTime) {
        let report =
            crate::sources::kmsg::report(line, None, at, crate::catalog::DriverBranch::Unknown)
                .expect("a fault line");
        self.apply(Observation::Fault(report));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{classify_xid, DriverBranch};
    use crate::host::PciDevice;
    use crate::model::PciAddress;
    use crate::model::{Health, KmsgStats};
    use std::time::SystemTime;

    fn pci(text: &str) -> PciAddress {
        text.parse().expect("address")
    }

    fn model() -> HealthModel {
        let gpus = [
            "0000:18:00.0",
            "0000:2a:00.0",
            "0000:3a:00.0",
            "0000:5d:00.0",
        ]
        .iter()
        .map(|a| PciDevice {
            pci: pci(a),
            numa_node: Some(0),
        })
        .collect();
        let devices = NvidiaDevices {
            gpus,
            ..NvidiaDevices::default()
        };
        HealthModel::new(&node_a(), "boot-1", devices, Duration::from_secs(60))
    }

    fn node_a() -> NodeName {
        NodeName {
            name: "node-a".into(),
            source: crate::model::NameSource::Config,
        }
    }

    fn xid(address: &str, code: u32, seq: u64) -> Observation {
        Observation::Fault(FaultReport {
            component: Component::Gpu { pci: pci(address) },
            code: FaultCode::Xid(code),
            class: classify_xid(code, "", DriverBranch::Unknown),
            source: SourceKind::Kmsg,
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(seq),
            detail: format!("Xid {code}"),
            cursor: Some(seq),
            drill: false,
        })
    }

    #[test]
    fn joins_faults_to_gpus_and_summarises() {
        let mut m = model();
        assert_eq!(m.snapshot(KmsgStats::default()).summary, "4 GPUs, healthy");
        m.apply(xid("0000:5d:00", 79, 10));
        m.apply(xid("0000:18:00", 13, 11));
        let s = m.snapshot(KmsgStats::default());
        assert_eq!(
            s.summary,
            "4 GPUs, 1 fatal, 1 warning: GPU 3 Xid 79 (reboot)"
        );
        assert_eq!(s.health, Health::Fatal);
        assert_eq!(s.gpus[3].health, Health::Fatal);
        assert_eq!(s.gpus[3].faults, ["Xid 79"]);
        assert_eq!(s.gpus[0].health, Health::Warning);
        assert_eq!(s.faults[0].gpu_index, Some(3));
        assert_eq!(m.kmsg_cursor(), Some(11));
    }

    #[test]
    fn repeats_aggregate_into_a_count() {
        let mut m = model();
        for seq in 0..10_000 {
            m.apply(xid("0000:3a:00", 95, seq));
        }
        let s = m.snapshot(KmsgStats::default());
        assert_eq!(s.faults.len(), 1);
        assert_eq!(s.faults[0].count, 10_000);
        assert_eq!(s.faults[0].first_seen, SystemTime::UNIX_EPOCH);
        assert_eq!(
            s.faults[0].last_seen,
            SystemTime::UNIX_EPOCH + Duration::from_secs(9_999)
        );
    }

    #[test]
    fn distinct_faults_are_bounded() {
        let mut m = model();
        for i in 0..(MAX_FAULTS as u32 + 500) {
            let address = format!("{:04x}:{:02x}:00", 0x100 + i / 256, i % 256);
            m.apply(xid(&address, 13, u64::from(i)));
        }
        m.apply(xid("0000:18:00", 79, 99_999));
        let s = m.snapshot(KmsgStats::default());
        assert_eq!(s.faults.len(), MAX_FAULTS);
        assert_eq!(
            s.faults[0].code,
            FaultCode::Xid(79),
            "a fatal fault is never the one evicted"
        );
    }

    #[test]
    fn restore_same_boot_and_new_boot() {
        let mut m = model();
        m.apply(xid("0000:18:00", 79, 5));
        m.apply(xid("0000:2a:00", 54, 6));
        let state = m.persisted();

        let mut same = model();
        same.restore(state.clone());
        assert_eq!(same.kmsg_cursor(), Some(6));
        assert_eq!(same.snapshot(KmsgStats::default()).faults.len(), 2);

        let mut rebooted = HealthModel::new(
            &node_a(),
            "boot-2",
            NvidiaDevices::default(),
            Duration::from_secs(60),
        );
        rebooted.restore(state);
        assert_eq!(rebooted.kmsg_cursor(), None);
        let faults = rebooted.snapshot(KmsgStats::default()).faults;
        assert_eq!(faults.len(), 1, "only the replace fault survives a reboot");
        assert_eq!(faults[0].code, FaultCode::Xid(54));
    }

    #[test]
    fn failed_source_shows_in_summary() {
        let mut m = model();
        assert!(m.apply(Observation::Source(
            SourceKind::Kmsg,
            SourceState::Failed("denied".into())
        )));
        assert!(!m.apply(Observation::Source(
            SourceKind::Kmsg,
            SourceState::Failed("denied".into())
        )));
        assert_eq!(
            m.snapshot(KmsgStats::default()).summary,
            "4 GPUs, healthy; kmsg failed"
        );
    }

    fn on_boot(boot: &str, state: Option<PersistedState>) -> HealthModel {
        let mut m = HealthModel::new(
            &node_a(),
            boot,
            NvidiaDevices::default(),
            Duration::from_secs(60),
        );
        if let Some(state) = state {
            m.restore(state);
        }
        m
    }

    fn nvml_sees(m: &mut HealthModel, address: &str, uuid: &str) {
        m.apply(Observation::Poll {
            source: SourceKind::Nvml,
            faults: Vec::new(),
            partial: Vec::new(),
            inventory: crate::model::Inventory::Gpus {
                gpus: vec![GpuIdentity {
                    pci: Some(pci(address)),
                    uuid: Some(uuid.into()),
                    ..GpuIdentity::default()
                }],
                driver_version: None,
            },
        });
    }

    /// Review 2026-12-03b, old L3: history was kept by PCI slot, so after an EC2 stop/start
    /// onto new GPUs the old GPU's `replace` condemned the new one.
    #[test]
    fn another_gpu_in_the_slot_does_not_inherit_the_old_ones_history() {
        let slot = "0000:18:00.0";
        // Boot 1: GPU-A in the slot, Xid 54 (replace), and Xid 79 sightings.
        let mut m = on_boot("boot-1", None);
        nvml_sees(&mut m, slot, "GPU-A");
        m.apply(xid("0000:18:00", 54, 1));
        m.apply(xid("0000:18:00", 79, 2));
        // Boot 2, same GPU: the replace stays.
        let mut m = on_boot("boot-2", Some(m.persisted()));
        nvml_sees(&mut m, slot, "GPU-A");
        m.apply(xid("0000:18:00", 79, 1));
        let faults = m.snapshot(KmsgStats::default()).faults;
        assert!(
            faults.iter().any(|f| f.code == FaultCode::Xid(54)),
            "{faults:?}"
        );
        // Boot 3, another GPU in the slot (stop/start): the Xid 79 of this boot is the new
        // GPU's and stays; the replace and the earlier boots' sightings are gone.
        let mut m = on_boot("boot-3", Some(m.persisted()));
        m.apply(xid("0000:18:00", 79, 1));
        nvml_sees(&mut m, slot, "GPU-B");
        let faults = m.snapshot(KmsgStats::default()).faults;
        assert_eq!(
            faults.iter().map(|f| f.code).collect::<Vec<_>>(),
            [FaultCode::Xid(79)]
        );
        assert_eq!(
            faults[0].class.action,
            classify_xid(79, "", DriverBranch::Unknown).action,
            "one boot's sighting of the new GPU escalates nothing"
        );
        let state = m.persisted();
        assert_eq!(
            state.gpus.get("0000:18:00").map(String::as_str),
            Some("GPU-B")
        );
        assert!(state
            .recurrence
            .values()
            .flatten()
            .all(|b| b.boot_id == "boot-3"));
    }

    #[test]
    fn a_fault_recurring_across_reboots_escalates_to_replace() {
        let mut m = on_boot("boot-1", None);
        m.apply(xid("0000:18:00", 79, 1));
        let mut m = on_boot("boot-2", Some(m.persisted()));
        assert!(
            m.snapshot(KmsgStats::default()).faults.is_empty(),
            "a reboot cleared it"
        );
        m.apply(xid("0000:18:00", 79, 1));
        assert_eq!(
            m.snapshot(KmsgStats::default()).faults[0].class.action,
            Action::Reboot
        );
        let mut m = on_boot("boot-3", Some(m.persisted()));
        m.apply(xid("0000:18:00", 79, 1));
        let f = &m.snapshot(KmsgStats::default()).faults[0];
        assert_eq!(f.class.action, Action::Replace);
        assert!(
            f.escalated
                .as_deref()
                .is_some_and(|e| e.contains("recurred in 3 boots")),
            "{:?}",
            f.escalated
        );
        // Replace survives the next reboot.
        let m = on_boot("boot-4", Some(m.persisted()));
        assert_eq!(m.snapshot(KmsgStats::default()).faults.len(), 1);
    }

    #[test]
    fn clear_by_reason_code_label_or_all() {
        let mut m = model();
        m.apply(xid("0000:18:00", 79, 1));
        m.apply(xid("0000:2a:00", 48, 2));
        m.apply(xid("0000:3a:00", 13, 3));
        assert!(m.clear(Some("NvidiaXID999Error")).is_empty());
        assert_eq!(m.clear(Some("nvidiaxid79error")), ["GPU 0 Xid 79"]);
        assert_eq!(m.clear(Some("xid-48")), ["GPU 1 Xid 48"]);
        assert_eq!(m.clear(None), ["GPU 2 Xid 13"]);
        assert!(
            m.persisted().recurrence.is_empty(),
            "history goes with the repair"
        );
    }

    #[test]
    fn an_application_xid_storm_never_condemns_the_node() {
        let mut m = model();
        let t0 = SystemTime::UNIX_EPOCH;
        // One job crashing over and over, on every GPU: Xid 13, 31, 43, 45 (NVIDIA:
        // restart the application), thousands of times.
        for i in 0..2_000u32 {
            let gpu = ["0000:18:00", "0000:2a:00", "0000:3a:00", "0000:5d:00"][i as usize % 4];
            let code = [13, 31, 43, 45][i as usize % 4 / 2 + (i as usize % 2) * 2];
            m.apply_line(
                &format!("NVRM: Xid (PCI:{gpu}): {code}, pid={i}, name=python3, Ch 00000008"),
                t0 + Duration::from_millis(u64::from(i)),
            );
        }
        let s = m.snapshot(KmsgStats::default());
        assert_ne!(s.health, Health::Fatal, "{}", s.summary);
        assert!(s.faults.iter().all(|f| f.class.severity < Severity::Fatal));
        assert!(
            s.faults.len() <= 16,
            "one fault per GPU and code: {}",
            s.faults.len()
        );
        assert_eq!(s.faults.iter().map(|f| f.count).sum::<u64>(), 2_000);
    }

    #[test]
    fn a_paired_all_clear_clears_its_fault() {
        let mut m = model();
        let t0 = SystemTime::UNIX_EPOCH;
        m.apply_line("NVRM: Xid (PCI:0000:18:00): 163, PSHC disengaged", t0);
        m.apply_line("NVRM: Xid (PCI:0000:2a:00): 163, PSHC disengaged", t0);
        assert!(m
            .snapshot(KmsgStats::default())
            .faults
            .iter()
            .any(|f| f.code == FaultCode::Xid(163)));
        m.apply_line("NVRM: Xid (PCI:0000:18:00): 162, PSHC reengaged", t0);
        let faults = m.snapshot(KmsgStats::default()).faults;
        let on = |gpu: &str| {
            faults.iter().any(|f| {
                f.code == FaultCode::Xid(163) && f.component == Component::Gpu { pci: pci(gpu) }
            })
        };
        assert!(!on("0000:18:00.0"), "cleared by its re-engaged Xid");
        assert!(on("0000:2a:00.0"), "another GPU's stays");
    }

    #[test]
    fn repeated_episodes_in_one_boot_escalate_a_reset_to_a_reboot_never_to_replace() {
        let mut m = model();
        m.set_escalation(3, 5, Duration::from_secs(24 * 3600));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let line = "NVRM: Xid (PCI:0000:18:00): 48, pid=1, DBE (double bit error)";
        // A burst of a hundred lines is one episode.
        for i in 0..100 {
            m.apply_line(line, t0 + Duration::from_millis(i));
        }
        let f = |m: &HealthModel| m.snapshot(KmsgStats::default()).faults[0].clone();
        assert_eq!(
            (f(&m).class.action, f(&m).escalated.clone()),
            (Action::ResetGpu, None)
        );
        // Four more episodes, an hour apart: five within a day.
        for h in 1..=4 {
            m.apply_line(line, t0 + Duration::from_secs(3600 * h));
        }
        let fault = f(&m);
        assert_eq!(fault.class.action, Action::Reboot);
        assert!(
            fault
                .escalated
                .as_deref()
                .is_some_and(|e| e.contains("5 episodes")),
            "{:?}",
            fault.escalated
        );
        // The reboot fixed it: nothing survives into the next boot.
        let m = on_boot("boot-2", Some(m.persisted()));
        assert!(m.snapshot(KmsgStats::default()).faults.is_empty());
    }

    /// Issue 22: four minutes of Xid 119 every few seconds counted as five episodes (the
    /// gap was measured from the episode's start) and escalated to a replace that survived
    /// the reboot that fixed it.
    #[test]
    fn a_storm_of_any_length_is_one_episode() {
        let mut m = model();
        m.set_escalation(3, 5, Duration::from_secs(24 * 3600));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let line = "NVRM: Xid (PCI:0000:18:00): 119, pid=1, Timeout after 6s of waiting for RPC response from GPU0 GSP!";
        for i in 0..48 {
            m.apply_line(line, t0 + Duration::from_secs(5 * i));
        }
        let fault = m.snapshot(KmsgStats::default()).faults[0].clone();
        assert_eq!(fault.count, 48);
        assert_eq!(
            (fault.class.action, fault.escalated),
            (Action::ResetGpu, None)
        );
        let m = on_boot("boot-2", Some(m.persisted()));
        assert!(
            m.snapshot(KmsgStats::default()).faults.is_empty(),
            "the reboot fixed it"
        );
    }

    #[test]
    fn boots_outside_the_window_do_not_escalate() {
        let day = Duration::from_secs(24 * 3600);
        let line = "NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.";
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000_000);
        let mut state = None;
        for (boot, days) in [("boot-1", 0), ("boot-2", 3), ("boot-3", 6)] {
            let mut m = on_boot(boot, state.take());
            m.set_escalation(3, 5, 4 * day);
            m.apply_line(line, t0 + day * days);
            let f = m.snapshot(KmsgStats::default()).faults[0].clone();
            assert_eq!(f.class.action, Action::Reboot, "{boot}: {:?}", f.escalated);
            state = Some(m.persisted());
        }
        // A fourth boot one day later: boots 2, 3 and 4 lie within four days.
        let mut m = on_boot("boot-4", state);
        m.set_escalation(3, 5, 4 * day);
        m.apply_line(line, t0 + day * 7);
        let f = m.snapshot(KmsgStats::default()).faults[0].clone();
        assert_eq!(f.class.action, Action::Replace);
        assert!(f
            .escalated
            .as_deref()
            .is_some_and(|e| e.contains("recurred in 3 boots within 4days")));
    }

    #[test]
    fn a_replace_escalated_without_boots_is_dropped_at_the_next_boot() {
        // A state file written before the storm fix: replace escalated within one boot.
        let mut m = model();
        m.apply(xid("0000:18:00", 119, 1));
        let mut state = m.persisted();
        state.faults[0].class.action = Action::Replace;
        state.faults[0].escalated = Some("5 episodes within 1day".into());
        state.faults.push({
            // A catalog replace (not escalated) always survives.
            let mut m = model();
            m.apply(xid("0000:2a:00", 54, 2));
            m.persisted().faults[0].clone()
        });
        let m = on_boot("boot-2", Some(state));
        let faults = m.snapshot(KmsgStats::default()).faults;
        assert_eq!(faults.len(), 1);
        assert_eq!(faults[0].code, FaultCode::Xid(54));
    }

    #[test]
    fn clear_forgets_the_episodes_too() {
        let mut m = model();
        m.set_escalation(3, 2, Duration::from_secs(24 * 3600));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let line = "NVRM: Xid (PCI:0000:18:00): 48, pid=1, DBE (double bit error)";
        m.apply_line(line, t0);
        m.clear(None);
        m.apply_line(line, t0 + Duration::from_secs(3600));
        let f = m.snapshot(KmsgStats::default()).faults[0].clone();
        assert_eq!((f.class.action, f.escalated), (Action::ResetGpu, None));
    }

    #[test]
    fn the_pending_end_is_the_one_acted_on_first() {
        use crate::model::{Notice, NoticeKind};
        let mut m = model();
        m.set_leads([(NoticeKind::ScheduledMaintenance, Duration::from_secs(600))].into());
        let now = SystemTime::now();
        let notice = |id: &str, kind, deadline| Notice {
            id: id.into(),
            kind,
            deadline,
            detail: String::new(),
            source: SourceKind::Imds,
        };
        m.apply(Observation::Notices {
            source: SourceKind::Imds,
            notices: vec![notice(
                "maintenance",
                NoticeKind::ScheduledMaintenance,
                now + Duration::from_secs(3 * 86_400),
            )],
        });
        let end = m.snapshot(KmsgStats::default()).pending_end.expect("end");
        assert_eq!(end.kind, "scheduled-maintenance");
        // A Spot notice is acted on at once, whatever its own time says.
        m.apply(Observation::Notices {
            source: SourceKind::Imds,
            notices: vec![
                notice(
                    "maintenance",
                    NoticeKind::ScheduledMaintenance,
                    now + Duration::from_secs(3 * 86_400),
                ),
                notice(
                    "spot",
                    NoticeKind::Spot,
                    now + Duration::from_secs(4 * 86_400),
                ),
            ],
        });
        let end = m.snapshot(KmsgStats::default()).pending_end.expect("end");
        assert_eq!((end.kind.as_str(), end.act_at), ("spot", None));
    }

    /// Issue 22: NVML's Xid event (code only) arriving before the kernel-log line dropped
    /// the line's decoded verdict: a fatal NVLink5 error stayed a warning.
    #[test]
    fn the_kernel_logs_decoded_verdict_stands_when_nvml_came_first() {
        let mut m = model();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let pci = pci("0000:18:00.0");
        m.apply(Observation::Fault(crate::sources::nvml::events::report(
            pci,
            149,
            crate::catalog::DriverBranch::Unknown,
            at,
        )));
        let first = m.snapshot(KmsgStats::default()).faults[0].clone();
        assert_eq!(
            first.class.severity,
            Severity::Warning,
            "NVML knows only the code"
        );
        m.apply_line(
            "NVRM: Xid (PCI:0000:18:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 04 (0x004505c6 0x00000000 0x00000000)",
            at + Duration::from_secs(1),
        );
        let faults = m.snapshot(KmsgStats::default()).faults;
        assert_eq!(faults.len(), 1, "one occurrence");
        assert_eq!(faults[0].count, 1);
        assert_eq!(
            faults[0].class.severity,
            Severity::Fatal,
            "{:?}",
            faults[0].class
        );
        assert!(
            faults[0].detail.contains("NETIR_LINK_EVT"),
            "{}",
            faults[0].detail
        );
    }

    /// A kernel-log report of Xid `code` on `pci` with the given verdict (as a decoded line
    /// would give it), or NVML's event of it when `nvml`.
    fn occurrence(
        pci: PciAddress,
        code: u32,
        nvml: bool,
        severity: Severity,
        at: SystemTime,
    ) -> Observation {
        let mut report = crate::sources::nvml::events::report(
            pci,
            code,
            crate::catalog::DriverBranch::Unknown,
            at,
        );
        if !nvml {
            report.source = SourceKind::Kmsg;
            report.detail = format!("NVRM: Xid {code} decoded as {severity:?}");
        }
        report.class.severity = severity;
        report.class.action = if severity == Severity::Fatal {
            Action::ResetGpu
        } else {
            Action::None
        };
        Observation::Fault(report)
    }

    /// Review 2026-12-03b M2: a later occurrence that NVML reports first and the kernel log
    /// decodes as milder must not downgrade what an earlier occurrence latched as fatal.
    #[test]
    fn a_milder_kernel_log_verdict_never_downgrades_a_latched_fatal_fault() {
        let mut m = model();
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let gpu = pci("0000:18:00.0");
        m.apply(occurrence(gpu, 145, true, Severity::Warning, t));
        m.apply(occurrence(
            gpu,
            145,
            false,
            Severity::Fatal,
            t + Duration::from_secs(1),
        ));
        assert_eq!(
            m.faults.values().next().map(|f| f.class.severity),
            Some(Severity::Fatal)
        );
        // Hours later the same code again, NVML first, then a Nonfatal line.
        let later = t + Duration::from_secs(3_600);
        m.apply(occurrence(gpu, 145, true, Severity::Warning, later));
        m.apply(occurrence(
            gpu,
            145,
            false,
            Severity::Warning,
            later + Duration::from_secs(1),
        ));
        let faults = m.snapshot(KmsgStats::default()).faults;
        assert_eq!(faults.len(), 1);
        assert_eq!(faults[0].count, 2, "two occurrences, each counted once");
        assert_eq!(
            faults[0].class.severity,
            Severity::Fatal,
            "{:?}",
            faults[0].class
        );
        assert_eq!(faults[0].class.action, Action::ResetGpu);
    }

    /// Xid 154 "to None" is the driver's explicit all-clear for Xid 154, not a milder
    /// verdict that happens to win a race; the NVML event of that same line changes nothing.
    /// The driver's recovery action back to None (NVML's poll) ends the GPU-confined
    /// occurrences latched on that GPU, never a GPU gone or another GPU's.
    #[test]
    fn recovery_action_none_ends_the_gpus_confined_faults() {
        let mut m = model();
        m.apply(xid("0000:18:00", 48, 1));
        m.apply(xid("0000:18:00", 13, 2));
        m.apply(xid("0000:2a:00", 13, 3));
        m.apply(xid("0000:3a:00", 79, 4));
        let gpu = pci("0000:18:00.0");
        let poll = |faults: Vec<FaultReport>, recovery_action: Option<u32>| Observation::Poll {
            source: SourceKind::Nvml,
            faults,
            partial: Vec::new(),
            inventory: crate::model::Inventory::Gpus {
                gpus: vec![GpuIdentity {
                    pci: Some(gpu),
                    uuid: Some("GPU-a".into()),
                    telemetry: crate::model::GpuTelemetry {
                        recovery_action,
                        ..Default::default()
                    },
                    ..GpuIdentity::default()
                }],
                driver_version: None,
            },
        };
        let reset = FaultReport {
            component: Component::Gpu { pci: gpu },
            code: FaultCode::RecoveryAction,
            class: crate::model::Classification {
                name: "GPU_RECOVERY_ACTION_GPU_RESET".into(),
                description: String::new(),
                nvidia_action: String::new(),
                severity: Severity::Fatal,
                action: Action::ResetGpu,
            },
            source: SourceKind::Nvml,
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(5),
            detail: "reset".into(),
            cursor: None,
            drill: false,
        };
        // No recovery action ever asked for: a None poll is no evidence.
        m.apply(poll(Vec::new(), Some(0)));
        assert_eq!(m.snapshot(KmsgStats::default()).faults.len(), 4);
        // The field gone unreadable (the GPU lost, a driver that stops answering it) is
        // no recovery: the recovery-action condition ends, the latched Xids stay.
        m.apply(poll(vec![reset.clone()], Some(1)));
        m.apply(poll(Vec::new(), None));
        assert_eq!(m.snapshot(KmsgStats::default()).faults.len(), 4);
        // An explicit read of None ends them.
        m.apply(poll(vec![reset], Some(1)));
        m.apply(poll(Vec::new(), Some(0)));
        let left: Vec<String> = m
            .snapshot(KmsgStats::default())
            .faults
            .iter()
            .map(Fault::label)
            .collect();
        assert_eq!(left, ["GPU 2 Xid 79", "GPU 1 Xid 13"]);
    }

    #[test]
    fn xid_154_to_none_clears_xid_154_explicitly() {
        let mut m = model();
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        m.apply_line(
            "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            t,
        );
        let fault = m.snapshot(KmsgStats::default()).faults[0].clone();
        assert_eq!(
            (fault.class.severity, fault.class.action),
            (Severity::Fatal, Action::Reboot)
        );
        // NVML's event of a later 154 (no text: a warning) does not soften it.
        let gpu = pci("0000:18:00.0");
        let later = t + Duration::from_secs(600);
        m.apply(Observation::Fault(crate::sources::nvml::events::report(
            gpu,
            154,
            crate::catalog::DriverBranch::Unknown,
            later,
        )));
        assert_eq!(
            m.snapshot(KmsgStats::default()).faults[0].class.severity,
            Severity::Fatal
        );
        m.apply_line(
            "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)",
            later + Duration::from_secs(1),
        );
        assert!(
            m.snapshot(KmsgStats::default()).faults.is_empty(),
            "cleared by the driver"
        );
        // The all-clear seen first by the kernel log: NVML's event of it is the same line.
        m.apply(Observation::Fault(crate::sources::nvml::events::report(
            gpu,
            154,
            crate::catalog::DriverBranch::Unknown,
            later + Duration::from_secs(2),
        )));
        assert!(m.snapshot(KmsgStats::default()).faults.is_empty());
    }

    proptest::proptest! {
        /// Over random sequences of one fault's reports from both paths, at random gaps: once
        /// a fatal verdict is latched (its occurrence over: the next report is another
        /// occurrence, or the kernel log has spoken for it), no later report makes the fault
        /// milder or removes it. Only evidence does (clear, the driver's all-clear, a boot),
        /// and these sequences hold none.
        #[test]
        fn a_latched_fatal_fault_never_becomes_milder_without_evidence(
            steps in proptest::collection::vec(
                (proptest::bool::ANY, 0u8..3, 0u64..30),
                1..40,
            )
        ) {
            let mut m = model();
            let gpu = pci("0000:18:00.0");
            let mut at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
            let mut latched = false;
            let mut last: Option<(bool, SystemTime)> = None;
            for (nvml, severity, gap) in steps {
                at += Duration::from_secs(gap);
                let severity = [Severity::Info, Severity::Warning, Severity::Fatal][usize::from(severity)];
                let fatal_now = m.faults.values().next().is_some_and(|f| f.class.severity == Severity::Fatal);
                let settled = last.is_some_and(|(was_nvml, then)| {
                    !was_nvml || at.duration_since(then).unwrap_or_default() > SAME_OCCURRENCE
                });
                latched |= fatal_now && settled;
                m.apply(occurrence(gpu, 145, nvml, severity, at));
                last = Some((nvml, at));
                if latched {
                    let class = m.faults.values().next().map(|f| (f.class.severity, f.class.action));
                    proptest::prop_assert_eq!(class, Some((Severity::Fatal, Action::ResetGpu)));
                }
            }
        }
    }

    #[test]
    fn drills_never_escalate_and_never_outlive_their_boot() {
        let drill = |m: &mut HealthModel| {
            let Observation::Fault(mut report) = xid("0000:18:00", 79, 1) else {
                unreachable!()
            };
            report.drill = true;
            m.apply(Observation::Fault(report));
        };
        let mut m = on_boot("boot-1", None);
        drill(&mut m);
        for boot in ["boot-2", "boot-3", "boot-4"] {
            m = on_boot(boot, Some(m.persisted()));
            drill(&mut m);
        }
        let f = m.snapshot(KmsgStats::default()).faults[0].clone();
        assert_eq!(
            (f.class.action, f.escalated, f.drill),
            (Action::Reboot, None, true)
        );
        let m = on_boot("boot-5", Some(m.persisted()));
        assert!(m.snapshot(KmsgStats::default()).faults.is_empty());
    }

    mod random_lives {
        //! Random observation sequences (faults, clears, restarts, reboots) through the model.
        use super::*;
        use proptest::prelude::*;
        use std::collections::{BTreeSet, HashMap};

        #[derive(Debug, Clone)]
        enum Step {
            /// An Xid on a GPU, `after` seconds after the previous step.
            Xid {
                gpu: usize,
                code: u32,
                after: u64,
            },
            Clear,
            Restart,
            Reboot,
        }

        const GPUS: [&str; 3] = ["0000:18:00", "0000:2a:00", "0000:3a:00"];
        // Reboot (79), reset (48, 119, 95), application (13) and catalog replace (54).
        const CODES: [u32; 6] = [79, 48, 119, 95, 13, 54];

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                8 => (0..GPUS.len(), 0..CODES.len(), prop_oneof![0..5u64, 0..200u64, 0..200_000u64])
                    .prop_map(|(gpu, code, after)| Step::Xid { gpu, code: CODES[code], after }),
                1 => Just(Step::Clear),
                2 => Just(Step::Restart),
                2 => Just(Step::Reboot),
            ]
        }

        fn fatal_set(m: &HealthModel) -> BTreeSet<(String, Action)> {
            m.snapshot(KmsgStats::default())
                .faults
                .iter()
                .filter(|f| f.class.severity == Severity::Fatal)
                .map(|f| (f.label(), f.class.action))
                .collect()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn no_replace_without_recurrence_across_boots_and_no_fatal_lost_on_restart(
                steps in prop::collection::vec(step(), 1..120),
            ) {
                let boots_needed = 3;
                let mut boot = 0u32;
                let mut m = on_boot("boot-0", None);
                m.set_escalation(3, 5, Duration::from_secs(24 * 3600));
                let mut now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
                // The boots each fault was seen in since the last clear.
                let mut seen: HashMap<(usize, u32), BTreeSet<u32>> = HashMap::new();
                for step in steps {
                    match step {
                        Step::Xid { gpu, code, after } => {
                            now += Duration::from_secs(after);
                            seen.entry((gpu, code)).or_default().insert(boot);
                            m.apply_line(
                                &format!("NVRM: Xid (PCI:{}): {code}, pid=1, x", GPUS[gpu]),
                                now,
                            );
                        }
                        Step::Clear => {
                            m.clear(None);
                            seen.clear();
                        }
                        Step::Restart => {
                            let before = fatal_set(&m);
                            let state = m.persisted();
                            m = on_boot(&format!("boot-{boot}"), Some(state));
                            m.set_escalation(3, 5, Duration::from_secs(24 * 3600));
                            prop_assert_eq!(fatal_set(&m), before, "a restart lost or changed a fatal fault");
                        }
                        Step::Reboot => {
                            let replace: BTreeSet<_> = fatal_set(&m)
                                .into_iter()
                                .filter(|(_, a)| *a == Action::Replace)
                                .collect();
                            boot += 1;
                            now += Duration::from_secs(120);
                            let state = m.persisted();
                            m = on_boot(&format!("boot-{boot}"), Some(state));
                            m.set_escalation(3, 5, Duration::from_secs(24 * 3600));
                            let after = fatal_set(&m);
                            prop_assert!(replace.is_subset(&after), "a replace was lost at a reboot");
                        }
                    }
                    for f in m.snapshot(KmsgStats::default()).faults {
                        if f.class.action == Action::Replace && f.escalated.is_some() {
                            let gpu = GPUS.iter().position(|g| f.component == Component::Gpu { pci: pci(g) });
                            let code = match f.code { FaultCode::Xid(c) => c, _ => 0 };
                            let boots = gpu.and_then(|g| seen.get(&(g, code))).map_or(0, BTreeSet::len);
                            prop_assert!(
                                boots >= boots_needed,
                                "{} escalated to replace after {} boot(s): {:?}",
                                f.label(), boots, f.escalated
                            );
                        }
                    }
                }
            }
        }
    }
}
