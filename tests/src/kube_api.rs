//! A test Kubernetes API server: what the agent uses, behaving like the real one. Bearer-token
//! auth (401 without it), `GET /api/v1/nodes/NAME` (404 Status for an unknown node),
//! `PATCH /api/v1/nodes/NAME/status` that requires `application/strategic-merge-patch+json`
//! (415 otherwise) and merges `status.conditions` by `type`, Events created with `POST`
//! (409 AlreadyExists on a duplicate name) and updated with merge-`PATCH`; modes for 401, 403,
//! 500, slow answers and requests never answered. Errors are `Status` objects, as the real server sends.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};

/// The bearer token the server accepts.
pub const TOKEN: &str = "gpu-agent-test-token";

/// How the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Like a healthy API server.
    Normal,
    /// Every request: 401.
    Unauthorized,
    /// Every request: 403 (RBAC).
    Forbidden,
    /// Every request: 500.
    ServerError,
    /// Every request is read and never answered (a half-open connection after a conntrack
    /// flush, an overloaded server): the client must give up on its own.
    Hang,
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Content-Type header.
    pub content_type: String,
    /// The body.
    pub body: String,
    /// When it arrived.
    pub at: std::time::Instant,
}

/// Everything the server holds.
#[derive(Debug)]
pub struct State {
    /// Nodes by name.
    pub nodes: BTreeMap<String, Value>,
    /// Events by name (namespace `default`).
    pub events: BTreeMap<String, Value>,
    /// Pods (listed by `spec.nodeName`).
    pub pods: Vec<Value>,
    /// Answer mode.
    pub mode: Mode,
    /// Delay before every answer.
    pub delay: Duration,
    /// Requests received.
    pub requests: Vec<Recorded>,
}

/// A running test API server.
#[derive(Debug)]
pub struct KubeApi {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state (shared with the server thread).
    pub state: Arc<Mutex<State>>,
    server: crate::http::Server,
}

impl KubeApi {
    /// Start on a free loopback port with these nodes (each with a kubelet-owned `Ready`
    /// condition, which the agent must never touch).
    pub fn start(nodes: &[&str]) -> Self {
        let mut map = BTreeMap::new();
        for (i, name) in nodes.iter().enumerate() {
            map.insert(
                name.to_string(),
                json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": { "name": name, "uid": format!("uid-{i}"), "resourceVersion": "1" },
                    "status": { "conditions": [
                        { "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                          "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z" }
                    ] }
                }),
            );
        }
        let state = Arc::new(Mutex::new(State {
            nodes: map,
            events: BTreeMap::new(),
            pods: Vec::new(),
            mode: Mode::Normal,
            delay: Duration::ZERO,
            requests: Vec::new(),
        }));
        Self::serve(state, "127.0.0.1:0".parse().expect("addr"))
    }

    /// Start again (after [`KubeApi::stop`]) on the same address with the same state.
    pub fn restart(addr: SocketAddr, state: Arc<Mutex<State>>) -> Self {
        Self::serve(state, addr)
    }

    fn serve(state: Arc<Mutex<State>>, addr: SocketAddr) -> Self {
        let shared = Arc::clone(&state);
        let handler: crate::http::Handler =
            Arc::new(move |req| Box::pin(handle(req, Arc::clone(&shared))));
        let server = crate::http::Server::start(addr, handler);
        Self {
            addr: server.addr,
            state,
            server,
        }
    }

    /// Stop listening (an outage); returns what [`KubeApi::restart`] needs.
    pub fn stop(mut self) -> (SocketAddr, Arc<Mutex<State>>) {
        self.server.stop();
        (self.addr, Arc::clone(&self.state))
    }

    /// Write a kubeconfig for this server (bearer token auth) into `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: http://{}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\nusers:\n- name: test\n  user:\n    token: {TOKEN}\n",
            self.addr
        );
        std::fs::write(&path, text).expect("kubeconfig");
        path
    }

    /// Set the answer mode.
    pub fn set_mode(&self, mode: Mode) {
        self.state.lock().expect("state").mode = mode;
    }

    /// The condition `type_` on node `node`, as stored.
    pub fn condition(&self, node: &str, type_: &str) -> Option<Value> {
        let state = self.state.lock().expect("state");
        state.nodes.get(node)?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_)
            .cloned()
    }

    /// Add a pod running on `node`.
    pub fn add_pod(&self, namespace: &str, name: &str, uid: &str, node: &str) {
        self.state.lock().expect("state").pods.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "namespace": namespace, "uid": uid },
            "spec": { "nodeName": node, "containers": [] }
        }));
    }

    /// Add a pod running on `node` with these containers (`(name, containerd id)`), as the
    /// API server reports them in `status.containerStatuses`.
    pub fn add_pod_with_containers(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
        containers: &[(&str, &str)],
    ) {
        let statuses: Vec<Value> = containers
            .iter()
            .map(|(c, id)| json!({ "name": c, "containerID": format!("containerd://{id}"), "ready": true, "restartCount": 0, "image": "trainer", "imageID": "" }))
            .collect();
        let specs: Vec<Value> = containers
            .iter()
            .map(|(c, _)| json!({ "name": c, "image": "trainer" }))
            .collect();
        self.state.lock().expect("state").pods.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "namespace": namespace, "uid": uid },
            "spec": { "nodeName": node, "containers": specs },
            "status": { "phase": "Running", "containerStatuses": statuses }
        }));
    }

    /// Set an annotation on a stored pod (`namespace/name`).
    pub fn annotate_pod(&self, namespace: &str, name: &str, key: &str, value: &str) {
        let mut state = self.state.lock().expect("state");
        let pod = state
            .pods
            .iter_mut()
            .find(|p| p["metadata"]["namespace"] == namespace && p["metadata"]["name"] == name)
            .expect("no such pod");
        pod["metadata"]["annotations"][key] = json!(value);
    }

    /// Drop every stored Event, as the API server's Event TTL (an hour by default) does.
    pub fn expire_events(&self) {
        self.state.lock().expect("state").events.clear();
    }

    /// A stored node.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.state.lock().expect("state").nodes.get(name).cloned()
    }

    /// All stored Events.
    pub fn events(&self) -> Vec<Value> {
        self.state
            .lock()
            .expect("state")
            .events
            .values()
            .cloned()
            .collect()
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().expect("state").requests.clone()
    }
}

fn status(
    code: StatusCode,
    reason: &str,
    message: String,
    details: Value,
) -> Response<Full<Bytes>> {
    respond(
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": details, "code": code.as_u16()
        }),
    )
}

fn respond(code: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = code;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

/// 415, as the real server answers a PATCH that is not a merge patch.
fn refuse_non_patch(content_type: &str) -> Option<Response<Full<Bytes>>> {
    let ok = content_type == "application/merge-patch+json"
        || content_type == "application/strategic-merge-patch+json";
    (!ok).then(|| {
        status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!("unsupported media type {content_type}"),
            json!({}),
        )
    })
}

/// Strategic merge of `status.conditions` (merge key `type`); other fields merge as JSON.
fn strategic_merge(node: &mut Value, patch: &Value) {
    if let Some(conditions) = patch["status"]["conditions"].as_array() {
        let existing = node["status"]["conditions"].as_array_mut();
        let mut list = existing.map(std::mem::take).unwrap_or_default();
        for c in conditions {
            match list.iter_mut().find(|e| e["type"] == c["type"]) {
                Some(e) => merge(e, c),
                None => list.push(c.clone()),
            }
        }
        node["status"]["conditions"] = Value::Array(list);
    }
}

/// JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    // RFC 7386: an object patched onto anything but an object patches an empty object (so
    // its nulls remove, never store, a key).
    if !target.is_object() {
        *target = json!({});
    }
    if let Some(t) = target.as_object_mut() {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

async fn handle(req: Request<Incoming>, state: Arc<Mutex<State>>) -> Response<Full<Bytes>> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let authorized = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {TOKEN}"));
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let (mode, delay) = {
        let mut s = state.lock().expect("state");
        s.requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            content_type: content_type.clone(),
            body: String::from_utf8_lossy(&body).into_owned(),
            at: std::time::Instant::now(),
        });
        (s.mode, s.delay)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if mode == Mode::Hang {
        std::future::pending::<()>().await;
    }
    if !authorized || mode == Mode::Unauthorized {
        return status(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized".into(),
            json!({}),
        );
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if mode == Mode::Forbidden {
        let (verb, resource) = match (method.as_str(), parts.as_slice()) {
            ("PATCH", ["api", "v1", "nodes", _, "status"]) => ("patch", "nodes/status"),
            (_, ["api", "v1", "nodes", ..]) => ("get", "nodes"),
            _ => ("create", "events"),
        };
        return status(StatusCode::FORBIDDEN, "Forbidden", format!("{resource} is forbidden: User \"system:node:test\" cannot {verb} resource \"{resource}\" in API group \"\" at the cluster scope"), json!({}));
    }
    if mode == Mode::ServerError {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "Internal error occurred: etcdserver: request timed out".into(),
            json!({}),
        );
    }
    let parsed: Option<Value> = if body.is_empty() {
        None
    } else {
        serde_json::from_slice(&body).ok()
    };
    let mut s = state.lock().expect("state");
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["api", "v1", "pods"]) => {
            let node = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("fieldSelector="))
                .map(|v| v.replace("%3D", "=").replace("%3d", "="));
            let items: Vec<Value> = s
                .pods
                .iter()
                .filter(|p| {
                    node.as_deref().is_none_or(|sel| {
                        sel == format!(
                            "spec.nodeName={}",
                            p["spec"]["nodeName"].as_str().unwrap_or_default()
                        )
                    })
                })
                .cloned()
                .collect();
            respond(
                StatusCode::OK,
                json!({ "apiVersion": "v1", "kind": "PodList", "metadata": { "resourceVersion": "1" }, "items": items }),
            )
        }
        ("PATCH", ["api", "v1", "nodes", name]) => {
            if let Some(refused) = refuse_non_patch(&content_type) {
                return refused;
            }
            match (parsed, s.nodes.get_mut(*name)) {
                (Some(patch), Some(node)) => {
                    merge(node, &patch);
                    respond(StatusCode::OK, node.clone())
                }
                _ => status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("nodes \"{name}\" not found"),
                    json!({ "name": name, "kind": "nodes" }),
                ),
            }
        }
        ("GET", ["api", "v1", "nodes", name]) => match s.nodes.get(*name) {
            Some(node) => respond(StatusCode::OK, node.clone()),
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("nodes \"{name}\" not found"),
                json!({ "name": name, "kind": "nodes" }),
            ),
        },
        ("PATCH", ["api", "v1", "nodes", name, "status"]) => {
            if content_type != "application/strategic-merge-patch+json" {
                return status(StatusCode::UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type})"), json!({}));
            }
            let Some(patch) = parsed else {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "invalid JSON in the body".into(),
                    json!({}),
                );
            };
            match s.nodes.get_mut(*name) {
                Some(node) => {
                    strategic_merge(node, &patch);
                    respond(StatusCode::OK, node.clone())
                }
                None => status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("nodes \"{name}\" not found"),
                    json!({ "name": name, "kind": "nodes" }),
                ),
            }
        }
        ("POST", ["api", "v1", "namespaces", ns, "events"]) => {
            let Some(event) = parsed.filter(|e| {
                e["metadata"]["name"].is_string() && e["involvedObject"]["kind"].is_string()
            }) else {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "Event is invalid: metadata.name and involvedObject are required".into(),
                    json!({}),
                );
            };
            if !content_type.starts_with("application/json") {
                return status(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    format!("unsupported media type {content_type}"),
                    json!({}),
                );
            }
            let name = event["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if s.events.contains_key(&name) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    format!("events \"{name}\" already exists"),
                    json!({ "name": name, "kind": "events" }),
                );
            }
            let mut stored = event.clone();
            stored["metadata"]["namespace"] = json!(ns);
            s.events.insert(name, stored.clone());
            respond(StatusCode::CREATED, stored)
        }
        ("PATCH", ["api", "v1", "namespaces", _, "events", name]) => {
            if let Some(refused) = refuse_non_patch(&content_type) {
                return refused;
            }
            let (Some(patch), Some(event)) = (parsed, s.events.get_mut(*name)) else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("events \"{name}\" not found"),
                    json!({ "name": name, "kind": "events" }),
                );
            };
            merge(event, &patch);
            respond(StatusCode::OK, event.clone())
        }
        _ => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource".into(),
            json!({}),
        ),
    }
}
