//! The subcommands. Each returns the process exit code; errors go to `main`.

pub mod check;
pub mod drill;
pub mod inject;
pub mod kubelet_config;
mod rehearse;
pub mod run;
mod settings;
pub mod status;
pub mod xid;

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::core::HealthModel;
use crate::host::{self, NvidiaDevices};
use crate::sources::kmsg;

/// Exit code: the daemon could not be reached, or the check could not run.
pub const EXIT_UNREACHABLE: u8 = 2;

/// What `run` and `check` learn about the host before they start.
#[derive(Debug, Clone)]
pub struct HostFacts {
    /// Node name as resolved at start (the Kubernetes sink resolves it again when needed).
    pub node_name: crate::model::NodeName,
    /// Kernel boot id (`unknown` if unreadable).
    pub boot_id: String,
    /// NVIDIA devices on the PCI bus.
    pub devices: NvidiaDevices,
}

impl HostFacts {
    /// Read them from the config's sysfs and procfs roots. Nothing here fails: what cannot be
    /// read is logged and left empty.
    pub fn read(config: &Config) -> Self {
        let devices = host::nvidia_devices(&config.sysfs.root);
        if let Some(problem) = &devices.problem {
            tracing::warn!(%problem, "GPU enumeration from sysfs is incomplete.");
        }
        let boot_id = host::boot_id(&config.procfs.root).unwrap_or_else(|| {
            tracing::warn!(procfs = %config.procfs.root.display(), "Cannot read the boot id; restarts are tracked as one boot.");
            "unknown".to_string()
        });
        Self {
            node_name: host::node_name::resolve(
                &config.node_name,
                &config.procfs.root,
                &config.kubernetes.kubelet_environment,
            ),
            boot_id,
            devices,
        }
    }

    /// An empty health model for this host.
    pub fn model(&self, config: &Config) -> HealthModel {
        let mut model = HealthModel::new(
            &self.node_name,
            &self.boot_id,
            self.devices.clone(),
            config.kmsg.repeat_log_interval.0,
        );
        model.set_leads(Self::leads(config));
        model.set_escalation(
            config.escalate_after_boots,
            config.escalate_after_repeats,
            config.escalate_window.0,
        );
        model.set_condition_rules(Self::condition_rules(config));
        model
    }

    /// How each polling source's conditions are set and cleared: NVML's clear
    /// `[nvml] clear_after` after their last sighting; EFA's a whole `[efa] window` after
    /// theirs, a counter-based fatal needs its rate over the limit for a whole window (two
    /// windows back to back), a link down or a device missing two polls in a row.
    pub fn condition_rules(config: &Config) -> crate::core::condition::Rules {
        use crate::core::condition::{Rule, Rules};
        use crate::model::{FaultCode, SourceKind};
        let mut rules = Rules::default();
        rules.set(
            SourceKind::Nvml,
            Rule {
                confirm: Duration::ZERO,
                hold: config.nvml.clear_after.0,
            },
        );
        let window = config.efa.window.0;
        rules.set(
            SourceKind::Efa,
            Rule {
                confirm: Duration::ZERO,
                hold: window,
            },
        );
        for code in [FaultCode::EfaErrors, FaultCode::EfaAdminErrors] {
            rules.set_code(
                SourceKind::Efa,
                code,
                Rule {
                    confirm: window,
                    hold: window,
                },
            );
        }
        // Seen on two polls in a row: the second comes a poll interval after the first.
        let two_polls = config.efa.poll_interval.0 / 2;
        for code in [FaultCode::EfaLinkDown, FaultCode::EfaMissing] {
            rules.set_code(
                SourceKind::Efa,
                code,
                Rule {
                    confirm: two_polls,
                    hold: window,
                },
            );
        }
        rules
    }

    /// How long before its deadline each notice kind is acted on (`[checkpoint.lead]`).
    pub fn leads(config: &Config) -> std::collections::HashMap<crate::model::NoticeKind, Duration> {
        use crate::model::NoticeKind;
        let lead = &config.checkpoint.lead;
        [
            (
                NoticeKind::ScheduledMaintenance,
                lead.scheduled_maintenance.0,
            ),
            (NoticeKind::CapacityBlock, lead.capacity_block.0),
        ]
        .into()
    }

    /// Checkpoint target selection from the config.
    pub fn checkpoint_selection(config: &Config) -> crate::sinks::checkpoint::Selection {
        use crate::sinks::checkpoint;
        checkpoint::Selection {
            procfs: config.procfs.root.clone(),
            signal: checkpoint::parse_signal(&config.checkpoint.signal)
                .unwrap_or(rustix::process::Signal::USR1),
            // Validated when the config was loaded.
            device_glob: glob::Pattern::new(&config.checkpoint.device_glob)
                .unwrap_or_else(|_| glob::Pattern::new("/dev/nvidia[0-9]*").unwrap_or_default()),
            exclude: config.checkpoint.exclude.clone(),
            opt_in_env: config.checkpoint.opt_in_env,
            read_deadline: crate::host::proc_read::DEFAULT_DEADLINE,
            declared: checkpoint::ByPod::new(),
            only_pods: None,
        }
    }

    /// EFA source settings.
    pub fn efa_settings(config: &Config) -> crate::sources::efa::Settings {
        let e = &config.efa;
        crate::sources::efa::Settings {
            sysfs_root: config.sysfs.root.clone(),
            procfs_root: config.procfs.root.clone(),
            poll_interval: e.poll_interval.0,
            window: e.window.0,
            startup_grace: e.startup_grace.0,
            expected_devices: e.expected_devices,
            thresholds: Self::efa_thresholds(config),
            baseline: None,
            launch: None,
        }
    }

    /// The EFA counters' limits, per minute.
    pub fn efa_thresholds(config: &Config) -> crate::sources::efa::Thresholds {
        let e = &config.efa;
        crate::sources::efa::Thresholds {
            errors_warning: e.errors_warning_per_minute,
            errors_fatal: e.errors_fatal_per_minute,
            retrans_warning: e.retrans_warning_per_minute,
        }
    }

    /// NVML source settings.
    pub fn nvml_settings(config: &Config) -> crate::sources::nvml::Settings {
        crate::sources::nvml::Settings {
            library: config.nvml.library.clone(),
            poll_interval: config.nvml.poll_interval.0,
            expected_gpus: config.nvml.expected_gpus,
            sysfs_root: config.sysfs.root.clone(),
            procfs_root: config.procfs.root.clone(),
            nvlink_boot_grace: config.nvml.nvlink_boot_grace.0,
            baseline: None,
            slow: crate::sources::nvml::slow::Limits {
                busy_percent: config.nvml.busy_percent,
                polls: config.nvml.slow_after_polls,
                clock_ratio: config.nvml.slow_clock_ratio,
            },
        }
    }

    /// Kernel-log source settings, resuming after `cursor`; drills are recognised with the
    /// drill key as `holder` has it (the daemon makes this boot's if there is none yet;
    /// `check` only reads it).
    pub fn kmsg_settings(
        &self,
        config: &Config,
        cursor: Option<u64>,
        holder: crate::drill::Holder,
    ) -> kmsg::Settings {
        let drill_key = crate::drill::key(&config.state_dir, &self.boot_id, holder)
            .map_err(|e| {
                if holder == crate::drill::Holder::Daemon {
                    tracing::warn!(error = %e, "No drill key: gpu-agent inject lines will not count.");
                }
            })
            .ok();
        kmsg::Settings {
            path: config.kmsg.path.clone(),
            resume_after: cursor,
            branch: host::driver_branch(&config.sysfs.root),
            boot_time: host::boot_time(&config.procfs.root),
            accept_userspace: config.kmsg.accept_userspace,
            drill_key,
        }
    }
}

/// Print a snapshot as JSON or the human table.
pub fn print_snapshot(snapshot: &crate::model::HealthSnapshot, json: bool) -> anyhow::Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(snapshot)
                .map_err(|e| anyhow::anyhow!("cannot encode JSON: {e}"))?
        );
    } else {
        print!("{}", crate::sinks::status::render(snapshot));
    }
    Ok(())
}

/// New kernel-log counters.
pub fn counters() -> Arc<crate::model::KmsgCounters> {
    Arc::new(crate::model::KmsgCounters::default())
}

/// A tokio runtime for one command: current-thread, since the agent's work is I/O-bound and
/// the kernel log has its own thread.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// How long shutdown waits for tasks before the runtime is dropped.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
