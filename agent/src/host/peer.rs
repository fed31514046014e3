//! Where the process at the other end of a local socket lives: only an operator on the node
//! itself shares the agent's PID namespace and the host's mount namespace; a container's
//! root, however privileged inside, does not. The peer's pid comes from the kernel
//! (`SO_PEERCRED`), so the kernel's own `/proc` is read, never `[procfs] root`.

use std::path::{Path, PathBuf};

/// Why a peer is not the host's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Foreign {
    /// The kernel named no pid (the peer is in a PID namespace the agent cannot see into).
    #[error("the caller's process is not visible from the agent's PID namespace")]
    Unseen,
    /// Its namespace could not be read (it exited, or procfs refused).
    #[error("the caller's {ns} namespace cannot be read: {reason}")]
    Unreadable {
        /// `pid` or `mnt`.
        ns: &'static str,
        /// The error.
        reason: String,
    },
    /// Another PID namespace (a container).
    #[error("the caller is in another PID namespace (a container)")]
    PidNamespace,
    /// Another mount namespace than the agent's and the host's (a container, `unshare -m`).
    #[error("the caller is in another mount namespace (a container, or unshare)")]
    MountNamespace,
}

/// The namespace link `/proc/<who>/ns/<ns>` (`pid:[4026531836]`).
fn namespace(proc: &Path, who: &str, ns: &'static str) -> Result<PathBuf, Foreign> {
    std::fs::read_link(proc.join(who).join("ns").join(ns)).map_err(|e| Foreign::Unreadable {
        ns,
        reason: e.to_string(),
    })
}

/// Is process `pid` (`None`: the kernel named none) in the agent's PID namespace and in the
/// agent's or PID 1's mount namespace (the packaged unit gives the agent mounts of its own,
/// so an operator's shell is in PID 1's)?
pub fn on_host(pid: Option<i32>) -> Result<(), Foreign> {
    on_host_in(Path::new("/proc"), pid)
}

/// [`on_host`] with procfs at `proc` (`[procfs] root`, for a pid read from that procfs).
pub fn on_host_in(proc: &Path, pid: Option<i32>) -> Result<(), Foreign> {
    let pid = pid.filter(|p| *p > 0).ok_or(Foreign::Unseen)?.to_string();
    if namespace(proc, &pid, "pid")? != namespace(proc, "self", "pid")? {
        return Err(Foreign::PidNamespace);
    }
    let mnt = namespace(proc, &pid, "mnt")?;
    if mnt == namespace(proc, "self", "mnt")? {
        return Ok(());
    }
    // PID 1's, where it can be read (a sandbox may hide its init even from root).
    match namespace(proc, "1", "mnt") {
        Ok(host) if host == mnt => Ok(()),
        _ => Err(Foreign::MountNamespace),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_itself_is_on_the_host_and_an_unseen_peer_is_not() {
        let me = i32::try_from(std::process::id()).expect("pid");
        assert_eq!(on_host(Some(me)), Ok(()));
        assert_eq!(on_host(None), Err(Foreign::Unseen));
        assert_eq!(on_host(Some(0)), Err(Foreign::Unseen));
    }

    #[test]
    fn another_mount_namespace_is_foreign() {
        // A procfs double: the peer's links differ from the agent's and PID 1's.
        let dir = tempfile::tempdir().expect("tempdir");
        for (who, pid, mnt) in [
            ("self", "pid:[1]", "mnt:[10]"),
            ("1", "pid:[1]", "mnt:[11]"),
            ("42", "pid:[1]", "mnt:[12]"),
            ("43", "pid:[1]", "mnt:[11]"),
            ("44", "pid:[2]", "mnt:[11]"),
        ] {
            let ns = dir.path().join(who).join("ns");
            std::fs::create_dir_all(&ns).expect("ns");
            std::os::unix::fs::symlink(pid, ns.join("pid")).expect("pid");
            std::os::unix::fs::symlink(mnt, ns.join("mnt")).expect("mnt");
        }
        assert_eq!(
            on_host_in(dir.path(), Some(42)),
            Err(Foreign::MountNamespace)
        );
        assert_eq!(on_host_in(dir.path(), Some(43)), Ok(()), "PID 1's mounts");
        assert_eq!(on_host_in(dir.path(), Some(44)), Err(Foreign::PidNamespace));
        // With PID 1's unreadable, only the agent's own mounts count.
        std::fs::remove_file(dir.path().join("1/ns/mnt")).expect("rm");
        assert_eq!(
            on_host_in(dir.path(), Some(43)),
            Err(Foreign::MountNamespace)
        );
        assert!(matches!(
            on_host_in(dir.path(), Some(45)),
            Err(Foreign::Unreadable { ns: "pid", .. })
        ));
    }
}
