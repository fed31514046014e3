//! The sink's own metrics: condition state, API errors, patch latency.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of `gpu_agent_kubernetes_condition`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    /// Condition type.
    pub r#type: String,
    /// `True` / `False`.
    pub status: String,
}

/// Labels of `gpu_agent_kubernetes_api_errors_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// HTTP verb.
    pub verb: String,
    /// HTTP status, or `none` when the server did not answer.
    pub code: String,
}

/// The sink's metrics, registered once.
#[derive(Debug, Clone)]
pub struct SinkMetrics {
    /// 1 for the status each owned condition has on the server, 0 for the other.
    pub condition: Family<ConditionLabels, Gauge>,
    /// Failed API calls.
    pub errors: Family<ErrorLabels, Counter>,
    /// Node status PATCH latency.
    pub patch_seconds: Histogram,
}

impl SinkMetrics {
    /// Create and register.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            condition: Family::default(),
            errors: Family::default(),
            patch_seconds: Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
        };
        registry.register(
            "gpu_agent_kubernetes_condition",
            "Owned node condition status as last written (1 = current)",
            metrics.condition.clone(),
        );
        registry.register(
            "gpu_agent_kubernetes_api_errors",
            "Failed Kubernetes API calls, by verb and status code",
            metrics.errors.clone(),
        );
        registry.register(
            "gpu_agent_kubernetes_patch_duration_seconds",
            "Latency of node status PATCH requests",
            metrics.patch_seconds.clone(),
        );
        metrics
    }
}
