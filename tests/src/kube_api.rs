//! A test Kubernetes API server: what the agent uses, behaving like the real one. Bearer-token
//! auth (401 without it), `GET /api/v1/nodes/NAME` (404 Status for an unknown node),
//! `PATCH /api/v1/nodes/NAME/status` that requires `application/strategic-merge-patch+json`
//! (415 otherwise) and merges `status.conditions` by `type`, Events created with `POST`
//! (409 AlreadyExists on a duplicate name) and updated with merge-`PATCH`; modes for 401, 403,
//! 500, slow answers and requests never answered. `resource.k8s.io` as a 1.36/1.37 server
//! has it: discovery (DeviceTaintRule in `v1`, `v1beta2` or neither), ResourceSlices as the
//! NVIDIA DRA driver publishes them (listed by field selector), and cluster-scoped
//! DeviceTaintRules (409 on an existing name, 404, 403 without RBAC, 422 on an invalid
//! effect, `timeAdded` set by the server). Errors are `Status` objects, as the real server sends.

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
    /// The `resource.k8s.io` versions served with DeviceTaintRule (`v1`, `v1beta2`); empty:
    /// none (a cluster before 1.36, or the gate off). ResourceSlices are served in `v1`
    /// (and `v1beta2`) either way.
    pub taint_rule_versions: Vec<String>,
    /// ResourceSlices.
    pub slices: Vec<Value>,
    /// DeviceTaintRules by name (cluster-scoped).
    pub rules: BTreeMap<String, Value>,
    /// Every DeviceTaintRule call is refused 403 (the ClusterRole not applied).
    pub rules_forbidden: bool,
    /// Rules ever deleted (names), in order.
    pub deleted_rules: Vec<String>,
    /// Delay before answering a DeviceTaintRule write (POST, PATCH): an admission webhook
    /// or an etcd that is slow.
    pub rule_write_delay: Duration,
    /// Event writes in this namespace answer 500 (an etcd hiccup for that namespace).
    pub failing_events_namespace: Option<String>,
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
    /// Start on a free loopback port with these nodes (each with the kubelet's labels and a
    /// kubelet-owned `Ready` condition, which the agent must never touch).
    pub fn start(nodes: &[&str]) -> Self {
        let mut map = BTreeMap::new();
        for (i, name) in nodes.iter().enumerate() {
            map.insert(
                name.to_string(),
                json!({
                    "apiVersion": "v1", "kind": "Node",
                    // The labels the kubelet registers a node with (a Node is never bare).
                    "metadata": { "name": name, "uid": format!("uid-{i}"), "resourceVersion": "1",
                        "labels": {
                            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "node.kubernetes.io/instance-type": "p5.48xlarge"
                        } },
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
            taint_rule_versions: Vec::new(),
            slices: Vec::new(),
            rules: BTreeMap::new(),
            rules_forbidden: false,
            deleted_rules: Vec::new(),
            rule_write_delay: Duration::ZERO,
            failing_events_namespace: None,
        }));
        Self::serve(state, "127.0.0.1:0".parse().expect("addr"))
    }

    /// Write `condition` on `node` as another writer would (replacing one of its type).
    pub fn set_condition(&self, node: &str, condition: Value) {
        let mut state = self.state.lock().expect("state");
        let node = state.nodes.get_mut(node).expect("node");
        let list = node["status"]["conditions"]
            .as_array_mut()
            .expect("conditions");
        list.retain(|c| c["type"] != condition["type"]);
        list.push(condition);
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

    /// Serve DeviceTaintRule in these `resource.k8s.io` versions (none: not at all).
    pub fn serve_taint_rules(&self, versions: &[&str]) {
        self.state.lock().expect("state").taint_rule_versions =
            versions.iter().map(|v| v.to_string()).collect();
    }

    /// Publish a ResourceSlice as the NVIDIA DRA driver does for `node`: one device per GPU
    /// (`(name, uuid)`) and per MIG device (`(name, uuid, parent uuid)`), each with its
    /// `uuid` attribute (and `parentUUID` for MIG).
    pub fn publish_gpus(&self, node: &str, gpus: &[(&str, &str)], migs: &[(&str, &str, &str)]) {
        let mut devices: Vec<Value> = gpus
            .iter()
            .enumerate()
            .map(|(i, (name, uuid))| {
                json!({
                    "name": name,
                    "attributes": {
                        "type": { "string": "gpu" },
                        "uuid": { "string": uuid },
                        "index": { "int": i },
                        "productName": { "string": "NVIDIA H100 80GB HBM3" },
                        "driverVersion": { "version": "580.95.5" },
                    },
                    "capacity": { "memory": { "value": "80Gi" } },
                })
            })
            .collect();
        devices.extend(migs.iter().map(|(name, uuid, parent)| {
            json!({
                "name": name,
                "attributes": {
                    "type": { "string": "mig" },
                    "uuid": { "string": uuid },
                    "parentUUID": { "string": parent },
                    "profile": { "string": "1g.10gb" },
                },
                "capacity": { "memory": { "value": "10Gi" } },
            })
        }));
        let mut state = self.state.lock().expect("state");
        let n = state.slices.len();
        state.slices.push(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": { "name": format!("{node}-gpu.nvidia.com-{n}"), "uid": format!("slice-{n}"), "resourceVersion": "1" },
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": node,
                "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 },
                "devices": devices,
            }
        }));
    }

    /// Refuse (403) or allow every DeviceTaintRule call.
    pub fn forbid_taint_rules(&self, forbidden: bool) {
        self.state.lock().expect("state").rules_forbidden = forbidden;
    }

    /// Fail (500) every Event write in `namespace`, or none.
    pub fn fail_events_in(&self, namespace: Option<&str>) {
        self.state.lock().expect("state").failing_events_namespace = namespace.map(str::to_string);
    }

    /// Answer DeviceTaintRule writes only after `delay`.
    pub fn delay_rule_writes(&self, delay: Duration) {
        self.state.lock().expect("state").rule_write_delay = delay;
    }

    /// Delete rule `name` as an operator or a cleanup job would (`kubectl delete`).
    pub fn delete_rule(&self, name: &str) {
        let mut s = self.state.lock().expect("state");
        s.rules.remove(name);
        s.deleted_rules.push(name.to_string());
    }

    /// Set `node`'s `spec.providerID` (`aws:///<zone>/<instance id>`).
    pub fn set_provider_id(&self, node: &str, provider_id: &str) {
        let mut s = self.state.lock().expect("state");
        let node = s.nodes.get_mut(node).expect("node");
        node["spec"]["providerID"] = json!(provider_id);
    }

    /// Delete `node` and create it again under the same name with a new uid and
    /// `provider_id`, as a replaced EKS node whose private IP is recycled: the garbage
    /// collector then deletes every object the old Node owned (`ownerReferences` naming its
    /// uid), DeviceTaintRules included, as the real one does in the background.
    pub fn recreate_node(&self, node: &str, uid: &str, provider_id: &str) {
        let mut s = self.state.lock().expect("state");
        let old = s.nodes.get_mut(node).expect("node");
        let old_uid = old["metadata"]["uid"].clone();
        old["metadata"]["uid"] = json!(uid);
        old["spec"] = json!({ "providerID": provider_id });
        old["status"]["conditions"]
            .as_array_mut()
            .expect("conditions")
            .retain(|c| c["type"] == "Ready");
        let owned: Vec<String> = s
            .rules
            .iter()
            .filter(|(_, r)| {
                r["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|o| o.iter().any(|o| o["uid"] == old_uid))
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in owned {
            s.rules.remove(&name);
            s.deleted_rules.push(name);
        }
    }

    /// The stored DeviceTaintRules.
    pub fn rules(&self) -> Vec<Value> {
        self.state
            .lock()
            .expect("state")
            .rules
            .values()
            .cloned()
            .collect()
    }

    /// When the first request after the first `from` whose body names `text` arrived;
    /// panics after 10 s without one.
    pub fn wait_for_request_naming(&self, from: usize, text: &str) -> std::time::Instant {
        let started = std::time::Instant::now();
        loop {
            if let Some(at) = self.requests()[from..]
                .iter()
                .find(|r| r.body.contains(text))
                .map(|r| r.at)
            {
                return at;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no request naming {text}"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
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

/// 409 AlreadyExists for `resource` `name`, as the real server answers a create.
fn already_exists(resource: &str, name: &str, details: Value) -> Response<Full<Bytes>> {
    status(
        StatusCode::CONFLICT,
        "AlreadyExists",
        format!("{resource} \"{name}\" already exists"),
        details,
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
    if let ["apis", "resource.k8s.io", ..] = parts.as_slice() {
        if mode == Mode::Normal {
            let write_delay = state.lock().expect("state").rule_write_delay;
            if matches!(method.as_str(), "POST" | "PATCH")
                && parts.get(3) == Some(&"devicetaintrules")
                && !write_delay.is_zero()
            {
                tokio::time::sleep(write_delay).await;
            }
            let mut s = state.lock().expect("state");
            return dra(&mut s, &method, &parts[2..], &query, &content_type, &body);
        }
    }
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
        ("POST" | "PATCH" | "PUT", ["api", "v1", "namespaces", ns, "events", ..])
            if s.failing_events_namespace.as_deref() == Some(*ns) =>
        {
            status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "Internal error occurred: etcdserver: request timed out".into(),
                json!({}),
            )
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
                return already_exists("events", &name, json!({ "name": name, "kind": "events" }));
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

/// A query parameter, percent-decoded.
fn query_param(query: &str, key: &str) -> Option<String> {
    let raw = query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?;
    let mut out = Vec::new();
    let mut bytes = raw.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hex: String = bytes.by_ref().take(2).map(char::from).collect();
                out.push(u8::from_str_radix(&hex, 16).unwrap_or(b'?'));
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// A `k=v,k2=v2` selector as pairs.
fn selector(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The JSON value at a dotted path (`spec.nodeName`).
fn at<'a>(object: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(object, |v, key| &v[key])
}

/// `resource.k8s.io`: discovery, ResourceSlices (list by field selector) and DeviceTaintRules
/// (cluster-scoped create/get/list/patch/delete; 409 on an existing name, 404, 403 when
/// forbidden, 422 on an invalid effect or no selector, `timeAdded` set by the server).
fn dra(
    s: &mut State,
    method: &str,
    parts: &[&str],
    query: &str,
    content_type: &str,
    body: &[u8],
) -> Response<Full<Bytes>> {
    let not_found = |what: String| {
        status(
            StatusCode::NOT_FOUND,
            "NotFound",
            what,
            json!({ "group": "resource.k8s.io", "kind": "devicetaintrules" }),
        )
    };
    let served = |s: &State, v: &str| {
        v == "v1" || v == "v1beta2" || s.taint_rule_versions.iter().any(|t| t == v)
    };
    let versions: Vec<&str> = ["v1", "v1beta2"]
        .into_iter()
        .filter(|v| served(s, v))
        .collect();
    match (method, parts) {
        ("GET", []) => respond(
            StatusCode::OK,
            json!({
                "kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io",
                "versions": versions.iter().map(|v| json!({ "groupVersion": format!("resource.k8s.io/{v}"), "version": v })).collect::<Vec<_>>(),
                "preferredVersion": { "groupVersion": "resource.k8s.io/v1", "version": "v1" },
            }),
        ),
        ("GET", [version]) if served(s, version) => {
            let mut resources = vec![
                json!({ "name": "resourceslices", "singularName": "resourceslice", "namespaced": false, "kind": "ResourceSlice", "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"] }),
                json!({ "name": "deviceclasses", "singularName": "deviceclass", "namespaced": false, "kind": "DeviceClass", "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"] }),
            ];
            if s.taint_rule_versions.iter().any(|t| t == version) {
                resources.push(json!({ "name": "devicetaintrules", "singularName": "devicetaintrule", "namespaced": false, "kind": "DeviceTaintRule", "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"] }));
                resources.push(json!({ "name": "devicetaintrules/status", "singularName": "", "namespaced": false, "kind": "DeviceTaintRule", "verbs": ["get", "patch", "update"] }));
            }
            respond(
                StatusCode::OK,
                json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("resource.k8s.io/{version}"), "resources": resources }),
            )
        }
        ("GET", [version, "resourceslices"]) if served(s, version) => {
            let fields = query_param(query, "fieldSelector")
                .map(|f| selector(&f))
                .unwrap_or_default();
            let items: Vec<Value> = s
                .slices
                .iter()
                .filter(|slice| fields.iter().all(|(k, v)| at(slice, k).as_str() == Some(v)))
                .map(|slice| {
                    let mut slice = slice.clone();
                    slice["apiVersion"] = json!(format!("resource.k8s.io/{version}"));
                    slice
                })
                .collect();
            respond(
                StatusCode::OK,
                json!({ "apiVersion": format!("resource.k8s.io/{version}"), "kind": "ResourceSliceList", "metadata": { "resourceVersion": "1" }, "items": items }),
            )
        }
        (_, [version, "devicetaintrules", rest @ ..])
            if s.taint_rule_versions.iter().any(|t| t == version) =>
        {
            if s.rules_forbidden {
                let verb = match (method, rest) {
                    ("POST", _) => "create",
                    ("GET", []) => "list",
                    ("GET", _) => "get",
                    ("PATCH", _) => "patch",
                    _ => "delete",
                };
                return status(StatusCode::FORBIDDEN, "Forbidden", format!("devicetaintrules.resource.k8s.io is forbidden: User \"system:node:test\" cannot {verb} resource \"devicetaintrules\" in API group \"resource.k8s.io\" at the cluster scope"), json!({ "group": "resource.k8s.io", "kind": "devicetaintrules" }));
            }
            let parsed: Option<Value> = serde_json::from_slice(body).ok();
            let api_version = format!("resource.k8s.io/{version}");
            match (method, rest) {
                ("GET", []) => {
                    let labels = query_param(query, "labelSelector")
                        .map(|l| selector(&l))
                        .unwrap_or_default();
                    let items: Vec<Value> = s
                        .rules
                        .values()
                        .filter(|r| {
                            labels
                                .iter()
                                .all(|(k, v)| r["metadata"]["labels"][k].as_str() == Some(v))
                        })
                        .cloned()
                        .collect();
                    respond(
                        StatusCode::OK,
                        json!({ "apiVersion": api_version, "kind": "DeviceTaintRuleList", "metadata": { "resourceVersion": "1" }, "items": items }),
                    )
                }
                ("POST", []) => {
                    if !content_type.starts_with("application/json") {
                        return status(
                            StatusCode::UNSUPPORTED_MEDIA_TYPE,
                            "UnsupportedMediaType",
                            format!("unsupported media type {content_type}"),
                            json!({}),
                        );
                    }
                    let Some(mut rule) = parsed else {
                        return status(
                            StatusCode::BAD_REQUEST,
                            "BadRequest",
                            "invalid JSON in the body".into(),
                            json!({}),
                        );
                    };
                    if let Some(invalid) = invalid_rule(&rule) {
                        return invalid;
                    }
                    let name = rule["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    if s.rules.contains_key(&name) {
                        return already_exists(
                            "devicetaintrules.resource.k8s.io",
                            &name,
                            json!({ "name": name, "group": "resource.k8s.io", "kind": "devicetaintrules" }),
                        );
                    }
                    let n = s.rules.len() + s.deleted_rules.len();
                    rule["apiVersion"] = json!(api_version);
                    rule["metadata"]["uid"] = json!(format!("rule-{n}"));
                    rule["metadata"]["resourceVersion"] = json!(n.to_string());
                    rule["metadata"]["creationTimestamp"] = json!(now_rfc3339());
                    if rule["spec"]["taint"]["timeAdded"].is_null() {
                        rule["spec"]["taint"]["timeAdded"] = json!(now_rfc3339());
                    }
                    s.rules.insert(name, rule.clone());
                    respond(StatusCode::CREATED, rule)
                }
                ("GET", [name]) => match s.rules.get(*name) {
                    Some(rule) => respond(StatusCode::OK, rule.clone()),
                    None => not_found(format!(
                        "devicetaintrules.resource.k8s.io \"{name}\" not found"
                    )),
                },
                ("PATCH", [name]) => {
                    if let Some(refused) = refuse_non_patch(content_type) {
                        return refused;
                    }
                    let Some(patch) = parsed else {
                        return status(
                            StatusCode::BAD_REQUEST,
                            "BadRequest",
                            "invalid JSON in the body".into(),
                            json!({}),
                        );
                    };
                    let Some(rule) = s.rules.get(*name) else {
                        return not_found(format!(
                            "devicetaintrules.resource.k8s.io \"{name}\" not found"
                        ));
                    };
                    let mut next = rule.clone();
                    merge(&mut next, &patch);
                    if let Some(invalid) = invalid_rule(&next) {
                        return invalid;
                    }
                    // A changed taint gets a new timeAdded, unless the patch sets one.
                    if next["spec"]["taint"] != rule["spec"]["taint"]
                        && patch["spec"]["taint"]["timeAdded"].is_null()
                    {
                        next["spec"]["taint"]["timeAdded"] = json!(now_rfc3339());
                    }
                    s.rules.insert(name.to_string(), next.clone());
                    respond(StatusCode::OK, next)
                }
                ("DELETE", [name]) => match s.rules.remove(*name) {
                    Some(rule) => {
                        s.deleted_rules.push(name.to_string());
                        respond(StatusCode::OK, rule)
                    }
                    None => not_found(format!(
                        "devicetaintrules.resource.k8s.io \"{name}\" not found"
                    )),
                },
                _ => status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource".into(),
                    json!({}),
                ),
            }
        }
        _ => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource".into(),
            json!({}),
        ),
    }
}

/// 422 as the API server's validation answers: a name, a device selector, a taint key and a
/// known effect (`PreferNoSchedule` is not one).
fn invalid_rule(rule: &Value) -> Option<Response<Full<Bytes>>> {
    let name = rule["metadata"]["name"].as_str().unwrap_or_default();
    let effect = rule["spec"]["taint"]["effect"].as_str().unwrap_or_default();
    let problem = if name.is_empty() {
        Some("metadata.name: Required value: name or generateName is required".to_string())
    } else if !rule["spec"]["deviceSelector"].is_object() {
        Some("spec.deviceSelector: Required value".into())
    } else if rule["spec"]["taint"]["key"]
        .as_str()
        .is_none_or(str::is_empty)
    {
        Some("spec.taint.key: Required value".into())
    } else if !["None", "NoSchedule", "NoExecute"].contains(&effect) {
        Some(format!("spec.taint.effect: Unsupported value: \"{effect}\": supported values: \"NoExecute\", \"NoSchedule\", \"None\""))
    } else {
        None
    };
    problem.map(|p| {
        status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("DeviceTaintRule.resource.k8s.io \"{name}\" is invalid: {p}"),
            json!({ "name": name, "group": "resource.k8s.io", "kind": "DeviceTaintRule" }),
        )
    })
}

fn now_rfc3339() -> String {
    crate::trainer::rfc3339(std::time::SystemTime::now())
}
