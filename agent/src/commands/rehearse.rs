//! The rehearsal `host::resident` runs once after it hands the program's start-up pages
//! back: every fault path on made-up input, with no effect outside this process (nothing
//! logged, sent, signalled or saved), so that the pages it maps again are among those
//! locked. The kernel log's reader and classifier on a made-up Xid, NVML's event report,
//! an EFA poll's checks on a made-up device (link down, errors past the fatal rate), a
//! Spot notice's parser and the checkpoint sink's act on it (no process to signal); the
//! core's verdict on them in a model of its own; the status table and JSON; the Node
//! conditions' PATCH and Events, the maintenance deadline's annotation and its log line, a
//! DeviceTaintRule and its patch; the checkpoint scan and the pidfd send path up to its
//! start-time check; one `status` asked of this daemon's own socket; two GETs of this Node
//! at once through the shared Kubernetes connection (one opens a connection of its own) and
//! the list of its pods (reads). Log lines are formatted and written nowhere
//! (`logging::discarding`). The systemd sink rehearses its own part when the lock starts
//! watching: it sends systemd the status line it last sent, once more.

use std::sync::Arc;
use std::time::SystemTime;

use super::settings;
use super::HostFacts;
use crate::config::Config;
use crate::host::resident::Rehearsal;
use crate::model::{HealthSnapshot, KmsgStats, Notice, Observation, PciAddress, SourceKind};
use crate::sinks::{checkpoint, status};
use crate::sources::{efa, kmsg, nvml};

/// The connection the Kubernetes rehearsal reads this Node through (`None`: no Kubernetes).
#[cfg(feature = "clients")]
pub type Kubernetes = Option<crate::sinks::kubernetes::Link>;
/// No Kubernetes in a build without the clients.
#[cfg(not(feature = "clients"))]
pub type Kubernetes = Option<std::convert::Infallible>;

/// The rehearsal of this daemon's fault paths, for `host::resident::run`.
pub fn rehearsal(config: &Config, host: &HostFacts, kubernetes: Kubernetes) -> Rehearsal {
    let shared = Arc::new((config.clone(), host.clone()));
    Box::new(move || {
        let shared = Arc::clone(&shared);
        let kubernetes = kubernetes.clone();
        let socket = shared.0.status.socket.clone();
        Box::pin(async move {
            use tracing::instrument::WithSubscriber;
            let config = &shared.0;
            let quiet = crate::logging::discarding();
            let on_kubernetes = kubernetes.is_some();
            let local = tokio::task::spawn_blocking({
                let (shared, quiet) = (Arc::clone(&shared), quiet.clone());
                move || {
                    tracing::dispatcher::with_default(&quiet, || {
                        local(&shared.0, &shared.1, on_kubernetes)
                    })
                }
            });
            let (built, acted) = local.await.unwrap_or_default();
            if let (true, Some((notice, snapshot))) = (config.checkpoint.enabled, acted) {
                let settings = settings::checkpoint(
                    config,
                    #[cfg(feature = "clients")]
                    None,
                    #[cfg(feature = "clients")]
                    None,
                );
                checkpoint::rehearse_act(settings, &notice, &snapshot)
                    .with_subscriber(quiet.clone())
                    .await;
            }
            let asked = status::query(&socket, &status::Request::Status)
                .with_subscriber(quiet.clone())
                .await
                .is_ok();
            let read = remote(kubernetes).with_subscriber(quiet).await;
            tracing::debug!(
                bytes = built,
                status_answered = asked,
                node_read = read,
                "Fault paths rehearsed."
            );
        })
    })
}

/// What the checkpoint sink acts on: the rehearsal's Spot notice, in its snapshot.
type Acted = Option<(Notice, HealthSnapshot)>;

/// Everything that needs no server, for the sources and sinks that run (`kubernetes`: the
/// Kubernetes sinks do): the bytes built, and the notice to act on. What is off is not
/// rehearsed, so its code is not locked.
fn local(config: &Config, host: &HostFacts, kubernetes: bool) -> (usize, Acted) {
    threads();
    let now = SystemTime::now();
    let pci = host
        .devices
        .gpus
        .first()
        .map(|g| g.pci)
        .or_else(|| "0000:18:00.0".parse::<PciAddress>().ok());
    let mut model = host.model(config);
    let kmsg_settings = host.kmsg_settings(config, None, crate::drill::Holder::Reader);
    let branch = kmsg_settings.branch;
    if let Some(pci) = pci {
        if config.kmsg.enabled {
            if let Some(report) = kmsg::rehearse(kmsg_settings, pci) {
                model.apply(Observation::Fault(report));
            }
        }
        if config.nvml.enabled {
            model.apply(Observation::Fault(nvml::events::report(
                pci, 48, branch, now,
            )));
        }
    }
    if config.efa.enabled {
        efa(&mut model, config, pci);
    }
    let notice = spot(now);
    model.apply(Observation::Notices {
        source: SourceKind::Imds,
        notices: notice.iter().cloned().collect(),
    });
    let snapshot = model.snapshot(KmsgStats::default());
    let mut built = status::render(&snapshot).len()
        + serde_json::to_string(&snapshot).map_or(0, |json| json.len());
    #[cfg(feature = "clients")]
    if kubernetes {
        built += crate::sinks::node_conditions::rehearse(
            &snapshot,
            &settings::node_conditions(config).types,
        );
        built += crate::sinks::device_taints::rehearse(&snapshot);
    }
    if config.checkpoint.enabled {
        built += checkpoint::rehearse(&HostFacts::checkpoint_selection(config));
    }
    #[cfg(not(feature = "clients"))]
    let _ = kubernetes;
    (built, notice.map(|n| (n, snapshot)))
}

/// An EFA poll's findings on a made-up device serving `gpu`: first under this daemon's
/// rules (a fatal finding not yet confirmed stands as a warning), then as if confirmed
/// (the fatal verdict, and with it the NetworkingReady condition's message).
fn efa(model: &mut crate::core::HealthModel, config: &Config, gpu: Option<PciAddress>) {
    let Ok(pci) = "0000:fe:00.0".parse::<PciAddress>() else {
        return;
    };
    let thresholds = HostFacts::efa_thresholds(config);
    let gpus: Vec<PciAddress> = gpu.into_iter().collect();
    model.apply(efa::rehearse(pci, gpus.clone(), &thresholds));
    model.set_condition_rules(crate::core::condition::Rules::default());
    model.apply(efa::rehearse(pci, gpus, &thresholds));
}

/// A thread started, ended and started again: a fault's work on the blocking pool may start
/// a thread on the stack of one that ended, and glibc binds what that path calls (its own
/// `_dl_allocate_tls_init`) on first use, looking the name up through every loaded
/// program's symbol tables, this one's included, which would otherwise be read from the
/// disk.
fn threads() {
    for _ in 0..2 {
        if let Ok(thread) = std::thread::Builder::new()
            .name("rehearsal".into())
            .spawn(|| ())
        {
            let _ = thread.join();
        }
    }
}

/// A Spot notice two minutes out, through the IMDS source's parser.
#[cfg(feature = "clients")]
fn spot(now: SystemTime) -> Option<crate::model::Notice> {
    let at = crate::model::time::rfc3339(now + std::time::Duration::from_secs(120));
    let body = format!(r#"{{"action": "terminate", "time": "{at}"}}"#);
    crate::sources::imds::notices::spot(&body).ok()
}

/// No IMDS source in a build without the clients.
#[cfg(not(feature = "clients"))]
fn spot(_now: SystemTime) -> Option<crate::model::Notice> {
    None
}

/// Two GETs of this Node at once through the shared connection (the request path every
/// PATCH and Event takes, and a new connection's), then the list of its pods (a fault's pod
/// Events look their pods up): whether all answered.
#[cfg(feature = "clients")]
async fn remote(kubernetes: Kubernetes) -> bool {
    let Some(link) = kubernetes else {
        return false;
    };
    match link.api().await {
        // Two at once: one on the connection kept open, one on a connection of its own (a
        // fault's PATCH and Events go out together).
        Ok(api) => {
            let (one, two) = tokio::join!(api.get(), api.get());
            let pods = api.pods_on_node().await;
            one.is_ok() && two.is_ok() && pods.is_ok()
        }
        Err(_) => false,
    }
}

/// No Kubernetes in a build without the clients.
#[cfg(not(feature = "clients"))]
async fn remote(_kubernetes: Kubernetes) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FaultCode, NameSource, NodeName, Severity};

    #[test]
    fn the_efa_rehearsal_ends_on_a_fatal_finding_on_its_device() {
        let config = Config::default();
        let host = HostFacts {
            node_name: NodeName {
                name: "rehearsal".into(),
                source: NameSource::Config,
            },
            boot_id: "boot".into(),
            devices: Default::default(),
        };
        let mut model = host.model(&config);
        efa(&mut model, &config, None);
        let snapshot = model.snapshot(KmsgStats::default());
        let link = snapshot
            .faults
            .iter()
            .find(|f| f.code == FaultCode::EfaLinkDown)
            .expect("a link-down fault");
        assert_eq!(link.class.severity, Severity::Fatal, "{link:?}");
        assert!(link.detail.contains("rdmap0s0"), "{}", link.detail);
    }
}
