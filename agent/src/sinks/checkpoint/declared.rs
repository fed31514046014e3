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
