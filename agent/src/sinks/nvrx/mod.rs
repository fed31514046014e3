//! NVIDIA Resiliency Extension's node health check, answered from the health model:
//! `nvhcd.HealthCheckService/RunHealthCheck` on a Unix socket, as NVRx's `ft_launcher
//! --ft-node-health-check-endpoint unix://<socket>` calls it before rendezvous. A node with a
//! fatal GPU fault, or whose end is being acted on (`InterruptionPending` True), answers
//! unhealthy, so the launcher leaves it out of the next rendezvous. Off unless `[nvrx]
//! socket` is set; the socket is the agent's, mode 0660, and `[nvrx] group` is given access
//! by an ACL (the sink is `failed` in `status` when it cannot be).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::{mpsc, watch};

use crate::host::listen::{Directory, Limits, Listener};
use crate::model::{HealthSnapshot, Observation, Severity, SinkStatus, SourceState};
use crate::shutdown::Shutdown;

mod authority;

/// The generated service (agent/proto/nvhcd/nvhcd.proto).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("nvhcd");
}

use pb::health_check_service_server::{HealthCheckService, HealthCheckServiceServer};
use pb::{HealthCheckRequest, HealthCheckResponse};

/// The name `status` shows.
const SINK: &str = "nvrx-health";
/// Health checks served at once (more wait in the backlog); a launcher's check takes
/// milliseconds, and its connection is closed after 30 s whatever it does.
const LIMITS: Limits = Limits {
    clients: 16,
    lifetime: std::time::Duration::from_secs(30),
    when_full: crate::host::listen::WhenFull::Wait,
};

/// What the endpoint needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The socket.
    pub socket: PathBuf,
    /// The group that may call it (besides root and the agent's group); `None`: no other.
    pub group: Option<String>,
}

/// The verdict for `snapshot` at `now`: unhealthy with a fatal fault or an end being acted
/// on; `output` is the JSON NVRx reads (`fail_count`, and what failed).
pub fn verdict(snapshot: &HealthSnapshot, now: SystemTime) -> HealthCheckResponse {
    let mut failures: Vec<String> = snapshot
        .faults
        .iter()
        .filter(|f| f.class.severity == Severity::Fatal)
        .map(|f| format!("{}: {} ({})", f.label(), f.class.name, f.class.action))
        .collect();
    if let Some(end) = snapshot.pending_end.as_ref().filter(|e| e.due(now)) {
        failures.push(format!(
            "{} end at {}: {}",
            end.kind,
            crate::model::time::rfc3339(end.deadline),
            end.detail
        ));
    }
    // A slow GPU is a warning: the node stays fit, and the answer names it for whoever
    // reads it (a job deciding which ranks drag it).
    let slow: Vec<String> = snapshot
        .faults
        .iter()
        .filter(|f| f.code == crate::model::FaultCode::GpuSlow)
        .map(|f| format!("{}: {}", f.label(), f.detail))
        .collect();
    let output = serde_json::json!({
        "fail_count": failures.len(),
        "failures": failures,
        "slow_gpus": slow,
        "node": snapshot.node_name,
    });
    let healthy = failures.is_empty();
    HealthCheckResponse {
        success: healthy,
        exit_code: i32::from(!healthy),
        output: output.to_string(),
        error: if healthy {
            String::new()
        } else {
            format!("gpu-agent: node unfit for a job: {}", failures.join("; "))
        },
    }
}

/// The service: the latest snapshot's verdict.
struct Answer {
    snapshots: watch::Receiver<Arc<HealthSnapshot>>,
}

#[tonic::async_trait]
impl HealthCheckService for Answer {
    async fn run_health_check(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        let snapshot = Arc::clone(&self.snapshots.borrow());
        let answer = verdict(&snapshot, SystemTime::now());
        tracing::info!(args = ?request.get_ref().args, healthy = answer.success, "NVRx health check answered.");
        Ok(tonic::Response::new(answer))
    }
}

/// The gid of group `name` (or a number), from `<root>/etc/group`.
fn gid(name: &str, group_file: &std::path::Path) -> Option<u32> {
    if let Ok(gid) = name.parse() {
        return Some(gid);
    }
    std::fs::read_to_string(group_file)
        .ok()?
        .lines()
        .find_map(|line| {
            let mut fields = line.split(':');
            (fields.next() == Some(name))
                .then(|| fields.nth(1).and_then(|g| g.parse().ok()))
                .flatten()
        })
}

/// Serve until shutdown; the sink's state goes to `status`.
pub async fn run(
    settings: Settings,
    snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    reports: mpsc::Sender<Observation>,
    mut shutdown: Shutdown,
) {
    let report = |state| {
        let reports = reports.clone();
        async move {
            let _ = reports
                .send(Observation::Sink(SinkStatus {
                    sink: SINK.into(),
                    state,
                }))
                .await;
        }
    };
    let listener = match Listener::bind(&settings.socket, Directory::Shared).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "NVRx health-check endpoint is off.");
            report(SourceState::Failed(e.to_string())).await;
            return;
        }
    };
    let granted = settings.group.as_deref().map(|group| {
        gid(group, std::path::Path::new("/etc/group"))
            .ok_or_else(|| format!("no group {group:?} in /etc/group"))
            .and_then(|gid| {
                crate::host::listen::grant_group(&settings.socket, gid)
                    .map_err(|e| format!("cannot give group {group:?} access: {e}"))
            })
    });
    if let Some(Err(e)) = &granted {
        // Loud: NVRx counts a connection error as a passing health check, so a launcher of
        // that group would admit this node to its rendezvous however sick it is.
        tracing::error!(socket = %settings.socket.display(), error = %e, "The NVRx health-check socket answers root only: a launcher of the configured group gets EACCES, which NVRx counts as healthy.");
        report(SourceState::Failed(format!(
            "serving root only ({e}); NVRx counts the group's EACCES as healthy"
        )))
        .await;
    } else {
        report(SourceState::On).await;
    }
    tracing::info!(socket = %settings.socket.display(), group = settings.group.as_deref().unwrap_or("root"), "Serving NVRx node health checks.");
    let (listener, _remove) = listener.into_parts();
    // Each client connection goes through the :authority shim to the server's end of a
    // socket pair; a client holds three descriptors, so the cap bounds them.
    let (connections, incoming) = mpsc::channel::<std::io::Result<tokio::net::UnixStream>>(8);
    tokio::spawn(crate::host::listen::serve(
        listener,
        LIMITS,
        "nvrx",
        shutdown.clone(),
        move |client| {
            let connections = connections.clone();
            async move {
                match tokio::net::UnixStream::pair() {
                    Ok((shim, server)) => {
                        if connections.send(Ok(server)).await.is_ok() {
                            authority::relay(client, shim).await;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "Cannot open a socket pair for a health check.");
                    }
                }
            }
        },
    ));
    let served = tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(
            HealthCheckServiceServer::new(Answer { snapshots }),
            tokio_stream::wrappers::ReceiverStream::new(incoming),
            shutdown.wait(),
        )
        .await;
    if let Err(e) = served {
        tracing::warn!(error = %e, "NVRx health-check endpoint stopped.");
        report(SourceState::Failed(e.to_string())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::HealthModel;
    use crate::model::KmsgStats;

    #[test]
    fn healthy_until_a_fatal_fault() {
        let mut model = HealthModel::for_test();
        let healthy = verdict(&model.snapshot(KmsgStats::default()), SystemTime::now());
        assert!(healthy.success && healthy.exit_code == 0 && healthy.error.is_empty());
        let output: serde_json::Value = serde_json::from_str(&healthy.output).expect("json");
        assert_eq!(output["fail_count"], 0);
        model.apply_line(
            "NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception",
            SystemTime::now(),
        );
        assert!(verdict(&model.snapshot(KmsgStats::default()), SystemTime::now()).success);
        model.apply_line(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
            SystemTime::now(),
        );
        let sick = verdict(&model.snapshot(KmsgStats::default()), SystemTime::now());
        assert!(!sick.success && sick.exit_code == 1);
        assert!(sick.error.contains("Xid 79"), "{}", sick.error);
        let output: serde_json::Value = serde_json::from_str(&sick.output).expect("json");
        assert_eq!(output["fail_count"], 1);
    }

    /// A slow GPU is a warning: the node stays fit, and the answer names it.
    #[test]
    fn a_slow_gpu_is_named_and_the_node_stays_fit() {
        let mut model = HealthModel::for_test();
        let pci: crate::model::PciAddress = "0000:3b:00.0".parse().expect("pci");
        model.apply(crate::model::Observation::Poll {
            source: crate::model::SourceKind::Nvml,
            faults: vec![crate::model::FaultReport {
                component: crate::model::Component::Gpu { pci },
                code: crate::model::FaultCode::GpuSlow,
                class: crate::model::Classification {
                    name: "GPU_SLOW".into(),
                    description: String::new(),
                    nvidia_action: String::new(),
                    severity: Severity::Warning,
                    action: crate::model::Action::None,
                },
                source: crate::model::SourceKind::Nvml,
                at: SystemTime::now(),
                detail: "slow while busy: clock events: power brake".into(),
                cursor: None,
                drill: false,
            }],
            partial: Vec::new(),
            inventory: crate::model::Inventory::Gpus {
                gpus: Vec::new(),
                driver_version: None,
            },
        });
        let answer = verdict(&model.snapshot(KmsgStats::default()), SystemTime::now());
        assert!(answer.success);
        let output: serde_json::Value = serde_json::from_str(&answer.output).expect("json");
        assert_eq!(output["fail_count"], 0);
        assert!(
            output["slow_gpus"][0]
                .as_str()
                .is_some_and(|s| s.contains("power brake")),
            "{output}"
        );
    }

    #[test]
    fn groups_by_name_or_number() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("group");
        std::fs::write(&file, "root:x:0:\nnvrx:x:1234:alice\n").expect("group");
        assert_eq!(gid("nvrx", &file), Some(1234));
        assert_eq!(gid("77", &file), Some(77));
        assert_eq!(gid("nobody", &file), None);
    }
}
