//! The agent's configuration: TOML with an embedded default for every key.
//!
//! Loading order: `--config PATH` (must exist), else `/etc/gpu-agent/config.toml` when it
//! exists, else the embedded default ([`DEFAULT_TOML`]). Unknown keys and bad values are
//! rejected with the file, the key and the reason.

mod duration;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use duration::HumanDuration;
use duration::{DAY, HOUR, MINUTE, MS, SECOND};

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
    /// ran once does not stay resident; what the idle loop uses comes back on use. `0s`: never.
    pub page_out_after: HumanDuration<0, DAY>,
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

/// `[nvrx]`: NVRx's node health check (`ft_launcher --ft-node-health-check-endpoint
/// unix://<socket>`), answered from the health model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvrxConfig {
    /// The Unix socket to serve `nvhcd.HealthCheckService` on; empty: off.
    pub socket: PathBuf,
    /// The group (name or number) that may call it besides root and the agent's own group
    /// (the socket is 0660; the group is given access by an ACL); empty: no other.
    pub group: String,
}

/// `[checkpoint]`: signal the training processes before the instance goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Signal targets on notices.
    pub enabled: bool,
    /// The signal (`SIGUSR1`); processes that opt in with `GPU_AGENT_CHECKPOINT_SIGNAL` get theirs.
    pub signal: String,
    /// Notice kinds that trigger a checkpoint: spot, scheduled-maintenance, capacity-block,
    /// shutdown (default), rebalance, fatal-fault.
    pub triggers: Vec<crate::model::NoticeKind>,
    /// How long before the deadline to signal, per kind (Spot and shutdown: at once).
    pub lead: LeadConfig,
    /// Device files whose holders are GPU processes.
    pub device_glob: String,
    /// Process names never signalled, beyond the built-in system daemons.
    pub exclude: Vec<String>,
    /// Honour `GPU_AGENT_CHECKPOINT_SIGNAL` in process environments (opt-in targets).
    pub opt_in_env: bool,
    /// Also cordon the node on a notice (for clusters without a termination handler; needs
    /// patch on nodes).
    pub cordon: bool,
    /// An ending of the instance already signalled covers a later ending within this window
    /// (a shutdown after a Spot notice or a Capacity Block end): one ending, one signal.
    pub ending_window: HumanDuration<0, DAY>,
    /// Fatal faults within this window of a fatal fault already signalled are the same
    /// incident (`fatal-fault` trigger): one incident, one signal.
    pub incident_window: HumanDuration<0, DAY>,
    /// After a signal, how long the agent waits for the signalled processes to finish; a
    /// host shutdown is held this long at most (keep it under logind's
    /// `InhibitDelayMaxSec` and `[logind] max_delay`).
    pub hold: HumanDuration<0, { 30 * MINUTE }>,
    /// The current ending as JSON, for trainers that poll instead of taking a signal
    /// (world-readable, replaced atomically, absent when nothing is pending); empty: off.
    pub notice_file: PathBuf,
    /// Where a signalled process confirms its checkpoint: it writes `done` (or the
    /// checkpoint's path) to `<ack_dir>/<its pid>`, as it sees both (read through its own
    /// root and PID namespace); empty: only an exit confirms.
    pub ack_dir: PathBuf,
}

/// `[checkpoint.lead]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct LeadConfig {
    /// Before scheduled maintenance's `NotBefore`.
    pub scheduled_maintenance: HumanDuration<0, DAY>,
    /// Before the Capacity Block's termination start (EndDate - 30 min).
    pub capacity_block: HumanDuration<0, DAY>,
}

impl Default for LeadConfig {
    fn default() -> Self {
        Self {
            scheduled_maintenance: HumanDuration(std::time::Duration::from_secs(600)),
            capacity_block: HumanDuration(std::time::Duration::from_secs(900)),
        }
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            signal: "SIGUSR1".into(),
            triggers: vec![
                crate::model::NoticeKind::Spot,
                crate::model::NoticeKind::ScheduledMaintenance,
                crate::model::NoticeKind::CapacityBlock,
                crate::model::NoticeKind::Shutdown,
            ],
            lead: LeadConfig::default(),
            device_glob: "/dev/nvidia[0-9]*".into(),
            exclude: Vec::new(),
            opt_in_env: true,
            cordon: false,
            ending_window: HumanDuration(std::time::Duration::from_secs(3600)),
            incident_window: HumanDuration(std::time::Duration::from_secs(600)),
            hold: HumanDuration(std::time::Duration::from_secs(50)),
            notice_file: PathBuf::from("/run/gpu-agent/notice.json"),
            ack_dir: PathBuf::from("/run/gpu-agent/ack"),
        }
    }
}

/// `[imds]`: EC2 instance metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImdsConfig {
    /// Poll IMDS (only on EC2, unless `endpoint` is set).
    pub enabled: bool,
    /// Endpoint override (tests point it at a loopback server); empty: the standard
    /// `AWS_EC2_METADATA_SERVICE_ENDPOINT` variable, else the link-local address on EC2.
    pub endpoint: String,
    /// How often the Spot instance-action is polled (it gives two minutes).
    pub poll_interval: HumanDuration<{ 100 * MS }, MINUTE>,
    /// How often the rebalance recommendation is polled (it changes rarely).
    pub rebalance_interval: HumanDuration<{ 100 * MS }, HOUR>,
    /// How often scheduled events are polled (announced days ahead).
    pub scheduled_interval: HumanDuration<{ 100 * MS }, DAY>,
}

impl Default for ImdsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            endpoint: String::new(),
            poll_interval: HumanDuration(std::time::Duration::from_secs(1)),
            rebalance_interval: HumanDuration(std::time::Duration::from_secs(30)),
            scheduled_interval: HumanDuration(std::time::Duration::from_secs(60)),
        }
    }
}

/// `[ec2]`: the EC2 API, for the Capacity Block end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Ec2Config {
    /// Look up the Capacity Block end.
    pub enabled: bool,
    /// Endpoint override (tests); empty: the region's endpoint.
    pub endpoint: String,
    /// How often to re-read the reservation; one lookup (IMDS, credentials, both EC2 calls)
    /// is cut off after this, or a minute if that is shorter.
    pub poll_interval: HumanDuration<SECOND, DAY>,
}

impl Default for Ec2Config {
    fn default() -> Self {
        Self {
            enabled: true,
            endpoint: String::new(),
            poll_interval: HumanDuration(std::time::Duration::from_secs(300)),
        }
    }
}

/// `[logind]`: host shutdown through systemd-logind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogindConfig {
    /// Watch for shutdown.
    pub enabled: bool,
    /// D-Bus system bus address; empty: the standard system bus.
    pub bus_address: String,
    /// Longest the shutdown is delayed while targets are signalled and finish (also capped
    /// by logind's `InhibitDelayMaxSec`, 60 s with the package's drop-in).
    pub max_delay: HumanDuration<0, HOUR>,
}

impl Default for LogindConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            bus_address: String::new(),
            max_delay: HumanDuration(std::time::Duration::from_secs(60)),
        }
    }
}

/// `[kubelet]`: overrides for `gpu-agent kubelet-config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeletConfig {
    /// Physical cores reserved for the system and kubelet; 0 = one per 32 CPUs (1 to 8), at
    /// least one per NUMA node.
    pub reserved_cores: u32,
    /// `auto` (single-numa-node on one NUMA node, else best-effort), `none`, `best-effort`,
    /// `restricted` or `single-numa-node`.
    pub topology_policy: String,
    /// `pod` or `container`.
    pub topology_scope: String,
    /// `full-pcpus-only`: `auto` (on when SMT is on), `true` or `false`.
    pub full_pcpus_only: String,
    /// Memory Manager `Static` (with per-NUMA `reservedMemory`).
    pub memory_manager: bool,
    /// `kubeReserved.memory`: `auto` (nodeadm's 11 × maxPods + 255 Mi for the instance type)
    /// or a quantity such as `2Gi`.
    pub kube_reserved_memory: String,
    /// `systemReserved.memory`.
    pub system_reserved_memory: String,
    /// `evictionHard["memory.available"]`.
    pub eviction_hard_memory: String,
    /// `auto` (nodeadm when its drop-in directory exists, else the kubelet drop-in),
    /// `nodeadm` or `kubelet-drop-in`.
    pub target: String,
    /// nodeadm's NodeConfig drop-in directory.
    pub nodeadm_dir: PathBuf,
    /// The kubelet's `--config-dir`.
    pub kubelet_config_dir: PathBuf,
    /// The kubelet's root directory (checkpoints).
    pub kubelet_root: PathBuf,
    /// Kubelet version the options are checked against (`MAJOR.MINOR`).
    pub kubelet_version: String,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            reserved_cores: 0,
            topology_policy: "auto".into(),
            topology_scope: "pod".into(),
            full_pcpus_only: "auto".into(),
            memory_manager: true,
            kube_reserved_memory: "auto".into(),
            system_reserved_memory: "1Gi".into(),
            eviction_hard_memory: "100Mi".into(),
            target: "auto".into(),
            nodeadm_dir: PathBuf::from("/etc/eks/nodeadm.d"),
            kubelet_config_dir: PathBuf::from("/etc/kubernetes/kubelet/config.json.d"),
            kubelet_root: PathBuf::from("/var/lib/kubelet"),
            kubelet_version: "1.33".into(),
        }
    }
}

/// `[kubernetes]`: node conditions and events for EKS node auto repair and Karpenter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// Write conditions and events.
    pub enabled: bool,
    /// Kubeconfig (the kubelet's, exec credential plugin included). If absent and running in
    /// a pod, the in-cluster config is used; otherwise the sink is off (standalone).
    pub kubeconfig: PathBuf,
    /// Condition type for GPU health.
    pub hardware_condition: String,
    /// Condition type for a pending end of the instance.
    pub interruption_condition: String,
    /// Condition type for the network fabric (EFA): `NetworkingReady`, which EKS node auto
    /// repair acts on (replace after 30 min).
    pub network_condition: String,
    /// The first change after a quiet window is written at once; changes within this long
    /// of a write are gathered into the next PATCH (at most 1s: changes must reach the API
    /// server within a second).
    pub debounce: HumanDuration<0, SECOND>,
    /// `lastHeartbeatTime` is refreshed this often with no change.
    pub heartbeat_interval: HumanDuration<SECOND, DAY>,
    /// Record warning and fatal faults as Node Events.
    pub events: bool,
    /// Write the node lifecycle conditions (KEP-5683) `MaintenancePlanned` (a known end is
    /// coming: Spot, scheduled maintenance, a Capacity Block's end, shutdown) and
    /// `MaintenanceInProgress` (it is acted on now), with the deadline in the annotation
    /// `gpu-agent.io/maintenance-deadline`. Plain conditions: harmless where nothing reads
    /// them.
    pub lifecycle_conditions: bool,
    /// A rebalance recommendation also sets `MaintenancePlanned` (off: it is only a hint
    /// that a Spot interruption may follow).
    pub lifecycle_rebalance: bool,
    /// Time limit for every API call: connecting, each read and write, and the whole call. A
    /// server that accepts and never answers shows as the sink `failed` after this. Building
    /// the client (the kubeconfig's exec credential plugin included) gets three times this.
    pub timeout: HumanDuration<{ 100 * MS }, { 5 * MINUTE }>,
    /// nodeadm's kubelet environment file, whose `NODEADM_KUBELET_ARGS` carries the
    /// kubelet's `--hostname-override` before the kubelet runs (a hint: the running kubelet's
    /// command line wins).
    pub kubelet_environment: PathBuf,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            kubeconfig: PathBuf::from("/var/lib/kubelet/kubeconfig"),
            hardware_condition: "AcceleratedHardwareReady".into(),
            interruption_condition: "InterruptionPending".into(),
            network_condition: "NetworkingReady".into(),
            debounce: HumanDuration(std::time::Duration::from_millis(100)),
            heartbeat_interval: HumanDuration(std::time::Duration::from_secs(60)),
            events: true,
            lifecycle_conditions: true,
            lifecycle_rebalance: false,
            timeout: HumanDuration(std::time::Duration::from_secs(10)),
            kubelet_environment: PathBuf::from("/etc/eks/kubelet/environment"),
        }
    }
}

/// `[pod_resources]`: the kubelet's pod-resources API, asked when a GPU fault, a checkpoint
/// signal or `status` needs to know which pod holds a GPU (never polled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PodResourcesConfig {
    /// Ask the kubelet; post GPU faults on the pods holding the GPU (needs `[kubernetes]`).
    pub enabled: bool,
    /// The kubelet's pod-resources socket (gRPC `v1.PodResourcesLister`).
    pub socket: PathBuf,
    /// Time limit for connecting and for the `List` call (10ms to 1.5s: `status` answers
    /// within 2s, holders included).
    pub timeout: HumanDuration<{ 10 * MS }, { 1500 * MS }>,
    /// How long one answer is reused (a burst of faults costs one `List`).
    pub cache_for: HumanDuration<0, MINUTE>,
    /// Extended resources whose name starts with this are GPUs (`nvidia.com/gpu`,
    /// `nvidia.com/gpu.shared`, `nvidia.com/mig-1g.10gb`, ...).
    pub resource_prefix: String,
}

impl Default for PodResourcesConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            timeout: HumanDuration(std::time::Duration::from_secs(1)),
            cache_for: HumanDuration(std::time::Duration::from_secs(2)),
            resource_prefix: "nvidia.com/".into(),
        }
    }
}

/// `[efa]`: the Elastic Fabric Adapters' health, from sysfs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EfaConfig {
    /// Watch the EFA devices (off by itself where there are none).
    pub enabled: bool,
    /// How often the devices are read.
    pub poll_interval: HumanDuration<SECOND, HOUR>,
    /// Counters are turned into rates over this window, and a fault outlives its evidence
    /// by it (a link back up, rates under the limits, for a whole window).
    pub window: HumanDuration<{ 10 * SECOND }, HOUR>,
    /// From boot, how long fewer devices than expected are not a fault (EFA devices can
    /// initialise late: seen on p5en).
    pub startup_grace: HumanDuration<0, HOUR>,
    /// EFA devices this node should have; 0: from the instance type (a type not in the
    /// table: not checked). Set it where nodes are launched with fewer EFA interfaces than
    /// the type allows.
    pub expected_devices: u32,
    /// An error counter (`rx_drops`, `rdma_read_wr_err`, `rdma_write_wr_err`,
    /// `unresponsive_remote_events`, `impaired_remote_conn_events`, `retrans_timeout_events`)
    /// rising faster than this per minute is a warning.
    pub errors_warning_per_minute: f64,
    /// ... and faster than this, fatal (`NetworkingReady=False`).
    pub errors_fatal_per_minute: f64,
    /// `retrans_pkts` rising faster than this per minute is a warning (never fatal).
    pub retrans_warning_per_minute: f64,
}

impl Default for EfaConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            poll_interval: HumanDuration(std::time::Duration::from_secs(5)),
            window: HumanDuration(std::time::Duration::from_secs(60)),
            startup_grace: HumanDuration(std::time::Duration::from_secs(300)),
            expected_devices: 0,
            errors_warning_per_minute: 60.0,
            errors_fatal_per_minute: 600.0,
            retrans_warning_per_minute: 60_000.0,
        }
    }
}

/// `[imex]`: the host's IMEX daemon, through which multi-node NVLink (GB200/GB300 NVL72)
/// shares GPU memory across the domain's nodes. Checked only where it is the host's job:
/// the instance type has an NVLink domain or the host unit is enabled, and never on a type
/// known to have none (p5, p6-b200...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImexConfig {
    /// Watch the host's IMEX unit (off by itself where IMEX is not the host's).
    pub enabled: bool,
    /// D-Bus system bus address (systemd's manager); empty: the standard system bus.
    pub bus_address: String,
    /// The host's IMEX unit.
    pub unit: String,
    /// Where the IMEX channel devices are (`channel0`, ...).
    pub channels_dir: std::path::PathBuf,
    /// How often the unit and its channels are read.
    pub poll_interval: HumanDuration<SECOND, HOUR>,
    /// From boot, how long the unit may take to become active.
    pub startup_grace: HumanDuration<0, HOUR>,
}

impl Default for ImexConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            bus_address: String::new(),
            unit: "nvidia-imex.service".into(),
            channels_dir: "/dev/nvidia-caps-imex-channels".into(),
            poll_interval: HumanDuration(std::time::Duration::from_secs(30)),
            startup_grace: HumanDuration(std::time::Duration::from_secs(300)),
        }
    }
}

/// `[nvml]`: GPU health polled through NVML (no DCGM needed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvmlConfig {
    /// Poll NVML.
    pub enabled: bool,
    /// The NVML library: a file name searched the usual way, or a path.
    pub library: PathBuf,
    /// How often to poll.
    pub poll_interval: HumanDuration<{ 100 * MS }, HOUR>,
    /// GPUs this node should have; 0 derives it from the instance type (DMI product name)
    /// or, failing that, from the NVIDIA GPUs on the PCI bus.
    pub expected_gpus: u32,
    /// From boot, how long NVLinks that have not come up yet are not judged: on HGX hosts
    /// nvidia-fabricmanager trains them after the agent starts. A link that was up and goes
    /// down is fatal at once, grace or not; one never up after the grace is a warning.
    pub nvlink_boot_grace: HumanDuration<0, DAY>,
}

impl Default for NvmlConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            library: PathBuf::from("libnvidia-ml.so.1"),
            poll_interval: HumanDuration(std::time::Duration::from_secs(10)),
            expected_gpus: 0,
            nvlink_boot_grace: HumanDuration(std::time::Duration::from_secs(600)),
        }
    }
}

/// `[status]`: the socket `gpu-agent status` (and `clear`) talks to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatusConfig {
    /// Unix socket path; its directory is made 0750 and must never be shared with pods (not
    /// the notice file's, the NVRx socket's or the ack directory's).
    pub socket: PathBuf,
}

/// `[kmsg]`: the kernel-log source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KmsgConfig {
    /// Follow the kernel log.
    pub enabled: bool,
    /// The kernel log device, or a file holding a `/dev/kmsg` dump.
    pub path: PathBuf,
    /// How often a repeating fault is summarised in the agent's own log.
    pub repeat_log_interval: HumanDuration<MS, DAY>,
    /// Count fault lines written by userspace (any facility but the kernel's) as faults.
    /// Off: only the kernel's own lines and `gpu-agent inject`'s marked drill lines count, so
    /// nothing that can write to `/dev/kmsg` can forge an Xid; the rest are counted as
    /// ignored. On: for test rigs that replay real lines through `/dev/kmsg`.
    pub accept_userspace: bool,
}

/// `[sysfs]`: where sysfs is mounted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SysfsConfig {
    /// Root directory (`/sys`).
    pub root: PathBuf,
}

/// `[procfs]`: where procfs is mounted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcfsConfig {
    /// Root directory (`/proc`).
    pub root: PathBuf,
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Serve `/metrics`.
    pub enabled: bool,
    /// Listen address.
    pub listen: SocketAddr,
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

impl Default for StatusConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("/run/gpu-agent-admin/agent.sock"),
        }
    }
}

impl Default for KmsgConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: PathBuf::from("/dev/kmsg"),
            repeat_log_interval: HumanDuration(std::time::Duration::from_secs(60)),
            accept_userspace: false,
        }
    }
}

impl Default for SysfsConfig {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/sys"),
        }
    }
}

impl Default for ProcfsConfig {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/proc"),
        }
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 9467)),
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
