//! A node's Kubernetes name and where it came from (resolved by `host::node_name`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a node name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NameSource {
    /// `node_name` in the config.
    Config,
    /// The running kubelet's `--hostname-override`.
    KubeletCommandLine,
    /// nodeadm's kubelet environment file.
    NodeadmEnvironment,
    /// The kernel hostname (no kubelet and no override found).
    Hostname,
}

impl fmt::Display for NameSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Config => "config node_name",
            Self::KubeletCommandLine => "kubelet --hostname-override",
            Self::NodeadmEnvironment => "nodeadm kubelet environment",
            Self::Hostname => "hostname",
        })
    }
}

/// A resolved node name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeName {
    /// The name.
    pub name: String,
    /// Where it came from.
    pub source: NameSource,
}
