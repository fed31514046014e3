//! A test kubelet pod-resources server: gRPC `v1.PodResourcesLister` on a Unix socket, as the
//! kubelet serves it (`List`, `GetAllocatableResources`), on its own thread and runtime.
//! Stopping it removes the socket (a kubelet restart); modes answer with the kubelet's error
//! codes (UNAVAILABLE, UNIMPLEMENTED for an API a kubelet does not serve).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tonic::{Request, Response, Status};

/// The generated server side of the agent's proto.
pub mod proto {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("v1");
}

use proto::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};

/// How the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Like a healthy kubelet.
    Normal,
    /// Every call: UNAVAILABLE (a kubelet shutting down its servers).
    Unavailable,
}

/// What the server holds.
#[derive(Debug)]
pub struct State {
    /// Pods and their device assignments.
    pub pods: Vec<proto::PodResources>,
    /// Every GPU device ID the node can allocate.
    pub allocatable: Vec<String>,
    /// Answer mode.
    pub mode: Mode,
    /// `List` calls received.
    pub list_calls: u64,
}

#[derive(Clone)]
struct Service(Arc<Mutex<State>>);

#[tonic::async_trait]
impl PodResourcesLister for Service {
    async fn list(
        &self,
        _request: Request<proto::ListPodResourcesRequest>,
    ) -> Result<Response<proto::ListPodResourcesResponse>, Status> {
        let mut s = self.0.lock().expect("state");
        s.list_calls += 1;
        if s.mode == Mode::Unavailable {
            return Err(Status::unavailable("kubelet is shutting down"));
        }
        Ok(Response::new(proto::ListPodResourcesResponse {
            pod_resources: s.pods.clone(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<proto::AllocatableResourcesRequest>,
    ) -> Result<Response<proto::AllocatableResourcesResponse>, Status> {
        let s = self.0.lock().expect("state");
        if s.mode == Mode::Unavailable {
            return Err(Status::unavailable("kubelet is shutting down"));
        }
        Ok(Response::new(proto::AllocatableResourcesResponse {
            devices: vec![proto::ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: s.allocatable.clone(),
                topology: None,
            }],
            ..Default::default()
        }))
    }
}

/// A running test kubelet.
pub struct Kubelet {
    /// The socket.
    pub socket: PathBuf,
    /// Its state (shared with the server thread).
    pub state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl Kubelet {
    /// Serve on `socket` (its directory is created) with no pods.
    pub fn start(socket: &Path) -> Self {
        let state = Arc::new(Mutex::new(State {
            pods: Vec::new(),
            allocatable: Vec::new(),
            mode: Mode::Normal,
            list_calls: 0,
        }));
        Self::serve(socket, state)
    }

    /// Serve again (after [`Kubelet::stop`]) with the same state: the kubelet restarted.
    pub fn restart(socket: &Path, state: Arc<Mutex<State>>) -> Self {
        Self::serve(socket, state)
    }

    fn serve(socket: &Path, state: Arc<Mutex<State>>) -> Self {
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).expect("socket dir");
        }
        let _ = std::fs::remove_file(socket);
        let listener = std::os::unix::net::UnixListener::bind(socket).expect("bind kubelet socket");
        listener.set_nonblocking(true).expect("nonblocking");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = Service(Arc::clone(&state));
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::from_std(listener).expect("listener");
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(PodResourcesListerServer::new(service))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        Self {
            socket: socket.to_path_buf(),
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stop serving and remove the socket (the kubelet stopped); returns the state for
    /// [`Kubelet::restart`].
    pub fn stop(mut self) -> Arc<Mutex<State>> {
        self.shut();
        Arc::clone(&self.state)
    }

    fn shut(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Assign `device_ids` of `resource` to a container of a pod (each added if new), as the
    /// kubelet lists them: one entry per container, and in it one per resource.
    pub fn assign(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        resource: &str,
        device_ids: &[&str],
    ) {
        let mut s = self.state.lock().expect("state");
        for id in device_ids {
            if !s.allocatable.iter().any(|a| a == id) {
                s.allocatable.push((*id).to_string());
            }
        }
        let index = match s
            .pods
            .iter()
            .position(|p| p.namespace == namespace && p.name == pod)
        {
            Some(i) => i,
            None => {
                s.pods.push(proto::PodResources {
                    name: pod.into(),
                    namespace: namespace.into(),
                    containers: Vec::new(),
                });
                s.pods.len() - 1
            }
        };
        let containers = &mut s.pods[index].containers;
        let c = match containers.iter().position(|c| c.name == container) {
            Some(c) => c,
            None => {
                containers.push(proto::ContainerResources {
                    name: container.into(),
                    ..Default::default()
                });
                containers.len() - 1
            }
        };
        let devices = &mut containers[c].devices;
        let ids = device_ids.iter().map(|d| (*d).to_string());
        match devices.iter_mut().find(|d| d.resource_name == resource) {
            Some(d) => d.device_ids.extend(ids),
            None => devices.push(proto::ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.collect(),
                topology: None,
            }),
        }
    }

    /// Give a container of a pod a GPU through DRA (driver `gpu.nvidia.com`).
    pub fn assign_dra(&self, namespace: &str, pod: &str, container: &str, device: &str) {
        self.state
            .lock()
            .expect("state")
            .pods
            .push(proto::PodResources {
                name: pod.into(),
                namespace: namespace.into(),
                containers: vec![proto::ContainerResources {
                    name: container.into(),
                    dynamic_resources: vec![proto::DynamicResource {
                        claim_name: format!("{pod}-gpu"),
                        claim_namespace: namespace.into(),
                        claim_resources: vec![proto::ClaimResource {
                            cdi_devices: vec![proto::CdiDevice {
                                name: format!("k8s.gpu.nvidia.com/device={device}"),
                            }],
                            driver_name: "gpu.nvidia.com".into(),
                            pool_name: "node".into(),
                            device_name: device.into(),
                        }],
                    }],
                    ..Default::default()
                }],
            });
    }

    /// Set the answer mode.
    pub fn set_mode(&self, mode: Mode) {
        self.state.lock().expect("state").mode = mode;
    }

    /// `List` calls so far.
    pub fn list_calls(&self) -> u64 {
        self.state.lock().expect("state").list_calls
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shut();
    }
}
