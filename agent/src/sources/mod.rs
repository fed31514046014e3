//! Sources: each reads one kind of outside input and emits typed [`Observation`]s to the core.
//! Sources never call sinks.
//!
//! [`Observation`]: crate::model::Observation

#[cfg(feature = "clients")]
pub mod capacity_block;
#[cfg(feature = "clients")]
mod dbus;
#[cfg(feature = "clients")]
pub mod ec2;
pub mod efa;
pub mod imds;
#[cfg(feature = "clients")]
pub mod imex;
pub mod kmsg;
#[cfg(feature = "clients")]
pub mod logind;
pub mod nvml;
