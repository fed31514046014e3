//! `[ec2]`: the EC2 API, for the Capacity Block's end.

use serde::{Deserialize, Serialize};

use super::duration::{DAY, SECOND};
use super::HumanDuration;

/// `[ec2]`: the EC2 API, for the Capacity Block end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Ec2Config {
    /// Look up the Capacity Block end.
    pub enabled: bool,
    /// Endpoint override (tests); empty: the region's endpoint.
    pub endpoint: String,
    /// How often to re-read the reservation; one lookup (IMDS, credentials, both EC2 calls)
    /// is cut off after this, or a minute if that is shorter.
    pub poll_interval: HumanDuration<SECOND, DAY>,
}

impl Default for Ec2Config {
    fn default() -> Self {
        Self {
            enabled: true,
            endpoint: String::new(),
            poll_interval: HumanDuration(std::time::Duration::from_secs(300)),
        }
    }
}
