//! Sinks: each renders the core's [`HealthSnapshot`] for one audience. Sinks read
//! snapshots; they never change health state.
//!
//! [`HealthSnapshot`]: crate::model::HealthSnapshot

pub mod checkpoint;
#[cfg(feature = "clients")]
pub mod device_taints;
pub mod efa_traffic;
pub mod funnel;
#[cfg(feature = "clients")]
pub mod kubernetes;
pub mod metrics;
#[cfg(feature = "clients")]
pub mod node_conditions;
#[cfg(feature = "clients")]
pub mod nvrx;
#[cfg(feature = "clients")]
pub mod pod_events;
#[cfg(feature = "clients")]
pub mod pod_resources;
pub mod status;
pub mod systemd;
