//! `[metrics]`: the Prometheus endpoint.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::duration::{DAY, HOUR, SECOND};
use super::HumanDuration;

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Serve `/metrics`.
    pub enabled: bool,
    /// Listen address.
    pub listen: SocketAddr,
    /// How often the funnel (which GPUs pods hold and keep busy, and their GPU-seconds) is
    /// taken: each time asks the kubelet which pod holds which GPU.
    pub funnel_interval: HumanDuration<SECOND, HOUR>,
    /// A pod that holds GPUs and keeps none of them busy this long is reported held but
    /// idle (a Pod Event once per episode, `gpu_agent_pod_held_idle`, a line in `status`).
    pub held_idle_after: HumanDuration<SECOND, DAY>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 9467)),
            funnel_interval: HumanDuration(std::time::Duration::from_secs(30)),
            held_idle_after: HumanDuration(std::time::Duration::from_secs(20 * 60)),
        }
    }
}
