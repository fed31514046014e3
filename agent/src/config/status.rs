//! `[status]`: the admin socket.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[status]`: the socket `gpu-agent status` (and `clear`) talks to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatusConfig {
    /// Unix socket path; its directory is made 0750 and must never be shared with pods (not
    /// the notice file's, the NVRx socket's or the ack directory's).
    pub socket: PathBuf,
}

impl Default for StatusConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("/run/gpu-agent-admin/agent.sock"),
        }
    }
}
