//! Acknowledgements: a signalled process confirms its checkpoint by writing `done` (or the
//! checkpoint's path) to `<ack_dir>/<its pid>`, as it sees both: the agent reads the file
//! through the process's own root (`/proc/<pid>/root`) under its PID in its own namespace
//! (`NSpid`), so a trainer in a container needs no host path, and two containers' PID 7s
//! never mix. On the host, `ack_dir` is made writable by every user (sticky, like /tmp, and
//! not listable).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The mode of the host's ack directory: anyone may create a file, no one may list, rename
/// or remove another's.
const DIR_MODE: u32 = 0o1733;

/// Create the host's ack directory (blocking). A failure is logged: exits still confirm.
pub fn prepare(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let made = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE)));
    if let Err(e) = made {
        tracing::warn!(dir = %dir.display(), error = %e, "Cannot prepare the checkpoint ack directory; only exits confirm.");
    }
}

/// Where the agent reads the ack of process `pid` (`ns_pid` in its own namespace).
pub fn path(procfs: &Path, pid: i32, ack_dir: &Path, ns_pid: i32) -> PathBuf {
    let relative = ack_dir.strip_prefix("/").unwrap_or(ack_dir);
    procfs
        .join(pid.to_string())
        .join("root")
        .join(relative)
        .join(ns_pid.to_string())
}

/// The ack's words (the first line, at most 200 characters) if the file was written at or
/// after `since`: an older file is a previous notice's.
pub fn read(
    reader: &mut crate::host::proc_read::ProcReader,
    path: &Path,
    since: SystemTime,
) -> Option<String> {
    // The bounded read first: a file that answers it is safe to stat.
    let text = reader.read_text(path).ok().flatten()?;
    // A second of slack for filesystems that keep coarse times.
    let fresh = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .is_ok_and(|m| m + std::time::Duration::from_secs(1) >= since);
    if !fresh {
        return None;
    }
    let first = text.lines().next().unwrap_or_default().trim();
    Some(first.chars().take(200).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn through_the_process_root_under_its_namespace_pid() {
        assert_eq!(
            path(Path::new("/proc"), 4242, Path::new("/run/gpu-agent/ack"), 7),
            PathBuf::from("/proc/4242/root/run/gpu-agent/ack/7")
        );
    }

    #[test]
    fn a_stale_ack_is_not_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("7");
        std::fs::write(&file, "/ckpt/step-100.pt\nmore\n").expect("ack");
        let mut reader = crate::host::proc_read::ProcReader::new(std::time::Duration::from_secs(1));
        let now = SystemTime::now();
        assert_eq!(
            read(&mut reader, &file, now - std::time::Duration::from_secs(5)).as_deref(),
            Some("/ckpt/step-100.pt")
        );
        assert_eq!(
            read(&mut reader, &file, now + std::time::Duration::from_secs(60)),
            None
        );
        assert_eq!(read(&mut reader, &dir.path().join("8"), now), None);
    }
}
