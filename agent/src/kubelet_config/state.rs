//! The kubelet's CPU and Memory Manager checkpoints: a policy change needs them gone, and the
//! kubelet must not be running when they go.

use std::path::{Path, PathBuf};

use super::plan::KubeletFields;

/// A checkpoint recorded for a policy other than the planned one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleState {
    /// The checkpoint file.
    pub path: PathBuf,
    /// The policy it records.
    pub found: String,
    /// The policy planned.
    pub planned: String,
}

/// Checkpoints under `kubelet_root` whose policy differs from `fields`.
pub fn stale_state_files(kubelet_root: &Path, fields: &KubeletFields) -> Vec<StaleState> {
    let mut out = Vec::new();
    for (file, planned) in [
        ("cpu_manager_state", &fields.cpu_manager_policy),
        ("memory_manager_state", &fields.memory_manager_policy),
    ] {
        let path = kubelet_root.join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let found = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["policyName"].as_str().map(str::to_string))
            .unwrap_or_else(|| "unreadable".to_string());
        if found != *planned {
            out.push(StaleState {
                path,
                found,
                planned: planned.clone(),
            });
        }
    }
    out
}

/// Is a kubelet process running (its command line in procfs)?
pub fn kubelet_running(procfs_root: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(procfs_root) else {
        return false;
    };
    entries.flatten().any(|e| {
        e.file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
            && std::fs::read(e.path().join("cmdline"))
                .ok()
                .and_then(|c| {
                    c.split(|b| *b == 0)
                        .next()
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                })
                .is_some_and(|argv0| argv0 == "kubelet" || argv0.ends_with("/kubelet"))
    })
}
