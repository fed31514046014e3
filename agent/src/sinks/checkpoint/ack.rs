//! Acknowledgements: a signalled process confirms its checkpoint by writing `done` (or the
//! checkpoint's path) to `<ack_dir>/<its pid>`, as it sees both: the agent reads the file
//! through the process's own root (`/proc/<pid>/root`) under its PID in its own namespace
//! (`NSpid`), so a trainer in a container needs no host path, and two containers' PID 7s
//! never mix. The file is hostile input (the agent reads it with the powers of root): it is
//! opened inside the process's root with no link followed, only a small regular file is
//! read, only a few hundred bytes of it, and only a short sanitised token of it is kept. On
//! the host, `ack_dir` is made writable by every user (sticky, like /tmp, and
//! not listable).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::proc_facts;
use crate::host::proc_read::{read_in_root, Limits, ProcReader, Refused};

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

/// The most an ack file may hold: a word or a checkpoint's path. A larger one (a checkpoint
/// itself, a sparse file) is refused unread.
const MAX_SIZE: u64 = 4096;
/// The most of it that is read.
const MAX_READ: u64 = 256;
/// The most of its words that are kept (and logged), after [`token`].
const MAX_TOKEN: usize = 64;

/// Where one signalled process's ack is: `<ack_dir>/<ns_pid>` inside the root of process
/// `pid` (which started at `start_time`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckFile {
    /// procfs root.
    pub procfs: PathBuf,
    /// The process (host PID).
    pub pid: i32,
    /// Its start time: with the PID, its identity.
    pub start_time: u64,
    /// The ack directory, as the process sees it.
    pub dir: PathBuf,
    /// Its PID in its own namespace: the file's name.
    pub ns_pid: i32,
}

/// What one look at an ack file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ack {
    /// Written at or after the signal: its words, as a short sanitised token.
    Fresh(String),
    /// None yet, or an older one (a previous notice's).
    Absent,
    /// Not read, and why (never its content): a link, a FIFO, too large, ...
    Refused(Refused),
}

/// Look at the ack of `file` (blocking, bounded: see [`read_in_root`]); fresh if written at
/// or after `since`.
pub fn read(reader: &mut ProcReader, file: &AckFile, since: SystemTime) -> Ack {
    let key = file
        .procfs
        .join(file.pid.to_string())
        .join("root")
        .join(file.dir.strip_prefix("/").unwrap_or(&file.dir))
        .join(file.ns_pid.to_string());
    let f = file.clone();
    let read = reader.run(&key, move || {
        let start_time = f.start_time;
        read_in_root(
            &f.procfs,
            f.pid,
            |stat| proc_facts::parse_stat(stat).is_some_and(|s| s.start_time == start_time),
            &f.dir,
            &f.ns_pid.to_string(),
            Limits {
                max_size: MAX_SIZE,
                max_read: MAX_READ,
            },
        )
    });
    match read {
        // A second of slack for filesystems that keep coarse times.
        Ok(Ok(c)) if c.modified + std::time::Duration::from_secs(1) >= since => {
            Ack::Fresh(token(&c.bytes))
        }
        Ok(Ok(_) | Err(Refused::Absent | Refused::Gone)) => Ack::Absent,
        Ok(Err(why)) => Ack::Refused(why),
        // A directory that does not answer (a hung network mount) is not an ack.
        Err(stuck) => Ack::Refused(Refused::Stuck(stuck)),
    }
}

/// The first line of an ack, as a token safe to log and to show: at most [`MAX_TOKEN`]
/// characters, each outside `[A-Za-z0-9._/:=+-]` replaced by `_`.
fn token(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let first = text.lines().next().unwrap_or_default().trim();
    first
        .chars()
        .take(MAX_TOKEN)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._/:=+-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// This test process's own ack in `dir` (its root is the host's, its namespace PID its PID).
    fn own(dir: &Path) -> (AckFile, PathBuf) {
        let pid = i32::try_from(std::process::id()).expect("pid");
        let procfs = PathBuf::from("/proc");
        let start_time = proc_facts::stat(&procfs, pid).expect("own stat").start_time;
        let file = AckFile {
            procfs,
            pid,
            start_time,
            dir: dir.to_path_buf(),
            ns_pid: pid,
        };
        (file, dir.join(pid.to_string()))
    }

    fn look(file: &AckFile, since: SystemTime) -> Ack {
        read(&mut ProcReader::new(Duration::from_secs(2)), file, since)
    }

    #[test]
    fn a_fresh_ack_is_its_first_line_as_a_token_and_a_stale_one_is_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (file, path) = own(dir.path());
        let now = SystemTime::now();
        assert_eq!(look(&file, now), Ack::Absent);
        std::fs::write(&path, "/ckpt/step-100.pt\nmore\n").expect("ack");
        assert_eq!(
            look(&file, now - Duration::from_secs(5)),
            Ack::Fresh("/ckpt/step-100.pt".into())
        );
        assert_eq!(look(&file, now + Duration::from_secs(60)), Ack::Absent);
        std::fs::write(&path, "done \u{1b}[31m$(rm -rf /)").expect("ack");
        assert_eq!(
            look(&file, now - Duration::from_secs(5)),
            Ack::Fresh("done___31m__rm_-rf_/_".into())
        );
        // Another process's identity (a recycled PID) never lends its root.
        let other = AckFile {
            start_time: file.start_time + 1,
            ..file
        };
        assert_eq!(look(&other, now - Duration::from_secs(5)), Ack::Absent);
    }

    #[test]
    fn hostile_acks_are_refused_unread() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (file, path) = own(dir.path());
        let since = SystemTime::now() - Duration::from_secs(5);
        let refused = |what: &str| match look(&file, since) {
            Ack::Refused(why) => why,
            other => panic!("{what}: {other:?}"),
        };

        std::os::unix::fs::symlink("/dev/zero", &path).expect("symlink");
        assert_eq!(refused("a link to /dev/zero"), Refused::Escapes);
        std::fs::remove_file(&path).expect("rm");

        std::os::unix::fs::symlink("../../../../../../etc/passwd", &path).expect("symlink");
        assert_eq!(refused("a relative link out"), Refused::Escapes);
        std::fs::remove_file(&path).expect("rm");

        crate::host::proc_read::fifo(&path);
        assert_eq!(refused("a FIFO"), Refused::NotRegular);
        std::fs::remove_file(&path).expect("rm");

        let sparse = std::fs::File::create(&path).expect("create");
        sparse.set_len(1 << 40).expect("a sparse terabyte");
        assert_eq!(refused("a sparse TB"), Refused::TooLarge(MAX_SIZE));
        std::fs::remove_file(&path).expect("rm");

        std::fs::create_dir(&path).expect("mkdir");
        assert_eq!(refused("a directory"), Refused::NotRegular);
    }

    #[test]
    fn an_ack_directory_that_is_a_link_stays_inside_the_root() {
        // A link as the directory is resolved inside the process's root: here that root is
        // the host's, so an absolute link lands where it says, and `..` stops at the root.
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        let linked = dir.path().join("linked");
        std::os::unix::fs::symlink(&real, &linked).expect("symlink");
        let (file, _) = own(&linked);
        std::fs::write(real.join(file.ns_pid.to_string()), "done").expect("ack");
        assert_eq!(
            look(&file, SystemTime::now() - Duration::from_secs(5)),
            Ack::Fresh("done".into())
        );
    }
}
