//! Node lifecycle conditions (KEP-5683): `MaintenancePlanned` and `MaintenanceInProgress`,
//! the two "admin managed" types an outside writer may own. So the agent writes `True` only
//! while it has an end to report, and `False` only over a `True` that carries one of its own
//! reasons ([`is_ours`], read from the server just before): another writer's condition, on
//! a heartbeat or otherwise, is never touched. (`GracefulNodeShutdownInProgress`,
//! `DrainInProgress` and `Drained` are the kubelet's own and never written.) The conditions
//! carry no time, so the planned end's deadline is in the message and, machine-readable, in
//! the node annotation [`DEADLINE_ANNOTATION`]. Pure: no Kubernetes types.

use std::time::SystemTime;

use super::conditions::{ends_at, truncate, Desired};
use crate::model::{HealthSnapshot, Notice, NoticeKind};

/// A known end of the instance is coming.
pub const PLANNED: &str = "MaintenancePlanned";
/// The end is being acted on now.
pub const IN_PROGRESS: &str = "MaintenanceInProgress";
/// The planned end's deadline, RFC 3339 (absent when nothing is planned).
pub const DEADLINE_ANNOTATION: &str = "gpu-agent.io/maintenance-deadline";

/// The CamelCase reason for an end of this kind.
pub fn reason(kind: NoticeKind) -> &'static str {
    match kind {
        NoticeKind::Spot => "SpotInterruption",
        NoticeKind::Rebalance => "RebalanceRecommendation",
        NoticeKind::ScheduledMaintenance => "ScheduledMaintenance",
        NoticeKind::CapacityBlock => "CapacityBlockEnd",
        NoticeKind::Shutdown => "NodeShutdown",
        NoticeKind::FatalFault => "FatalFault",
    }
}

/// Is `type_` one of the two lifecycle conditions?
pub fn is_lifecycle(type_: &str) -> bool {
    type_ == PLANNED || type_ == IN_PROGRESS
}

/// Does a `True` lifecycle condition with `reason` come from this agent?
pub fn is_ours(reason: &str) -> bool {
    reason == UNKNOWN_END || NoticeKind::ALL.iter().any(|k| self::reason(*k) == reason)
}

/// The reason of an end being acted on whose kind is not known by name.
const UNKNOWN_END: &str = "InstanceEnding";

/// The planned end: the earliest notice that ends the instance (a rebalance recommendation
/// too, where `rebalance` says so).
fn planned(snapshot: &HealthSnapshot, rebalance: bool) -> Option<&Notice> {
    snapshot
        .notices
        .iter()
        .filter(|n| n.kind.ends_instance() || (rebalance && n.kind == NoticeKind::Rebalance))
        .min_by_key(|n| n.deadline)
}

/// The deadline annotation's value for `snapshot`; `None`: no end planned (remove it).
pub fn deadline(snapshot: &HealthSnapshot, rebalance: bool) -> Option<String> {
    planned(snapshot, rebalance).map(|n| crate::model::time::rfc3339(n.deadline))
}

/// Both conditions for `snapshot` at `now`.
pub fn desired(snapshot: &HealthSnapshot, rebalance: bool, now: SystemTime) -> [Desired; 2] {
    let planned = match planned(snapshot, rebalance) {
        Some(n) => Desired {
            type_: PLANNED.into(),
            status: "True",
            reason: reason(n.kind).into(),
            message: truncate(&format!(
                "{} {} {}: {}",
                n.kind,
                if n.kind == NoticeKind::Rebalance {
                    "recommended at"
                } else {
                    "at"
                },
                crate::model::time::rfc3339(n.deadline),
                n.detail
            )),
        },
        None => Desired {
            type_: PLANNED.into(),
            status: "False",
            reason: "NoMaintenancePlanned".into(),
            message:
                "no Spot notice, scheduled maintenance, Capacity Block end or shutdown pending"
                    .into(),
        },
    };
    let in_progress = match snapshot.pending_end.as_ref().filter(|e| e.due(now)) {
        Some(end) => Desired {
            type_: IN_PROGRESS.into(),
            status: "True",
            reason: NoticeKind::ALL
                .iter()
                .find(|k| k.name() == end.kind)
                .map_or(UNKNOWN_END, |k| reason(*k))
                .into(),
            message: ends_at(end),
        },
        None => Desired {
            type_: IN_PROGRESS.into(),
            status: "False",
            reason: "NoMaintenanceInProgress".into(),
            message: "no end of the instance is being acted on".into(),
        },
    };
    [planned, in_progress]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::{PendingEnd, SourceKind};

    fn notice(kind: NoticeKind, deadline: SystemTime) -> Notice {
        Notice {
            id: format!("{kind}-1"),
            kind,
            deadline,
            detail: "from the test".into(),
            source: SourceKind::Imds,
        }
    }

    fn snapshot(notices: Vec<Notice>, pending: Option<PendingEnd>) -> HealthSnapshot {
        let mut s =
            crate::core::HealthModel::for_test().snapshot(crate::model::KmsgStats::default());
        s.notices = notices;
        s.pending_end = pending;
        s
    }

    fn end(kind: &str, deadline: SystemTime, act_at: Option<SystemTime>) -> PendingEnd {
        PendingEnd {
            kind: kind.into(),
            deadline,
            detail: "from the test".into(),
            signalled: 0,
            act_at,
            lead_from: None,
            covered_by: None,
            waiting_for: Vec::new(),
        }
    }

    #[test]
    fn nothing_pending_is_both_false() {
        let now = SystemTime::now();
        let [planned, in_progress] = desired(&snapshot(Vec::new(), None), false, now);
        assert_eq!(
            (planned.status, planned.reason.as_str()),
            ("False", "NoMaintenancePlanned")
        );
        assert_eq!(
            (in_progress.status, in_progress.reason.as_str()),
            ("False", "NoMaintenanceInProgress")
        );
        assert_eq!(deadline(&snapshot(Vec::new(), None), false), None);
    }

    #[test]
    fn maintenance_days_ahead_is_planned_at_once_and_in_progress_only_at_its_act_time() {
        let now = SystemTime::now();
        let at = now + Duration::from_secs(3 * 86_400);
        let act = at - Duration::from_secs(900);
        let s = snapshot(
            vec![notice(NoticeKind::ScheduledMaintenance, at)],
            Some(end("scheduled-maintenance", at, Some(act))),
        );
        let [planned, in_progress] = desired(&s, false, now);
        assert_eq!(
            (planned.status, planned.reason.as_str()),
            ("True", "ScheduledMaintenance")
        );
        let rfc = crate::model::time::rfc3339(at);
        assert!(planned.message.contains(&rfc), "{}", planned.message);
        assert_eq!(deadline(&s, false), Some(rfc));
        assert_eq!(in_progress.status, "False");
        let [_, in_progress] = desired(&s, false, act + Duration::from_secs(1));
        assert_eq!(
            (in_progress.status, in_progress.reason.as_str()),
            ("True", "ScheduledMaintenance")
        );
    }

    #[test]
    fn a_spot_notice_is_planned_and_in_progress_at_once() {
        let now = SystemTime::now();
        let at = now + Duration::from_secs(120);
        let s = snapshot(
            vec![notice(NoticeKind::Spot, at)],
            Some(end("spot", at, None)),
        );
        let [planned, in_progress] = desired(&s, false, now);
        assert_eq!(planned.reason, "SpotInterruption");
        assert_eq!(
            (in_progress.status, in_progress.reason.as_str()),
            ("True", "SpotInterruption")
        );
    }

    #[test]
    fn a_rebalance_recommendation_plans_maintenance_only_when_opted_in() {
        let now = SystemTime::now();
        let s = snapshot(vec![notice(NoticeKind::Rebalance, now)], None);
        assert_eq!(desired(&s, false, now)[0].status, "False");
        let [planned, _] = desired(&s, true, now);
        assert_eq!(
            (planned.status, planned.reason.as_str()),
            ("True", "RebalanceRecommendation")
        );
        assert!(
            planned.message.contains("recommended at"),
            "{}",
            planned.message
        );
    }

    #[test]
    fn the_earliest_end_is_the_planned_one() {
        let now = SystemTime::now();
        let cb = now + Duration::from_secs(7200);
        let sm = now + Duration::from_secs(3600);
        let s = snapshot(
            vec![
                notice(NoticeKind::CapacityBlock, cb),
                notice(NoticeKind::ScheduledMaintenance, sm),
            ],
            None,
        );
        assert_eq!(desired(&s, false, now)[0].reason, "ScheduledMaintenance");
        assert_eq!(deadline(&s, false), Some(crate::model::time::rfc3339(sm)));
    }
}
