//! Command-line interface: one binary, a subcommand per job.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::model::PciAddress;

/// GPU health and interruption agent for GPU nodes.
#[derive(Debug, Parser)]
#[command(name = "gpu-agent", version, about, long_about = None)]
pub struct Cli {
    /// Config file [default: /etc/gpu-agent/config.toml if present, else the built-in default].
    #[arg(long, global = true, env = "GPU_AGENT_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: follow the kernel log, keep the health model, serve status and metrics.
    Run,
    /// Ask the running daemon for the node's health. Exit 0 healthy, 1 warning or fatal, 2 daemon unreachable.
    Status(OutputArgs),
    /// One-shot health check of this boot's kernel log; no daemon needed. Exit 0 healthy, 1 warning or fatal, 2 could not check.
    Check(OutputArgs),
    /// Explain an Xid (or with --sxid an NVSwitch SXid) from NVIDIA's catalog, and what the agent does about it.
    Xid(XidArgs),
    /// Write a realistic fault line into the kernel log, for fire drills.
    Inject {
        /// What to inject.
        #[command(subcommand)]
        what: Inject,
    },
    /// Clear latched faults after a repair: by reason (NvidiaXID79Error), code (xid-79) or label, or --all. Needs root.
    Clear(ClearArgs),
    /// Kubelet CPU, Topology and Memory Manager config from this host's topology (run at boot, before the kubelet).
    KubeletConfig {
        /// plan or apply.
        #[command(subcommand)]
        action: KubeletConfigAction,
    },
    /// Fire drills.
    Drill {
        /// What to drill.
        #[command(subcommand)]
        what: Drill,
    },
    /// Print the built-in default config (the documented file installed at /etc/gpu-agent/config.toml).
    DefaultConfig,
}

/// Output format.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `gpu-agent clear`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["selector", "all"])))]
pub struct ClearArgs {
    /// Reason, code or label of the faults to clear.
    pub selector: Option<String>,
    /// Clear every fault.
    #[arg(long)]
    pub all: bool,
}

/// `gpu-agent xid`.
#[derive(Debug, Args)]
pub struct XidArgs {
    /// The code.
    pub code: u32,
    /// The code is an NVSwitch SXid.
    #[arg(long)]
    pub sxid: bool,
}

/// `gpu-agent inject`.
#[derive(Debug, Subcommand)]
pub enum Inject {
    /// An NVIDIA Xid line for a GPU.
    Xid {
        /// The Xid.
        code: u32,
        /// The GPU's PCI address [default: the first NVIDIA GPU on the bus, else 0000:3b:00.0].
        #[arg(long, value_name = "BDF")]
        pci: Option<PciAddress>,
    },
    /// An NVSwitch SXid line.
    Sxid {
        /// The SXid.
        code: u32,
        /// The NVSwitch's PCI address [default: the first NVSwitch, else 0000:05:00.0].
        #[arg(long, value_name = "BDF")]
        pci: Option<PciAddress>,
    },
}

/// `gpu-agent kubelet-config`.
#[derive(Debug, Subcommand)]
pub enum KubeletConfigAction {
    /// Print the plan, the reasoning and warnings; write nothing.
    Plan {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// sysfs root [default: [sysfs] root].
        #[arg(long, value_name = "PATH")]
        sysfs_root: Option<PathBuf>,
    },
    /// Validate and write the config (idempotent; the previous file is kept as .bak).
    Apply {
        /// Show the diff, write nothing.
        #[arg(long)]
        dry_run: bool,
        /// auto, nodeadm or kubelet-drop-in [default: [kubelet] target].
        #[arg(long)]
        target: Option<String>,
        /// sysfs root [default: [sysfs] root].
        #[arg(long, value_name = "PATH")]
        sysfs_root: Option<PathBuf>,
    },
}

/// `gpu-agent drill`.
#[derive(Debug, Subcommand)]
pub enum Drill {
    /// List the checkpoint targets and why each is in or out; without --dry-run, signal them as a real notice would.
    Checkpoint {
        /// List only.
        #[arg(long)]
        dry_run: bool,
    },
}
