//! How a workload declares the way it wants to be told: annotations on its pod.
//!
//! - `gpu-agent.io/checkpoint-signal: SIGTERM | SIGUSR1 | SIGUSR2 | none` (any catchable
//!   signal but SIGINT): the signal the pod's GPU processes get, instead of `[checkpoint]
//!   signal` and their `GPU_AGENT_CHECKPOINT_SIGNAL`; `none`: never signalled (it reads the
//!   notice file).
//! - `gpu-agent.io/checkpoint-lead: 120s`: how long its checkpoint takes; a scheduled end is
//!   acted on at `deadline - lead` when that is earlier than the configured lead.
//!
//! A value that does not parse is reported and ignored (the defaults apply): a typo never
//! stops a signal.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use rustix::process::Signal;

use crate::model::signal as signals;

/// The signal annotation.
pub const SIGNAL_ANNOTATION: &str = "gpu-agent.io/checkpoint-signal";
/// The lead annotation.
pub const LEAD_ANNOTATION: &str = "gpu-agent.io/checkpoint-lead";
/// The longest lead a pod may declare: a week (a scheduled event's notice is about two).
pub const MAX_LEAD: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a pod asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Send this signal.
    Signal(Signal),
    /// Send nothing: the pod reads the notice file.
    Nothing,
}

/// One pod's declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// `namespace/name`.
    pub pod: String,
    /// Its signal annotation, if it has a valid one.
    pub ask: Option<Ask>,
    /// Its lead annotation, if it has a valid one.
    pub lead: Option<Duration>,
    /// Annotations that did not parse, and why (ignored: the defaults apply).
    pub problems: Vec<String>,
}

impl Declared {
    /// Read a pod's annotations; `None` when it declares nothing.
    pub fn from_annotations(pod: &str, annotations: &BTreeMap<String, String>) -> Option<Self> {
        let signal = annotations.get(SIGNAL_ANNOTATION).map(|v| v.trim());
        let lead = annotations.get(LEAD_ANNOTATION).map(|v| v.trim());
        if signal.is_none() && lead.is_none() {
            return None;
        }
        let mut problems = Vec::new();
        let ask = signal.and_then(|value| {
            if value.eq_ignore_ascii_case("none") {
                return Some(Ask::Nothing);
            }
            match signals::parse(value) {
                Some(s) => match signals::refused(s) {
                    Some(why) => {
                        problems.push(format!("{SIGNAL_ANNOTATION}: {why}"));
                        None
                    }
                    None => Some(Ask::Signal(s)),
                },
                None => {
                    problems.push(format!(
                        "{SIGNAL_ANNOTATION}: {value:?} is not a catchable signal \
                         (SIGTERM, SIGUSR1, SIGUSR2, ... or none)"
                    ));
                    None
                }
            }
        });
        let lead = lead.and_then(|value| match humantime::parse_duration(value) {
            Ok(d) if d <= MAX_LEAD => Some(d),
            Ok(_) => {
                problems.push(format!(
                    "{LEAD_ANNOTATION}: {value:?} is longer than {}",
                    humantime::format_duration(MAX_LEAD)
                ));
                None
            }
            Err(e) => {
                problems.push(format!(
                    "{LEAD_ANNOTATION}: {value:?} is not a duration ({e}; e.g. 120s, 15m)"
                ));
                None
            }
        });
        Some(Self {
            pod: pod.to_string(),
            ask,
            lead,
            problems,
        })
    }
}

/// Declarations of the pods on this node, by pod UID.
pub type ByPod = HashMap<String, Declared>;

/// The pods (UIDs, of `gpu_pods`) whose own declared lead makes `notice` due for their
/// processes at `now` while the node's configured lead does not yet (and not in `done`),
/// and the next time another pod's will be.
pub fn due_early(
    declared: &ByPod,
    gpu_pods: &[String],
    notice: &crate::model::Notice,
    configured: Duration,
    now: std::time::SystemTime,
    done: &[String],
) -> (Vec<String>, Option<std::time::SystemTime>) {
    let mut due = Vec::new();
    let mut next: Option<std::time::SystemTime> = None;
    for uid in gpu_pods {
        let Some(lead) = declared.get(uid).and_then(|d| d.lead) else {
            continue;
        };
        let lead = crate::model::notice::pod_lead(configured, lead);
        if lead <= configured || done.contains(uid) {
            continue;
        }
        let Some(at) = notice.act_at(lead) else {
            continue;
        };
        if at <= now {
            due.push(uid.clone());
        } else {
            next = Some(next.map_or(at, |n| n.min(at)));
        }
    }
    due.sort();
    (due, next)
}

/// The longest lead declared, and by which pod.
#[cfg_attr(not(feature = "clients"), allow(dead_code))]
pub fn longest_lead(declared: &ByPod) -> Option<(Duration, String)> {
    declared
        .values()
        .filter_map(|d| d.lead.map(|lead| (lead, d.pod.clone())))
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review M3: a pod's declared lead moves its own processes only, capped relative to the
    /// configured lead, and a pod holding no GPU moves nothing.
    #[test]
    fn only_gpu_pods_go_early_and_no_further_than_the_cap() {
        use crate::model::{Notice, NoticeKind, SourceKind};
        use std::time::SystemTime;
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let notice = Notice {
            id: "cb".into(),
            kind: NoticeKind::CapacityBlock,
            // Five days away.
            deadline: now + Duration::from_secs(5 * 24 * 3600),
            detail: String::new(),
            source: SourceKind::Imds,
        };
        let pod = |lead: u64| Declared {
            pod: "ml/x".into(),
            ask: None,
            lead: Some(Duration::from_secs(lead)),
            problems: Vec::new(),
        };
        let declared: ByPod = [
            ("week".to_string(), pod(7 * 24 * 3600)),
            ("idle".to_string(), pod(7 * 24 * 3600)),
        ]
        .into_iter()
        .collect();
        let configured = Duration::from_secs(15 * 60);
        let gpu = vec!["week".to_string()];
        // A week's lead is capped at 4 x 15 min = 1 h: nothing is due five days ahead.
        let (due, next) = due_early(&declared, &gpu, &notice, configured, now, &[]);
        assert!(due.is_empty());
        assert_eq!(next, Some(notice.deadline - Duration::from_secs(3600)));
        // An hour before the end the GPU pod is due, the pod holding no GPU never.
        let late = notice.deadline - Duration::from_secs(3600);
        let (due, _) = due_early(&declared, &gpu, &notice, configured, late, &[]);
        assert_eq!(due, ["week"]);
        let (due, next) = due_early(&declared, &gpu, &notice, configured, late, &due);
        assert!(due.is_empty() && next.is_none(), "once");
        assert_eq!(
            crate::model::notice::lead_cap(Duration::from_secs(1)),
            Duration::from_secs(600),
            "never under 10 minutes"
        );
        assert_eq!(
            crate::model::notice::lead_cap(Duration::from_secs(3600)),
            Duration::from_secs(7200),
            "never over 2 hours"
        );
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn reads_signal_and_lead() {
        let d = Declared::from_annotations(
            "ml/train-0",
            &annotations(&[(SIGNAL_ANNOTATION, "SIGTERM"), (LEAD_ANNOTATION, "120s")]),
        )
        .expect("declared");
        assert_eq!(d.ask, Some(Ask::Signal(Signal::TERM)));
        assert_eq!(d.lead, Some(Duration::from_secs(120)));
        assert!(d.problems.is_empty());
        let none = Declared::from_annotations("a/b", &annotations(&[(SIGNAL_ANNOTATION, "none")]))
            .expect("declared");
        assert_eq!((none.ask, none.lead), (Some(Ask::Nothing), None));
        let short =
            Declared::from_annotations("a/b", &annotations(&[(SIGNAL_ANNOTATION, " usr2 ")]))
                .expect("declared");
        assert_eq!(short.ask, Some(Ask::Signal(Signal::USR2)));
        assert!(Declared::from_annotations("a/b", &annotations(&[("other", "x")])).is_none());
    }

    #[test]
    fn bad_values_are_named_and_ignored() {
        let d = Declared::from_annotations(
            "a/b",
            &annotations(&[(SIGNAL_ANNOTATION, "SIGINT"), (LEAD_ANNOTATION, "soon")]),
        )
        .expect("declared");
        assert_eq!((d.ask, d.lead), (None, None));
        assert_eq!(d.problems.len(), 2, "{:?}", d.problems);
        assert!(d.problems[0].contains("SIGINT"), "{:?}", d.problems);
        assert!(d.problems[1].contains("\"soon\""), "{:?}", d.problems);
        let d = Declared::from_annotations(
            "a/b",
            &annotations(&[(SIGNAL_ANNOTATION, "SIGFOO"), (LEAD_ANNOTATION, "30d")]),
        )
        .expect("declared");
        assert!(d.problems[0].contains("not a catchable signal"));
        assert!(d.problems[1].contains("longer than"));
    }

    #[test]
    fn the_longest_lead_wins() {
        let mut by_pod = ByPod::new();
        for (uid, pod, lead) in [("u1", "a/one", "2m"), ("u2", "a/two", "20m")] {
            by_pod.insert(
                uid.into(),
                Declared::from_annotations(pod, &annotations(&[(LEAD_ANNOTATION, lead)]))
                    .expect("declared"),
            );
        }
        assert_eq!(
            longest_lead(&by_pod),
            Some((Duration::from_secs(1200), "a/two".into()))
        );
    }
}
