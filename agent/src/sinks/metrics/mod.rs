//! Prometheus metrics, rendered from the latest health snapshot at scrape time (so they can
//! never disagree with `status`), served over HTTP at `/metrics`.
//!
//! Names are `gpu_agent_<thing>_<unit>`; labels are bounded (GPU index or PCI address, fault
//! code, severity, action), never a raw message.

mod collector;
#[cfg(test)]
mod reference;
mod server;

pub use collector::{encode, SnapshotCollector};
pub use server::{serve, ServeError};
