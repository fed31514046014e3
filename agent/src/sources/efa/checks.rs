//! What the EFA devices' state means (pure). Every finding carries the device and the
//! evidence.
//!
//! | evidence | code | severity | action |
//! |---|---|---|---|
//! | fewer devices than configured, or than this boot had once the start-up grace ended | `efa-missing` | fatal | reboot |
//! | the device's interface is up but has no carrier | `efa-link-down` | fatal | reboot |
//! | admin commands never completed (`no_completion_cmds` rising) | `efa-admin-errors` | fatal | reboot |
//! | admin commands in error (`cmds_err` rising) | `efa-admin-errors` | warning | none |
//! | a local error counter rising past the fatal rate | `efa-errors` | fatal | reboot |
//! | a local error counter, a peer's or the receiver's, or `retrans_pkts`, rising past the warning rate | `efa-errors` | warning | none |
//!
//! What is judged here is one poll's evidence; the core confirms a fatal one (a counter's
//! rate for a whole window, a link or a device count for two polls) and clears a fault only
//! a whole window after its last sighting (`core/health/condition.rs`). Fewer devices than
//! the instance type allows is no fault: a launch may attach fewer EFA interfaces.

use crate::model::{Action, Classification, Component, EfaDevice, FaultCode, Severity};

/// The per-port counters AWS names as EFA degradation indicators ("Monitor an EFA") that
/// say this device failed: past the fatal rate they condemn the node.
pub const ERROR_COUNTERS: &[&str] = &[
    "rdma_read_wr_err",
    "rdma_write_wr_err",
    "retrans_timeout_events",
];
/// Indicators that say more about the other end than about this device: a peer that stopped
/// answering (`unresponsive_remote_events`, `impaired_remote_conn_events`: every node that
/// talks to a dead peer counts them) or a receiver not ready (`rx_drops`, in SRD mostly the
/// workload's own receive queues). Only ever a warning: they never condemn the observer.
pub const REMOTE_COUNTERS: &[&str] = &[
    "rx_drops",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
];
/// Retransmitted packets: normal in small numbers on a busy fabric; only a warning.
pub const RETRANS: &str = "retrans_pkts";
/// Admin commands the device never completed (the device is not answering its driver).
pub const NO_COMPLETION: &str = "no_completion_cmds";
/// Admin commands that completed in error.
pub const CMDS_ERR: &str = "cmds_err";

/// Rates (per minute, over the window) past which a counter is a fault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// An error counter past this is a warning.
    pub errors_warning: f64,
    /// An error counter past this is fatal.
    pub errors_fatal: f64,
    /// `retrans_pkts` past this is a warning.
    pub retrans_warning: f64,
}

/// One fault found by a poll.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// Where.
    pub component: Component,
    /// What.
    pub code: FaultCode,
    /// Our verdict.
    pub class: Classification,
    /// The evidence.
    pub detail: String,
}

fn finding(
    component: Component,
    code: FaultCode,
    (severity, action): (Severity, Action),
    name: &str,
    detail: String,
) -> Finding {
    Finding {
        component,
        code,
        class: Classification {
            name: name.to_string(),
            description: detail.clone(),
            nvidia_action: String::new(),
            severity,
            action,
        },
        detail,
    }
}

const FATAL: (Severity, Action) = (Severity::Fatal, Action::Reboot);
const WARNING: (Severity, Action) = (Severity::Warning, Action::None);

/// Judge one poll. `expected` is how many devices the node should have (with where that
/// came from: the config, or the count this boot had once the start-up grace ended),
/// checked only once `settled` (the start-up grace is over).
pub fn evaluate(
    devices: &[EfaDevice],
    expected: Option<&(u32, String)>,
    settled: bool,
    limits: &Thresholds,
) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some((want, from)) = expected {
        let have = u32::try_from(devices.len()).unwrap_or(u32::MAX);
        if settled && have < *want {
            out.push(finding(
                Component::Node,
                FaultCode::EfaMissing,
                FATAL,
                "EFA_DEVICE_MISSING",
                format!("{have} of {want} EFA devices present ({from})"),
            ));
        }
    }
    for d in devices {
        let name = &d.name;
        let component = d.pci.map_or(Component::Node, |pci| Component::Efa { pci });
        if d.link_up == Some(false) {
            out.push(finding(
                component,
                FaultCode::EfaLinkDown,
                FATAL,
                "EFA_LINK_DOWN",
                format!("{name}: its network interface is up but has no carrier"),
            ));
        }
        let rate = |c: &str| d.rates.get(c).copied().unwrap_or(0.0);
        // The evidence names the counters and the limit crossed, never the live rate: it
        // is the condition's message, and a number that changes each poll would rewrite
        // the Node each poll. The rates themselves are in `status` and the metrics.
        if rate(NO_COMPLETION) > 0.0 {
            out.push(finding(
                component,
                FaultCode::EfaAdminErrors,
                FATAL,
                "EFA_ADMIN_NO_COMPLETION",
                format!("{name}: admin commands not completed by the device"),
            ));
        } else if rate(CMDS_ERR) > 0.0 {
            out.push(finding(
                component,
                FaultCode::EfaAdminErrors,
                WARNING,
                "EFA_ADMIN_CMD_ERRORS",
                format!("{name}: admin commands in error"),
            ));
        }
        let over = |counters: &[&'static str], limit: f64| -> Vec<&'static str> {
            counters
                .iter()
                .copied()
                .filter(|c| rate(c) > limit)
                .collect()
        };
        let fatal = over(ERROR_COUNTERS, limits.errors_fatal);
        let mut warning = over(ERROR_COUNTERS, limits.errors_warning);
        warning.extend(over(REMOTE_COUNTERS, limits.errors_warning));
        if rate(RETRANS) > limits.retrans_warning {
            warning.push(RETRANS);
        }
        if !fatal.is_empty() {
            out.push(finding(
                component,
                FaultCode::EfaErrors,
                FATAL,
                "EFA_ERROR_RATE_FATAL",
                format!(
                    "{name}: {} rising past {:.0}/min",
                    fatal.join(", "),
                    limits.errors_fatal
                ),
            ));
        } else if !warning.is_empty() {
            out.push(finding(
                component,
                FaultCode::EfaErrors,
                WARNING,
                "EFA_ERROR_RATE",
                format!(
                    "{name}: {} rising past the warning rate",
                    warning.join(", ")
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Thresholds = Thresholds {
        errors_warning: 60.0,
        errors_fatal: 600.0,
        retrans_warning: 60_000.0,
    };

    fn seen(i: u8) -> EfaDevice {
        EfaDevice {
            name: format!("rdmap{i}s0"),
            pci: Some(format!("0000:{i:02x}:00.0").parse().expect("pci")),
            link_up: Some(true),
            ..EfaDevice::default()
        }
    }

    fn codes(found: &[Finding]) -> Vec<(FaultCode, Severity)> {
        found.iter().map(|f| (f.code, f.class.severity)).collect()
    }

    #[test]
    fn a_missing_device_counts_only_after_the_grace() {
        let devices: Vec<EfaDevice> = (0..31).map(seen).collect();
        let expected = (32, "instance type p5.48xlarge".to_string());
        assert!(evaluate(&devices, Some(&expected), false, &LIMITS).is_empty());
        let found = evaluate(&devices, Some(&expected), true, &LIMITS);
        assert_eq!(codes(&found), [(FaultCode::EfaMissing, Severity::Fatal)]);
        assert!(found[0].detail.contains("31 of 32"), "{}", found[0].detail);
        assert!(
            evaluate(&devices, None, true, &LIMITS).is_empty(),
            "no count known"
        );
    }

    #[test]
    fn link_admin_queue_and_rates() {
        let mut d = seen(1);
        d.link_up = Some(false);
        assert_eq!(
            codes(&evaluate(&[d], None, true, &LIMITS)),
            [(FaultCode::EfaLinkDown, Severity::Fatal)]
        );
        let mut d = seen(1);
        d.link_up = None;
        assert!(evaluate(&[d], None, true, &LIMITS).is_empty(), "EFA-only");
        let mut d = seen(1);
        d.rates.insert(CMDS_ERR.into(), 1.0);
        assert_eq!(
            codes(&evaluate(&[d.clone()], None, true, &LIMITS)),
            [(FaultCode::EfaAdminErrors, Severity::Warning)]
        );
        d.rates.insert(NO_COMPLETION.into(), 1.0);
        assert_eq!(
            codes(&evaluate(&[d], None, true, &LIMITS)),
            [(FaultCode::EfaAdminErrors, Severity::Fatal)]
        );
        for (rate, want) in [
            (10.0, None),
            (100.0, Some(Severity::Warning)),
            (1_000.0, Some(Severity::Fatal)),
        ] {
            let mut d = seen(1);
            d.rates.insert("rdma_write_wr_err".into(), rate);
            let found = evaluate(&[d], None, true, &LIMITS);
            assert_eq!(found.first().map(|f| f.class.severity), want, "{rate}");
        }
        // The evidence is stable while the rate moves: no live number in it.
        let detail = |rate: f64| {
            let mut d = seen(1);
            d.rates.insert("rdma_write_wr_err".into(), rate);
            evaluate(&[d], None, true, &LIMITS)[0].detail.clone()
        };
        assert_eq!(detail(720.0), detail(1_500.0));
        assert!(detail(720.0).contains("rdma_write_wr_err rising past 600/min"));
        let mut d = seen(1);
        d.rates.insert(RETRANS.into(), 100_000.0);
        assert_eq!(
            codes(&evaluate(&[d], None, true, &LIMITS)),
            [(FaultCode::EfaErrors, Severity::Warning)],
            "retransmits never condemn"
        );
    }

    #[test]
    fn a_peers_trouble_never_condemns_the_observer() {
        for counter in REMOTE_COUNTERS {
            let mut d = seen(1);
            d.rates.insert((*counter).into(), 100_000.0);
            let found = evaluate(&[d], None, true, &LIMITS);
            assert_eq!(
                codes(&found),
                [(FaultCode::EfaErrors, Severity::Warning)],
                "{counter}"
            );
            assert!(found[0].detail.contains(counter), "{}", found[0].detail);
        }
        // Beside a local counter past the fatal rate, the fatal names only the local one.
        let mut d = seen(1);
        d.rates
            .insert("unresponsive_remote_events".into(), 100_000.0);
        d.rates.insert("rdma_read_wr_err".into(), 1_000.0);
        let found = evaluate(&[d], None, true, &LIMITS);
        assert_eq!(codes(&found), [(FaultCode::EfaErrors, Severity::Fatal)]);
        assert!(
            !found[0].detail.contains("unresponsive"),
            "{}",
            found[0].detail
        );
    }
}
