//! Sending a signal through a pidfd, so a recycled PID is never hit. The pidfd is the
//! process's directory in the configured procfs (`pidfd_send_signal` takes a `/proc/<pid>`
//! descriptor): the process checked (start time, handler) is the process signalled, also
//! when `[procfs] root` is not the agent's own `/proc` (a host's procfs seen from a pod).

use std::path::Path;

use rustix::fs::{Mode, OFlags};
use rustix::process::{pidfd_send_signal, Signal};

use super::targets;
use crate::model::signal as signals;

/// Why a signal was not sent.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The process is gone.
    #[error("process {0} exited")]
    Gone(i32),
    /// The PID now belongs to another process.
    #[error("PID {0} was reused by another process; not signalled")]
    Reused(i32),
    /// The process stopped handling the signal since the scan.
    #[error("process {0} no longer handles the signal; not signalled")]
    NoHandler(i32),
    /// The kernel refused.
    #[error("pidfd for {pid}: {source}")]
    Os {
        /// PID.
        pid: i32,
        /// The error.
        source: std::io::Error,
    },
}

/// Signal the process `pid` that started at `start_time`. The pidfd pins the process; it is
/// then checked to be the one scanned (same start time) and still catching the signal
/// before anything is sent.
pub fn send(procfs: &Path, pid: i32, start_time: u64, signal: Signal) -> Result<(), SendError> {
    let fd = rustix::fs::open(
        procfs.join(pid.to_string()),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT | rustix::io::Errno::SRCH => SendError::Gone(pid),
        e => SendError::Os {
            pid,
            source: e.into(),
        },
    })?;
    match targets::stat(procfs, pid) {
        Some(s) if s.start_time == start_time => {}
        Some(_) => return Err(SendError::Reused(pid)),
        None => return Err(SendError::Gone(pid)),
    }
    if !targets::sigcgt(procfs, pid).is_some_and(|mask| signals::caught(&mask, signal)) {
        return Err(SendError::NoHandler(pid));
    }
    pidfd_send_signal(&fd, signal).map_err(|e| match e {
        rustix::io::Errno::SRCH => SendError::Gone(pid),
        e => SendError::Os {
            pid,
            source: e.into(),
        },
    })
}
