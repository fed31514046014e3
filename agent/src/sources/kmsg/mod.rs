//! The kernel-log source: follows `/dev/kmsg` (through rmesg) for NVIDIA Xid, "fallen off
//! the bus" and NVSwitch SXid lines.
//!
//! It reads what this boot already logged, then follows. Records at or before the persisted
//! cursor (the sequence number of the last record the core merged) are skipped, so a restart
//! never counts a record twice. Gaps in sequence numbers are records the kernel overwrote
//! before we read them (ring-buffer overrun, `EPIPE`): they are counted, and logged once.
//!
//! Reading is a blocking loop on its own thread: a `/dev/kmsg` read blocks until the next
//! record, and a dedicated thread keeps the latency at a plain `read(2)`'s.

pub mod parse;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use crate::catalog::{self, DriverBranch};
use crate::model::{
    Component, FaultCode, FaultReport, KmsgStats, Observation, SourceKind, SourceState,
};
use parse::FaultLine;

/// The longest raw line kept as a fault's evidence.
const MAX_DETAIL: usize = 512;

/// Why the kernel log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KmsgError {
    /// Opening failed (missing device, permission denied).
    #[error("cannot open kernel log {path}: {reason}")]
    Open {
        /// The kernel log path.
        path: PathBuf,
        /// rmesg's description.
        reason: String,
    },
}

/// What the source needs to know.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `/dev/kmsg`, or a file holding a dump of it.
    pub path: PathBuf,
    /// Skip records with a sequence number at or below this (already merged before a restart).
    pub resume_after: Option<u64>,
    /// Driver branch, for NVLink5 decoding.
    pub branch: DriverBranch,
    /// When this boot started, to turn record timestamps into wall-clock time.
    pub boot_time: Option<SystemTime>,
}

/// Reading statistics, shared with the core (which puts them into snapshots).
#[derive(Debug, Default)]
pub struct Counters {
    read: AtomicU64,
    lost: AtomicU64,
    matched: AtomicU64,
}

impl Counters {
    /// The counts so far.
    pub fn stats(&self) -> KmsgStats {
        KmsgStats {
            records_read: self.read.load(Ordering::Relaxed),
            records_lost: self.lost.load(Ordering::Relaxed),
            records_matched: self.matched.load(Ordering::Relaxed),
        }
    }
}

/// Turns kernel-log records into fault reports, tracking sequence numbers.
#[derive(Debug)]
pub struct RecordReader {
    settings: Settings,
    counters: Arc<Counters>,
    last_seq: Option<u64>,
    overrun_logged: bool,
}

impl RecordReader {
    /// A reader with fresh or shared counters.
    pub fn new(settings: Settings, counters: Arc<Counters>) -> Self {
        Self {
            settings,
            counters,
            last_seq: None,
            overrun_logged: false,
        }
    }

    /// Process one record; `Some` when it is a fault line not seen before.
    pub fn on_entry(&mut self, entry: &rmesg::entry::Entry) -> Option<FaultReport> {
        // Continuation lines of a record (` KEY=value`) carry no sequence number.
        let seq = u64::try_from(entry.sequence_num?).ok()?;
        self.counters.read.fetch_add(1, Ordering::Relaxed);
        if let Some(last) = self.last_seq {
            if seq > last + 1 {
                self.on_lost(seq - last - 1);
            }
        }
        self.last_seq = Some(seq);
        if self
            .settings
            .resume_after
            .is_some_and(|cursor| seq <= cursor)
        {
            return None;
        }
        let at = match (self.settings.boot_time, entry.timestamp_from_system_start) {
            (Some(boot), Some(since_boot)) => boot + since_boot,
            _ => SystemTime::now(),
        };
        let report = report(&entry.message, Some(seq), at, self.settings.branch)?;
        self.counters.matched.fetch_add(1, Ordering::Relaxed);
        Some(report)
    }

    fn on_lost(&mut self, lost: u64) {
        self.counters.lost.fetch_add(lost, Ordering::Relaxed);
        if !self.overrun_logged {
            self.overrun_logged = true;
            tracing::warn!(
                lost,
                "Kernel log overran before it was read; lost records are counted in \
                 gpu_agent_kmsg_records_lost_total (logged once)."
            );
        }
    }

    /// A read error from rmesg: an overrun (`EPIPE`) is expected and carried on from; the
    /// lost records show up as a sequence gap on the next record. Returns `false` when the
    /// error is not recoverable.
    fn on_error(&mut self, error: &rmesg::error::RMesgError) -> bool {
        // rmesg flattens io::Error into a string; EPIPE is "Broken pipe (os error 32)".
        let text = error.to_string();
        text.contains("os error 32") || text.contains("BrokenPipe")
    }
}

/// Build a fault report from one kernel-log message, or `None` if it is not a fault line.
pub fn report(
    message: &str,
    seq: Option<u64>,
    at: SystemTime,
    branch: DriverBranch,
) -> Option<FaultReport> {
    let (component, code, class) = match parse::parse(message)? {
        FaultLine::Xid { pci, code, rest } => (
            Component::Gpu { pci },
            FaultCode::Xid(code),
            catalog::classify_xid(code, rest, branch),
        ),
        FaultLine::FallenOffBus { pci } => (
            Component::Gpu { pci },
            FaultCode::FallenOffBus,
            catalog::classify_fallen_off_bus(),
        ),
        // Follow-up lines detail an event whose first line was already counted.
        FaultLine::Sxid {
            follow_up: true, ..
        } => return None,
        FaultLine::Sxid {
            pci, code, fatal, ..
        } => (
            Component::Nvswitch { pci },
            FaultCode::Sxid(code),
            catalog::classify_sxid(code, fatal),
        ),
    };
    Some(FaultReport {
        component,
        code,
        class,
        source: SourceKind::Kmsg,
        at,
        detail: truncate(message.trim(), MAX_DETAIL),
        cursor: seq,
    })
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn path_string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Read what the kernel log holds now, without following (for `gpu-agent check`).
pub fn read_snapshot(
    settings: Settings,
    counters: Arc<Counters>,
) -> Result<Vec<FaultReport>, KmsgError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let open_err = |reason: String| KmsgError::Open {
        path: settings.path.clone(),
        reason,
    };
    // Non-blocking: /dev/kmsg returns one record per read and EAGAIN at the end. An overrun
    // while reading (EPIPE) is carried on from, like the daemon does, instead of failing.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(&settings.path)
        .map_err(|e| open_err(e.to_string()))?;
    let mut reader = RecordReader::new(settings.clone(), counters);
    let mut reports = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut pending = String::new();
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                pending.push_str(&String::from_utf8_lossy(&buf[..n]));
                // A record device gives whole records; a dump file gives arbitrary chunks.
                while let Some(end) = pending.find('\n') {
                    let line: String = pending.drain(..=end).collect();
                    if let Ok(entry) = rmesg::kmsgfile::entry_from_line(line.trim_end_matches('\n'))
                    {
                        reports.extend(reader.on_entry(&entry));
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.raw_os_error() == Some(32) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(open_err(format!("reading: {e}"))),
        }
    }
    Ok(reports)
}

/// Start following the kernel log on its own thread. Observations go to `tx`; the thread
/// ends when the log ends (a dump file), on an unrecoverable error, or when the core is gone.
pub fn spawn(
    settings: Settings,
    counters: Arc<Counters>,
    tx: mpsc::Sender<Observation>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("kmsg".into())
        .spawn(move || follow(settings, counters, &tx))
}

fn follow(settings: Settings, counters: Arc<Counters>, tx: &mpsc::Sender<Observation>) {
    let send_state = |state| {
        tx.blocking_send(Observation::Source(SourceKind::Kmsg, state))
            .is_ok()
    };
    let path = settings.path.clone();
    let entries =
        match rmesg::kmsgfile::KMsgEntriesIter::with_options(Some(path_string(&path)), false) {
            Ok(entries) => entries,
            Err(e) => {
                let reason = KmsgError::Open {
                    path,
                    reason: e.to_string(),
                }
                .to_string();
                tracing::warn!(%reason, "Kernel log source is off.");
                send_state(SourceState::Failed(reason));
                return;
            }
        };
    if !send_state(SourceState::On) {
        return;
    }
    tracing::info!(path = %path.display(), resume_after = ?settings.resume_after, "Following the kernel log.");
    let mut reader = RecordReader::new(settings, counters);
    let mut consecutive_errors = 0u32;
    for entry in entries {
        match entry {
            Ok(entry) => {
                consecutive_errors = 0;
                if let Some(report) = reader.on_entry(&entry) {
                    if tx.blocking_send(Observation::Fault(report)).is_err() {
                        return;
                    }
                }
            }
            Err(e) if reader.on_error(&e) => {}
            Err(e) => {
                consecutive_errors += 1;
                if consecutive_errors >= 10 {
                    let reason = format!("reading {}: {e}", path.display());
                    tracing::error!(%reason, "Kernel log source stopped.");
                    send_state(SourceState::Failed(reason));
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    tracing::info!(path = %path.display(), "Kernel log ended.");
    send_state(SourceState::Ended);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Action, Severity};

    fn entry(seq: usize, message: &str) -> rmesg::entry::Entry {
        rmesg::entry::Entry {
            facility: None,
            level: None,
            sequence_num: Some(seq),
            timestamp_from_system_start: Some(Duration::from_secs(5)),
            message: message.to_string(),
        }
    }

    fn reader(resume_after: Option<u64>) -> RecordReader {
        let settings = Settings {
            path: PathBuf::from("/dev/null"),
            resume_after,
            branch: DriverBranch::Unknown,
            boot_time: Some(SystemTime::UNIX_EPOCH),
        };
        RecordReader::new(settings, Arc::new(Counters::default()))
    }

    #[test]
    fn classifies_and_stamps_records() {
        let mut r = reader(None);
        let report = r
            .on_entry(&entry(
                7,
                "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus.",
            ))
            .expect("fault");
        assert_eq!(report.code, FaultCode::Xid(79));
        assert_eq!(
            (report.class.severity, report.class.action),
            (Severity::Fatal, Action::Reboot)
        );
        assert_eq!(report.at, SystemTime::UNIX_EPOCH + Duration::from_secs(5));
        assert_eq!(report.cursor, Some(7));
        assert!(r.on_entry(&entry(8, "usb 1-1: new device")).is_none());
        assert_eq!(
            r.counters.stats(),
            KmsgStats {
                records_read: 2,
                records_lost: 0,
                records_matched: 1
            }
        );
    }

    #[test]
    fn skips_up_to_the_cursor_and_counts_gaps() {
        let mut r = reader(Some(10));
        let line = "NVRM: Xid (PCI:0000:3b:00): 48, DBE";
        assert!(r.on_entry(&entry(9, line)).is_none());
        assert!(r.on_entry(&entry(10, line)).is_none());
        assert!(r.on_entry(&entry(15, line)).is_some());
        assert_eq!(r.counters.stats().records_lost, 4);
        let mut continuation = entry(0, " SUBSYSTEM=pci");
        continuation.sequence_num = None;
        assert!(r.on_entry(&continuation).is_none());
        assert_eq!(r.counters.stats().records_read, 3);
    }

    #[test]
    fn sxid_follow_ups_are_not_new_events() {
        let at = SystemTime::UNIX_EPOCH;
        assert!(report(
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 27",
            None,
            at,
            DriverBranch::Unknown
        )
        .is_some());
        assert!(report(
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Data {0x0, 0x1}",
            None,
            at,
            DriverBranch::Unknown
        )
        .is_none());
    }

    #[test]
    fn overrun_errors_are_recoverable() {
        let mut r = reader(None);
        let epipe: rmesg::error::RMesgError = std::io::Error::from_raw_os_error(32).into();
        assert!(r.on_error(&epipe));
        let other: rmesg::error::RMesgError = std::io::Error::from_raw_os_error(5).into();
        assert!(!r.on_error(&other));
    }

    #[test]
    fn long_details_are_truncated_on_a_char_boundary() {
        let long = "é".repeat(400);
        let t = truncate(&long, MAX_DETAIL);
        assert!(t.len() <= MAX_DETAIL + "…".len());
    }
}
