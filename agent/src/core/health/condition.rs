//! How a polled condition is set and cleared: one rule for every polling source.
//!
//! A polling source (NVML, EFA, IMEX) reports on each poll what it sees now; it never
//! remembers findings itself. The core turns those sightings into faults with one rule per
//! source (and, where a finding needs it, per fault code):
//!
//! - **set**: a fatal finding counts as fatal only once it has been seen on every poll for
//!   [`Rule::confirm`] (zero: at once). Until then it stands as a warning that says so, so a
//!   blip (a carrier lost for one poll while the ENA resets, one window of errors) never
//!   condemns the node.
//! - **latch**: a verdict gets milder only a whole [`Rule::hold`] after the last sighting of
//!   the worse one: a rate that falls back under the fatal limit does not turn a fatal fault
//!   into a warning at the next poll, and until then the evidence shown stays that of the
//!   verdict (no new message, and so no Node PATCH, on every poll).
//! - **clear**: the fault ends only [`Rule::hold`] after its last sighting, so a fault that
//!   comes and goes is one fault, not a condition that flips each poll.
//!
//! The grace after boot (NVLink training, EFA devices initialising late, Fabric Manager
//! registering the GPUs, IMEX starting) is judged by the source, which alone knows what is
//! still expected to come up; a finding the source reports is evidence.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use crate::model::{Action, Classification, FaultCode, Severity, SourceKind};

/// How one kind of polled condition is set and cleared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rule {
    /// A fatal finding is fatal once seen on every poll for this long (zero: at once).
    pub confirm: Duration,
    /// A fault clears this long after its last sighting (zero: at the first poll without it).
    pub hold: Duration,
}

/// The rules of every polling source, with per-code exceptions.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    by_source: HashMap<SourceKind, Rule>,
    by_code: HashMap<(SourceKind, FaultCode), Rule>,
}

impl Rules {
    /// `source`'s rule (for every code without its own).
    pub fn set(&mut self, source: SourceKind, rule: Rule) {
        self.by_source.insert(source, rule);
    }

    /// The rule for `code` from `source`.
    pub fn set_code(&mut self, source: SourceKind, code: FaultCode, rule: Rule) {
        self.by_code.insert((source, code), rule);
    }

    /// The rule that applies (the default one, at once and at the first clean poll, for a
    /// source without one).
    pub fn get(&self, source: SourceKind, code: FaultCode) -> Rule {
        self.by_code
            .get(&(source, code))
            .or_else(|| self.by_source.get(&source))
            .copied()
            .unwrap_or_default()
    }
}

/// The verdict and evidence a fatal sighting carries before it is confirmed: a warning
/// whose detail says how long it must last.
pub fn provisional(
    class: &Classification,
    detail: &str,
    confirm: Duration,
) -> (Classification, String) {
    (
        Classification {
            severity: Severity::Warning,
            action: Action::None,
            ..class.clone()
        },
        format!(
            "{detail} (fatal once it lasts {})",
            humantime::format_duration(confirm)
        ),
    )
}

/// Has a fatal finding first seen at `since` and seen again at `now` lasted `confirm`?
pub fn confirmed(since: SystemTime, now: SystemTime, confirm: Duration) -> bool {
    now.duration_since(since).unwrap_or_default() >= confirm
}

/// Has a fault last seen at `last_seen` been gone for its `hold` at `now`?
pub fn expired(last_seen: SystemTime, now: SystemTime, hold: Duration) -> bool {
    now.duration_since(last_seen).unwrap_or_default() >= hold
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_codes_rule_wins_over_its_sources_and_none_is_at_once() {
        let mut rules = Rules::default();
        let hold = Rule {
            confirm: Duration::ZERO,
            hold: Duration::from_secs(60),
        };
        let confirm = Rule {
            confirm: Duration::from_secs(5),
            hold: Duration::from_secs(60),
        };
        rules.set(SourceKind::Efa, hold);
        rules.set_code(SourceKind::Efa, FaultCode::EfaLinkDown, confirm);
        assert_eq!(rules.get(SourceKind::Efa, FaultCode::EfaErrors), hold);
        assert_eq!(rules.get(SourceKind::Efa, FaultCode::EfaLinkDown), confirm);
        assert_eq!(
            rules.get(SourceKind::Nvml, FaultCode::EfaLinkDown),
            Rule::default()
        );
    }

    #[test]
    fn times() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let s = Duration::from_secs;
        assert!(!confirmed(t, t + s(4), s(5)));
        assert!(confirmed(t, t + s(5), s(5)));
        assert!(confirmed(t, t, Duration::ZERO));
        assert!(!expired(t, t + s(59), s(60)));
        assert!(expired(t, t + s(60), s(60)));
        // A clock stepped back never clears or confirms early.
        assert!(!expired(t, t - s(10), s(60)));
        assert!(expired(t, t - s(10), Duration::ZERO));
    }

    /// The model under the rules the daemon gives EFA and NVML (a 60 s window, 5 s polls,
    /// NVML's conditions held a minute).
    mod in_the_model {
        use super::super::super::HealthModel;
        use super::*;
        use crate::host::NvidiaDevices;
        use crate::model::{
            Component, FaultReport, Inventory, KmsgStats, NameSource, NodeName, Observation,
        };

        const T0: u64 = 1_000_000;

        fn model() -> HealthModel {
            let node = NodeName {
                name: "node-a".into(),
                source: NameSource::Config,
            };
            let mut m = HealthModel::new(
                &node,
                "boot-1",
                NvidiaDevices::default(),
                Duration::from_secs(60),
            );
            let window = Duration::from_secs(60);
            let mut rules = Rules::default();
            rules.set(
                SourceKind::Efa,
                Rule {
                    confirm: Duration::ZERO,
                    hold: window,
                },
            );
            rules.set_code(
                SourceKind::Efa,
                FaultCode::EfaErrors,
                Rule {
                    confirm: window,
                    hold: window,
                },
            );
            rules.set_code(
                SourceKind::Efa,
                FaultCode::EfaLinkDown,
                Rule {
                    confirm: Duration::from_millis(2500),
                    hold: window,
                },
            );
            rules.set(
                SourceKind::Nvml,
                Rule {
                    confirm: Duration::ZERO,
                    hold: Duration::from_secs(60),
                },
            );
            m.set_condition_rules(rules);
            m
        }

        fn at(secs: u64) -> SystemTime {
            SystemTime::UNIX_EPOCH + Duration::from_secs(T0 + secs)
        }

        fn efa() -> Component {
            Component::Efa {
                pci: "0000:10:00.0".parse().expect("pci"),
            }
        }

        fn report(
            source: SourceKind,
            code: FaultCode,
            severity: Severity,
            detail: &str,
            secs: u64,
        ) -> FaultReport {
            let action = if severity == Severity::Fatal {
                Action::Reboot
            } else {
                Action::None
            };
            FaultReport {
                component: efa(),
                code,
                class: Classification {
                    name: format!("{code}-{severity}"),
                    description: String::new(),
                    nvidia_action: String::new(),
                    severity,
                    action,
                },
                source,
                at: at(secs),
                detail: detail.into(),
                cursor: None,
                drill: false,
            }
        }

        /// One EFA poll at `secs` seeing `errors` (fatal or warning, with its evidence).
        fn poll(m: &mut HealthModel, secs: u64, code: FaultCode, seen: Option<(Severity, &str)>) {
            let faults = seen
                .map(|(severity, detail)| report(SourceKind::Efa, code, severity, detail, secs))
                .into_iter()
                .collect();
            m.apply_at(
                Observation::Poll {
                    source: SourceKind::Efa,
                    faults,
                    partial: Vec::new(),
                    inventory: Inventory::Efa(Vec::new()),
                },
                at(secs),
            );
        }

        /// The one fault's severity and detail, if any.
        fn state(m: &HealthModel) -> Option<(Severity, String)> {
            m.snapshot(KmsgStats::default())
                .faults
                .first()
                .map(|f| (f.class.severity, f.detail.clone()))
        }

        const FATAL: &str = "rdmap0s0: rdma_write_wr_err rising past 600/min";
        const WARN: &str = "rdmap0s0: rdma_write_wr_err rising past the warning rate";

        /// One EFA poll at `secs` with the error rate over the fatal limit, or only over the
        /// warning one.
        fn rate(m: &mut HealthModel, secs: u64, over: bool) {
            let seen = if over {
                (Severity::Fatal, FATAL)
            } else {
                (Severity::Warning, WARN)
            };
            poll(m, secs, FaultCode::EfaErrors, Some(seen));
        }

        #[test]
        fn a_fatal_rate_is_confirmed_over_a_window_and_does_not_decay_within_one() {
            let mut m = model();
            let errors = FaultCode::EfaErrors;
            poll(&mut m, 0, errors, Some((Severity::Fatal, FATAL)));
            let (severity, detail) = state(&m).expect("fault");
            assert_eq!(severity, Severity::Warning, "one window is not yet fatal");
            assert!(detail.contains("fatal once it lasts 1m"), "{detail}");
            for t in (5..60).step_by(5) {
                poll(&mut m, t, errors, Some((Severity::Fatal, FATAL)));
                assert_eq!(state(&m).map(|s| s.0), Some(Severity::Warning), "{t}");
            }
            poll(&mut m, 60, errors, Some((Severity::Fatal, FATAL)));
            assert_eq!(state(&m), Some((Severity::Fatal, FATAL.to_string())));
            // The measured rate falls under the fatal limit, then the counter stops: fatal,
            // with the same message, until a whole window after the last fatal sighting.
            poll(&mut m, 65, errors, Some((Severity::Warning, WARN)));
            assert_eq!(state(&m), Some((Severity::Fatal, FATAL.to_string())));
            for t in (70..125).step_by(5) {
                poll(&mut m, t, errors, None);
                assert_eq!(state(&m), Some((Severity::Fatal, FATAL.to_string())), "{t}");
            }
            poll(&mut m, 125, errors, None);
            assert_eq!(state(&m), None, "a window after its last sighting (65 s)");
        }

        #[test]
        fn a_rate_that_comes_and_goes_is_one_fatal_fault_not_a_flapping_one() {
            let mut m = model();
            let errors = FaultCode::EfaErrors;
            let mut seen = Vec::new();
            // Over the fatal rate for a window, then 5 s over it and 3 s under it (a
            // warning), polled each second: once fatal it stays fatal until the rate has
            // been under the limit for a whole window.
            for t in 0..240 {
                rate(&mut m, t, t <= 60 || t % 8 < 5);
                seen.push(state(&m).map(|s| s.0));
            }
            seen.dedup();
            assert_eq!(
                seen,
                [Some(Severity::Warning), Some(Severity::Fatal)],
                "one transition to fatal, none back"
            );
            // A whole window under the limit: a warning again; then gone a window later.
            for t in 240..300 {
                poll(&mut m, t, errors, Some((Severity::Warning, WARN)));
            }
            assert_eq!(state(&m), Some((Severity::Warning, WARN.to_string())));
        }

        #[test]
        fn a_rate_never_sustained_for_a_window_stays_a_warning() {
            let mut m = model();
            for t in 0..240 {
                rate(&mut m, t, t % 8 < 5);
                assert_eq!(state(&m).map(|s| s.0), Some(Severity::Warning), "{t}");
            }
        }

        #[test]
        fn a_link_down_for_one_poll_is_never_fatal_two_in_a_row_are() {
            let mut m = model();
            let link = FaultCode::EfaLinkDown;
            poll(&mut m, 0, link, Some((Severity::Fatal, "no carrier")));
            poll(&mut m, 5, link, None);
            poll(&mut m, 10, link, Some((Severity::Fatal, "no carrier")));
            assert_eq!(state(&m).map(|s| s.0), Some(Severity::Warning));
            poll(&mut m, 15, link, Some((Severity::Fatal, "no carrier")));
            assert_eq!(state(&m).map(|s| s.0), Some(Severity::Fatal));
        }

        #[test]
        fn an_nvml_condition_clears_a_minute_after_its_last_poll() {
            let mut m = model();
            let nvml = |m: &mut HealthModel, secs: u64, seen: bool| {
                let faults = seen
                    .then(|| {
                        report(
                            SourceKind::Nvml,
                            FaultCode::EccUncorrectedVolatile,
                            Severity::Fatal,
                            "2 uncorrectable",
                            secs,
                        )
                    })
                    .into_iter()
                    .collect();
                m.apply_at(
                    Observation::Poll {
                        source: SourceKind::Nvml,
                        faults,
                        partial: Vec::new(),
                        inventory: Inventory::Gpus {
                            gpus: Vec::new(),
                            driver_version: None,
                        },
                    },
                    at(secs),
                );
            };
            nvml(&mut m, 0, true);
            assert_eq!(state(&m).map(|s| s.0), Some(Severity::Fatal), "at once");
            nvml(&mut m, 10, false);
            nvml(&mut m, 50, false);
            assert!(state(&m).is_some(), "held");
            nvml(&mut m, 60, false);
            assert_eq!(state(&m), None);
        }
    }
}
