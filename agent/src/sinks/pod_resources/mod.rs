//! Which pod holds which GPU: the kubelet's pod-resources API (gRPC `v1.PodResourcesLister/
//! List` on a Unix socket), asked on demand.
//!
//! A lookup the sinks call, not a source: nothing here runs when nothing happens. A fault
//! on a GPU (the pod-Events sink), a checkpoint signal (the checkpoint sink) or a `status`
//! request asks; the answer is kept for [`Settings::cache_for`] so a burst of faults costs
//! one `List`. Each `List` opens its own connection, so a kubelet restart (socket gone,
//! then back) needs nothing from the agent. No socket, no permission, or a kubelet that
//! answers with an error: the lookup is off with the reason (once, on the `pod-resources`
//! sink line of `status`), and on again when the kubelet answers.
//!
//! Device-plugin assignments of resources named `nvidia.com/...` are kept (every strategy:
//! `nvidia.com/gpu`, time-sliced `nvidia.com/gpu.shared`, MIG `nvidia.com/mig-...`); DRA
//! claims of NVIDIA drivers are kept apart (shown in `status`, not mapped to GPUs).

mod proto {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("v1");
}

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Mutex};

use crate::model::{Assignment, Assignments, DraClaim, Observation, SinkStatus, SourceState};

pub use proto::pod_resources_lister_client::PodResourcesListerClient;

/// The kubelet's answers are at most this big (the kubelet's own gRPC limit).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// The sink name `status` shows.
pub const SINK: &str = "pod-resources";

/// What the lookup needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The kubelet's pod-resources socket.
    pub socket: PathBuf,
    /// Connect and call time limit.
    pub timeout: Duration,
    /// How long one `List` answer is reused.
    pub cache_for: Duration,
    /// Resource names (prefix) that are GPUs.
    pub resource_prefix: String,
}

/// Why the kubelet could not be asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    /// No socket: not a Kubernetes node, or the kubelet is not (yet) running.
    #[error(
        "no pod-resources socket at {path} (not a Kubernetes node, or the kubelet is not running)"
    )]
    NoSocket {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket is there but cannot be connected to (permission, nobody listening).
    #[error("cannot connect to the kubelet's pod-resources socket {path}: {message}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The kubelet answered with a gRPC error (UNAVAILABLE while it restarts, UNIMPLEMENTED
    /// on a kubelet without the API).
    #[error("the kubelet's pod-resources List failed: {code}: {message}")]
    Call {
        /// The gRPC status code.
        code: String,
        /// Its message.
        message: String,
    },
    /// No answer in time.
    #[error("the kubelet's pod-resources List did not answer within {0:?}")]
    Timeout(Duration),
}

struct Inner {
    settings: Settings,
    cached: Mutex<Option<(Instant, Arc<Assignments>)>>,
    state: std::sync::Mutex<Option<SourceState>>,
    report: mpsc::Sender<Observation>,
}

/// The lookup: cheap to clone, shared by the sinks that need it.
#[derive(Clone)]
pub struct Lookup {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookup")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

impl Lookup {
    /// A lookup that asks nothing until first used; its state goes to `report`.
    pub fn new(settings: Settings, report: mpsc::Sender<Observation>) -> Self {
        Self {
            inner: Arc::new(Inner {
                settings,
                cached: Mutex::new(None),
                state: std::sync::Mutex::new(None),
                report,
            }),
        }
    }

    /// What the kubelet has assigned now (or a moment ago: see [`Settings::cache_for`]).
    /// The cache's lock is held only to read or store the answer, never across the kubelet
    /// call or the report to the core: a kubelet that is slow to answer (up to the timeout)
    /// keeps no other caller waiting on the lock, and a cached answer is served meanwhile.
    pub async fn assignments(&self) -> Result<Arc<Assignments>, LookupError> {
        if let Some((at, answer)) = self.inner.cached.lock().await.as_ref() {
            if at.elapsed() < self.inner.settings.cache_for {
                return Ok(Arc::clone(answer));
            }
        }
        let s = &self.inner.settings;
        let result = match tokio::time::timeout(s.timeout, list(&s.socket, s.timeout)).await {
            Ok(Ok(response)) => Ok(Arc::new(convert(response, &s.resource_prefix))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(LookupError::Timeout(s.timeout)),
        };
        *self.inner.cached.lock().await = result
            .as_ref()
            .ok()
            .map(|answer| (Instant::now(), Arc::clone(answer)));
        match &result {
            Ok(_) => self.set_state(SourceState::On).await,
            Err(e @ LookupError::NoSocket { .. }) => {
                self.set_state(SourceState::Off(e.to_string())).await;
            }
            Err(e) => self.set_state(SourceState::Failed(e.to_string())).await,
        }
        result
    }

    /// Report a changed state to the core, once per change (and log it once).
    async fn set_state(&self, state: SourceState) {
        {
            let Ok(mut known) = self.inner.state.lock() else {
                return;
            };
            if known.as_ref() == Some(&state) {
                return;
            }
            *known = Some(state.clone());
        }
        match &state {
            SourceState::On => {
                tracing::info!(socket = %self.inner.settings.socket.display(), "Pod-resources lookup is on: faults reach the pods holding the GPU.")
            }
            SourceState::Off(why) | SourceState::Failed(why) => {
                tracing::info!(reason = %why, "Pod-resources lookup is off: no pod Events, no holders in status.");
            }
            SourceState::Starting | SourceState::Ended => {}
        }
        let _ = self
            .inner
            .report
            .send(Observation::Sink(SinkStatus {
                sink: SINK.into(),
                state,
            }))
            .await;
    }
}

/// Fill in each GPU's holders and the lookup's view (what `status` shows).
pub async fn fill(lookup: &Lookup, snapshot: &mut crate::model::HealthSnapshot) {
    let mut view = crate::model::HolderView::default();
    match lookup.assignments().await {
        Ok(a) => {
            let known = snapshot.gpus.clone();
            for gpu in &mut snapshot.gpus {
                gpu.holders = a.holders(gpu.pci, &known);
            }
            let devices = snapshot.efa.clone();
            for device in &mut snapshot.efa {
                device.holders = a.efa_holders(Some(&device.name), &devices);
            }
            view.unresolved = a.unresolved(&known);
            view.dra.clone_from(&a.dra);
        }
        Err(e) => view.unavailable = Some(e.to_string()),
    }
    snapshot.holders = Some(view);
}

/// One `List` call on a fresh connection.
async fn list(
    socket: &Path,
    timeout: Duration,
) -> Result<proto::ListPodResourcesResponse, LookupError> {
    if !socket.exists() {
        return Err(LookupError::NoSocket {
            path: socket.to_path_buf(),
        });
    }
    let path = socket.to_path_buf();
    let connect_err = |message: String| LookupError::Connect {
        path: socket.to_path_buf(),
        message,
    };
    // The URI is not used: every connection goes to the socket.
    let channel = tonic::transport::Endpoint::from_static("http://kubelet.sock")
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| connect_err(error_chain(&e)))?;
    let mut client = PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
    client
        .list(proto::ListPodResourcesRequest {})
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| LookupError::Call {
            code: format!("{:?}", status.code()),
            message: status.message().to_string(),
        })
}

/// An error and its causes on one line (tonic's transport error says only "transport error").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The extended resource of the AWS EFA device plugin.
const EFA_RESOURCE: &str = "vpc.amazonaws.com/efa";

/// Keep what concerns NVIDIA GPUs, and the EFA devices.
fn convert(response: proto::ListPodResourcesResponse, prefix: &str) -> Assignments {
    let mut out = Assignments::default();
    for pod in response.pod_resources {
        for container in pod.containers {
            for devices in container
                .devices
                .iter()
                .filter(|d| d.resource_name == EFA_RESOURCE)
            {
                for id in &devices.device_ids {
                    out.efa.push(Assignment {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                        resource: devices.resource_name.clone(),
                        device_id: id.clone(),
                    });
                }
            }
            for devices in container
                .devices
                .iter()
                .filter(|d| d.resource_name.starts_with(prefix))
            {
                for id in &devices.device_ids {
                    out.devices.push(Assignment {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                        resource: devices.resource_name.clone(),
                        device_id: id.clone(),
                    });
                }
            }
            for claim in &container.dynamic_resources {
                for device in claim
                    .claim_resources
                    .iter()
                    .filter(|r| r.driver_name.contains("nvidia"))
                {
                    out.dra.push(DraClaim {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                        driver: device.driver_name.clone(),
                        device: device.device_name.clone(),
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_nvidia_devices_dra_claims_and_efa_devices_only() {
        let response = proto::ListPodResourcesResponse {
            pod_resources: vec![proto::PodResources {
                name: "train-0".into(),
                namespace: "ml".into(),
                containers: vec![proto::ContainerResources {
                    name: "trainer".into(),
                    devices: vec![
                        proto::ContainerDevices {
                            resource_name: "nvidia.com/gpu".into(),
                            device_ids: vec!["GPU-a".into(), "GPU-b".into()],
                            topology: None,
                        },
                        proto::ContainerDevices {
                            resource_name: "vpc.amazonaws.com/efa".into(),
                            device_ids: vec!["efa0".into()],
                            topology: None,
                        },
                    ],
                    dynamic_resources: vec![proto::DynamicResource {
                        claim_name: "gpus".into(),
                        claim_namespace: "ml".into(),
                        claim_resources: vec![proto::ClaimResource {
                            cdi_devices: vec![],
                            driver_name: "gpu.nvidia.com".into(),
                            pool_name: "node-a".into(),
                            device_name: "gpu-0".into(),
                        }],
                    }],
                    ..Default::default()
                }],
            }],
        };
        let out = convert(response, "nvidia.com/");
        let ids: Vec<&str> = out.devices.iter().map(|a| a.device_id.as_str()).collect();
        assert_eq!(ids, ["GPU-a", "GPU-b"]);
        let efa: Vec<&str> = out.efa.iter().map(|a| a.device_id.as_str()).collect();
        assert_eq!(efa, ["efa0"], "EFA devices are kept apart");
        assert_eq!(out.dra.len(), 1);
        assert_eq!(out.dra[0].device, "gpu-0");
    }

    #[tokio::test]
    async fn no_socket_is_off_with_the_path_reported_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (tx, mut rx) = mpsc::channel(8);
        let lookup = Lookup::new(
            Settings {
                socket: dir.path().join("kubelet.sock"),
                timeout: Duration::from_secs(1),
                cache_for: Duration::from_secs(2),
                resource_prefix: "nvidia.com/".into(),
            },
            tx,
        );
        for _ in 0..3 {
            let err = lookup.assignments().await.expect_err("no socket");
            assert!(matches!(err, LookupError::NoSocket { .. }), "{err}");
        }
        let Some(Observation::Sink(s)) = rx.recv().await else {
            panic!("state reported")
        };
        assert_eq!(s.sink, SINK);
        assert!(matches!(&s.state, SourceState::Off(why) if why.contains("kubelet.sock")));
        assert!(rx.try_recv().is_err(), "reported once");
    }

    /// Review 2026-12-03b L6: the cache's lock is never held across the kubelet's `List`.
    /// A kubelet that accepts and never answers: while one lookup waits for it, the lock is
    /// free for every other caller.
    #[tokio::test]
    async fn the_cache_lock_is_free_while_the_kubelet_is_asked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("kubelet.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
        let hung = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let (report, _rx) = mpsc::channel(8);
        let lookup = Lookup::new(
            Settings {
                socket,
                timeout: Duration::from_secs(2),
                cache_for: Duration::from_secs(1),
                resource_prefix: "nvidia.com/gpu".into(),
            },
            report,
        );
        let asking = tokio::spawn({
            let lookup = lookup.clone();
            async move { lookup.assignments().await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!asking.is_finished(), "the kubelet never answers");
        assert!(
            lookup.inner.cached.try_lock().is_ok(),
            "the lock is free while the call waits"
        );
        // Cut off by the call's own deadline or the lookup's, whichever fires first.
        let answer = asking.await.expect("join");
        assert!(answer.is_err(), "{answer:?}");
        hung.abort();
    }
}
