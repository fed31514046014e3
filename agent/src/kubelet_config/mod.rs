//! `gpu-agent kubelet-config`: a one-shot job, run at boot before the kubelet, that writes
//! CPU Manager, Topology Manager and Memory Manager settings from the host's real topology,
//! validated against the kubelet's own rules so the node joins on the first try.

mod cpuset;
mod plan;
mod quantity;
mod render;
mod state;
mod topology;
mod validate;

use std::path::Path;

pub use cpuset::CpuSet;
pub use plan::{make_plan, KubeletFields, Plan, ReservedMemory};
pub use render::{contents, diff, Target};
pub use state::{stale_state_files, StaleState};
pub use topology::{read_topology, Topology};
pub use validate::{validate, Version};

use crate::config::KubeletConfig;

/// Why `plan` or `apply` stopped.
#[derive(Debug, thiserror::Error)]
pub enum KubeletConfigError {
    /// sysfs could not be read.
    #[error(transparent)]
    Topology(#[from] topology::TopologyError),
    /// A setting is unusable.
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    /// The plan breaks the kubelet's rules; nothing was written.
    #[error("the planned config would be rejected by the kubelet; nothing was written:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
    /// `[kubelet] kubelet_version` does not parse.
    #[error("[kubelet] kubelet_version {0:?}: expected MAJOR.MINOR, e.g. 1.33")]
    Version(String),
    /// No target directory exists.
    #[error("no target: neither {nodeadm} (nodeadm, AL2023) nor {kubelet} (kubelet --config-dir) exists; create one or pass --target")]
    NoTarget {
        /// nodeadm drop-in directory.
        nodeadm: String,
        /// kubelet drop-in directory.
        kubelet: String,
    },
    /// The target's directory does not exist.
    #[error("target directory {0} does not exist")]
    MissingDir(String),
    /// Writing failed.
    #[error(transparent)]
    Write(#[from] crate::fsutil::WriteError),
    /// The kubelet runs with a checkpoint for another policy.
    #[error("{0}")]
    KubeletRunning(String),
    /// A stale state file could not be removed.
    #[error("cannot remove {path}: {source}")]
    RemoveState {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Read the topology, plan and validate.
pub fn plan(sysfs_root: &Path, settings: &KubeletConfig) -> Result<Plan, KubeletConfigError> {
    let topology = read_topology(sysfs_root)?;
    let instance_type = crate::host::instance_type(sysfs_root);
    let plan = make_plan(&topology, settings, instance_type.as_deref())?;
    let version = Version::parse(&settings.kubelet_version)
        .ok_or_else(|| KubeletConfigError::Version(settings.kubelet_version.clone()))?;
    let violations = validate(&plan.kubelet, &topology, version);
    if !violations.is_empty() {
        return Err(KubeletConfigError::Invalid(violations));
    }
    Ok(plan)
}

/// Resolve `auto` to the target present on this host.
pub fn resolve_target(
    choice: &str,
    settings: &KubeletConfig,
) -> Result<Target, KubeletConfigError> {
    match choice {
        "nodeadm" => Ok(Target::Nodeadm),
        "kubelet-drop-in" => Ok(Target::KubeletDropIn),
        _ if settings.nodeadm_dir.is_dir() => Ok(Target::Nodeadm),
        _ if settings.kubelet_config_dir.is_dir() => Ok(Target::KubeletDropIn),
        _ => Err(KubeletConfigError::NoTarget {
            nodeadm: settings.nodeadm_dir.display().to_string(),
            kubelet: settings.kubelet_config_dir.display().to_string(),
        }),
    }
}

/// What `apply` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The file already held exactly this.
    Unchanged(std::path::PathBuf),
    /// Written (the previous version, if any, kept as `.bak`); stale state files removed.
    Written {
        /// The file.
        path: std::path::PathBuf,
        /// State files removed.
        removed: Vec<std::path::PathBuf>,
    },
    /// Dry run: the diff that would be applied.
    DryRun {
        /// The file.
        path: std::path::PathBuf,
        /// `-`/`+` lines.
        diff: String,
    },
}

/// Write the plan to `target` (idempotent). Stale kubelet checkpoints for another policy are
/// removed when the kubelet is not running; when it is, nothing is written and the
/// documented procedure is returned as the error.
pub fn apply(
    plan: &Plan,
    target: Target,
    settings: &KubeletConfig,
    procfs_root: &Path,
    dry_run: bool,
) -> Result<Applied, KubeletConfigError> {
    let dir = match target {
        Target::Nodeadm => &settings.nodeadm_dir,
        Target::KubeletDropIn => &settings.kubelet_config_dir,
    };
    let path = render::path(target, &settings.nodeadm_dir, &settings.kubelet_config_dir);
    let new = contents(target, &plan.kubelet);
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    if dry_run {
        return Ok(Applied::DryRun {
            diff: diff(&old, &new),
            path,
        });
    }
    let stale = stale_state_files(&settings.kubelet_root, &plan.kubelet);
    if old == new && stale.is_empty() {
        return Ok(Applied::Unchanged(path));
    }
    if !stale.is_empty() && state::kubelet_running(procfs_root) {
        let files: Vec<String> = stale
            .iter()
            .map(|s| {
                format!(
                    "{} (policy {:?}, planned {:?})",
                    s.path.display(),
                    s.found,
                    s.planned
                )
            })
            .collect();
        return Err(KubeletConfigError::KubeletRunning(format!(
            "the kubelet is running with checkpoints for another policy: {}. Nothing was written. Procedure: drain the node, stop the kubelet, run `gpu-agent kubelet-config apply` again (it removes the checkpoints), start the kubelet. On EKS, replacing the node is usually simpler.",
            files.join(", ")
        )));
    }
    if !dir.is_dir() {
        return Err(KubeletConfigError::MissingDir(dir.display().to_string()));
    }
    if old != new {
        crate::fsutil::write_atomic(&path, new.as_bytes())?;
    }
    let mut removed = Vec::new();
    for s in stale {
        std::fs::remove_file(&s.path).map_err(|source| KubeletConfigError::RemoveState {
            path: s.path.display().to_string(),
            source,
        })?;
        removed.push(s.path);
    }
    Ok(Applied::Written { path, removed })
}
