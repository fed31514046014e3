//! The status socket: a Unix socket where `gpu-agent status` asks the running daemon for its
//! health snapshot. One JSON request line in, one JSON response line out.

mod client;
mod render;
mod server;

use serde::{Deserialize, Serialize};

pub use client::{query, ClientError};
pub use render::render;
pub use server::{serve, Holders};

use crate::model::HealthSnapshot;

/// A request on the status socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum Request {
    /// The current health snapshot.
    Status,
    /// Clear latched faults after a repair (root only).
    Clear {
        /// Reason, code or label of the faults to clear; `None` clears all.
        selector: Option<String>,
    },
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Response {
    /// The snapshot.
    Status {
        /// Health as of now.
        snapshot: Box<HealthSnapshot>,
    },
    /// The faults cleared.
    Cleared {
        /// Their labels.
        faults: Vec<String>,
    },
    /// The request was not understood or could not be served.
    Error {
        /// Why.
        message: String,
    },
}
