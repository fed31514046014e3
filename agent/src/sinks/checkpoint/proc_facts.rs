//! The facts of one process, from its procfs files: `stat` (name, parent, start time, the
//! layout of its arguments), `status` (`SigCgt`, `NSpid`), its pod and container from its
//! cgroup, its executable. Parsing only: what they mean for the checkpoint signal is
//! [`super::targets`]'s.

use std::path::Path;

use crate::host::proc_read::{ProcReader, Stuck};

/// A process's own procfs file (`stat`, `status`: lock-free, no deadline needed), capped.
pub(super) fn read(path: &Path) -> Option<String> {
    crate::host::proc_read::read_capped(path, crate::host::proc_read::PROC_FILE_CAP)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// What `/proc/PID/stat` says of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The kernel's 15-character command name.
    pub comm: String,
    /// Parent PID.
    pub ppid: i32,
    /// Start time in clock ticks since boot.
    pub start_time: u64,
    /// Exited, waiting for its parent to reap it (state `Z` or `X`).
    pub zombie: bool,
    /// Where its arguments and environment lie in its memory (fields 48-51: `arg_start`,
    /// `arg_end`, `env_start`, `env_end`), digested: a forked copy shares them with its
    /// parent (a rewritten argv included), a process that exec'd has its own. `None` where
    /// the kernel shows zeros (no ptrace access to it) or an older kernel shows none. Read
    /// without the process's memory-map lock, unlike `cmdline` and `environ`.
    pub image: Option<u64>,
}

/// `/proc/PID/stat`, parsed (comm may hold spaces and parentheses).
pub fn stat(procfs: &Path, pid: i32) -> Option<Stat> {
    parse_stat(&read(&procfs.join(pid.to_string()).join("stat"))?)
}

/// `/proc/PID/stat`'s text, parsed.
pub(super) fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // After the comm: state(0) ppid(1) ... starttime is field 22 overall, index 19 here.
    // Fields 48-51 overall, indices 45-48 here.
    let layout: Option<Vec<u64>> = (45..49)
        .map(|i| fields.get(i).and_then(|f| f.parse().ok()))
        .collect();
    let image = layout.filter(|l| l.iter().any(|a| *a != 0)).map(|l| {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        l.hash(&mut h);
        h.finish()
    });
    Some(Stat {
        comm: text[open + 1..close].to_string(),
        ppid: fields.get(1)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
        zombie: matches!(fields.first(), Some(&"Z" | &"X")),
        image,
    })
}

/// The `SigCgt` mask from `/proc/PID/status`.
pub fn sigcgt(procfs: &Path, pid: i32) -> Option<String> {
    sigcgt_in(&read(&procfs.join(pid.to_string()).join("status"))?)
}

/// The PID in the innermost PID namespace (`NSpid:\t4242\t7` -> 7).
pub(super) fn ns_pid_in(status: &str) -> Option<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

pub(super) fn sigcgt_in(status: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:").map(|v| v.trim().to_string()))
}

pub(super) fn pod_uid(cgroup: &str) -> Option<String> {
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

/// The container ID in a pod's cgroup path (the first hierarchy that names the pod): its
/// last part, as the runtime names it (`cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `docker-<id>.scope` with the systemd driver; `<id>` with cgroupfs).
pub(super) fn container_id(cgroup: &str) -> Option<String> {
    let line = cgroup.lines().find(|l| l.contains("kubepods"))?;
    let last = line.rsplit('/').next()?;
    let last = last.strip_suffix(".scope").unwrap_or(last);
    let id = ["cri-containerd-", "crio-", "docker-", "containerd-"]
        .iter()
        .find_map(|p| last.strip_prefix(p))
        .unwrap_or(last);
    (id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_string())
}

/// The executable's file name (`/proc/PID/exe`, else the command line's first word).
pub(super) fn executable(
    reader: &mut ProcReader,
    dir: &Path,
    cmdline: &[String],
) -> Result<Option<String>, Stuck> {
    Ok(reader
        .read_link(&dir.join("exe"))?
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| {
            cmdline
                .first()
                .and_then(|a| Path::new(a).file_name())
                .map(|n| n.to_string_lossy().into_owned())
        }))
}
