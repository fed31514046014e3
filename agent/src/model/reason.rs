//! Condition reasons on the EKS node monitoring agent's contract (`NvidiaXID79Error`,
//! `NvidiaDoubleBitError`, ...): what node auto repair and Karpenter read, and what
//! `gpu-agent clear` takes. Faults the EKS agent has no name for get ours, in the same style.

use super::{Fault, FaultCode, Severity};

/// Why one lost GPU condemns the whole node (the condition message and `status` say it).
pub const WHOLE_NODE: &str = "a GPU is gone from the node (lost or fallen off the bus): the \
     NVIDIA device plugin then refuses every GPU pod here, so the whole node is unfit, not \
     only that GPU";

/// The reason string for a fault.
pub fn reason(code: FaultCode, severity: Severity) -> String {
    let level = if severity == Severity::Fatal {
        "Error"
    } else {
        "Warning"
    };
    match code {
        FaultCode::Xid(n) => format!("NvidiaXID{n}{level}"),
        FaultCode::FallenOffBus => format!("NvidiaXID79{level}"),
        FaultCode::Sxid(n) => format!("NvidiaSXID{n}{level}"),
        FaultCode::GpuMissing => "NvidiaDeviceCountMismatch".into(),
        FaultCode::GpuLost => "NvidiaGPULost".into(),
        FaultCode::ResetRequired => "NvidiaGPUResetRequired".into(),
        FaultCode::EccDisabled => "NvidiaECCDisabled".into(),
        FaultCode::EccUncorrectedVolatile => "NvidiaDoubleBitError".into(),
        FaultCode::EccUncorrectedAggregate => "NvidiaDoubleBitErrorHistory".into(),
        FaultCode::RetiredPagesPending => "NvidiaPageRetirementPending".into(),
        FaultCode::RemapPending => "NvidiaRowRemapPending".into(),
        FaultCode::RemapFailure => "NvidiaRowRemapFailure".into(),
        FaultCode::NvlinkDown => "NvidiaNVLinkError".into(),
        FaultCode::NvlinkInactive => "NvidiaNVLinkInactive".into(),
        FaultCode::NvlinkErrors => "NvidiaNVLinkErrorRate".into(),
        FaultCode::PcieDegraded => "NvidiaPCIeError".into(),
        FaultCode::ClockSlowdown => "NvidiaClockSlowdown".into(),
        FaultCode::GpuSlow => "NvidiaGPUSlow".into(),
        FaultCode::RecoveryAction => "NvidiaGPURecoveryAction".into(),
        FaultCode::EfaMissing => "EFADeviceMissing".into(),
        FaultCode::EfaLinkDown => "EFALinkDown".into(),
        FaultCode::EfaErrors => format!("EFAErrorRate{level}"),
        FaultCode::EfaAdminErrors => "EFAAdminQueueError".into(),
        FaultCode::EfaDriverError => "EFADriverError".into(),
        FaultCode::FabricUnregistered => "NvidiaFabricNotRegistered".into(),
        FaultCode::FabricRegistrationFailed => "NvidiaFabricRegistrationError".into(),
        FaultCode::FabricUnhealthy => "NvidiaFabricUnhealthy".into(),
        FaultCode::FabricDegraded => "NvidiaFabricDegraded".into(),
        FaultCode::ImexDown => "NvidiaIMEXDown".into(),
        FaultCode::ImexNoChannels => "NvidiaIMEXNoChannels".into(),
    }
}

impl Fault {
    /// This fault's condition/event reason.
    pub fn reason(&self) -> String {
        reason(self.code, self.class.severity)
    }

    /// Does `selector` name this fault? Accepts the reason (`NvidiaXID79Error`), the code
    /// (`Xid 79`, `xid-79`, `remap-failure`) or the label (`GPU 3 Xid 79`), case-insensitive.
    pub fn matches(&self, selector: &str) -> bool {
        let s = selector.trim();
        let slug = match self.code {
            FaultCode::Xid(n) => format!("xid-{n}"),
            FaultCode::Sxid(n) => format!("sxid-{n}"),
            other => other.slug().to_string(),
        };
        [self.reason(), self.code.to_string(), slug, self.label()]
            .iter()
            .any(|candidate| candidate.eq_ignore_ascii_case(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eks_contract_names() {
        assert_eq!(
            reason(FaultCode::Xid(79), Severity::Fatal),
            "NvidiaXID79Error"
        );
        assert_eq!(
            reason(FaultCode::Xid(13), Severity::Warning),
            "NvidiaXID13Warning"
        );
        assert_eq!(
            reason(FaultCode::EccUncorrectedVolatile, Severity::Fatal),
            "NvidiaDoubleBitError"
        );
        assert_eq!(
            reason(FaultCode::NvlinkDown, Severity::Fatal),
            "NvidiaNVLinkError"
        );
        assert_eq!(
            reason(FaultCode::GpuMissing, Severity::Fatal),
            "NvidiaDeviceCountMismatch"
        );
    }
}
