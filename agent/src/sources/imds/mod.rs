//! The IMDS source: polls EC2 instance metadata (IMDSv2, on a light session of its own over
//! hyper: [`session`]) for a Spot interruption notice, a rebalance recommendation and
//! scheduled maintenance, and sends the complete set of current notices each poll.
//!
//! Off the EC2 network it never sends a packet: unless an endpoint is configured (tests, or
//! `AWS_EC2_METADATA_SERVICE_ENDPOINT`), DMI decides first, and not-EC2 turns the source off
//! with the reason, re-checked every ten minutes.

mod detect;
pub mod notices;
#[cfg(feature = "clients")]
mod poll;
#[cfg(feature = "clients")]
pub mod session;

pub use detect::ec2;
#[cfg(feature = "clients")]
pub use poll::{client, http_client, poll, run, Settings};
