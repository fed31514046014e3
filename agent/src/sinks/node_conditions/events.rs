//! Node Events for warning and fatal faults: one Event per fault, with a deterministic name,
//! updated with the fault's count rather than a new Event per occurrence.

use std::collections::HashMap;
use std::time::Instant;

use crate::model::{Fault, Severity};
use crate::sinks::kubernetes::events::{
    event_name, update_of, EventText, EventWrite, UPDATE_EVERY,
};

/// What was last sent for each fault's Event.
#[derive(Debug, Default)]
pub struct Posted {
    sent: HashMap<String, (u64, Instant)>,
}

impl Posted {
    /// The writes needed to bring Events up to date with `faults`.
    pub fn pending(
        &self,
        node: &str,
        node_uid: &str,
        faults: &[Fault],
        now: Instant,
    ) -> Vec<EventWrite> {
        let mut out = Vec::new();
        for f in faults
            .iter()
            .filter(|f| f.class.severity >= Severity::Warning)
        {
            let name = event_name(node, f);
            let message = format!(
                "{}: {} ({}), action {}: {}",
                f.label(),
                f.class.name,
                f.class.severity,
                f.class.action,
                f.detail
            );
            let reason = f.reason();
            let full = || {
                crate::sinks::kubernetes::events::build(
                    &name,
                    "default",
                    serde_json::json!({ "apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid }),
                    &EventText {
                        reason: &reason,
                        type_: if matches!(f.class.severity, Severity::Fatal | Severity::Warning) {
                            "Warning"
                        } else {
                            "Normal"
                        },
                        message: &message,
                        count: f.count,
                        first: f.first_seen,
                        last: f.last_seen,
                    },
                    node,
                )
            };
            match self.sent.get(&name) {
                None => out.push(EventWrite::Create {
                    body: full(),
                    name,
                    count: f.count,
                }),
                Some((count, at))
                    if f.count > *count && now.duration_since(*at) >= UPDATE_EVERY =>
                {
                    let full = full();
                    out.push(EventWrite::Update {
                        body: update_of(&full),
                        full,
                        name,
                        count: f.count,
                    });
                }
                Some(_) => {}
            }
        }
        out
    }

    /// Record a successful write.
    pub fn sent(&mut self, name: &str, count: u64, now: Instant) {
        self.sent.insert(name.to_string(), (count, now));
    }

    /// Forget Events whose faults are gone (bounded by the model's fault limit).
    pub fn retain(&mut self, node: &str, faults: &[Fault]) {
        let live: std::collections::HashSet<String> =
            faults.iter().map(|f| event_name(node, f)).collect();
        self.sent.retain(|name, _| live.contains(name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::HealthModel;
    use crate::model::KmsgStats;
    use std::time::{Duration, SystemTime};

    #[test]
    fn one_event_per_fault_updated_not_duplicated() {
        let mut model = HealthModel::for_test();
        let line = "NVRM: Xid (PCI:0000:3b:00): 95, pid=1, Uncontained";
        let add = |m: &mut HealthModel| m.apply_line(line, SystemTime::now());
        add(&mut model);
        let mut posted = Posted::default();
        let t0 = Instant::now();
        let faults = model.snapshot(KmsgStats::default()).faults;
        let writes = posted.pending("node-a", "uid", &faults, t0);
        assert_eq!(writes.len(), 1);
        let EventWrite::Create { body, name, count } = &writes[0] else {
            panic!("create first")
        };
        assert_eq!(body["reason"], "NvidiaXID95Error");
        assert_eq!(body["involvedObject"]["kind"], "Node");
        posted.sent(name, *count, t0);
        for _ in 0..1000 {
            add(&mut model);
        }
        let faults = model.snapshot(KmsgStats::default()).faults;
        assert!(
            posted
                .pending("node-a", "uid", &faults, t0 + Duration::from_secs(1))
                .is_empty(),
            "rate-limited"
        );
        let writes = posted.pending("node-a", "uid", &faults, t0 + UPDATE_EVERY);
        assert!(
            matches!(&writes[..], [EventWrite::Update { count: 1001, .. }]),
            "{writes:?}"
        );
    }

    #[test]
    fn warning_faults_are_warning_events() {
        let mut model = HealthModel::for_test();
        // Xid 13: a warning (the application's fault), still a Warning Event for watchers.
        model.apply_line(
            "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception",
            SystemTime::now(),
        );
        let faults = model.snapshot(KmsgStats::default()).faults;
        let writes = Posted::default().pending("node-a", "uid", &faults, Instant::now());
        let [EventWrite::Create { body, .. }] = &writes[..] else {
            panic!("{writes:?}")
        };
        assert_eq!(body["type"], "Warning", "{body}");
    }
}
