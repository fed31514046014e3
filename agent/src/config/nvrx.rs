//! `[nvrx]`: NVIDIA Resiliency Extension's node health check, served on a Unix socket.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[nvrx]`: NVRx's node health check (`ft_launcher --ft-node-health-check-endpoint
/// unix://<socket>`), answered from the health model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvrxConfig {
    /// The Unix socket to serve `nvhcd.HealthCheckService` on; empty: off.
    pub socket: PathBuf,
    /// The group (name or number) that may call it besides root and the agent's own group
    /// (the socket is 0660; the group is given access by an ACL); empty: no other.
    pub group: String,
}
