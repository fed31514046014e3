//! Reads of other processes' files: procfs, each under a deadline, and files a tenant
//! controls (acks) inside a process's root, as hostile input. The one place the agent opens
//! another party's file: every read is size-capped, never follows a symlink at its last
//! component and reads only regular files.
//!
//! A process in uninterruptible sleep (D state; common after Xid 79, a thread stuck in the
//! driver) can block a reader of its `/proc/PID/cmdline` or `environ` (they take that
//! process's memory-map lock) for as long as it stays stuck. Every read here runs on a worker
//! thread and is waited for at most the deadline. A read that does not answer leaves its
//! worker behind (the thread ends when the read returns) and is reported as [`Stuck`]; while
//! it is outstanding, that file is not read again (a read of it answers `Stuck` at once), so
//! a stuck process costs at most one thread per file however many scans ask.

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// How long one procfs read may take: a healthy read takes microseconds.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(250);

/// A read that did not answer within the deadline (or of a file with one still outstanding).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} did not answer within {} (uninterruptible sleep?)", path.display(), humantime::format_duration(*after))]
pub struct Stuck {
    /// The file.
    pub path: PathBuf,
    /// The deadline it missed.
    pub after: Duration,
}

/// The most a read of a procfs file returns: `environ` and `cmdline` can hold up to the
/// kernel's argument limit, and nothing the agent decides on lies beyond the first MiB.
pub const PROC_FILE_CAP: u64 = 1 << 20;

/// The bytes of the regular file at `path`, at most `cap` of them; `None` when it cannot be
/// opened, is a symbolic link (its last component is never followed) or is not a regular
/// file (a FIFO or a device file is never read). Blocking: procfs files answer at once unless
/// their process is stuck, which is why [`ProcReader`] runs this under a deadline.
pub fn read_capped(path: &Path, cap: u64) -> Option<Vec<u8>> {
    read_capped_at(rustix::fs::CWD, path, cap).ok()
}

/// [`read_capped`], `path` relative to the directory `dir`.
fn read_capped_at(dir: impl AsFd, path: &Path, cap: u64) -> Result<Vec<u8>, Refused> {
    let fd = rustix::fs::openat(
        dir,
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(read_regular(fd, cap, u64::MAX)?.0)
}

/// Why a contained file was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// It does not exist (or its directory does not).
    #[error("absent")]
    Absent,
    /// The process is gone, or its PID now names another process.
    #[error("the process is gone")]
    Gone,
    /// Resolving it would leave the root, follow a symbolic link or cross a mount.
    #[error("a symbolic link, a magic link, a mount or a path out of the process's root")]
    Escapes,
    /// Not a regular file (a FIFO, a socket, a device file, a directory).
    #[error("not a regular file")]
    NotRegular,
    /// Larger than allowed.
    #[error("larger than {0} bytes")]
    TooLarge(u64),
    /// The read did not answer within its deadline (a hung network mount).
    #[error("{0}")]
    Stuck(Stuck),
    /// Another error from the kernel.
    #[error("unreadable ({0})")]
    Os(rustix::io::Errno),
}

impl From<rustix::io::Errno> for Refused {
    fn from(e: rustix::io::Errno) -> Self {
        use rustix::io::Errno;
        match e {
            Errno::NOENT | Errno::NOTDIR => Refused::Absent,
            Errno::SRCH => Refused::Gone,
            Errno::LOOP | Errno::XDEV | Errno::AGAIN => Refused::Escapes,
            e => Refused::Os(e),
        }
    }
}

/// A small file read from inside a process's root: its first bytes and its modification time,
/// both taken from the one descriptor that was checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contained {
    /// At most the requested number of bytes.
    pub bytes: Vec<u8>,
    /// Its mtime.
    pub modified: SystemTime,
}

/// How much of a contained file is read, and how large it may be.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A larger file (a sparse one included) is refused unread.
    pub max_size: u64,
    /// At most this many bytes are read.
    pub max_read: u64,
}

/// The file `dir/name` as the process `pid` sees it, read as hostile input: `dir` is resolved
/// inside the process's own root (`/proc/<pid>/root`; absolute links and `..` never leave
/// it, magic links are refused), the file itself with no symbolic link, no magic link and no
/// mount crossing (`openat2`), opened with `O_NOFOLLOW | O_NONBLOCK | O_NOCTTY` (a FIFO does
/// not block the open), then `fstat`ed: only a regular file of at most `limits.max_size`
/// bytes is read, and at most `limits.max_read` of it. The PID is pinned by a descriptor of
/// its procfs directory, and `same_process` is asked about its `stat` through that
/// descriptor before its root is entered: a recycled PID never lends another process's root.
/// `dir` may cross mounts (an ack directory is often a volume); the file may not.
pub fn read_in_root(
    procfs: &Path,
    pid: i32,
    same_process: impl FnOnce(&str) -> bool,
    dir: &Path,
    name: &str,
    limits: Limits,
) -> Result<Contained, Refused> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(Refused::Escapes);
    }
    let process = rustix::fs::open(
        procfs.join(pid.to_string()),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let stat = read_capped_at(&process, Path::new("stat"), 4096)?;
    if !same_process(&String::from_utf8_lossy(&stat)) {
        return Err(Refused::Gone);
    }
    // Following the magic link is the point here: it is the process's root.
    let root = rustix::fs::openat(
        &process,
        "root",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let relative = dir.strip_prefix("/").unwrap_or(dir);
    let dir = if relative.as_os_str().is_empty() {
        root
    } else {
        rustix::fs::openat2(
            &root,
            relative,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )?
    };
    let file = rustix::fs::openat2(
        &dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH
            | ResolveFlags::NO_SYMLINKS
            | ResolveFlags::NO_MAGICLINKS
            | ResolveFlags::NO_XDEV,
    )?;
    let (bytes, modified) = read_regular(file, limits.max_read, limits.max_size)?;
    Ok(Contained { bytes, modified })
}

/// Up to `cap` bytes of an open file, after `fstat` says it is a regular file of at most
/// `max_size` bytes; with its mtime.
fn read_regular(fd: OwnedFd, cap: u64, max_size: u64) -> Result<(Vec<u8>, SystemTime), Refused> {
    use std::io::Read;
    let os = |e: std::io::Error| {
        Refused::Os(rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO))
    };
    let file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(os)?;
    if !meta.file_type().is_file() {
        return Err(Refused::NotRegular);
    }
    if meta.len() > max_size {
        return Err(Refused::TooLarge(max_size));
    }
    let modified = meta.modified().unwrap_or(UNIX_EPOCH);
    let mut bytes = Vec::new();
    file.take(cap).read_to_end(&mut bytes).map_err(os)?;
    Ok((bytes, modified))
}

/// Files with a read outstanding past its deadline, process-wide.
fn outstanding() -> MutexGuard<'static, HashSet<PathBuf>> {
    static SET: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    SET.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One read to run on the worker: the file it is about (the key of the outstanding set) and
/// the read, which sends its own answer and says whether anyone still waited for it.
type Job = (PathBuf, Box<dyn FnOnce() -> bool + Send>);

/// Reads procfs files through a worker thread, each under a deadline. One per scan.
#[derive(Debug)]
pub struct ProcReader {
    deadline: Duration,
    worker: Option<mpsc::Sender<Job>>,
}

impl ProcReader {
    /// A reader whose reads each wait at most `deadline`.
    pub fn new(deadline: Duration) -> Self {
        Self {
            deadline,
            worker: None,
        }
    }

    fn worker(&mut self) -> Option<&mpsc::Sender<Job>> {
        if self.worker.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let spawned = std::thread::Builder::new()
                .name("proc-read".into())
                .spawn(move || {
                    for (path, read) in rx {
                        // The answer is sent under the lock (inside `read`), so a caller that
                        // gave up either sees it or has marked the file, unmarked here.
                        if !read() {
                            outstanding().remove(&path);
                        }
                    }
                });
            match spawned {
                Ok(_) => self.worker = Some(tx),
                Err(e) => tracing::warn!(error = %e, "Cannot start a procfs reader thread."),
            }
        }
        self.worker.as_ref()
    }

    /// Run `read`, a blocking read about the file `path`, waiting at most the deadline.
    pub fn run<T: Send + 'static>(
        &mut self,
        path: &Path,
        read: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Stuck> {
        let path = path.to_path_buf();
        let after = self.deadline;
        let stuck = |path| Stuck { path, after };
        if outstanding().contains(&path) {
            return Err(stuck(path));
        }
        let (reply, answer) = mpsc::channel::<T>();
        let job: Box<dyn FnOnce() -> bool + Send> = Box::new(move || {
            let value = read();
            let _held = outstanding();
            reply.send(value).is_ok()
        });
        let unsent = match self.worker() {
            Some(worker) => worker
                .send((path.clone(), job))
                .err()
                .map(|mpsc::SendError((_, job))| job),
            None => Some(job),
        };
        if let Some(job) = unsent {
            // No thread to spare (or it is gone): read here rather than not at all.
            self.worker = None;
            job();
            return answer.try_recv().map_err(|_| stuck(path));
        }
        match answer.recv_timeout(after) {
            Ok(answer) => Ok(answer),
            Err(_) => {
                let mut marked = outstanding();
                // The answer may have come between the timeout and the lock.
                if let Ok(answer) = answer.try_recv() {
                    return Ok(answer);
                }
                marked.insert(path.clone());
                drop(answer);
                drop(marked);
                // That worker is stuck in the read: the next read gets a fresh one.
                self.worker = None;
                Err(stuck(path))
            }
        }
    }

    /// The file's bytes, at most [`PROC_FILE_CAP`] of them (`None` when it cannot be read;
    /// see [`read_capped`]).
    pub fn read(&mut self, path: &Path) -> Result<Option<Vec<u8>>, Stuck> {
        let p = path.to_path_buf();
        self.run(path, move || read_capped(&p, PROC_FILE_CAP))
    }

    /// The file as text, lossily (`None` when it cannot be read).
    pub fn read_text(&mut self, path: &Path) -> Result<Option<String>, Stuck> {
        Ok(self
            .read(path)?
            .map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// A symbolic link's target.
    pub fn read_link(&mut self, path: &Path) -> Result<Option<PathBuf>, Stuck> {
        let p = path.to_path_buf();
        self.run(path, move || std::fs::read_link(p).ok())
    }

    /// The targets of every link in a directory (`/proc/PID/fd`).
    pub fn links_in(&mut self, dir: &Path) -> Result<Option<Vec<PathBuf>>, Stuck> {
        let p = dir.to_path_buf();
        self.run(dir, move || {
            std::fs::read_dir(p).ok().map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| std::fs::read_link(e.path()).ok())
                    .collect()
            })
        })
    }
}

/// Make a FIFO at `path` (tests: a file whose open blocks, or that must never be read).
#[cfg(test)]
pub fn fifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .expect("mkfifo");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_read_that_never_answers_is_stuck_and_the_next_reads_go_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stuck_dir = dir.path().join("4242");
        let fine_dir = dir.path().join("4243");
        std::fs::create_dir_all(&stuck_dir).expect("mkdir");
        std::fs::create_dir_all(&fine_dir).expect("mkdir");
        // A FIFO without a writer blocks `open(2)`, as a D-state process blocks a read of
        // its `cmdline`.
        fifo(&stuck_dir.join("cmdline"));
        std::fs::write(stuck_dir.join("stat"), "x").expect("stat");
        std::fs::write(fine_dir.join("cmdline"), "python3\0train.py").expect("cmdline");

        let mut reader = ProcReader::new(Duration::from_millis(100));
        let started = Instant::now();
        let err = reader.read(&stuck_dir.join("cmdline")).expect_err("stuck");
        assert_eq!(err.path, stuck_dir.join("cmdline"));
        assert!(
            err.to_string().contains("did not answer within 100ms"),
            "{err}"
        );
        // Another process's files still read, on a fresh worker.
        assert_eq!(
            reader.read(&fine_dir.join("cmdline")).expect("answers"),
            Some(b"python3\0train.py".to_vec())
        );
        // While the stuck read is outstanding, that file is not read again (no wait, no
        // second thread); the process's other files still are.
        let again = Instant::now();
        assert!(reader.read(&stuck_dir.join("cmdline")).is_err());
        assert!(again.elapsed() < Duration::from_millis(50));
        assert_eq!(
            reader.read(&stuck_dir.join("stat")).expect("answers"),
            Some(b"x".to_vec())
        );
        assert!(started.elapsed() < Duration::from_secs(2));

        // The stuck read returns (a writer comes): the process reads again.
        let fifo = stuck_dir.join("cmdline");
        let writer = std::thread::spawn(move || std::fs::write(fifo, b"done"));
        let _ = writer.join();
        let deadline = Instant::now() + Duration::from_secs(5);
        while outstanding().contains(&stuck_dir.join("cmdline")) {
            assert!(Instant::now() < deadline, "the worker never unmarked it");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Once it answers, it is read again (here: a plain file now).
        std::fs::remove_file(stuck_dir.join("cmdline")).expect("rm");
        std::fs::write(stuck_dir.join("cmdline"), "x").expect("file");
        assert!(reader.read(&stuck_dir.join("cmdline")).is_ok());
    }
}
