//! One occurrence of a fault, as first one path (NVML, the kernel log) and then maybe the
//! other saw it: which source set its class, and the latch that never lets a later, milder
//! verdict soften what an earlier occurrence found.

use std::time::{Duration, SystemTime};

use crate::model::{FaultReport, SourceKind};

/// The latest occurrence of a fault, as first one path and then maybe the other saw it.
#[derive(Debug, Clone)]
pub(super) struct Occurrence {
    /// The path whose verdict this occurrence carries (the kernel log once it has spoken).
    pub(super) source: SourceKind,
    /// When it was first seen.
    pub(super) at: SystemTime,
    /// Its verdict.
    pub(super) class: crate::model::Classification,
    /// What the fault's earlier occurrences had latched (`None`: this is its first).
    pub(super) before: Option<crate::model::Classification>,
    /// It was the driver's all-clear (the fault is gone).
    pub(super) all_clear: bool,
}

impl Occurrence {
    /// `report`'s occurrence, after earlier ones latched `before`.
    pub(super) fn of(
        report: &FaultReport,
        before: Option<crate::model::Classification>,
        all_clear: bool,
    ) -> Self {
        Self {
            source: report.source,
            at: report.at,
            class: report.class.clone(),
            before,
            all_clear,
        }
    }
}

/// Is `a` a worse verdict than `b` (more severe, or as severe with a harsher action)?
pub(super) fn worse(a: &crate::model::Classification, b: &crate::model::Classification) -> bool {
    (a.severity, a.action) > (b.severity, b.action)
}

/// The fault's class once this occurrence says `now`: the worse of it and what the earlier
/// occurrences latched (`before`), with the harsher of their actions; never milder than
/// `before`.
pub(super) fn latch(
    before: Option<&crate::model::Classification>,
    now: &crate::model::Classification,
) -> crate::model::Classification {
    match before {
        Some(b) => {
            let mut class = if worse(now, b) {
                now.clone()
            } else {
                b.clone()
            };
            class.action = b.action.max(now.action);
            class
        }
        None => now.clone(),
    }
}

/// The same fault reported by two sources this close together is one occurrence.
pub(super) const SAME_OCCURRENCE: Duration = Duration::from_secs(10);
