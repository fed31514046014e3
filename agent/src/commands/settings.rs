//! What each task of the daemon is handed, from the config: the settings of every source
//! and sink that `run` starts and `check` does not share. Pure translation; the policies
//! (what a setting means) live with the task that reads it.

use std::time::Duration;

use crate::config::Config;

/// A non-empty string setting, or `None` for "off" / "the default".
#[cfg(feature = "clients")]
fn set(value: &str) -> Option<String> {
    Some(value.to_string()).filter(|v| !v.is_empty())
}

/// A non-empty path setting, or `None` for "off".
fn set_path(value: &std::path::Path) -> Option<std::path::PathBuf> {
    Some(value.to_path_buf()).filter(|p| !p.as_os_str().is_empty())
}

/// `[checkpoint] hold`, at most `[logind] max_delay` (the shutdown lock goes by then anyway;
/// a config from before the hold existed may still say `max_delay = "5s"`), with the
/// warning when it was cut.
fn checkpoint_hold(config: &Config) -> Duration {
    let hold = config.checkpoint.hold.0;
    let cap = config.logind.max_delay.0;
    if config.logind.enabled && hold > cap {
        tracing::warn!(?hold, max_delay = ?cap, "[checkpoint] hold is longer than [logind] max_delay; a shutdown waits at most max_delay.");
        return cap;
    }
    hold
}

/// The checkpoint sink, with the Kubernetes link and the pod-resources lookup it reports
/// through (where they run).
pub fn checkpoint(
    config: &Config,
    #[cfg(feature = "clients")] kubernetes: Option<crate::sinks::kubernetes::Link>,
    #[cfg(feature = "clients")] pod_resources: Option<crate::sinks::pod_resources::Lookup>,
) -> crate::sinks::checkpoint::Settings {
    let c = &config.checkpoint;
    crate::sinks::checkpoint::Settings {
        selection: super::HostFacts::checkpoint_selection(config),
        triggers: c.triggers.clone(),
        state_file: config.state_dir.join("checkpoint.json"),
        #[cfg(feature = "clients")]
        kubernetes,
        #[cfg(feature = "clients")]
        pod_resources,
        cordon: c.cordon,
        windows: crate::sinks::checkpoint::Windows {
            ending: c.ending_window.0,
            incident: c.incident_window.0,
        },
        hold: checkpoint_hold(config),
        notice_file: set_path(&c.notice_file),
        ack_dir: set_path(&c.ack_dir),
    }
}

/// The funnel (present, allocated, busy).
pub fn funnel(config: &Config) -> crate::sinks::funnel::Settings {
    crate::sinks::funnel::Settings {
        interval: config.metrics.funnel_interval.0,
        busy_percent: config.nvml.busy_percent,
        productive_percent: config.nvml.productive_percent,
        held_idle_after: config.metrics.held_idle_after.0,
    }
}

/// The pod-resources lookup.
#[cfg(feature = "clients")]
pub fn pod_resources(config: &Config) -> crate::sinks::pod_resources::Settings {
    let p = &config.pod_resources;
    crate::sinks::pod_resources::Settings {
        socket: p.socket.clone(),
        timeout: p.timeout.0,
        cache_for: p.cache_for.0,
        resource_prefix: p.resource_prefix.clone(),
    }
}

/// The one Kubernetes connection.
#[cfg(feature = "clients")]
pub fn kubernetes(config: &Config) -> crate::sinks::kubernetes::Settings {
    crate::sinks::kubernetes::Settings {
        kubeconfig: config.kubernetes.kubeconfig.clone(),
        node_name: config.node_name.clone(),
        procfs_root: config.procfs.root.clone(),
        kubelet_environment: config.kubernetes.kubelet_environment.clone(),
        timeout: config.kubernetes.timeout.0,
    }
}

/// The node-conditions sink.
#[cfg(feature = "clients")]
pub fn node_conditions(config: &Config) -> crate::sinks::node_conditions::Settings {
    use crate::sinks::node_conditions;
    let k = &config.kubernetes;
    node_conditions::Settings {
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
    }
}

/// The device-taints sink.
#[cfg(feature = "clients")]
pub fn device_taints(config: &Config) -> crate::sinks::device_taints::Settings {
    crate::sinks::device_taints::Settings {
        no_execute: config.kubernetes.device_taint_no_execute,
        refresh: config.kubernetes.heartbeat_interval.0,
        slow_after: Some(config.kubernetes.slow_gpu_taint_after.0).filter(|d| !d.is_zero()),
    }
}

/// The NVRx health-check endpoint.
#[cfg(feature = "clients")]
pub fn nvrx(config: &Config) -> crate::sinks::nvrx::Settings {
    crate::sinks::nvrx::Settings {
        socket: config.nvrx.socket.clone(),
        group: set(&config.nvrx.group),
    }
}

/// The IMDS notice source.
#[cfg(feature = "clients")]
pub fn imds(config: &Config) -> crate::sources::imds::Settings {
    crate::sources::imds::Settings {
        endpoint: set(&config.imds.endpoint),
        poll_interval: config.imds.poll_interval.0,
        slow_intervals: [
            config.imds.rebalance_interval.0,
            config.imds.scheduled_interval.0,
        ],
        sysfs_root: config.sysfs.root.clone(),
    }
}

/// The Capacity Block source.
#[cfg(feature = "clients")]
pub fn capacity_block(config: &Config) -> crate::sources::capacity_block::Settings {
    crate::sources::capacity_block::Settings {
        imds_endpoint: set(&config.imds.endpoint),
        ec2_endpoint: set(&config.ec2.endpoint),
        poll_interval: config.ec2.poll_interval.0,
        sysfs_root: config.sysfs.root.clone(),
    }
}

/// Where this launch's EFA interface count is asked (the EC2 API).
#[cfg(feature = "clients")]
pub fn ec2(config: &Config) -> crate::sources::ec2::Settings {
    crate::sources::ec2::Settings {
        imds_endpoint: set(&config.imds.endpoint),
        ec2_endpoint: set(&config.ec2.endpoint),
        retry_interval: config.ec2.poll_interval.0,
        sysfs_root: config.sysfs.root.clone(),
    }
}

/// The logind (host shutdown) source.
#[cfg(feature = "clients")]
pub fn logind(config: &Config) -> crate::sources::logind::Settings {
    crate::sources::logind::Settings {
        bus_address: set(&config.logind.bus_address),
        max_delay: config.logind.max_delay.0,
        wait_for_checkpoint: config.checkpoint.enabled
            && config
                .checkpoint
                .triggers
                .contains(&crate::model::NoticeKind::Shutdown),
    }
}

/// The IMEX source.
#[cfg(feature = "clients")]
pub fn imex(config: &Config) -> crate::sources::imex::Settings {
    let boot =
        crate::host::boot_time(&config.procfs.root).unwrap_or_else(std::time::SystemTime::now);
    crate::sources::imex::Settings {
        bus_address: set(&config.imex.bus_address),
        unit: config.imex.unit.clone(),
        channels_dir: config.imex.channels_dir.clone(),
        poll_interval: config.imex.poll_interval.0,
        grace_ends: boot + config.imex.startup_grace.0,
        nvlink_domain: crate::host::instance_types::nvlink_domain(&config.sysfs.root),
    }
}

/// When the daemon hands its start-up pages back and locks its fault path.
pub fn resident(config: &Config) -> crate::host::resident::Settings {
    crate::host::resident::Settings {
        after: config.page_out_after.0,
        watch: config.fault_path_watch.0,
    }
}
