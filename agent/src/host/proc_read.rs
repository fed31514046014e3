//! Reads of other processes' procfs files, each under a deadline.
//!
//! A process in uninterruptible sleep (D state; common after Xid 79, a thread stuck in the
//! driver) can block a reader of its `/proc/PID/cmdline` or `environ` (they take that
//! process's memory-map lock) for as long as it stays stuck. Every read here runs on a worker
//! thread and is waited for at most the deadline. A read that does not answer leaves its
//! worker behind (the thread ends when the read returns) and is reported as [`Stuck`]; while
//! it is outstanding, that file is not read again (a read of it answers `Stuck` at once), so
//! a stuck process costs at most one thread per file however many scans ask.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

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

/// One read: the file's bytes, a link's target, or the targets of a directory's links.
enum Op {
    Read(PathBuf),
    Link(PathBuf),
    Links(PathBuf),
}

enum Answer {
    Bytes(Option<Vec<u8>>),
    Link(Option<PathBuf>),
    Links(Option<Vec<PathBuf>>),
}

impl Op {
    fn path(&self) -> &Path {
        match self {
            Op::Read(p) | Op::Link(p) | Op::Links(p) => p,
        }
    }

    fn run(&self) -> Answer {
        match self {
            Op::Read(p) => Answer::Bytes(std::fs::read(p).ok()),
            Op::Link(p) => Answer::Link(std::fs::read_link(p).ok()),
            Op::Links(p) => Answer::Links(std::fs::read_dir(p).ok().map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| std::fs::read_link(e.path()).ok())
                    .collect()
            })),
        }
    }
}

/// Files with a read outstanding past its deadline, process-wide.
fn outstanding() -> MutexGuard<'static, HashSet<PathBuf>> {
    static SET: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    SET.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

type Job = (Op, mpsc::Sender<Answer>);

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
                    for (op, reply) in rx {
                        let answer = op.run();
                        // Under the lock, so a caller that gave up either sees the answer or
                        // has marked the file, which is unmarked here.
                        let mut stuck = outstanding();
                        if reply.send(answer).is_err() {
                            stuck.remove(op.path());
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

    fn call(&mut self, op: Op) -> Result<Answer, Stuck> {
        let deadline = self.deadline;
        let path = op.path().to_path_buf();
        if outstanding().contains(&path) {
            return Err(Stuck {
                path,
                after: deadline,
            });
        }
        let (reply, answer) = mpsc::channel();
        let Some(worker) = self.worker() else {
            // No thread to spare: read here rather than not at all.
            return Ok(op.run());
        };
        if let Err(mpsc::SendError((op, _))) = worker.send((op, reply)) {
            self.worker = None;
            return Ok(op.run());
        }
        match answer.recv_timeout(deadline) {
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
                Err(Stuck {
                    path,
                    after: deadline,
                })
            }
        }
    }

    /// The file's bytes (`None` when it cannot be read).
    pub fn read(&mut self, path: &Path) -> Result<Option<Vec<u8>>, Stuck> {
        match self.call(Op::Read(path.to_path_buf()))? {
            Answer::Bytes(b) => Ok(b),
            Answer::Link(_) | Answer::Links(_) => Ok(None),
        }
    }

    /// The file as text, lossily (`None` when it cannot be read).
    pub fn read_text(&mut self, path: &Path) -> Result<Option<String>, Stuck> {
        Ok(self
            .read(path)?
            .map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// A symbolic link's target.
    pub fn read_link(&mut self, path: &Path) -> Result<Option<PathBuf>, Stuck> {
        match self.call(Op::Link(path.to_path_buf()))? {
            Answer::Link(l) => Ok(l),
            Answer::Bytes(_) | Answer::Links(_) => Ok(None),
        }
    }

    /// The targets of every link in a directory (`/proc/PID/fd`).
    pub fn links_in(&mut self, dir: &Path) -> Result<Option<Vec<PathBuf>>, Stuck> {
        match self.call(Op::Links(dir.to_path_buf()))? {
            Answer::Links(l) => Ok(l),
            Answer::Bytes(_) | Answer::Link(_) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A file whose read never returns while nobody writes: a FIFO without a writer blocks
    /// `open(2)`, as a D-state process blocks a read of its `cmdline`.
    fn never_answers(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .expect("mkfifo");
        assert!(status.success());
    }

    #[test]
    fn a_read_that_never_answers_is_stuck_and_the_next_reads_go_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stuck_dir = dir.path().join("4242");
        let fine_dir = dir.path().join("4243");
        std::fs::create_dir_all(&stuck_dir).expect("mkdir");
        std::fs::create_dir_all(&fine_dir).expect("mkdir");
        never_answers(&stuck_dir.join("cmdline"));
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
