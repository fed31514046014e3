//! # gpu-agent
//!
//! A node agent for GPU hosts that keeps the GPU hour that was paid for productive.
//!
//! **Reads:** the kernel log (`/dev/kmsg`) for NVIDIA Xid, "fallen off the bus" and NVSwitch
//! SXid lines; sysfs for the GPUs and NVSwitches on the PCI bus; procfs for the boot id.
//!
//! **Decides:** every fault is classified by NVIDIA's catalog ([`catalog`]) into a severity
//! (info, warning, fatal) and an action (none, restart-app, reset-gpu, reboot, replace), and
//! merged into one health model owned by the [`core`].
//!
//! **Emits:** a status socket (`gpu-agent status`), Prometheus metrics, systemd `STATUS=`
//! and watchdog, and structured logs (journald fields when run under systemd).
//!
//! The pipeline is sources -> core -> sinks; see `docs/ARCHITECTURE.md`.

pub mod catalog;
pub mod cli;
pub mod commands;
pub mod config;
pub mod core;
pub mod drill;
pub mod fsutil;
pub mod host;
pub mod kubelet_config;
pub mod logging;
pub mod model;
pub mod shutdown;
pub mod sinks;
pub mod sources;
pub mod tick;
