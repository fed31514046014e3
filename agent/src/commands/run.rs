//! `gpu-agent run`: the daemon.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use super::{settings, HostFacts, SHUTDOWN_GRACE};
use crate::config::{Config, Loaded};
use crate::core::{Core, HealthModel, StateStore};
use crate::model::{Observation, SourceKind, SourceState};
use crate::sinks::{checkpoint, metrics, status, systemd};
use crate::sources::{kmsg, nvml};

/// Observations queued between sources and the core; a full queue slows the kernel-log
/// reader (the kernel then overruns and we count the loss) instead of growing memory.
const OBSERVATION_QUEUE: usize = 1024;
/// Why the IMDS, Capacity Block and logind sources and the Kubernetes sinks are off in a
/// build without the `clients` feature.
const NOT_BUILT_IN: &str = "not built in (gpu-agent built without the `clients` feature)";
/// How long start-up waits for sources to report before READY=1.
const SOURCE_START_WAIT: Duration = Duration::from_secs(5);

/// The core's snapshots, as every sink reads them.
type Snapshots = tokio::sync::watch::Receiver<Arc<crate::model::HealthSnapshot>>;

/// Run the daemon until SIGTERM or SIGINT.
pub fn run(loaded: Loaded) -> anyhow::Result<u8> {
    let runtime = super::runtime().context("cannot start the async runtime")?;
    let result = runtime.block_on(daemon(loaded));
    // The kernel-log thread blocks in read(2); it ends with the process.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    result
}

/// The composition root: what runs, in the order it starts.
async fn daemon(loaded: Loaded) -> anyhow::Result<u8> {
    let config = loaded.config;
    announce(&config, loaded.path.as_deref());
    let mut sigterm = signal(SignalKind::terminate()).context("cannot install SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot install SIGINT handler")?;

    let host = HostFacts::read(&config);
    let (mut model, store) = open_state(&config, &host);
    let (trigger, shutdown) = crate::shutdown::channel();
    let (tx, rx) = mpsc::channel(OBSERVATION_QUEUE);
    let counters = super::counters();
    start_sources(&config, &host, &mut model, &counters, &tx, &shutdown)?;

    let (core, handle, snapshots) = Core::new(model, store, Arc::clone(&counters));
    let core_task = tokio::spawn(core.run(rx, shutdown.clone()));
    let locks = tx.clone();
    let kubernetes = start_sinks(
        &config, &host, &snapshots, &handle, &counters, tx, &shutdown,
    )
    .await;
    tokio::spawn(systemd::run(snapshots.clone(), handle, shutdown.clone()));
    announce_ready(&snapshots).await;
    tokio::spawn(crate::host::resident::run(
        settings::resident(&config),
        super::rehearse::rehearsal(&config, &host, kubernetes),
        move |lock| {
            let locks = locks.clone();
            tokio::spawn(async move { locks.send(Observation::FaultPathLock(lock)).await });
        },
    ));

    tokio::select! {
        _ = sigterm.recv() => tracing::info!("SIGTERM received; stopping."),
        _ = sigint.recv() => tracing::info!("SIGINT received; stopping."),
    }
    systemd::stopping();
    trigger.fire();
    if tokio::time::timeout(SHUTDOWN_GRACE, core_task)
        .await
        .is_err()
    {
        tracing::warn!("Core did not stop in time.");
    }
    tracing::info!("Stopped.");
    Ok(0)
}

/// Log the start, the config it runs with, and a checkpoint signal that is risky.
fn announce(config: &Config, path: Option<&std::path::Path>) {
    let source = path.map_or_else(
        || "embedded default".to_string(),
        |p| p.display().to_string(),
    );
    tracing::info!(version = env!("CARGO_PKG_VERSION"), config = %source, "Starting gpu-agent.");
    if let Some(why) =
        crate::model::signal::parse(&config.checkpoint.signal).and_then(crate::model::signal::risky)
    {
        tracing::warn!(signal = %config.checkpoint.signal, "[checkpoint] signal: {why}.");
    }
}

/// The health model, restored from the state directory, and the store it is saved to
/// (`None`: the directory is unusable; state is kept in memory only).
fn open_state(config: &Config, host: &HostFacts) -> (HealthModel, Option<StateStore>) {
    let mut model = host.model(config);
    let store = StateStore::new(&config.state_dir);
    if let Some(state) = store.load() {
        model.restore(state);
    }
    match std::fs::create_dir_all(&config.state_dir) {
        Ok(()) => (model, Some(store)),
        Err(e) => {
            tracing::warn!(state_dir = %config.state_dir.display(), error = %e, "State directory unusable; state is kept in memory only.");
            (model, None)
        }
    }
}

/// The sources that need no client (kernel log, NVML, EFA) start now; every source's
/// starting (or off) state goes into the model first, so `status` never shows one missing.
fn start_sources(
    config: &Config,
    host: &HostFacts,
    model: &mut HealthModel,
    counters: &Arc<crate::model::KmsgCounters>,
    tx: &mpsc::Sender<Observation>,
    shutdown: &crate::shutdown::Shutdown,
) -> anyhow::Result<()> {
    let starting = |enabled: bool, section: &str, built_in: bool| {
        if !enabled {
            SourceState::Off(format!("disabled by [{section}] enabled = false"))
        } else if built_in {
            SourceState::Starting
        } else {
            SourceState::Off(NOT_BUILT_IN.into())
        }
    };
    let clients = cfg!(feature = "clients");
    for (kind, enabled, section, built_in) in [
        (SourceKind::Kmsg, config.kmsg.enabled, "kmsg", true),
        (SourceKind::Nvml, config.nvml.enabled, "nvml", true),
        (SourceKind::Efa, config.efa.enabled, "efa", true),
        (
            SourceKind::CapacityBlock,
            config.ec2.enabled,
            "ec2",
            clients,
        ),
        (SourceKind::Logind, config.logind.enabled, "logind", clients),
        (SourceKind::Imex, config.imex.enabled, "imex", clients),
        (SourceKind::Imds, config.imds.enabled, "imds", clients),
    ] {
        model.apply(Observation::Source(
            kind,
            starting(enabled, section, built_in),
        ));
    }
    if config.kmsg.enabled {
        let settings =
            host.kmsg_settings(config, model.kmsg_cursor(), crate::drill::Holder::Daemon);
        kmsg::spawn(settings, Arc::clone(counters), tx.clone())
            .context("cannot start the kernel-log thread")?;
    }
    if config.nvml.enabled {
        let mut settings = HostFacts::nvml_settings(config);
        // The daemon keeps the NVLink baseline across its restarts (`check` only reads NVML).
        settings.baseline = Some((
            config.state_dir.join("nvlink-baseline.json"),
            host.boot_id.clone(),
        ));
        nvml::spawn(settings, tx.clone()).context("cannot start the NVML thread")?;
    }
    if config.efa.enabled {
        let mut settings = HostFacts::efa_settings(config);
        // The daemon keeps this boot's EFA device count across its restarts.
        settings.baseline = Some((
            config.state_dir.join("efa-baseline.json"),
            host.boot_id.clone(),
        ));
        #[cfg(feature = "clients")]
        if config.ec2.enabled {
            // What this launch attached, from the EC2 API (on EC2 only).
            let (count, launch) = tokio::sync::watch::channel(None);
            settings.launch = Some(launch);
            tokio::spawn(crate::sources::ec2::learn_efa_interfaces(
                settings::ec2(config),
                count,
                shutdown.clone(),
            ));
        }
        tokio::spawn(crate::sources::efa::run(
            settings,
            tx.clone(),
            shutdown.clone(),
        ));
    }
    Ok(())
}

/// Every sink, and the sources that need a client (they share the sinks' queue to the
/// core): the status socket, NVRx, Kubernetes (conditions, fencing, pod Events), the
/// checkpoint sink, metrics. Returns the Kubernetes connection, for the fault paths'
/// rehearsal.
async fn start_sinks(
    config: &Config,
    host: &HostFacts,
    snapshots: &Snapshots,
    handle: &crate::core::CoreHandle,
    counters: &Arc<crate::model::KmsgCounters>,
    sink_tx: mpsc::Sender<Observation>,
    shutdown: &crate::shutdown::Shutdown,
) -> super::rehearse::Kubernetes {
    let mut registry = Registry::default();
    // Which pod holds which GPU: asked only when a fault, a signal or `status` needs it.
    #[cfg(feature = "clients")]
    let pod_resources = config.pod_resources.enabled.then(|| {
        crate::sinks::pod_resources::Lookup::new(settings::pod_resources(config), sink_tx.clone())
    });
    #[cfg(feature = "clients")]
    let holders: status::Holders = pod_resources.clone();
    #[cfg(not(feature = "clients"))]
    let holders: status::Holders = None;
    serve_status(config, snapshots, handle, holders, counters, shutdown).await;
    #[cfg(not(feature = "clients"))]
    if config.kubernetes.enabled || !config.nvrx.socket.as_os_str().is_empty() {
        tracing::info!(
            reason = NOT_BUILT_IN,
            "The Kubernetes sinks and the NVRx endpoint are off."
        );
    }
    #[cfg(feature = "clients")]
    if !config.nvrx.socket.as_os_str().is_empty() {
        tokio::spawn(crate::sinks::nvrx::run(
            settings::nvrx(config),
            snapshots.clone(),
            sink_tx.clone(),
            shutdown.clone(),
        ));
    }
    // One Kubernetes connection for every sink that talks to the API server.
    #[cfg(feature = "clients")]
    let kubernetes = config.kubernetes.enabled.then(|| {
        crate::sinks::kubernetes::Link::new(
            settings::kubernetes(config),
            host.node_name.clone(),
            sink_tx.clone(),
        )
    });
    #[cfg(not(feature = "clients"))]
    let _ = host;
    #[cfg(feature = "clients")]
    if let Some(link) = &kubernetes {
        start_kubernetes_sinks(
            config,
            link,
            pod_resources.as_ref(),
            &mut registry,
            snapshots,
            &sink_tx,
            shutdown,
        );
    }
    if config.checkpoint.enabled {
        let metrics = checkpoint::CheckpointMetrics::register(&mut registry);
        tokio::spawn(checkpoint::run(
            settings::checkpoint(
                config,
                #[cfg(feature = "clients")]
                kubernetes.clone(),
                #[cfg(feature = "clients")]
                pod_resources.clone(),
            ),
            metrics,
            snapshots.clone(),
            sink_tx.clone(),
            shutdown.clone(),
        ));
    }
    if config.nvml.enabled && config.metrics.enabled {
        // Which GPUs pods hold and keep busy, and their GPU-seconds.
        let metrics = crate::sinks::funnel::FunnelMetrics::register(&mut registry);
        #[cfg(feature = "clients")]
        let (holders, events): (
            crate::sinks::funnel::Holders,
            crate::sinks::funnel::Events,
        ) = (pod_resources.clone(), kubernetes.clone());
        #[cfg(not(feature = "clients"))]
        let (holders, events): (
            crate::sinks::funnel::Holders,
            crate::sinks::funnel::Events,
        ) = (None, None);
        tokio::spawn(crate::sinks::funnel::run(
            settings::funnel(config),
            metrics,
            holders,
            events,
            snapshots.clone(),
            sink_tx.clone(),
            shutdown.clone(),
        ));
    }
    #[cfg(feature = "clients")]
    start_client_sources(config, snapshots, &sink_tx, shutdown);
    drop(sink_tx);
    if config.metrics.enabled {
        serve_metrics(config, registry, snapshots, counters, shutdown).await;
    }
    #[cfg(feature = "clients")]
    return kubernetes;
    #[cfg(not(feature = "clients"))]
    None
}

/// The admin socket `gpu-agent status` and `clear` talk to.
async fn serve_status(
    config: &Config,
    snapshots: &Snapshots,
    handle: &crate::core::CoreHandle,
    holders: status::Holders,
    counters: &Arc<crate::model::KmsgCounters>,
    shutdown: &crate::shutdown::Shutdown,
) {
    match crate::host::listen::Listener::bind(
        &config.status.socket,
        crate::host::listen::Directory::Private,
    )
    .await
    {
        Ok(listener) => {
            tokio::spawn(status::serve(
                listener,
                snapshots.clone(),
                handle.clone(),
                holders,
                Arc::clone(counters),
                shutdown.clone(),
            ));
        }
        Err(e) => {
            tracing::warn!(error = %e, "Status socket is off; `gpu-agent status` cannot reach this daemon.")
        }
    }
}

/// `/metrics`: the sinks' registered metrics and the snapshot's, rendered at scrape time.
async fn serve_metrics(
    config: &Config,
    mut registry: Registry,
    snapshots: &Snapshots,
    counters: &Arc<crate::model::KmsgCounters>,
    shutdown: &crate::shutdown::Shutdown,
) {
    registry.register_collector(Box::new(metrics::SnapshotCollector::new(
        snapshots.clone(),
        Arc::clone(counters),
    )));
    match metrics::serve(config.metrics.listen, registry, shutdown.clone()).await {
        Ok((addr, server)) => {
            tracing::info!(%addr, "Serving metrics at /metrics.");
            tokio::spawn(server);
        }
        Err(e) => tracing::warn!(error = %e, "Metrics endpoint is off."),
    }
}

/// READY=1 once every source has said whether it runs (at most [`SOURCE_START_WAIT`]).
async fn announce_ready(snapshots: &Snapshots) {
    let mut watch = snapshots.clone();
    // (The `Ref` that `wait_for` returns holds the channel's read lock: drop it at once.)
    let timed_out = tokio::time::timeout(
        SOURCE_START_WAIT,
        watch.wait_for(|s| {
            s.sources
                .iter()
                .all(|src| src.state != SourceState::Starting)
        }),
    )
    .await
    .is_err();
    if timed_out {
        tracing::warn!("A source did not report within 5s; signalling readiness anyway.");
    }
    let summary = snapshots.borrow().summary.clone();
    systemd::ready(&summary);
    tracing::info!(%summary, "Ready.");
}

/// The node-conditions sink (conditions and Node Events), with `device_taints` the
/// device-taints sink (per-GPU fencing), and with the pod-resources lookup the pod Events.
#[cfg(feature = "clients")]
fn start_kubernetes_sinks(
    config: &Config,
    link: &crate::sinks::kubernetes::Link,
    pod_resources: Option<&crate::sinks::pod_resources::Lookup>,
    registry: &mut Registry,
    snapshots: &Snapshots,
    sink_tx: &mpsc::Sender<Observation>,
    shutdown: &crate::shutdown::Shutdown,
) {
    use crate::sinks::{device_taints, node_conditions, pod_events};
    let metrics = node_conditions::SinkMetrics::register(registry);
    tokio::spawn(node_conditions::run(
        settings::node_conditions(config),
        link.clone(),
        metrics,
        snapshots.clone(),
        sink_tx.clone(),
        shutdown.clone(),
    ));
    if config.kubernetes.device_taints {
        tokio::spawn(device_taints::run(
            settings::device_taints(config),
            link.clone(),
            snapshots.clone(),
            sink_tx.clone(),
            shutdown.clone(),
        ));
    }
    if let Some(lookup) = pod_resources {
        tokio::spawn(pod_events::run(
            link.clone(),
            lookup.clone(),
            snapshots.clone(),
            shutdown.clone(),
        ));
    }
}

/// The sources that need a client: IMDS, the Capacity Block (EC2 API), logind and IMEX
/// (D-Bus).
#[cfg(feature = "clients")]
fn start_client_sources(
    config: &Config,
    snapshots: &Snapshots,
    sink_tx: &mpsc::Sender<Observation>,
    shutdown: &crate::shutdown::Shutdown,
) {
    use crate::sources::{capacity_block, imds, imex, logind};
    if config.imds.enabled {
        tokio::spawn(imds::run(
            settings::imds(config),
            sink_tx.clone(),
            shutdown.clone(),
        ));
    }
    if config.ec2.enabled {
        tokio::spawn(capacity_block::run(
            settings::capacity_block(config),
            sink_tx.clone(),
            shutdown.clone(),
        ));
    }
    if config.logind.enabled {
        tokio::spawn(logind::run(
            settings::logind(config),
            sink_tx.clone(),
            snapshots.clone(),
            shutdown.clone(),
        ));
    }
    if config.imex.enabled {
        tokio::spawn(imex::run(
            settings::imex(config),
            sink_tx.clone(),
            shutdown.clone(),
        ));
    }
}
