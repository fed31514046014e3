//! Boot identity and the NVIDIA driver version.

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::catalog::DriverBranch;

/// The kernel's boot id (`<procfs>/sys/kernel/random/boot_id`); `None` if unreadable.
pub fn boot_id(procfs_root: &Path) -> Option<String> {
    let text = std::fs::read_to_string(procfs_root.join("sys/kernel/random/boot_id")).ok()?;
    let id = text.trim();
    (!id.is_empty()).then(|| id.to_string())
}

/// When this boot started, from `<procfs>/uptime`; `None` if unreadable.
pub fn boot_time(procfs_root: &Path) -> Option<SystemTime> {
    let text = std::fs::read_to_string(procfs_root.join("uptime")).ok()?;
    let uptime: f64 = text.split_whitespace().next()?.parse().ok()?;
    // `try_` because a corrupt file can hold a value no Duration holds (1e30, NaN, -1).
    let uptime = Duration::try_from_secs_f64(uptime).ok()?;
    SystemTime::now().checked_sub(uptime)
}

/// The loaded NVIDIA driver's branch (`<sysfs>/module/nvidia/version`), which decides how
/// NVLink5 Xid lines decode.
pub fn driver_branch(sysfs_root: &Path) -> DriverBranch {
    std::fs::read_to_string(sysfs_root.join("module/nvidia/version"))
        .map_or(DriverBranch::Unknown, |v| DriverBranch::from_version(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fake_procfs() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(boot_id(dir.path()), None);
        assert_eq!(boot_time(dir.path()), None);
        std::fs::create_dir_all(dir.path().join("sys/kernel/random")).expect("mkdir");
        std::fs::write(dir.path().join("sys/kernel/random/boot_id"), "abc-123\n").expect("write");
        std::fs::write(dir.path().join("uptime"), "100.5 200.0\n").expect("write");
        assert_eq!(boot_id(dir.path()).as_deref(), Some("abc-123"));
        let started = boot_time(dir.path()).expect("boot time");
        for corrupt in ["1e30 0", "NaN 0", "-1 0", "inf 0"] {
            let fake = tempfile::tempdir().expect("tempdir");
            std::fs::write(fake.path().join("uptime"), corrupt).expect("write");
            assert_eq!(boot_time(fake.path()), None, "{corrupt}");
        }
        let age = SystemTime::now().duration_since(started).expect("past");
        assert!((100..=102).contains(&age.as_secs()));
        std::fs::write(dir.path().join("uptime"), "garbage").expect("write");
        assert_eq!(boot_time(dir.path()), None);
    }
}
