//! The one way gpu-agent writes an Event: created, or updated where one of the same name is
//! already there (an earlier count, a restarted agent); updated, or created again where it
//! expired (the API server keeps Events an hour by default). Node Events, pod Events and the
//! checkpoint sink's Events all go through [`NodeApi::write_event`]; their names are
//! deterministic ([`event_name`], [`super::NodePod::event_name`]) so a restarted agent finds
//! its Events again.

use std::time::Duration;

use super::{ApiError, NodeApi};
use crate::model::Fault;

/// A repeating fault's Event is updated at most this often.
pub const UPDATE_EVERY: Duration = Duration::from_secs(10);

/// An Event to create or update.
#[derive(Debug, Clone, PartialEq)]
pub enum EventWrite {
    /// Create it (or, if it already exists, update it).
    Create {
        /// Its name.
        name: String,
        /// The whole Event.
        body: serde_json::Value,
        /// The fault's count.
        count: u64,
    },
    /// Update its count and timestamps.
    Update {
        /// Its name.
        name: String,
        /// Merge patch.
        body: serde_json::Value,
        /// The whole Event, to create it again if it expired (the API server keeps Events
        /// for an hour by default: an update then answers 404).
        full: serde_json::Value,
        /// The fault's count.
        count: u64,
    },
}

impl EventWrite {
    /// Create `body` (its name from its metadata), with the count it carries.
    pub fn create(body: serde_json::Value, count: u64) -> Self {
        let name = body["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        Self::Create { name, body, count }
    }

    /// The Event's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Create { name, .. } | Self::Update { name, .. } => name,
        }
    }
}

/// Deterministic Event name for a fault on a node (so a restarted agent finds its Event,
/// and a pod Event can name the Node Event it belongs to).
pub fn event_name(node: &str, fault: &Fault) -> String {
    let hash = crate::model::stable_hash(&fault_key(fault));
    format!("{node}.gpu-agent.{hash:016x}")
}

/// A fault's identity: its component and code.
pub fn fault_key(fault: &Fault) -> String {
    format!("{:?}|{:?}", fault.component, fault.code)
}

/// What an Event says.
#[derive(Debug, Clone, Copy)]
pub struct EventText<'a> {
    /// `reason` (`CheckpointSignal`, `NvidiaXID79Error`, ...).
    pub reason: &'a str,
    /// `Warning` or `Normal`.
    pub type_: &'a str,
    /// The message.
    pub message: &'a str,
    /// How many times it happened.
    pub count: u64,
    /// First time.
    pub first: std::time::SystemTime,
    /// Latest time.
    pub last: std::time::SystemTime,
}

/// The Event `name` in `namespace` about `involved` (an `involvedObject`), reported by
/// gpu-agent on `node`: the one shape of every Event the agent writes.
pub fn build(
    name: &str,
    namespace: &str,
    involved: serde_json::Value,
    event: &EventText<'_>,
    node: &str,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": { "name": name, "namespace": namespace },
        "involvedObject": involved,
        "reason": event.reason,
        "message": event.message,
        "type": event.type_,
        "count": event.count,
        "firstTimestamp": crate::model::time::rfc3339(event.first),
        "lastTimestamp": crate::model::time::rfc3339(event.last),
        "source": { "component": "gpu-agent", "host": node },
        "reportingComponent": "gpu-agent",
        "reportingInstance": node,
    })
}

/// The merge patch that brings an existing Event up to `event`: its count, latest time and
/// message.
pub fn update_of(event: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({ "count": event["count"], "lastTimestamp": event["lastTimestamp"], "message": event["message"] })
}

impl NodeApi {
    /// Write an Event in `namespace`: a create that finds one already there updates it; an
    /// update that finds it gone creates it again.
    pub async fn write_event(&self, namespace: &str, write: &EventWrite) -> Result<(), ApiError> {
        match write {
            EventWrite::Create { body, name, .. } => {
                match self.create_event_in(namespace, body).await {
                    Err(e) if e.code() == Some(409) => {
                        self.patch_event_in(namespace, name, &update_of(body)).await
                    }
                    other => other,
                }
            }
            EventWrite::Update {
                name, body, full, ..
            } => match self.patch_event_in(namespace, name, body).await {
                Err(e) if e.code() == Some(404) => self.create_event_in(namespace, full).await,
                other => other,
            },
        }
    }
}
