//! Talking to the API server: connecting with the kubelet's kubeconfig (exec credential
//! plugins included) or in-cluster config, and the calls the sinks make, each time-limited,
//! with errors that name the verb and resource.

use std::future::Future;

use super::events::EventText;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// Why the API server could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No kubeconfig and not in a pod: standalone mode.
    #[error("no kubeconfig at {path} and not running in a pod: standalone mode")]
    NotConfigured {
        /// The kubeconfig looked for.
        path: String,
    },
    /// The kubeconfig could not be used.
    #[error("kubeconfig {path}: {reason}")]
    Config {
        /// The kubeconfig.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// 401: the credentials were rejected.
    #[error(
        "{verb} {resource}: 401 Unauthorized: the API server rejected the credentials ({message})"
    )]
    Unauthorized {
        /// HTTP verb.
        verb: &'static str,
        /// Resource path (`nodes/NAME/status`).
        resource: String,
        /// The server's message.
        message: String,
    },
    /// 403: RBAC denies the call.
    #[error("{verb} {resource}: 403 Forbidden: RBAC denies it; the node identity needs patch on nodes/status and create/patch on events, and for per-GPU fencing the ClusterRole in device-taints-rbac.yaml ({message})")]
    Forbidden {
        /// HTTP verb.
        verb: &'static str,
        /// Resource path.
        resource: String,
        /// The server's message.
        message: String,
    },
    /// Any other status from the server.
    #[error("{verb} {resource}: {code} {reason}: {message}")]
    Status {
        /// HTTP verb.
        verb: &'static str,
        /// Resource path.
        resource: String,
        /// HTTP status code.
        code: u16,
        /// The Status reason (`NotFound`, `Conflict`, ...).
        reason: String,
        /// The server's message.
        message: String,
    },
    /// No answer (connection refused, timeout, TLS).
    #[error("{verb} {resource}: API server unreachable: {reason}")]
    Unreachable {
        /// HTTP verb.
        verb: &'static str,
        /// Resource path.
        resource: String,
        /// What failed.
        reason: String,
    },
}

impl ApiError {
    /// The HTTP status, where the server answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Unauthorized { .. } => Some(401),
            Self::Forbidden { .. } => Some(403),
            Self::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Metric labels: verb and code (`none` when the server did not answer; `CONNECT` when
    /// no client could be built from the kubeconfig). [`ApiError::NotConfigured`] is never
    /// counted: with no kubeconfig the sink is off.
    pub fn labels(&self) -> (&'static str, String) {
        let verb = match self {
            Self::Unauthorized { verb, .. }
            | Self::Forbidden { verb, .. }
            | Self::Status { verb, .. }
            | Self::Unreachable { verb, .. } => verb,
            Self::NotConfigured { .. } | Self::Config { .. } => "CONNECT",
        };
        (
            verb,
            self.code()
                .map_or_else(|| "none".to_string(), |c| c.to_string()),
        )
    }

    pub(super) fn from_kube(verb: &'static str, resource: String, e: kube::Error) -> Self {
        match e {
            kube::Error::Api(status) => {
                let message = status.message.clone();
                match status.code {
                    401 => Self::Unauthorized {
                        verb,
                        resource,
                        message,
                    },
                    403 => Self::Forbidden {
                        verb,
                        resource,
                        message,
                    },
                    code => Self::Status {
                        verb,
                        resource,
                        code,
                        reason: status.reason.clone(),
                        message,
                    },
                }
            }
            other => Self::Unreachable {
                verb,
                resource,
                reason: other.to_string(),
            },
        }
    }
}

/// How many call time limits building a client may take: reading the kubeconfig and running
/// its exec credential plugin (`aws eks get-token` takes a second or two; a plugin that hangs
/// must not hold the client, which every sink waits on, for ever).
const CONNECT_LIMITS: u32 = 3;

/// Connect: the kubeconfig at `path` if it exists, else in-cluster config when running in
/// a pod, else [`ApiError::NotConfigured`]. `timeout` limits each read and write, and three
/// of it the whole of connecting. The client is built on the blocking pool: building it
/// runs the kubeconfig's exec credential plugin, a blocking process call.
pub async fn connect(path: &Path, timeout: Duration) -> Result<Client, ApiError> {
    let limit = timeout.saturating_mul(CONNECT_LIMITS);
    tokio::time::timeout(limit, build(path, timeout))
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::Config {
                path: path.display().to_string(),
                reason: format!(
                    "building the client (the exec credential plugin included) did not finish \
                     within {}",
                    humantime::format_duration(limit)
                ),
            })
        })
}

async fn build(path: &Path, timeout: Duration) -> Result<Client, ApiError> {
    let shown = path.display().to_string();
    let config_err = |reason: String| ApiError::Config {
        path: shown.clone(),
        reason,
    };
    let mut config = if path.exists() {
        let kubeconfig = Kubeconfig::read_from(path).map_err(|e| config_err(e.to_string()))?;
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| config_err(e.to_string()))?
    } else if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        Config::incluster().map_err(|e| config_err(format!("in-cluster config: {e}")))?
    } else {
        return Err(ApiError::NotConfigured { path: shown });
    };
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    // The blocking pool's threads carry the runtime's context: the client's background
    // task is spawned onto the daemon's runtime.
    tokio::task::spawn_blocking(move || Client::try_from(config))
        .await
        .map_err(|e| config_err(format!("building the client: {e}")))?
        .map_err(|e| config_err(e.to_string()))
}

/// Run one call within `limit`; a call with no answer by then is [`ApiError::Unreachable`].
pub(super) async fn timed<T>(
    limit: Duration,
    verb: &'static str,
    resource: String,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result.map_err(|e| ApiError::from_kube(verb, resource, e)),
        Err(_) => Err(ApiError::Unreachable {
            verb,
            resource,
            reason: format!("no answer within {limit:?}"),
        }),
    }
}

/// The calls the sinks make, each limited to `timeout` as a whole.
#[derive(Clone)]
pub struct NodeApi {
    nodes: Api<Node>,
    events: Api<Event>,
    node: String,
    timeout: Duration,
}

impl NodeApi {
    /// For node `node`; Node events live in the `default` namespace (as the kubelet's do).
    pub fn new(client: Client, node: &str, timeout: Duration) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client, "default"),
            node: node.to_string(),
            timeout,
        }
    }

    /// The node name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// GET the node; returns `(uid, conditions as JSON)`.
    pub async fn get(&self) -> Result<(String, Vec<serde_json::Value>), ApiError> {
        let node = timed(
            self.timeout,
            "GET",
            format!("nodes/{}", self.node),
            self.nodes.get(&self.node),
        )
        .await?;
        let uid = node.metadata.uid.clone().unwrap_or_default();
        let conditions =
            serde_json::to_value(node.status.and_then(|s| s.conditions).unwrap_or_default())
                .ok()
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default();
        Ok((uid, conditions))
    }

    /// Strategic-merge PATCH of `nodes/NAME/status`.
    pub async fn patch_status(&self, body: &serde_json::Value) -> Result<(), ApiError> {
        timed(
            self.timeout,
            "PATCH",
            format!("nodes/{}/status", self.node),
            self.nodes
                .patch_status(&self.node, &PatchParams::default(), &Patch::Strategic(body)),
        )
        .await
        .map(|_| ())
    }

    /// Pods on this node, with their uids and containers.
    pub async fn pods_on_node(&self) -> Result<Vec<NodePod>, ApiError> {
        let pods: Api<Pod> = Api::all(self.events.clone().into_client());
        let params = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        let list = timed(self.timeout, "LIST", "pods".into(), pods.list(&params)).await?;
        Ok(list
            .items
            .into_iter()
            .map(|p| NodePod {
                annotations: p.metadata.annotations.unwrap_or_default(),
                uid: p.metadata.uid.unwrap_or_default(),
                namespace: p.metadata.namespace.unwrap_or_default(),
                name: p.metadata.name.unwrap_or_default(),
                containers: p
                    .status
                    .and_then(|s| s.container_statuses)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| {
                        // `containerd://<id>`: the id is what the cgroup path carries.
                        let id = c.container_id.unwrap_or_default();
                        let id = id.rsplit_once("://").map_or(id.as_str(), |(_, id)| id);
                        (c.name, id.to_string())
                    })
                    .collect(),
            })
            .collect())
    }

    /// POST an Event in `namespace` (only through [`NodeApi::write_event`]).
    pub(super) async fn create_event_in(
        &self,
        namespace: &str,
        event: &serde_json::Value,
    ) -> Result<(), ApiError> {
        let typed: Event = serde_json::from_value(event.clone()).map_err(|e| ApiError::Status {
            verb: "POST",
            resource: format!("namespaces/{namespace}/events"),
            code: 0,
            reason: "Encode".into(),
            message: e.to_string(),
        })?;
        let events: Api<Event> = Api::namespaced(self.events.clone().into_client(), namespace);
        timed(
            self.timeout,
            "POST",
            format!("namespaces/{namespace}/events"),
            events.create(&PostParams::default(), &typed),
        )
        .await
        .map(|_| ())
    }

    /// JSON merge PATCH of the node object itself (not its status).
    async fn merge_patch(&self, body: &serde_json::Value) -> Result<(), ApiError> {
        timed(
            self.timeout,
            "PATCH",
            format!("nodes/{}", self.node),
            self.nodes
                .patch(&self.node, &PatchParams::default(), &Patch::Merge(body)),
        )
        .await
        .map(|_| ())
    }

    /// Set annotation `key` on the node to `value`, or remove it (`None`): a JSON merge
    /// patch of `metadata.annotations` only.
    pub async fn annotate(&self, key: &str, value: Option<&str>) -> Result<(), ApiError> {
        self.merge_patch(&annotation_patch(key, value)).await
    }

    /// Cordon the node (`spec.unschedulable = true`).
    pub async fn cordon(&self) -> Result<(), ApiError> {
        self.merge_patch(&serde_json::json!({ "spec": { "unschedulable": true } }))
            .await
    }

    /// Merge-PATCH an Event in `namespace` (only through [`NodeApi::write_event`]).
    pub(super) async fn patch_event_in(
        &self,
        namespace: &str,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<(), ApiError> {
        let events: Api<Event> = Api::namespaced(self.events.clone().into_client(), namespace);
        timed(
            self.timeout,
            "PATCH",
            format!("namespaces/{namespace}/events/{name}"),
            events.patch(name, &PatchParams::default(), &Patch::Merge(body)),
        )
        .await
        .map(|_| ())
    }
}

/// The merge patch that sets annotation `key` to `value` (`None`: removes it).
pub fn annotation_patch(key: &str, value: Option<&str>) -> serde_json::Value {
    serde_json::json!({ "metadata": { "annotations": { key: value } } })
}

/// A pod on this node, as the API server has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePod {
    /// Its uid (what Events name and the cgroup path carries).
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its containers: `(name, container id without the runtime prefix)`.
    pub containers: Vec<(String, String)>,
    /// Its annotations.
    pub annotations: std::collections::BTreeMap<String, String>,
}

impl NodePod {
    /// The name of the Event `key` identifies on this pod: deterministic, so a restarted
    /// agent finds its Event again.
    pub fn event_name(&self, key: &str) -> String {
        format!(
            "{}.gpu-agent.{:016x}",
            self.name,
            crate::model::stable_hash(key)
        )
    }

    /// The Event `name` on this pod, reported by gpu-agent on `node`.
    pub fn event(&self, name: &str, event: &EventText<'_>, node: &str) -> serde_json::Value {
        super::events::build(
            name,
            &self.namespace,
            serde_json::json!({ "apiVersion": "v1", "kind": "Pod", "name": self.name, "namespace": self.namespace, "uid": self.uid }),
            event,
            node,
        )
    }
}
