//! The checkpoint sink's metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of the per-kind counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// Notice kind.
    pub kind: String,
}

/// Labels of skipped targets.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabels {
    /// Why ([`super::Verdict::label`]: `no-handler`, `excluded`, `launcher`, `stuck`, ...;
    /// `gone` when the process exited before its signal).
    pub reason: String,
}

/// The sink's metrics.
#[derive(Debug, Clone)]
pub struct CheckpointMetrics {
    pub(super) notices: Family<KindLabels, Counter>,
    pub(super) signalled: Family<KindLabels, Counter>,
    pub(super) skipped: Family<SkipLabels, Counter>,
    pub(super) latency: Histogram,
    pub(super) confirmed: Family<KindLabels, Counter>,
    pub(super) unconfirmed: Family<KindLabels, Counter>,
    pub(super) confirm_time: Histogram,
    pub(super) record_save_failures: Counter,
}

impl CheckpointMetrics {
    /// Create and register.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            notices: Family::default(),
            signalled: Family::default(),
            skipped: Family::default(),
            latency: Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0]),
            confirmed: Family::default(),
            unconfirmed: Family::default(),
            confirm_time: Histogram::new([1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0]),
            record_save_failures: Counter::default(),
        };
        registry.register(
            "gpu_agent_checkpoint_record_save_failures",
            "Saves of the record of signalled notices that failed (a restart may then signal a notice again)",
            m.record_save_failures.clone(),
        );
        registry.register(
            "gpu_agent_notices",
            "Notices acted on, by kind",
            m.notices.clone(),
        );
        registry.register(
            "gpu_agent_checkpoint_targets_signalled",
            "Processes signalled to checkpoint, by notice kind",
            m.signalled.clone(),
        );
        registry.register(
            "gpu_agent_checkpoint_targets_skipped",
            "Processes holding a GPU that were not signalled, by reason",
            m.skipped.clone(),
        );
        registry.register(
            "gpu_agent_checkpoint_signal_latency_seconds",
            "From the notice (or its lead time) to the signals sent",
            m.latency.clone(),
        );
        registry.register(
            "gpu_agent_checkpoint_confirmed",
            "Signalled processes that confirmed their checkpoint (ack file or exit), by notice kind",
            m.confirmed.clone(),
        );
        registry.register(
            "gpu_agent_checkpoint_unconfirmed",
            "Signalled processes that had not confirmed at the deadline, by notice kind",
            m.unconfirmed.clone(),
        );
        registry.register(
            "gpu_agent_checkpoint_confirm_seconds",
            "From the signal to the last confirmation of a notice's processes",
            m.confirm_time.clone(),
        );
        m
    }
}
