//! `gpu-agent run`: the daemon.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use super::{HostFacts, SHUTDOWN_GRACE};
use crate::config::Loaded;
use crate::core::{Core, StateStore};
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

/// Run the daemon until SIGTERM or SIGINT.
pub fn run(loaded: Loaded) -> anyhow::Result<u8> {
    let runtime = super::runtime().context("cannot start the async runtime")?;
    let result = runtime.block_on(daemon(loaded));
    // The kernel-log thread blocks in read(2); it ends with the process.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    result
}

async fn daemon(loaded: Loaded) -> anyhow::Result<u8> {
    let config = loaded.config;
    let source = loaded.path.map_or_else(
        || "embedded default".to_string(),
        |p| p.display().to_string(),
    );
    tracing::info!(version = env!("CARGO_PKG_VERSION"), config = %source, "Starting gpu-agent.");
    if let Some(why) =
        crate::model::signal::parse(&config.checkpoint.signal).and_then(crate::model::signal::risky)
    {
        tracing::warn!(signal = %config.checkpoint.signal, "[checkpoint] signal: {why}.");
    }
    let mut sigterm = signal(SignalKind::terminate()).context("cannot install SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot install SIGINT handler")?;

    let host = HostFacts::read(&config);
    let mut model = host.model(&config);
    let store = StateStore::new(&config.state_dir);
    if let Some(state) = store.load() {
        model.restore(state);
    }
    let store = match std::fs::create_dir_all(&config.state_dir) {
        Ok(()) => Some(store),
        Err(e) => {
            tracing::warn!(state_dir = %config.state_dir.display(), error = %e, "State directory unusable; state is kept in memory only.");
            None
        }
    };

    let (trigger, shutdown) = crate::shutdown::channel();
    let (tx, rx) = mpsc::channel(OBSERVATION_QUEUE);
    let counters = super::counters();
    if config.kmsg.enabled {
        model.apply(Observation::Source(SourceKind::Kmsg, SourceState::Starting));
        let settings =
            host.kmsg_settings(&config, model.kmsg_cursor(), crate::drill::Holder::Daemon);
        kmsg::spawn(settings, Arc::clone(&counters), tx.clone())
            .context("cannot start the kernel-log thread")?;
    } else {
        model.apply(Observation::Source(
            SourceKind::Kmsg,
            SourceState::Off("disabled by [kmsg] enabled = false".into()),
        ));
    }
    if config.nvml.enabled {
        model.apply(Observation::Source(SourceKind::Nvml, SourceState::Starting));
        let mut settings = HostFacts::nvml_settings(&config);
        // The daemon keeps the NVLink baseline across its restarts (`check` only reads NVML).
        settings.baseline = Some((
            config.state_dir.join("nvlink-baseline.json"),
            host.boot_id.clone(),
        ));
        nvml::spawn(settings, tx.clone()).context("cannot start the NVML thread")?;
    } else {
        model.apply(Observation::Source(
            SourceKind::Nvml,
            SourceState::Off("disabled by [nvml] enabled = false".into()),
        ));
    }
    if config.efa.enabled {
        model.apply(Observation::Source(SourceKind::Efa, SourceState::Starting));
        let mut settings = HostFacts::efa_settings(&config);
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
                crate::sources::ec2::Settings {
                    imds_endpoint: Some(config.imds.endpoint.clone()).filter(|e| !e.is_empty()),
                    ec2_endpoint: Some(config.ec2.endpoint.clone()).filter(|e| !e.is_empty()),
                    retry_interval: config.ec2.poll_interval.0,
                    sysfs_root: config.sysfs.root.clone(),
                },
                count,
                shutdown.clone(),
            ));
        }
        tokio::spawn(crate::sources::efa::run(
            settings,
            tx.clone(),
            shutdown.clone(),
        ));
    } else {
        model.apply(Observation::Source(
            SourceKind::Efa,
            SourceState::Off("disabled by [efa] enabled = false".into()),
        ));
    }
    for (kind, enabled, section) in [
        (SourceKind::CapacityBlock, config.ec2.enabled, "ec2"),
        (SourceKind::Logind, config.logind.enabled, "logind"),
        (SourceKind::Imex, config.imex.enabled, "imex"),
        (SourceKind::Imds, config.imds.enabled, "imds"),
    ] {
        let state = if !enabled {
            SourceState::Off(format!("disabled by [{section}] enabled = false"))
        } else if cfg!(feature = "clients") {
            SourceState::Starting
        } else {
            SourceState::Off(NOT_BUILT_IN.into())
        };
        model.apply(Observation::Source(kind, state));
    }
    // Sinks report their own state to the core on the same queue.
    let sink_tx = tx;

    let (core, handle, snapshots) = Core::new(model, store, Arc::clone(&counters));
    let core_task = tokio::spawn(core.run(rx, shutdown.clone()));

    // Which pod holds which GPU: asked only when a fault, a signal or `status` needs it.
    #[cfg(feature = "clients")]
    let pod_resources = config.pod_resources.enabled.then(|| {
        let p = &config.pod_resources;
        crate::sinks::pod_resources::Lookup::new(
            crate::sinks::pod_resources::Settings {
                socket: p.socket.clone(),
                timeout: p.timeout.0,
                cache_for: p.cache_for.0,
                resource_prefix: p.resource_prefix.clone(),
            },
            sink_tx.clone(),
        )
    });
    #[cfg(feature = "clients")]
    let holders: status::Holders = pod_resources.clone();
    #[cfg(not(feature = "clients"))]
    let holders: status::Holders = None;
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
                Arc::clone(&counters),
                shutdown.clone(),
            ));
        }
        Err(e) => {
            tracing::warn!(error = %e, "Status socket is off; `gpu-agent status` cannot reach this daemon.")
        }
    }
    let mut registry = Registry::default();
    #[cfg(not(feature = "clients"))]
    if config.kubernetes.enabled {
        tracing::info!(reason = NOT_BUILT_IN, "Kubernetes sink is off.");
    }
    if !config.nvrx.socket.as_os_str().is_empty() {
        #[cfg(feature = "clients")]
        tokio::spawn(crate::sinks::nvrx::run(
            crate::sinks::nvrx::Settings {
                socket: config.nvrx.socket.clone(),
                group: Some(config.nvrx.group.clone()).filter(|g| !g.is_empty()),
            },
            snapshots.clone(),
            sink_tx.clone(),
            shutdown.clone(),
        ));
        #[cfg(not(feature = "clients"))]
        tracing::info!(reason = NOT_BUILT_IN, "NVRx health-check endpoint is off.");
    }
    // One Kubernetes connection for both sinks, built on first use.
    #[cfg(feature = "clients")]
    let kubernetes = config.kubernetes.enabled.then(|| {
        crate::sinks::kubernetes::Link::new(
            crate::sinks::kubernetes::Settings {
                kubeconfig: config.kubernetes.kubeconfig.clone(),
                node_name: config.node_name.clone(),
                procfs_root: config.procfs.root.clone(),
                kubelet_environment: config.kubernetes.kubelet_environment.clone(),
                timeout: config.kubernetes.timeout.0,
            },
            host.node_name.clone(),
            sink_tx.clone(),
        )
    });
    #[cfg(feature = "clients")]
    if let Some(link) = &kubernetes {
        spawn_node_conditions(
            &config,
            link,
            &mut registry,
            &snapshots,
            &sink_tx,
            &shutdown,
        );
        // GPU faults on the pods holding the GPU.
        if let Some(lookup) = &pod_resources {
            tokio::spawn(crate::sinks::pod_events::run(
                link.clone(),
                lookup.clone(),
                snapshots.clone(),
                shutdown.clone(),
            ));
        }
    }
    if config.checkpoint.enabled {
        let c = &config.checkpoint;
        let settings = checkpoint::Settings {
            selection: HostFacts::checkpoint_selection(&config),
            triggers: c.triggers.clone(),
            state_file: config.state_dir.join("checkpoint.json"),
            #[cfg(feature = "clients")]
            kubernetes: kubernetes.clone(),
            #[cfg(feature = "clients")]
            pod_resources: pod_resources.clone(),
            cordon: c.cordon,
            windows: checkpoint::Windows {
                ending: c.ending_window.0,
                incident: c.incident_window.0,
            },
            hold: checkpoint_hold(&config),
            notice_file: Some(c.notice_file.clone()).filter(|p| !p.as_os_str().is_empty()),
            ack_dir: Some(c.ack_dir.clone()).filter(|p| !p.as_os_str().is_empty()),
        };
        let metrics = checkpoint::CheckpointMetrics::register(&mut registry);
        tokio::spawn(checkpoint::run(
            settings,
            metrics,
            snapshots.clone(),
            sink_tx.clone(),
            shutdown.clone(),
        ));
    }
    #[cfg(feature = "clients")]
    spawn_client_sources(&config, &snapshots, &sink_tx, &shutdown);
    drop(sink_tx);
    if config.metrics.enabled {
        registry.register_collector(Box::new(metrics::SnapshotCollector::new(
            snapshots.clone(),
            Arc::clone(&counters),
        )));
        match metrics::serve(config.metrics.listen, registry, shutdown.clone()).await {
            Ok((addr, server)) => {
                tracing::info!(%addr, "Serving metrics at /metrics.");
                tokio::spawn(server);
            }
            Err(e) => tracing::warn!(error = %e, "Metrics endpoint is off."),
        }
    }
    tokio::spawn(systemd::run(snapshots.clone(), handle, shutdown.clone()));

    // READY=1 once every source has said whether it runs.
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

    let page_out_after = config.page_out_after.0;
    if !page_out_after.is_zero() {
        tokio::spawn(async move {
            tokio::time::sleep(page_out_after).await;
            page_out_program().await;
        });
    }

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

/// Hand the program's resident pages back to the kernel (see [`crate::host::resident`]).
async fn page_out_program() {
    match tokio::task::spawn_blocking(crate::host::resident::page_out_program).await {
        Ok(Ok(out)) => match out.lock_failed {
            None => tracing::info!(
                rss_before_kib = out.rss_before_kib,
                rss_after_kib = out.rss_after_kib,
                fault_path_locked_kib = out.kept_kib,
                "Start-up pages handed back (unmapped; kept in the page cache); the fault path's code and read-only data stay locked in memory."
            ),
            Some(errno) => tracing::warn!(
                rss_before_kib = out.rss_before_kib,
                rss_after_kib = out.rss_after_kib,
                fault_path_mapped_kib = out.kept_kib,
                error = %errno,
                "Start-up pages handed back; the fault path's code and read-only data could not be locked (LimitMEMLOCK?) and stay mapped only."
            ),
        },
        Ok(Err(e)) => tracing::info!(error = %e, "Start-up pages stay resident."),
        Err(e) => tracing::warn!(error = %e, "Page-out task failed."),
    }
}

/// `[checkpoint] hold`, at most `[logind] max_delay`: the shutdown lock goes by then anyway
/// (a config from before the hold existed may still say `max_delay = "5s"`).
fn checkpoint_hold(config: &crate::config::Config) -> Duration {
    let hold = config.checkpoint.hold.0;
    let cap = config.logind.max_delay.0;
    if config.logind.enabled && hold > cap {
        tracing::warn!(?hold, max_delay = ?cap, "[checkpoint] hold is longer than [logind] max_delay; a shutdown waits at most max_delay.");
        return cap;
    }
    hold
}

/// The node-conditions sink (conditions and Node Events) and, with `device_taints`, the
/// device-taints sink (per-GPU fencing), when `[kubernetes]` is on.
#[cfg(feature = "clients")]
fn spawn_node_conditions(
    config: &crate::config::Config,
    link: &crate::sinks::kubernetes::Link,
    registry: &mut Registry,
    snapshots: &tokio::sync::watch::Receiver<std::sync::Arc<crate::model::HealthSnapshot>>,
    sink_tx: &mpsc::Sender<Observation>,
    shutdown: &crate::shutdown::Shutdown,
) {
    use crate::sinks::node_conditions;
    {
        let k = &config.kubernetes;
        let settings = node_conditions::Settings {
            types: node_conditions::ConditionTypes {
                hardware: k.hardware_condition.clone(),
                interruption: k.interruption_condition.clone(),
                network: k.network_condition.clone(),
                lifecycle: k.lifecycle_conditions,
                lifecycle_rebalance: k.lifecycle_rebalance,
            },
            debounce: k.debounce.0,
            heartbeat: k.heartbeat_interval.0,
            events: k.events,
            await_fencing: k.device_taints,
        };
        let metrics = node_conditions::SinkMetrics::register(registry);
        tokio::spawn(node_conditions::run(
            settings,
            link.clone(),
            metrics,
            snapshots.clone(),
            sink_tx.clone(),
            shutdown.clone(),
        ));
        if k.device_taints {
            tokio::spawn(crate::sinks::device_taints::run(
                crate::sinks::device_taints::Settings {
                    no_execute: k.device_taint_no_execute,
                    refresh: k.heartbeat_interval.0,
                },
                link.clone(),
                snapshots.clone(),
                sink_tx.clone(),
                shutdown.clone(),
            ));
        }
    }
}

/// The sources that need a client: IMDS, the Capacity Block (EC2 API), logind and IMEX
/// (D-Bus).
#[cfg(feature = "clients")]
fn spawn_client_sources(
    config: &crate::config::Config,
    snapshots: &tokio::sync::watch::Receiver<std::sync::Arc<crate::model::HealthSnapshot>>,
    sink_tx: &mpsc::Sender<Observation>,
    shutdown: &crate::shutdown::Shutdown,
) {
    use crate::sources::{capacity_block, imds, imex, logind};
    if config.imds.enabled {
        let settings = imds::Settings {
            endpoint: Some(config.imds.endpoint.clone()).filter(|e| !e.is_empty()),
            poll_interval: config.imds.poll_interval.0,
            slow_intervals: [
                config.imds.rebalance_interval.0,
                config.imds.scheduled_interval.0,
            ],
            sysfs_root: config.sysfs.root.clone(),
        };
        tokio::spawn(imds::run(settings, sink_tx.clone(), shutdown.clone()));
    }
    if config.ec2.enabled {
        let settings = capacity_block::Settings {
            imds_endpoint: Some(config.imds.endpoint.clone()).filter(|e| !e.is_empty()),
            ec2_endpoint: Some(config.ec2.endpoint.clone()).filter(|e| !e.is_empty()),
            poll_interval: config.ec2.poll_interval.0,
            sysfs_root: config.sysfs.root.clone(),
        };
        tokio::spawn(capacity_block::run(
            settings,
            sink_tx.clone(),
            shutdown.clone(),
        ));
    }
    if config.logind.enabled {
        let settings = logind::Settings {
            bus_address: Some(config.logind.bus_address.clone()).filter(|a| !a.is_empty()),
            max_delay: config.logind.max_delay.0,
            wait_for_checkpoint: config.checkpoint.enabled
                && config
                    .checkpoint
                    .triggers
                    .contains(&crate::model::NoticeKind::Shutdown),
        };
        tokio::spawn(logind::run(
            settings,
            sink_tx.clone(),
            snapshots.clone(),
            shutdown.clone(),
        ));
    }
    if config.imex.enabled {
        let boot =
            crate::host::boot_time(&config.procfs.root).unwrap_or_else(std::time::SystemTime::now);
        let settings = imex::Settings {
            bus_address: Some(config.imex.bus_address.clone()).filter(|a| !a.is_empty()),
            unit: config.imex.unit.clone(),
            channels_dir: config.imex.channels_dir.clone(),
            poll_interval: config.imex.poll_interval.0,
            grace_ends: boot + config.imex.startup_grace.0,
            nvlink_domain: crate::host::instance_types::nvlink_domain(&config.sysfs.root),
        };
        tokio::spawn(imex::run(settings, sink_tx.clone(), shutdown.clone()));
    }
}
