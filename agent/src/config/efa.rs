//! `[efa]`: the EFA devices' health.

use serde::{Deserialize, Serialize};

use super::duration::{HOUR, SECOND};
use super::HumanDuration;

/// `[efa]`: the Elastic Fabric Adapters' health, from sysfs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EfaConfig {
    /// Watch the EFA devices (off by itself where there are none).
    pub enabled: bool,
    /// How often the devices are read.
    pub poll_interval: HumanDuration<SECOND, HOUR>,
    /// Counters are turned into rates over this window; a counter's fatal rate must last a
    /// whole window before it condemns the node, and a fault outlives its evidence by a
    /// window (a link back up, rates under the limits, for a whole window).
    pub window: HumanDuration<{ 10 * SECOND }, HOUR>,
    /// From boot, how long fewer devices than expected are not a fault (EFA devices can
    /// initialise late: seen on p5en).
    pub startup_grace: HumanDuration<0, HOUR>,
    /// EFA devices this node should have; 0: this instance's EFA interfaces as the EC2 API
    /// lists them, else as many as this boot had once the start-up grace ended (only fewer
    /// is a fault: the instance type's maximum is not what a launch template attaches).
    pub expected_devices: u32,
    /// An error counter (`rdma_read_wr_err`, `rdma_write_wr_err`, `retrans_timeout_events`,
    /// and the peer's or receiver's `rx_drops`, `unresponsive_remote_events`,
    /// `impaired_remote_conn_events`) rising faster than this per minute is a warning.
    pub errors_warning_per_minute: f64,
    /// ... and a local one (`rdma_read_wr_err`, `rdma_write_wr_err`,
    /// `retrans_timeout_events`) faster than this for a whole window, fatal
    /// (`NetworkingReady=False`). A peer's trouble is never fatal here.
    pub errors_fatal_per_minute: f64,
    /// `retrans_pkts` rising faster than this per minute is a warning (never fatal).
    pub retrans_warning_per_minute: f64,
}

impl Default for EfaConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            poll_interval: HumanDuration(std::time::Duration::from_secs(5)),
            window: HumanDuration(std::time::Duration::from_secs(60)),
            startup_grace: HumanDuration(std::time::Duration::from_secs(300)),
            expected_devices: 0,
            errors_warning_per_minute: 60.0,
            errors_fatal_per_minute: 600.0,
            retrans_warning_per_minute: 60_000.0,
        }
    }
}
