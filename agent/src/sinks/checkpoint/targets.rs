//! Which processes get the checkpoint signal, and why each is in or out.
//!
//! In: a process that opted in with `GPU_AGENT_CHECKPOINT_SIGNAL=<SIGNAME>` in its environment
//! (that signal), or one that has a file matching `device_glob` open; in both cases only if
//! its `SigCgt` shows it catches the signal. Out, always: PID 1, the agent itself, kernel
//! threads, and system daemons by name (kubelet, container runtimes, NVIDIA device plugin,
//! DCGM, persistenced, fabric manager, gpu-agent) plus `[checkpoint] exclude`. A process that
//! holds a GPU but does not catch the signal is listed as skipped, never signalled.

use std::path::Path;

use rustix::process::Signal;
use serde::Serialize;

use super::signals;

/// The opt-in variable.
pub const OPT_IN_VAR: &str = "GPU_AGENT_CHECKPOINT_SIGNAL";

/// Process names never signalled (the kernel's 15-character `comm`).
const BUILT_IN_EXCLUDES: &[&str] = &[
    "kubelet",
    "containerd",
    "containerd-shim",
    "containerd-shim-runc-v2",
    "dockerd",
    "crio",
    "conmon",
    "runc",
    "nvidia-device-p",
    "nvidia-device-plugin",
    "k8s-device-plug",
    "dcgm",
    "nv-hostengine",
    "dcgm-exporter",
    "dcgmi",
    "nvidia-persistenced",
    "nvidia-persiste",
    "nv-fabricmanager",
    "nv-fabricmanage",
    "gpu-agent",
    "systemd",
    "systemd-logind",
    "sshd",
    "init",
];

/// One process considered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// PID.
    pub pid: i32,
    /// Start time in clock ticks since boot (with the PID, the process's identity).
    pub start_time: u64,
    /// Process name.
    pub name: String,
    /// The signal it gets, if it is a target.
    pub signal: Option<String>,
    /// Why it is in or out.
    pub why: String,
    /// Kubernetes pod UID, from its cgroup, where it runs in a pod.
    pub pod_uid: Option<String>,
}

/// What a scan needs.
#[derive(Debug, Clone)]
pub struct Selection {
    /// procfs root.
    pub procfs: std::path::PathBuf,
    /// The default signal.
    pub signal: Signal,
    /// Device files that mark a GPU process.
    pub device_glob: glob::Pattern,
    /// Extra names never signalled.
    pub exclude: Vec<String>,
    /// Honour the opt-in variable.
    pub opt_in_env: bool,
}

fn read(path: &Path) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// `(comm, ppid, start_time)` from `/proc/PID/stat` (comm may hold spaces and parentheses).
pub fn stat(procfs: &Path, pid: i32) -> Option<(String, i32, u64)> {
    let text = read(&procfs.join(pid.to_string()).join("stat"))?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // After the comm: state(0) ppid(1) ... starttime is field 22 overall, index 19 here.
    Some((
        comm,
        fields.get(1)?.parse().ok()?,
        fields.get(19)?.parse().ok()?,
    ))
}

/// The `SigCgt` mask from `/proc/PID/status`.
pub fn sigcgt(procfs: &Path, pid: i32) -> Option<String> {
    read(&procfs.join(pid.to_string()).join("status"))?
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:").map(|v| v.trim().to_string()))
}

fn pod_uid(cgroup: &str) -> Option<String> {
    // cgroupfs: .../kubepods/burstable/pod<uid>/...; systemd: ...kubepods-burstable-pod<uid_with_underscores>.slice
    if !cgroup.contains("kubepods") {
        return None;
    }
    cgroup.split(['/', '\n']).find_map(|part| {
        let at = part.rfind("pod")?;
        let uid = part[at + 3..].trim_end_matches(".slice").replace('_', "-");
        (uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')).then_some(uid)
    })
}

/// Consider every process; returns those holding a GPU or opted in (others are not listed).
pub fn scan(sel: &Selection) -> Vec<Candidate> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir(&sel.procfs) else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect();
    pids.sort_unstable();
    let mut out = Vec::new();
    for pid in pids {
        let dir = sel.procfs.join(pid.to_string());
        let Some((name, ppid, start_time)) = stat(&sel.procfs, pid) else {
            continue;
        };
        let environ = if sel.opt_in_env {
            std::fs::read(dir.join("environ")).unwrap_or_default()
        } else {
            Vec::new()
        };
        let opt_in = environ.split(|b| *b == 0).find_map(|kv| {
            std::str::from_utf8(kv)
                .ok()?
                .strip_prefix(OPT_IN_VAR)?
                .strip_prefix('=')
                .map(str::to_string)
        });
        let device = std::fs::read_dir(dir.join("fd")).ok().and_then(|fds| {
            fds.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .find(|target| sel.device_glob.matches_path(target))
        });
        if opt_in.is_none() && device.is_none() {
            continue;
        }
        let mut candidate = Candidate {
            pid,
            start_time,
            name: name.clone(),
            signal: None,
            why: String::new(),
            pod_uid: read(&dir.join("cgroup")).as_deref().and_then(pod_uid),
        };
        let excluded = BUILT_IN_EXCLUDES.contains(&name.as_str()) || sel.exclude.contains(&name);
        let signal = match &opt_in {
            Some(requested) => signals::parse(requested),
            None => Some(sel.signal),
        };
        candidate.why = if pid == 1 || u32::try_from(pid).is_ok_and(|p| p == me) {
            "skipped: init or the agent itself".into()
        } else if ppid == 2 || ppid == 0 {
            "skipped: kernel thread".into()
        } else if excluded {
            format!("skipped: {name} is a system daemon (excluded)")
        } else if let (Some(requested), None) = (&opt_in, signal) {
            format!(
                "skipped: opted in with {OPT_IN_VAR}={requested}, which is not a catchable signal"
            )
        } else {
            let signal = signal.unwrap_or(sel.signal);
            let what = match (&opt_in, &device) {
                (Some(requested), _) => format!("opted in with {OPT_IN_VAR}={requested}"),
                (None, Some(dev)) => format!("holds {}", dev.display()),
                (None, None) => String::new(),
            };
            if sigcgt(&sel.procfs, pid).is_some_and(|mask| signals::caught(&mask, signal)) {
                candidate.signal = Some(signals::name(signal));
                format!("target: {what} and handles {}", signals::name(signal))
            } else {
                format!(
                    "skipped: {what} but does not handle {} (it would be killed)",
                    signals::name(signal)
                )
            }
        };
        out.push(candidate);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_uid_from_either_cgroup_driver() {
        assert_eq!(
            pod_uid("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b4c7e9a_2f6d_4c1e_9a0b_3d5e7f9a1c2b.slice/cri-containerd-abc.scope"),
            Some("1b4c7e9a-2f6d-4c1e-9a0b-3d5e7f9a1c2b".into())
        );
        assert_eq!(
            pod_uid("0::/kubepods/burstable/pod1b4c7e9a-2f6d-4c1e-9a0b-3d5e7f9a1c2b/abcdef"),
            Some("1b4c7e9a-2f6d-4c1e-9a0b-3d5e7f9a1c2b".into())
        );
        assert_eq!(pod_uid("0::/user.slice/user-0.slice/session-1.scope"), None);
    }
}
