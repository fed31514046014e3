//! A GPU's NVLink fabric registration (`nvmlDeviceGetGpuFabricInfoV`): on GB200/GB300
//! NVL72 (and NVLink-5 HGX) systems each GPU registers with the NVLink fabric (Fabric
//! Manager, NVLSM) after boot; until it has, and unless it succeeded, it cannot join the
//! NVLink domain its job expects. The registration names the domain: the cluster UUID and
//! clique id (what the NVIDIA DRA driver's ComputeDomains and GFD's `nvidia.com/gpu.clique`
//! label use).
//!
//! | reading | fault | severity | action |
//! |---|---|---|---|
//! | not started / in progress past the boot grace | `fabric-unregistered` | fatal | reboot |
//! | completed with an error status | `fabric-registration-failed` | fatal | reboot |
//! | health: incorrect configuration, unhealthy routes, or summary unhealthy | `fabric-unhealthy` | fatal | reset-gpu |
//! | health: degraded bandwidth, route or access-timeout recovery, or limited capacity | `fabric-degraded` | warning | none |
//!
//! `not supported` (a PCIe GPU, Hopper HGX, an older driver) is no fault and shows nothing.

use crate::model::{Action, FaultCode, GpuFabric, Severity};

/// `nvmlGpuFabricState_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricState {
    /// This GPU does not register with a fabric.
    NotSupported,
    /// Registration has not started (Fabric Manager not running yet).
    NotStarted,
    /// Registration is under way.
    InProgress,
    /// Registration finished (see the status for its result).
    Completed,
}

impl FabricState {
    /// From NVML's value (an unknown value is taken as not supported).
    pub fn from_raw(raw: u8) -> Self {
        match raw {
            1 => Self::NotStarted,
            2 => Self::InProgress,
            3 => Self::Completed,
            _ => Self::NotSupported,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::NotSupported => "not-supported",
            Self::NotStarted => "not-started",
            Self::InProgress => "in-progress",
            Self::Completed => "completed",
        }
    }
}

/// What `nvmlDeviceGetGpuFabricInfoV` reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricInfo {
    /// Where registration stands.
    pub state: FabricState,
    /// The registration's result (`nvmlReturn_t`, 0 success), valid once completed.
    pub status: u32,
    /// The clique (NVLink partition) id.
    pub clique_id: u32,
    /// The fabric cluster's UUID.
    pub cluster_uuid: [u8; 16],
    /// `NVML_GPU_FABRIC_HEALTH_MASK_*` bits (v2 and later).
    pub health_mask: u32,
    /// `NVML_GPU_FABRIC_HEALTH_SUMMARY_*` (v3 only; `None` from a driver that knows v2).
    pub health_summary: Option<u8>,
}

/// A two-state field of the health mask: 0 not supported, 1 true, 2 false. NVML's header
/// calls `NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_*` (3) a width, but it is the mask `0b11` of a
/// 2-bit field: the fields sit at shifts 0, 2, 4 and 6, so a 3-bit window would take in the
/// next field's low bit (1 whenever that field is true).
fn field(mask: u32, shift: u32) -> u32 {
    (mask >> shift) & 0x3
}

/// `NVML_GPU_FABRIC_HEALTH_MASK_*_TRUE` of the two-state fields (degraded bandwidth, route
/// recovery, route unhealthy, access-timeout recovery).
const TRUE: u32 = 1;
const SHIFT_DEGRADED_BW: u32 = 0;
const SHIFT_ROUTE_RECOVERY: u32 = 2;
const SHIFT_ROUTE_UNHEALTHY: u32 = 4;
const SHIFT_ACCESS_TIMEOUT_RECOVERY: u32 = 6;
/// The incorrect-configuration field (4 bits wide in the header, values 0-5: 0 not
/// supported, 1 none, then the kind of misconfiguration).
const SHIFT_INCORRECT_CONFIGURATION: u32 = 8;
const SUMMARY_UNHEALTHY: u8 = 2;
const SUMMARY_LIMITED_CAPACITY: u8 = 3;

impl FabricInfo {
    /// The cluster UUID as text (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
    pub fn cluster_uuid_text(&self) -> String {
        let hex: String = self
            .cluster_uuid
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }

    /// What `status` and the metrics show; `None` where the GPU has no fabric.
    pub fn view(&self) -> Option<GpuFabric> {
        (self.state != FabricState::NotSupported).then(|| GpuFabric {
            state: self.state.name().to_string(),
            clique_id: self.clique_id,
            cluster_uuid: self.cluster_uuid_text(),
            health: self.health().map(|(_, _, _, what)| what),
        })
    }

    /// The health fields that say something is wrong, worst first:
    /// `(code, severity, action, what)`.
    fn health(&self) -> Option<(FaultCode, Severity, Action, String)> {
        let mask = self.health_mask;
        let misconfigured = (mask >> SHIFT_INCORRECT_CONFIGURATION) & 0xf;
        let unhealthy = [
            (misconfigured > 1).then(|| {
                let kind = match misconfigured {
                    2 => "incorrect system GUID",
                    3 => "incorrect chassis serial",
                    4 => "no partition",
                    5 => "insufficient NVLinks",
                    _ => "unknown",
                };
                format!("incorrect configuration ({kind})")
            }),
            (field(mask, SHIFT_ROUTE_UNHEALTHY) == TRUE).then(|| "unhealthy routes".to_string()),
            (self.health_summary == Some(SUMMARY_UNHEALTHY))
                .then(|| "health summary unhealthy".to_string()),
        ];
        let unhealthy: Vec<String> = unhealthy.into_iter().flatten().collect();
        if !unhealthy.is_empty() {
            return Some((
                FaultCode::FabricUnhealthy,
                Severity::Fatal,
                Action::ResetGpu,
                unhealthy.join(", "),
            ));
        }
        let degraded = [
            (field(mask, SHIFT_DEGRADED_BW) == TRUE).then_some("degraded bandwidth"),
            (field(mask, SHIFT_ROUTE_RECOVERY) == TRUE).then_some("route recovery in progress"),
            (field(mask, SHIFT_ACCESS_TIMEOUT_RECOVERY) == TRUE)
                .then_some("access-timeout recovery in progress"),
            (self.health_summary == Some(SUMMARY_LIMITED_CAPACITY)).then_some("limited capacity"),
        ];
        let degraded: Vec<&str> = degraded.into_iter().flatten().collect();
        (!degraded.is_empty()).then(|| {
            (
                FaultCode::FabricDegraded,
                Severity::Warning,
                Action::None,
                degraded.join(", "),
            )
        })
    }

    /// The fault this registration is, if any: `(code, severity, action, catalog name,
    /// detail)`. `booting`: within the boot grace, while Fabric Manager may still be
    /// registering the GPUs.
    pub fn judge(
        &self,
        booting: bool,
    ) -> Option<(FaultCode, Severity, Action, &'static str, String)> {
        // Built only for a fault: a healthy poll allocates nothing.
        let domain = || {
            format!(
                "cluster {} clique {}",
                self.cluster_uuid_text(),
                self.clique_id
            )
        };
        match self.state {
            FabricState::NotSupported => None,
            FabricState::NotStarted | FabricState::InProgress if booting => None,
            FabricState::NotStarted | FabricState::InProgress => Some((
                FaultCode::FabricUnregistered,
                Severity::Fatal,
                Action::Reboot,
                "GPU_FABRIC_NOT_REGISTERED",
                format!(
                    "NVLink fabric registration {} past the boot grace (Fabric Manager or \
                     NVLSM has not registered the GPU)",
                    self.state.name()
                ),
            )),
            FabricState::Completed if self.status != 0 => Some((
                FaultCode::FabricRegistrationFailed,
                Severity::Fatal,
                Action::Reboot,
                "GPU_FABRIC_REGISTRATION_FAILED",
                format!(
                    "NVLink fabric registration completed with error {} ({})",
                    self.status,
                    domain()
                ),
            )),
            FabricState::Completed => self.health().map(|(code, severity, action, what)| {
                let name = if severity == Severity::Fatal {
                    "GPU_FABRIC_UNHEALTHY"
                } else {
                    "GPU_FABRIC_DEGRADED"
                };
                (
                    code,
                    severity,
                    action,
                    name,
                    format!("NVLink fabric health: {what} ({})", domain()),
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed() -> FabricInfo {
        FabricInfo {
            state: FabricState::Completed,
            status: 0,
            clique_id: 32766,
            cluster_uuid: [
                0x5e, 0x1f, 0x00, 0x2a, 0x7b, 0x3c, 0x4d, 0x01, 0x8e, 0x9f, 0xa0, 0xb1, 0xc2, 0xd3,
                0xe4, 0xf5,
            ],
            // Every two-state field "false", configuration "none", as a healthy GB200 says.
            health_mask: 2 | (2 << 2) | (2 << 4) | (2 << 6) | (1 << 8),
            health_summary: Some(1),
        }
    }

    #[test]
    fn a_healthy_registration_is_no_fault_and_names_its_domain() {
        let info = completed();
        assert_eq!(info.judge(false), None);
        let view = info.view().expect("view");
        assert_eq!(view.cluster_uuid, "5e1f002a-7b3c-4d01-8e9f-a0b1c2d3e4f5");
        assert_eq!(view.clique_id, 32766);
        assert_eq!(view.state, "completed");
        assert_eq!(view.health, None);
    }

    #[test]
    fn not_supported_is_nothing_at_all() {
        let info = FabricInfo {
            state: FabricState::NotSupported,
            health_mask: 0,
            health_summary: None,
            ..completed()
        };
        assert_eq!(info.judge(false), None);
        assert_eq!(info.view(), None);
    }

    #[test]
    fn unregistered_waits_for_the_grace_then_is_fatal() {
        for state in [FabricState::NotStarted, FabricState::InProgress] {
            let info = FabricInfo {
                state,
                ..completed()
            };
            assert_eq!(info.judge(true), None, "{state:?}");
            let (code, severity, action, _, _) = info.judge(false).expect("fault");
            assert_eq!(
                (code, severity, action),
                (
                    FaultCode::FabricUnregistered,
                    Severity::Fatal,
                    Action::Reboot
                )
            );
        }
    }

    #[test]
    fn a_failed_registration_is_fatal_even_while_booting() {
        let info = FabricInfo {
            status: 999,
            ..completed()
        };
        let (code, severity, _, _, detail) = info.judge(true).expect("fault");
        assert_eq!(
            (code, severity),
            (FaultCode::FabricRegistrationFailed, Severity::Fatal)
        );
        assert!(detail.contains("error 999"), "{detail}");
        assert!(detail.contains("clique 32766"), "{detail}");
    }

    #[test]
    fn unhealthy_beats_degraded_and_degraded_is_a_warning() {
        let degraded = FabricInfo {
            health_mask: completed().health_mask & !0x3 | 1,
            ..completed()
        };
        let (code, severity, action, _, detail) = degraded.judge(false).expect("fault");
        assert_eq!(
            (code, severity, action),
            (FaultCode::FabricDegraded, Severity::Warning, Action::None)
        );
        assert!(detail.contains("degraded bandwidth"), "{detail}");

        let unhealthy = FabricInfo {
            health_mask: degraded.health_mask & !(0x3 << 4) | (1 << 4),
            ..degraded.clone()
        };
        let (code, severity, _, _, detail) = unhealthy.judge(false).expect("fault");
        assert_eq!(
            (code, severity),
            (FaultCode::FabricUnhealthy, Severity::Fatal)
        );
        assert!(detail.contains("unhealthy routes"), "{detail}");

        let misconfigured = FabricInfo {
            health_mask: completed().health_mask & !(0xf << 8) | (5 << 8),
            ..completed()
        };
        let (code, _, _, _, detail) = misconfigured.judge(false).expect("fault");
        assert_eq!(code, FaultCode::FabricUnhealthy);
        assert!(detail.contains("insufficient NVLinks"), "{detail}");

        let limited = FabricInfo {
            health_summary: Some(3),
            ..completed()
        };
        assert_eq!(
            limited.judge(false).map(|f| f.0),
            Some(FaultCode::FabricDegraded)
        );
    }

    /// A healthy mask with the two-state field at `shift` set to true.
    fn with_true(mask: u32, shift: u32) -> u32 {
        mask & !(0x3 << shift) | (TRUE << shift)
    }

    #[test]
    fn adjacent_true_fields_are_each_read_on_their_own() {
        // Route unhealthy and access-timeout recovery both true: a 3-bit window read 5 for
        // the first and missed the fatal, most of all on a v2 driver with no summary.
        let both = with_true(
            with_true(completed().health_mask, SHIFT_ROUTE_UNHEALTHY),
            SHIFT_ACCESS_TIMEOUT_RECOVERY,
        );
        let info = FabricInfo {
            health_mask: both,
            health_summary: None,
            ..completed()
        };
        let (code, severity, _, _, detail) = info.judge(false).expect("fault");
        assert_eq!(
            (code, severity),
            (FaultCode::FabricUnhealthy, Severity::Fatal)
        );
        assert!(detail.contains("unhealthy routes"), "{detail}");

        // Access-timeout recovery true beside configuration "none" (1 at bit 8) is reported.
        let recovery = FabricInfo {
            health_mask: with_true(completed().health_mask, SHIFT_ACCESS_TIMEOUT_RECOVERY),
            ..completed()
        };
        let (code, _, _, _, detail) = recovery.judge(false).expect("fault");
        assert_eq!(code, FaultCode::FabricDegraded);
        assert!(detail.contains("access-timeout recovery"), "{detail}");

        // Every two-state field true at once: each one named.
        let all = [0, 2, 4, 6]
            .into_iter()
            .fold(completed().health_mask, with_true);
        let info = FabricInfo {
            health_mask: all,
            ..completed()
        };
        let view = info.view().expect("view");
        assert_eq!(view.health.as_deref(), Some("unhealthy routes"));
        let degraded = FabricInfo {
            health_mask: with_true(
                with_true(completed().health_mask, SHIFT_DEGRADED_BW),
                SHIFT_ROUTE_RECOVERY,
            ),
            ..completed()
        };
        let (_, _, _, _, detail) = degraded.judge(false).expect("fault");
        assert!(
            detail.contains("degraded bandwidth") && detail.contains("route recovery"),
            "{detail}"
        );
    }

    #[test]
    fn a_v2_driver_without_a_summary_is_judged_on_the_mask_alone() {
        let info = FabricInfo {
            health_summary: None,
            ..completed()
        };
        assert_eq!(info.judge(false), None);
    }
}
