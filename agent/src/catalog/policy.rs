//! Our severity and action for each of NVIDIA's buckets, and the deliberate exceptions.
//!
//! The rule: a bucket that needs the GPU reset, the host restarted or a person at the machine
//! is fatal (the node cannot be trusted with work until then); an application-level bucket is
//! a warning; `IGNORE` is info. `docs/FAULTS.md` explains where this differs from the EKS
//! node monitoring agent.

use super::{Bucket, SxidFatality};
use crate::model::{Action, Severity};

/// A code whose policy is not what its bucket implies, with the reason.
#[derive(Debug, Clone, Copy)]
pub struct XidOverride {
    /// The Xid.
    pub code: u32,
    /// Our severity.
    pub severity: Severity,
    /// Our action.
    pub action: Action,
    /// Why we differ from the bucket.
    pub why: &'static str,
}

/// Deliberate exceptions to the bucket rule.
pub static XID_OVERRIDES: &[XidOverride] = &[
    XidOverride {
        code: 63,
        severity: Severity::Warning,
        action: Action::None,
        why: "A row-remapping event: NVIDIA says IGNORE, but repeated events precede remap \
              failure, so it is shown. Remap pending/failure (NVML) decide the action.",
    },
    XidOverride {
        code: 92,
        severity: Severity::Warning,
        action: Action::None,
        why: "Excessive single-bit ECC interrupts: corrected, but a leading indicator.",
    },
    XidOverride {
        code: 162,
        severity: Severity::Info,
        action: Action::None,
        why: "Power-smoothing controller re-engaged: informational (no bucket in the catalog).",
    },
    XidOverride {
        code: 163,
        severity: Severity::Warning,
        action: Action::None,
        why: "Power-smoothing controller disengaged (no bucket in the catalog).",
    },
    XidOverride {
        code: 164,
        severity: Severity::Warning,
        action: Action::None,
        why: "Power-smoothing controller lifetime low (no bucket in the catalog).",
    },
    XidOverride {
        code: 165,
        severity: Severity::Warning,
        action: Action::None,
        why: "Power-smoothing controller lifetime exhausted: plan replacement (no bucket).",
    },
    XidOverride {
        code: 166,
        severity: Severity::Fatal,
        action: Action::ResetGpu,
        why: "NVLink secure-crypto error: link traffic cannot be trusted (no bucket).",
    },
    XidOverride {
        code: 167,
        severity: Severity::Fatal,
        action: Action::Reboot,
        why: "PCIe fatal timeout: the GPU is unreachable until the host restarts (no bucket).",
    },
    XidOverride {
        code: 168,
        severity: Severity::Warning,
        action: Action::None,
        why: "Reduced GPU memory capacity after retirement: usable, smaller (no bucket).",
    },
    XidOverride {
        code: 169,
        severity: Severity::Fatal,
        action: Action::ResetGpu,
        why: "SEC2 halt: the security engine stopped; a GPU reset restarts it (no bucket).",
    },
    XidOverride {
        code: 170,
        severity: Severity::Warning,
        action: Action::None,
        why: "Other NVLink secure-mode error (no bucket in the catalog).",
    },
    XidOverride {
        code: 171,
        severity: Severity::Fatal,
        action: Action::ResetGpu,
        why: "Uncorrectable DRAM error: data was lost; reset to remap (no bucket).",
    },
    XidOverride {
        code: 172,
        severity: Severity::Fatal,
        action: Action::ResetGpu,
        why: "Uncorrectable SRAM error: data was lost (no bucket).",
    },
];

/// Severity and action for an Xid with an ordinary bucket.
pub(super) fn xid(code: u32, bucket: Bucket) -> (Severity, Action) {
    if let Some(o) = XID_OVERRIDES.iter().find(|o| o.code == code) {
        return (o.severity, o.action);
    }
    bucket_policy(bucket)
}

fn bucket_policy(bucket: Bucket) -> (Severity, Action) {
    match bucket {
        Bucket::ResetGpu | Bucket::WorkflowXid48 | Bucket::WorkflowNvlinkErr => {
            (Severity::Fatal, Action::ResetGpu)
        }
        Bucket::RestartBareMetal | Bucket::RestartVm => (Severity::Fatal, Action::Reboot),
        // Nobody can reseat a GPU in a cloud instance: a mechanical fault means a new node.
        Bucket::CheckMechanicals => (Severity::Fatal, Action::Replace),
        Bucket::RestartApp | Bucket::Xid154Eval => (Severity::Warning, Action::RestartApp),
        // Codes NVIDIA marks CONTACT_SUPPORT are legacy or display-engine codes on data-center
        // parts; worth a warning, nothing we can automate.
        Bucket::ContactSupport | Bucket::UpdateSwFw | Bucket::CheckUvm | Bucket::Unassigned => {
            (Severity::Warning, Action::None)
        }
        Bucket::Ignore | Bucket::WorkflowXid45 => (Severity::Info, Action::None),
        // Decoded per line; reaching here means the line could not be decoded.
        Bucket::WorkflowNvlink5Err | Bucket::Xid154 => (Severity::Warning, Action::None),
    }
}

/// Severity and action for a decoded NVLink5 line.
pub(super) fn nvlink5(bucket: Bucket, sheet_fatal: bool) -> (Severity, Action) {
    let (severity, action) = bucket_policy(bucket);
    if sheet_fatal && severity < Severity::Fatal {
        return (Severity::Fatal, Action::ResetGpu);
    }
    (severity, action)
}

/// Xid 154 names the recovery action the driver now requires ("... changed from 0x0 (None)
/// to 0x2 (Node Reboot Required)").
pub(super) fn xid154(text: &str) -> (Severity, Action) {
    let target = text
        .rsplit_once(" to ")
        .map_or(text, |(_, t)| t)
        .to_ascii_lowercase();
    if target.contains("reboot") {
        (Severity::Fatal, Action::Reboot)
    } else if target.contains("reset") {
        (Severity::Fatal, Action::ResetGpu)
    } else if target.contains("drain") {
        (Severity::Warning, Action::None)
    } else if target.contains("none") {
        (Severity::Info, Action::None)
    } else {
        (Severity::Warning, Action::None)
    }
}

/// Severity and action for an SXid. A fatal NVSwitch error needs every GPU and switch on the
/// baseboard reset, which on a cloud instance means a reboot.
pub(super) fn sxid(guide: Option<SxidFatality>, line_fatal: Option<bool>) -> (Severity, Action) {
    let fatal = matches!(guide, Some(SxidFatality::Fatal | SxidFatality::AlwaysFatal))
        || line_fatal == Some(true);
    if fatal {
        (Severity::Fatal, Action::Reboot)
    } else {
        (Severity::Warning, Action::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xid154_reads_the_new_action() {
        let r = xid154("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)");
        assert_eq!(r, (Severity::Fatal, Action::Reboot));
        let r = xid154("GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)");
        assert_eq!(r, (Severity::Info, Action::None));
        let r = xid154("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)");
        assert_eq!(r, (Severity::Fatal, Action::ResetGpu));
    }

    #[test]
    fn overrides_name_codes_in_the_catalog() {
        for o in XID_OVERRIDES {
            assert!(super::super::xid_entry(o.code).is_some(), "{}", o.code);
        }
    }
}
