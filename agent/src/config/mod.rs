//! The agent's configuration: TOML with an embedded default for every key.
//!
//! Loading order: `--config PATH` (must exist), else `/etc/gpu-agent/config.toml` when it
//! exists, else the embedded default ([`DEFAULT_TOML`]). Unknown keys and bad values are
//! rejected with the file, the key and the reason.

mod checkpoint;
mod duration;
mod ec2;
mod efa;
mod host;
mod imds;
mod imex;
mod kmsg;
mod kubelet;
mod kubernetes;
mod logind;
mod metrics;
mod nvml;
mod nvrx;
mod pod_resources;
mod status;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use checkpoint::{CheckpointConfig, LeadConfig};
pub use duration::HumanDuration;
use duration::{DAY, MINUTE, SECOND};
pub use ec2::Ec2Config;
pub use efa::EfaConfig;
pub use host::{ProcfsConfig, SysfsConfig};
pub use imds::ImdsConfig;
pub use imex::ImexConfig;
pub use kmsg::KmsgConfig;
pub use kubelet::KubeletConfig;
pub use kubernetes::KubernetesConfig;
pub use logind::LogindConfig;
pub use metrics::MetricsConfig;
pub use nvml::NvmlConfig;
pub use nvrx::NvrxConfig;
pub use pod_resources::PodResourcesConfig;
pub use status::StatusConfig;

/// Where the config file lives when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/gpu-agent/config.toml";

/// The embedded default config, also installed as `/etc/gpu-agent/config.toml`.
pub const DEFAULT_TOML: &str = include_str!("default.toml");

/// Why the config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config {path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or a key has the wrong type or an unknown name.
    #[error("config {path}: key `{key}`: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Dotted key path (`metrics.listen`), or `.` for the document.
        key: String,
        /// What is wrong, with line and column.
        reason: String,
    },
    /// A value parsed but is not acceptable.
    #[error("config {path}: key `{key}`: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Dotted key path.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// This node's Kubernetes name. Empty: the kubelet's node name, else the hostname.
    pub node_name: String,
    /// Where the agent keeps its state across restarts.
    pub state_dir: PathBuf,
    /// A fatal fault that a reset or reboot should fix, seen in this many boots within
    /// `escalate_window`, escalates to replace (the only way to replace by repetition).
    pub escalate_after_boots: u32,
    /// The same fatal reset fault on the same GPU in this many separate episodes within one
    /// boot and `escalate_window` escalates to reboot (an episode ends after a minute with no
    /// line of it, so a storm of any length is one episode). Never to replace.
    pub escalate_after_repeats: u32,
    /// The window of `escalate_after_boots` and `escalate_after_repeats`.
    pub escalate_window: HumanDuration<MINUTE, { 30 * DAY }>,
    /// After the daemon has run this long, the pages of its own program that start-up
    /// touched are unmapped from it (`MADV_DONTNEED`; they stay in the page cache): code that
    /// ran once does not stay resident. The pages the fault path needs are found at run time
    /// (every fault path rehearsed once with no effect, the steady state watched for
    /// `fault_path_watch`) and locked (`mlock`), so a fault never waits for its code to be
    /// read from the disk; if they cannot be locked, nothing is handed back and `status` says
    /// so. `0s`: never hand back (every page kept). Default 1 minute.
    pub page_out_after: HumanDuration<0, DAY>,
    /// How long the steady state runs after the hand-back before the pages it mapped again
    /// are locked (long enough for every periodic task to run: the Node heartbeat is one
    /// minute), and how often pages mapped since outside the lock are looked for and locked
    /// too. Default 2 minutes.
    pub fault_path_watch: HumanDuration<SECOND, DAY>,
    /// The status socket.
    pub status: StatusConfig,
    /// The kernel-log source.
    pub kmsg: KmsgConfig,
    /// Where sysfs is.
    pub sysfs: SysfsConfig,
    /// Where procfs is.
    pub procfs: ProcfsConfig,
    /// The Prometheus endpoint.
    pub metrics: MetricsConfig,
    /// The NVML health source.
    pub nvml: NvmlConfig,
    /// The EFA health source.
    pub efa: EfaConfig,
    /// The host's IMEX daemon (multi-node NVLink).
    pub imex: ImexConfig,
    /// Node conditions and events.
    pub kubernetes: KubernetesConfig,
    /// Which pod holds which GPU (the kubelet's pod-resources API).
    pub pod_resources: PodResourcesConfig,
    /// `gpu-agent kubelet-config`.
    pub kubelet: KubeletConfig,
    /// Checkpoint signals to the workload.
    pub checkpoint: CheckpointConfig,
    /// EC2 instance metadata (Spot, rebalance, scheduled events).
    pub imds: ImdsConfig,
    /// The EC2 API (Capacity Block end).
    pub ec2: Ec2Config,
    /// systemd-logind (host shutdown).
    pub logind: LogindConfig,
    /// The NVIDIA Resiliency Extension node health-check endpoint.
    pub nvrx: NvrxConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            node_name: String::new(),
            state_dir: PathBuf::from("/var/lib/gpu-agent"),
            escalate_after_boots: 3,
            escalate_after_repeats: 5,
            escalate_window: HumanDuration(std::time::Duration::from_secs(24 * 3600)),
            page_out_after: HumanDuration(std::time::Duration::from_secs(60)),
            fault_path_watch: HumanDuration(std::time::Duration::from_secs(120)),
            status: StatusConfig::default(),
            kmsg: KmsgConfig::default(),
            sysfs: SysfsConfig::default(),
            procfs: ProcfsConfig::default(),
            metrics: MetricsConfig::default(),
            nvml: NvmlConfig::default(),
            efa: EfaConfig::default(),
            imex: ImexConfig::default(),
            kubernetes: KubernetesConfig::default(),
            pod_resources: PodResourcesConfig::default(),
            kubelet: KubeletConfig::default(),
            checkpoint: CheckpointConfig::default(),
            imds: ImdsConfig::default(),
            ec2: Ec2Config::default(),
            logind: LogindConfig::default(),
            nvrx: NvrxConfig::default(),
        }
    }
}

/// A loaded config and where it came from.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The config.
    pub config: Config,
    /// The file it was read from; `None` for the embedded default.
    pub path: Option<PathBuf>,
}

/// Load the config: `explicit` if given (it must exist), else [`DEFAULT_PATH`] if it exists,
/// else the embedded default.
pub fn load(explicit: Option<&Path>) -> Result<Loaded, ConfigError> {
    let path = match explicit {
        Some(path) => path.to_path_buf(),
        None if Path::new(DEFAULT_PATH).exists() => PathBuf::from(DEFAULT_PATH),
        None => {
            let config = parse(DEFAULT_TOML, Path::new("<embedded default>"))?;
            return Ok(Loaded { config, path: None });
        }
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    let config = parse(&text, &path)?;
    Ok(Loaded {
        config,
        path: Some(path),
    })
}

/// Parse and validate config text; `path` names it in errors.
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let deserializer = toml::Deserializer::new(text);
    let config: Config = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let key = e.path().to_string();
        let inner = e.into_inner();
        let reason = match inner.span() {
            Some(span) => {
                let (line, col) = line_col(text, span.start);
                format!("{} (line {line}, column {col})", inner.message())
            }
            None => inner.message().to_string(),
        };
        ConfigError::Parse {
            path: path.to_path_buf(),
            key,
            reason,
        }
    })?;
    config.validate(path)?;
    Ok(config)
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

impl Config {
    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| ConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            reason: reason.to_string(),
        };
        let absolute: [(&'static str, &Path); 6] = [
            ("state_dir", &self.state_dir),
            ("pod_resources.socket", &self.pod_resources.socket),
            ("status.socket", &self.status.socket),
            ("kmsg.path", &self.kmsg.path),
            ("sysfs.root", &self.sysfs.root),
            ("procfs.root", &self.procfs.root),
        ];
        for (key, value) in absolute {
            if !value.is_absolute() {
                return Err(invalid(
                    key,
                    &format!("must be an absolute path, got {value:?}"),
                ));
            }
        }
        // Pods mount the notice file's and the NVRx socket's directory; the admin socket
        // must never be reachable from there.
        let admin = self.status.socket.parent().unwrap_or(Path::new("/"));
        let shared: [(&str, Option<&Path>); 3] = [
            (
                "checkpoint.notice_file",
                self.checkpoint.notice_file.parent(),
            ),
            ("nvrx.socket", self.nvrx.socket.parent()),
            (
                "checkpoint.ack_dir",
                Some(self.checkpoint.ack_dir.as_path()),
            ),
        ];
        for (key, dir) in shared {
            let Some(dir) = dir.filter(|d| !d.as_os_str().is_empty()) else {
                continue;
            };
            if dir.starts_with(admin) || admin.starts_with(dir) {
                return Err(invalid(
                    "status.socket",
                    &format!(
                        "its directory {} must not be shared with pods, but {key} is {}",
                        admin.display(),
                        dir.display()
                    ),
                ));
            }
        }
        let k = &self.kubernetes;
        for (key, value) in [
            ("kubernetes.hardware_condition", &k.hardware_condition),
            (
                "kubernetes.interruption_condition",
                &k.interruption_condition,
            ),
            ("kubernetes.network_condition", &k.network_condition),
        ] {
            if value.is_empty() || !value.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(invalid(key, "must be a non-empty CamelCase condition type"));
            }
        }
        if k.hardware_condition == k.interruption_condition {
            return Err(invalid(
                "kubernetes.interruption_condition",
                "must differ from hardware_condition",
            ));
        }
        if k.network_condition == k.hardware_condition
            || k.network_condition == k.interruption_condition
        {
            return Err(invalid(
                "kubernetes.network_condition",
                "must differ from hardware_condition and interruption_condition",
            ));
        }
        if !["auto", "nodeadm", "kubelet-drop-in"].contains(&self.kubelet.target.as_str()) {
            return Err(invalid(
                "kubelet.target",
                "must be auto, nodeadm or kubelet-drop-in",
            ));
        }
        match crate::model::signal::parse(&self.checkpoint.signal) {
            None => {
                return Err(invalid(
                    "checkpoint.signal",
                    &format!(
                        "{:?} is not a catchable signal (e.g. SIGUSR1)",
                        self.checkpoint.signal
                    ),
                ))
            }
            Some(signal) => {
                if let Some(why) = crate::model::signal::refused(signal) {
                    return Err(invalid("checkpoint.signal", why));
                }
            }
        }
        if let Err(e) = glob::Pattern::new(&self.checkpoint.device_glob) {
            return Err(invalid("checkpoint.device_glob", &e.to_string()));
        }
        let e = &self.efa;
        for (key, value) in [
            ("efa.errors_warning_per_minute", e.errors_warning_per_minute),
            ("efa.errors_fatal_per_minute", e.errors_fatal_per_minute),
            (
                "efa.retrans_warning_per_minute",
                e.retrans_warning_per_minute,
            ),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(invalid(key, "must be a number, 0 or more"));
            }
        }
        if e.errors_fatal_per_minute < e.errors_warning_per_minute {
            return Err(invalid(
                "efa.errors_fatal_per_minute",
                "must be at least errors_warning_per_minute",
            ));
        }
        let n = &self.nvml;
        for (key, value) in [
            ("nvml.busy_percent", n.busy_percent),
            ("nvml.productive_percent", n.productive_percent),
        ] {
            if value > 100 {
                return Err(invalid(key, "must be a percentage, 0 to 100"));
            }
        }
        if !(n.slow_clock_ratio.is_finite() && (0.0..=1.0).contains(&n.slow_clock_ratio)) {
            return Err(invalid("nvml.slow_clock_ratio", "must be between 0 and 1"));
        }
        if n.slow_after_polls == 0 {
            return Err(invalid("nvml.slow_after_polls", "must be at least 1"));
        }
        if self.escalate_after_repeats < 2 {
            return Err(invalid(
                "escalate_after_repeats",
                "must be at least 2 (one episode is not a pattern)",
            ));
        }
        if self.escalate_after_boots == 0 {
            return Err(invalid("escalate_after_boots", "must be at least 1"));
        }
        if self.node_name.len() > 253 {
            return Err(invalid("node_name", "longer than 253 characters"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(text, Path::new("/etc/x.toml"))
            .expect_err("must be rejected")
            .to_string()
    }

    #[test]
    fn embedded_default_equals_built_in_default() {
        let parsed = parse(DEFAULT_TOML, Path::new("default")).expect("default parses");
        assert_eq!(parsed, Config::default());
        assert_eq!(
            parse("", Path::new("empty")).expect("empty parses"),
            Config::default()
        );
    }

    /// Review 2026-12-03b, old L8: absurd durations passed the load and overflowed
    /// `Instant + Duration` in the running daemon (a panic loop under systemd).
    #[test]
    fn an_absurd_duration_names_its_key_line_and_range() {
        let e = err("[checkpoint]\nsignal = \"SIGUSR1\"\nhold = \"1000000d\"\n");
        assert!(e.contains("hold"), "{e}");
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("between 0s and 30m"), "{e}");
        for (table, key, value) in [
            ("logind", "max_delay", "100y"),
            ("nvml", "nvlink_boot_grace", "1000000d"),
            ("nvml", "poll_interval", "1ms"),
            ("kubernetes", "debounce", "2s"),
            ("pod_resources", "timeout", "3s"),
            ("checkpoint.lead", "capacity-block", "400d"),
        ] {
            let e = err(&format!("[{table}]\n{key} = {value:?}\n"));
            assert!(e.contains(key) && e.contains("out of range"), "{e}");
        }
    }

    #[test]
    fn unknown_key_names_file_key_and_line() {
        let e = err("[metrics]\nenabled = true\nlisten_addr = \"x\"\n");
        assert!(e.contains("/etc/x.toml"), "{e}");
        assert!(e.contains("listen_addr"), "{e}");
        assert!(e.contains("line 3"), "{e}");
    }

    #[test]
    fn bad_value_names_the_key() {
        let e = err("[metrics]\nlisten = \"not an address\"\n");
        assert!(e.contains("key `metrics.listen`"), "{e}");
        let e = err("[kmsg]\nrepeat_log_interval = \"soon\"\n");
        assert!(
            e.contains("kmsg.repeat_log_interval") && e.contains("invalid duration"),
            "{e}"
        );
        let e = err("[kmsg]\nenabled = \"yes\"\n");
        assert!(e.contains("kmsg.enabled"), "{e}");
        let e = err("state_dir = \"relative\"\n");
        assert!(e.contains("state_dir") && e.contains("absolute"), "{e}");
        let e = err("[kmsg\n");
        assert!(e.contains("/etc/x.toml"), "{e}");
    }

    #[test]
    fn durations_parse() {
        let c = parse("[kmsg]\nrepeat_log_interval = \"10m\"\n", Path::new("x")).expect("ok");
        assert_eq!(c.kmsg.repeat_log_interval.0.as_secs(), 600);
    }

    #[test]
    fn missing_explicit_file_is_an_error() {
        let e = load(Some(Path::new("/nonexistent/gpu-agent.toml"))).expect_err("missing");
        assert!(e.to_string().contains("/nonexistent/gpu-agent.toml"));
    }
}
