//! The subcommands. Each returns the process exit code; errors go to `main`.

pub mod check;
pub mod drill;
pub mod inject;
pub mod kubelet_config;
pub mod run;
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
#[derive(Debug)]
pub struct HostFacts {
    /// Node name.
    pub node_name: String,
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
            node_name: node_name(config),
            boot_id,
            devices,
        }
    }

    /// An empty health model for this host.
    pub fn model(&self, config: &Config) -> HealthModel {
        HealthModel::new(
            &self.node_name,
            &self.boot_id,
            self.devices.clone(),
            config.kmsg.repeat_log_interval.0,
        )
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
        }
    }

    /// NVML source settings.
    pub fn nvml_settings(config: &Config) -> crate::sources::nvml::Settings {
        crate::sources::nvml::Settings {
            library: config.nvml.library.clone(),
            poll_interval: config.nvml.poll_interval.0,
            expected_gpus: config.nvml.expected_gpus,
            sysfs_root: config.sysfs.root.clone(),
        }
    }

    /// Kernel-log source settings, resuming after `cursor`.
    pub fn kmsg_settings(config: &Config, cursor: Option<u64>) -> kmsg::Settings {
        kmsg::Settings {
            path: config.kmsg.path.clone(),
            resume_after: cursor,
            branch: host::driver_branch(&config.sysfs.root),
            boot_time: host::boot_time(&config.procfs.root),
        }
    }
}

/// This node's name: the config's, else the kubelet's `--hostname-override`, else the
/// hostname.
fn node_name(config: &Config) -> String {
    if !config.node_name.is_empty() {
        return config.node_name.clone();
    }
    if let Some(name) = kubelet_hostname_override(&config.procfs.root) {
        return name;
    }
    std::fs::read_to_string(config.procfs.root.join("sys/kernel/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The running kubelet's `--hostname-override`, from its command line in procfs.
fn kubelet_hostname_override(procfs_root: &std::path::Path) -> Option<String> {
    let entries = std::fs::read_dir(procfs_root).ok()?;
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !args
            .first()
            .is_some_and(|a| a.ends_with("/kubelet") || a == "kubelet")
        {
            continue;
        }
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            if let Some(v) = arg.strip_prefix("--hostname-override=") {
                return Some(v.to_string()).filter(|v| !v.is_empty());
            }
            if arg == "--hostname-override" {
                return it.next().cloned().filter(|v| !v.is_empty());
            }
        }
    }
    None
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
pub fn counters() -> Arc<kmsg::Counters> {
    Arc::new(kmsg::Counters::default())
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
