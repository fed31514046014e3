//! The shared vocabulary of sources, core and sinks.
//!
//! Nothing here depends on Kubernetes, AWS or NVML crates: sources translate what they read
//! into these types, the core merges them, sinks render them.

mod efa;
mod fault;
mod fence;
mod holder;
mod node_name;
pub mod notice;
mod pci;
mod reason;
pub mod signal;
mod snapshot;
pub mod time;

pub use efa::{EfaDevice, ImexState, Inventory, EFA_TRAFFIC_COUNTERS};
pub use fault::{
    Action, Classification, Component, Fault, FaultCode, FaultReport, Severity, SourceKind,
};
pub use fence::{Fencing, GpuFence, TaintEffect, TAINT_KEY};
pub use holder::{
    resolve as resolve_device, Assignment, Assignments, DraClaim, GpuHolder, HolderView,
};
pub use node_name::{NameSource, NodeName};
pub use notice::{CheckpointReport, DeclaredLead, Notice, NoticeKind};
pub use pci::{PciAddress, PciAddressError};
pub use reason::{reason, WHOLE_NODE};
pub use snapshot::{
    FaultPathLock, GpuFabric, GpuIdentity, GpuStatus, GpuTelemetry, Health, HealthSnapshot,
    HeldIdle, KmsgCounters, KmsgStats, MigActivity, NodeCondition, PendingEnd, SinkStatus,
    SourceState, SourceStatus,
};

/// FNV-1a of `text`: a hash stable across runs and builds, for deterministic object names
/// (an Event a restarted agent finds again).
pub fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What a source tells the core.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// A fault was seen.
    Fault(FaultReport),
    /// A source changed state (started, turned off, failed).
    Source(SourceKind, SourceState),
    /// A notice source's complete view: these notices are all it sees now.
    Notices {
        /// Which source.
        source: SourceKind,
        /// Every current notice.
        notices: Vec<Notice>,
    },
    /// The checkpoint sink signalled (or skipped) processes for a notice.
    Checkpoint(CheckpointReport),
    /// The longest checkpoint lead the pods holding this node's GPUs declare (`None`: none
    /// does), as the checkpoint sink last read it.
    DeclaredLead(Option<DeclaredLead>),
    /// A sink changed state (connected, off, failing); shown by `status`.
    Sink(SinkStatus),
    /// The Kubernetes sink resolved this node's name (shown by `status`).
    NodeName(NodeName),
    /// What per-GPU fencing can do and has done (the device-taints sink); `None`: off.
    Fencing(Option<Fencing>),
    /// The Node conditions the node-conditions sink wrote (shown by `status`).
    Conditions(Vec<NodeCondition>),
    /// The pods holding GPUs and keeping none busy for the funnel's window (the funnel
    /// sink; shown by `status`).
    HeldIdle(Vec<HeldIdle>),
    /// Whether the fault path's pages are locked in memory (`host::resident`).
    FaultPathLock(FaultPathLock),
    /// A polling source's complete view: these faults are all it sees now (faults it
    /// reported before and not now have cleared), and what it enumerated.
    Poll {
        /// Which source.
        source: SourceKind,
        /// Every fault currently present.
        faults: Vec<FaultReport>,
        /// Faults (component and code) that could not be judged because the call they come
        /// from failed: they stay as they were, neither cleared nor newly judged absent.
        partial: Vec<(Component, FaultCode)>,
        /// What it enumerated (the GPUs, the EFA devices).
        inventory: Inventory,
    },
}
