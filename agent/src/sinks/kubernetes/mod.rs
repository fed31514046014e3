//! The daemon's one connection to the Kubernetes API server, shared by the node-conditions
//! sink, the device-taints sink (per-GPU fencing) and the checkpoint sink's pod Events and
//! cordon.
//!
//! - **Built once, off the runtime thread.** Building a client runs the kubeconfig's exec
//!   credential plugin (`aws eks get-token`, aws-iam-authenticator) as a blocking process
//!   call; it runs on the blocking pool, once, and the client is reused (kube refreshes the
//!   credential itself, also on the blocking pool).
//! - **Every call time-limited**: connect, each read and write (kube's `Config` timeouts) and
//!   the whole call ([`client::NodeApi`] wraps each in `[kubernetes] timeout`). A server that
//!   accepts and never answers is an [`ApiError::Unreachable`] after that.
//! - **The node name is resolved again whenever the API server answers 403 or 404 for it**
//!   ([`crate::host::node_name`]): the kubelet starts after the agent, so the name resolved at
//!   start (the link's first name, shared with `status`) may be the hostname until then.
//!   Each new resolution is reported to the core so `status` shows the name and its source.
//! - **No kubeconfig yet** (nodeadm writes it after the agent starts) is not final: the
//!   file is looked for again on the next use.

mod client;
pub mod dra;
pub mod events;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

pub use client::{annotation_patch, ApiError, NodeApi, NodePod};
pub use dra::DraApi;
pub use events::EventText;

use crate::model::{NodeName, Observation};

/// What the link needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Kubeconfig path (the kubelet's by default).
    pub kubeconfig: PathBuf,
    /// `node_name` from the config (empty: resolve).
    pub node_name: String,
    /// procfs root (the kubelet's command line, the hostname).
    pub procfs_root: PathBuf,
    /// nodeadm's kubelet environment file.
    pub kubelet_environment: PathBuf,
    /// Time limit for every call.
    pub timeout: Duration,
}

struct Inner {
    settings: Settings,
    /// Serialises client building, so concurrent first uses build one client.
    client: tokio::sync::Mutex<Option<kube::Client>>,
    name: Mutex<Option<NodeName>>,
    names: mpsc::Sender<Observation>,
}

/// A cheap handle to the shared connection.
#[derive(Clone)]
pub struct Link {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("settings", &self.inner.settings)
            .field("name", &self.known_name())
            .finish_non_exhaustive()
    }
}

impl Link {
    /// A link that connects on first use, starting with the node name resolved at start;
    /// names resolved later are reported on `names`.
    pub fn new(settings: Settings, name: NodeName, names: mpsc::Sender<Observation>) -> Self {
        Self {
            inner: Arc::new(Inner {
                settings,
                client: tokio::sync::Mutex::new(None),
                name: Mutex::new(Some(name)),
                names,
            }),
        }
    }

    /// The time limit for every call.
    pub fn timeout(&self) -> Duration {
        self.inner.settings.timeout
    }

    /// The calls, for this node: connects (once) and resolves the node name (when not known).
    pub async fn api(&self) -> Result<NodeApi, ApiError> {
        let (client, name) = self.client_and_name().await?;
        Ok(NodeApi::new(client, &name, self.inner.settings.timeout))
    }

    /// The DRA calls (per-GPU fencing), for this node.
    pub async fn dra(&self) -> Result<DraApi, ApiError> {
        let (client, name) = self.client_and_name().await?;
        Ok(DraApi::new(client, &name, self.inner.settings.timeout))
    }

    async fn client_and_name(&self) -> Result<(kube::Client, String), ApiError> {
        let client = {
            let mut slot = self.inner.client.lock().await;
            match slot.as_ref() {
                Some(client) => client.clone(),
                None => {
                    let built = client::connect(
                        &self.inner.settings.kubeconfig,
                        self.inner.settings.timeout,
                    )
                    .await?;
                    *slot = Some(built.clone());
                    built
                }
            }
        };
        Ok((client, self.node_name().await.name))
    }

    /// This node's name: the one known, or resolved now (after a 403/404 dropped it).
    async fn node_name(&self) -> NodeName {
        if let Some(name) = self.known_name() {
            return name;
        }
        let s = &self.inner.settings;
        let (configured, procfs, env) = (
            s.node_name.clone(),
            s.procfs_root.clone(),
            s.kubelet_environment.clone(),
        );
        // Reads procfs (every process's command line): off the runtime thread.
        let name = tokio::task::spawn_blocking(move || {
            crate::host::node_name::resolve(&configured, &procfs, &env)
        })
        .await
        .unwrap_or_else(|_| NodeName {
            name: "localhost".into(),
            source: crate::model::NameSource::Hostname,
        });
        if let Ok(mut slot) = self.inner.name.lock() {
            *slot = Some(name.clone());
        }
        let _ = self
            .inner
            .names
            .send(Observation::NodeName(name.clone()))
            .await;
        name
    }

    fn known_name(&self) -> Option<NodeName> {
        self.inner.name.lock().ok().and_then(|n| n.clone())
    }

    /// After `error`: a 403 or 404 may mean the wrong node name (the kubelet registered
    /// under another one), so the name is resolved again on the next use.
    pub fn after_error(&self, error: &ApiError) {
        if matches!(error.code(), Some(403 | 404)) {
            if let Ok(mut slot) = self.inner.name.lock() {
                *slot = None;
            }
        }
    }
}
