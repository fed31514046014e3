//! `[imds]`: EC2 instance metadata (Spot notice, rebalance, scheduled events).

use serde::{Deserialize, Serialize};

use super::duration::{DAY, HOUR, MINUTE, MS};
use super::HumanDuration;

/// `[imds]`: EC2 instance metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImdsConfig {
    /// Poll IMDS (only on EC2, unless `endpoint` is set).
    pub enabled: bool,
    /// Endpoint override (tests point it at a loopback server); empty: the standard
    /// `AWS_EC2_METADATA_SERVICE_ENDPOINT` variable, else the link-local address on EC2.
    pub endpoint: String,
    /// How often the Spot instance-action is polled (it gives two minutes), on a Spot
    /// instance (IMDS `instance-life-cycle` is `spot`, or unreadable). Elsewhere no Spot
    /// notice can come: every path is read at the rebalance recommendation's pace. The
    /// cost: EC2's IMDS closes every connection, so each poll is a TCP connection of its
    /// own, about 0.04 % of a core at 1 s on an x86_64 VM (BENCHMARKS.md in the source
    /// tree, 2026-12-07, f21fcd6); `"2s"` (aws-node-termination-handler's pace) halves that
    /// and adds up to a second to the notice.
    pub poll_interval: HumanDuration<{ 100 * MS }, MINUTE>,
    /// How often the rebalance recommendation is polled (it changes rarely).
    pub rebalance_interval: HumanDuration<{ 100 * MS }, HOUR>,
    /// How often scheduled events are polled (announced days ahead).
    pub scheduled_interval: HumanDuration<{ 100 * MS }, DAY>,
}

impl Default for ImdsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            endpoint: String::new(),
            poll_interval: HumanDuration(std::time::Duration::from_secs(1)),
            rebalance_interval: HumanDuration(std::time::Duration::from_secs(30)),
            scheduled_interval: HumanDuration(std::time::Duration::from_secs(60)),
        }
    }
}
