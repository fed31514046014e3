//! Sending a signal through a pidfd, so a recycled PID is never hit.

use std::path::Path;

use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

use super::{signals, targets};

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
    let raw = Pid::from_raw(pid).ok_or(SendError::Gone(pid))?;
    let fd = pidfd_open(raw, PidfdFlags::empty()).map_err(|e| match e {
        rustix::io::Errno::SRCH => SendError::Gone(pid),
        e => SendError::Os {
            pid,
            source: e.into(),
        },
    })?;
    match targets::stat(procfs, pid) {
        Some((_, _, start)) if start == start_time => {}
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
