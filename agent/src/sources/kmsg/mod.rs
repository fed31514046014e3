//! The kernel-log source: follows `/dev/kmsg` for NVIDIA Xid, "fallen off the bus" and
//! NVSwitch SXid lines.
//!
//! It reads what this boot already logged, then follows. Records at or before the persisted
//! cursor (the sequence number of the last record the core merged) are skipped, so a restart
//! never counts a record twice. Gaps in sequence numbers are records the kernel overwrote
//! before we read them (ring-buffer overrun, `EPIPE`, or while the agent was stopped: the
//! first record read is compared with the cursor): they are counted, and logged once. A
//! record whose header cannot be parsed is skipped and counted; only I/O errors stop the
//! reader.
//!
//! Reading is a blocking loop on its own thread: a `/dev/kmsg` read blocks until the next
//! record, and a dedicated thread keeps the latency at a plain `read(2)`'s.

pub mod parse;
pub mod record;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use crate::catalog::{self, DriverBranch};
use crate::model::{
    Component, FaultCode, FaultReport, KmsgCounters, Observation, SourceKind, SourceState,
};
use parse::FaultLine;
use record::{Next, Record};

/// The longest raw line kept as a fault's evidence.
const MAX_DETAIL: usize = 512;
/// Consecutive I/O errors after which the follower gives up (an overrun is not one).
const MAX_IO_ERRORS: u32 = 10;

/// Why the kernel log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KmsgError {
    /// Opening failed (missing device, permission denied).
    #[error("cannot open kernel log {path}: {reason}")]
    Open {
        /// The kernel log path.
        path: PathBuf,
        /// The system's description.
        reason: String,
    },
    /// Reading failed.
    #[error("reading kernel log {path}: {reason}")]
    Read {
        /// The kernel log path.
        path: PathBuf,
        /// The system's description.
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
    /// Count fault lines written by userspace too (not only the kernel's and drills).
    pub accept_userspace: bool,
    /// This boot's drill key: a userspace line with a genuine drill mark counts
    /// ([`crate::drill`]); `None`: no drills.
    pub drill_key: Option<Vec<u8>>,
}

/// Records within which a multi-record notice's parts (an SXid's follow-ups, the rest of a
/// "fallen off the bus" notice) are taken as belonging together.
const CONTINUATION_SPAN: u64 = 8;

/// Turns kernel-log records into fault reports, tracking sequence numbers and the notices
/// the driver prints over several records.
#[derive(Debug)]
pub struct RecordReader {
    settings: Settings,
    counters: Arc<KmsgCounters>,
    last_seq: Option<u64>,
    overrun_logged: bool,
    /// The SXid event being printed: `(switch, code, seq of its last record)`.
    sxid: Option<(crate::model::PciAddress, u32, u64)>,
    /// A GPU named by `NVRM: The NVIDIA GPU ...` whose notice may go on: `(gpu, seq)`.
    notice: Option<(crate::model::PciAddress, u64)>,
    /// The newest drill nonce accepted, or read before the cursor after a restart: an older
    /// or equal one is a replayed line.
    last_drill: u128,
    /// A forged or replayed drill line was logged (once: they are counted as ignored).
    bad_drill_logged: bool,
}

/// How far a drill's nonce (when `gpu-agent inject` marked it) may lie from the time the
/// agent reads it. `inject` writes at once and the agent reads within milliseconds; a copy
/// written again later (after an agent restart, when the newest nonce seen is known only
/// for lines still in the ring) is stale.
const DRILL_FRESH: Duration = Duration::from_secs(120);

/// Whether a drill nonce (nanoseconds since the epoch) lies within [`DRILL_FRESH`] of `now`.
fn fresh(nonce: u128, now: SystemTime) -> bool {
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    now.abs_diff(nonce) <= DRILL_FRESH.as_nanos()
}

impl RecordReader {
    /// A reader with fresh or shared counters.
    pub fn new(settings: Settings, counters: Arc<KmsgCounters>) -> Self {
        Self {
            settings,
            counters,
            last_seq: None,
            overrun_logged: false,
            sxid: None,
            notice: None,
            last_drill: 0,
            bad_drill_logged: false,
        }
    }

    /// A userspace record with a genuine drill mark newer than the last one accepted.
    fn genuine_drill(&mut self, message: &str) -> bool {
        let Some(key) = &self.settings.drill_key else {
            return false;
        };
        let verified = crate::drill::verify(key, message);
        match verified {
            Some(nonce) if nonce > self.last_drill && fresh(nonce, SystemTime::now()) => {
                self.last_drill = nonce;
                true
            }
            _ => {
                if crate::drill::is_marked(message)
                    && !std::mem::replace(&mut self.bad_drill_logged, true)
                {
                    let what = if verified.is_some() {
                        "replayed or stale"
                    } else {
                        "forged or altered"
                    };
                    tracing::warn!(line = %truncate(message.trim(), MAX_DETAIL), "A {what} drill line is ignored; such lines are counted in gpu_agent_kmsg_records_ignored_total (logged once).");
                }
                false
            }
        }
    }

    /// Process one record; `Some` when it is a fault line not seen before.
    pub fn on_record(&mut self, record: &Record) -> Option<FaultReport> {
        let report = self.judge(record);
        if report.is_none() {
            // Released after every earlier report was handed over (this thread sends each
            // before it reads the next record).
            self.counters
                .quiet_through
                .fetch_max(record.seq.saturating_add(1), Ordering::Release);
        }
        report
    }

    /// The report for one record, if it is a fault line not seen before.
    fn judge(&mut self, record: &Record) -> Option<FaultReport> {
        let seq = record.seq;
        self.counters.read.fetch_add(1, Ordering::Relaxed);
        // The first record after a restart: records between the saved cursor and the oldest
        // one still in the ring were overwritten while the agent was not reading.
        let previous = self.last_seq.or(self.settings.resume_after);
        if let Some(last) = previous {
            if seq > last.saturating_add(1) {
                self.on_lost(seq - last - 1);
            }
        }
        self.last_seq = Some(seq);
        if self
            .settings
            .resume_after
            .is_some_and(|cursor| seq <= cursor)
        {
            // A drill merged before a restart: no copy of it may count again.
            if record.facility != record::KERNEL_FACILITY
                && crate::drill::is_marked(&record.message)
            {
                if let Some(nonce) = self
                    .settings
                    .drill_key
                    .as_ref()
                    .and_then(|key| crate::drill::verify(key, &record.message))
                {
                    self.last_drill = self.last_drill.max(nonce);
                }
            }
            return None;
        }
        let at = match self.settings.boot_time {
            Some(boot) => boot + record.since_boot,
            None => SystemTime::now(),
        };
        let line = parse::parse(&record.message)?;
        let kernel = record.facility == record::KERNEL_FACILITY;
        let drill = !kernel && self.genuine_drill(&record.message);
        let trusted = kernel || drill || self.settings.accept_userspace;
        if !trusted {
            // A fault line from userspace (a privileged pod, a stray logger): not evidence.
            if !matches!(line, FaultLine::GpuNotice { .. })
                && self.counters.ignored.fetch_add(1, Ordering::Relaxed) == 0
            {
                tracing::warn!(facility = record.facility, line = %truncate(record.message.trim(), MAX_DETAIL), "Ignoring a fault line written by userspace, not the kernel ([kmsg] accept_userspace = false); such lines are counted in gpu_agent_kmsg_records_ignored_total (logged once).");
            }
            return None;
        }
        let recent = |at: u64| seq.saturating_sub(at) <= CONTINUATION_SPAN;
        let line = match line {
            FaultLine::GpuNotice { pci } => {
                self.notice = Some((pci, seq));
                return None;
            }
            FaultLine::FallenOffBusTail => {
                let (pci, _) = self.notice.take().filter(|(_, at)| recent(*at))?;
                FaultLine::FallenOffBus { pci }
            }
            FaultLine::Sxid {
                pci,
                code,
                follow_up,
                ..
            } => {
                // A follow-up of the event just reported details it; one whose head was not
                // seen (overwritten, before our cursor, a driver printing only these) is the
                // event.
                let continues = self
                    .sxid
                    .is_some_and(|(p, c, at)| p == pci && c == code && recent(at));
                self.sxid = Some((pci, code, seq));
                if follow_up && continues {
                    return None;
                }
                line
            }
            other => other,
        };
        let mut report = report_line(line, &record.message, Some(seq), at, self.settings.branch)?;
        report.drill = drill;
        self.counters.matched.fetch_add(1, Ordering::Relaxed);
        Some(report)
    }

    /// A line that is not a record: skipped and counted.
    pub fn on_unparsed(&mut self, error: &record::RecordError) {
        if self.counters.unparsed.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::info!(%error, "Skipping a kernel-log record that cannot be parsed; such records are counted in gpu_agent_kmsg_records_unparsed_total (logged once).");
        }
    }

    fn on_lost(&mut self, lost: u64) {
        self.counters.lost.fetch_add(lost, Ordering::Relaxed);
        if !self.overrun_logged {
            self.overrun_logged = true;
            tracing::warn!(
                lost,
                "Kernel log overran: records were overwritten before they were read; lost records are \
                 counted in gpu_agent_kmsg_records_lost_total (logged once)."
            );
        }
    }
}

/// The kernel-log fault path run once, with no effect: a made-up kernel Xid 79 record on
/// `pci`, and the same line as a program would write it, read from a file in memory by the
/// record reader and judged by a fresh reader (its own counters) into a fault report, sent
/// nowhere (`host::resident` locks what this maps).
pub fn rehearse(settings: Settings, pci: crate::model::PciAddress) -> Option<FaultReport> {
    use std::io::{Seek, Write};
    let bus = pci.to_string();
    let bus = bus.rsplit_once('.').map_or(bus.as_str(), |(b, _)| b);
    let message =
        format!("NVRM: Xid (PCI:{bus}): 79, pid=1, name=rehearsal, GPU has fallen off the bus.");
    let mut file = std::fs::File::from(
        rustix::fs::memfd_create("kmsg-rehearsal", rustix::fs::MemfdFlags::CLOEXEC).ok()?,
    );
    write!(file, "3,1,1000000,-;{message}\n12,2,1000001,-;{message}\n").ok()?;
    file.rewind().ok()?;
    let mut log = record::Reader::from_file(file);
    let mut reader = RecordReader::new(settings, Arc::new(KmsgCounters::default()));
    let mut first = None;
    while let Ok(Next::Record(record)) = log.read_next() {
        let report = reader.on_record(&record);
        first = first.or(report);
    }
    first
}

/// Build a fault report from one kernel-log message, or `None` if it is not a fault line on
/// its own (the first record of a multi-record notice, or its tail: the reader joins those).
pub fn report(
    message: &str,
    seq: Option<u64>,
    at: SystemTime,
    branch: DriverBranch,
) -> Option<FaultReport> {
    report_line(parse::parse(message)?, message, seq, at, branch)
}

/// The report for a recognised fault line; `None` for the parts of a multi-record notice.
fn report_line(
    line: FaultLine<'_>,
    message: &str,
    seq: Option<u64>,
    at: SystemTime,
    branch: DriverBranch,
) -> Option<FaultReport> {
    let (component, code, class) = match line {
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
        FaultLine::GpuNotice { .. } | FaultLine::FallenOffBusTail => return None,
        FaultLine::Sxid {
            pci, code, fatal, ..
        } => (
            Component::Nvswitch { pci },
            FaultCode::Sxid(code),
            catalog::classify_sxid(code, fatal),
        ),
        FaultLine::EfaDriver { pci, what } => (
            Component::Efa { pci },
            FaultCode::EfaDriverError,
            crate::model::Classification {
                name: what.to_string(),
                description: "the efa driver reports the device failing".into(),
                nvidia_action: String::new(),
                severity: crate::model::Severity::Fatal,
                action: crate::model::Action::Reboot,
            },
        ),
    };
    Some(FaultReport {
        component,
        code,
        class,
        source: SourceKind::Kmsg,
        at,
        // The kernel escapes a record's newlines: show them as spaces.
        detail: truncate(message.replace("\\x0a", " ").trim(), MAX_DETAIL),
        cursor: seq,
        drill: false,
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

/// Read what the kernel log holds now, without following (for `gpu-agent check`): the same
/// reader and record handling as the daemon's.
pub fn read_snapshot(
    settings: Settings,
    counters: Arc<KmsgCounters>,
) -> Result<Vec<FaultReport>, KmsgError> {
    let path = settings.path.clone();
    let mut file = record::Reader::open(&path, false).map_err(|e| KmsgError::Open {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let mut reader = RecordReader::new(settings, counters);
    let mut reports = Vec::new();
    loop {
        match file.read_next() {
            Ok(Next::Record(record)) => reports.extend(reader.on_record(&record)),
            Ok(Next::Unparsed(e)) => reader.on_unparsed(&e),
            Ok(Next::Overrun) => {}
            Ok(Next::End) => return Ok(reports),
            Err(e) => {
                return Err(KmsgError::Read {
                    path,
                    reason: e.to_string(),
                })
            }
        }
    }
}

/// Start following the kernel log on its own thread. Observations go to `tx`; the thread
/// ends when the log ends (a dump file), on repeated I/O errors, or when the core is gone.
pub fn spawn(
    settings: Settings,
    counters: Arc<KmsgCounters>,
    tx: mpsc::Sender<Observation>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("kmsg".into())
        .spawn(move || follow(settings, counters, &tx))
}

fn follow(settings: Settings, counters: Arc<KmsgCounters>, tx: &mpsc::Sender<Observation>) {
    let send_state = |state| {
        tx.blocking_send(Observation::Source(SourceKind::Kmsg, state))
            .is_ok()
    };
    let path = settings.path.clone();
    let mut file = match record::Reader::open(&path, true) {
        Ok(file) => file,
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
    let mut io_errors = 0u32;
    loop {
        match file.read_next() {
            Ok(Next::Record(record)) => {
                io_errors = 0;
                if let Some(report) = reader.on_record(&record) {
                    if tx.blocking_send(Observation::Fault(report)).is_err() {
                        return;
                    }
                }
            }
            Ok(Next::Unparsed(e)) => reader.on_unparsed(&e),
            // The lost records show up as a sequence gap on the next record.
            Ok(Next::Overrun) => {}
            Ok(Next::End) => break,
            Err(e) => {
                io_errors += 1;
                if io_errors >= MAX_IO_ERRORS {
                    let reason = KmsgError::Read {
                        path,
                        reason: e.to_string(),
                    }
                    .to_string();
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
    use crate::model::{Action, KmsgStats, Severity};

    fn entry(seq: u64, message: &str) -> Record {
        Record {
            facility: record::KERNEL_FACILITY,
            level: 3,
            seq,
            since_boot: Duration::from_secs(5),
            message: message.to_string(),
        }
    }

    fn reader(resume_after: Option<u64>) -> RecordReader {
        let settings = Settings {
            path: PathBuf::from("/dev/null"),
            resume_after,
            branch: DriverBranch::Unknown,
            boot_time: Some(SystemTime::UNIX_EPOCH),
            accept_userspace: false,
            drill_key: Some(b"test-key".to_vec()),
        };
        RecordReader::new(settings, Arc::new(KmsgCounters::default()))
    }

    #[test]
    fn classifies_and_stamps_records() {
        let mut r = reader(None);
        let report = r
            .on_record(&entry(
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
        assert!(r.on_record(&entry(8, "usb 1-1: new device")).is_none());
        assert_eq!(
            r.counters.stats(),
            KmsgStats {
                records_read: 2,
                records_lost: 0,
                records_matched: 1,
                records_unparsed: 0,
                records_ignored: 0,
            }
        );
    }

    #[test]
    fn skips_up_to_the_cursor_and_counts_gaps() {
        let mut r = reader(Some(10));
        let line = "NVRM: Xid (PCI:0000:3b:00): 48, DBE";
        assert!(r.on_record(&entry(9, line)).is_none());
        assert!(r.on_record(&entry(10, line)).is_none());
        assert!(r.on_record(&entry(15, line)).is_some());
        assert_eq!(r.counters.stats().records_lost, 4);
        assert_eq!(r.counters.stats().records_read, 3);
    }

    #[test]
    fn records_overwritten_while_stopped_are_lost() {
        // Saved cursor 100; the oldest record still in the ring is 150: 101..=149 were lost.
        let mut r = reader(Some(100));
        assert!(r.on_record(&entry(150, "usb 1-1: new device")).is_none());
        assert_eq!(r.counters.stats().records_lost, 49);
        // The ring still holds records from before the cursor: nothing lost.
        let mut r = reader(Some(100));
        r.on_record(&entry(3, "early boot"));
        r.on_record(&entry(4, "early boot"));
        assert_eq!(r.counters.stats().records_lost, 0);
    }

    #[test]
    fn userspace_fault_lines_count_only_as_drills_or_when_accepted() {
        let forged = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.";
        let user = |seq, message: &str| Record {
            facility: 1,
            ..entry(seq, message)
        };
        let mut r = reader(None);
        assert!(
            r.on_record(&user(1, forged)).is_none(),
            "forged by userspace"
        );
        assert!(r.on_record(&user(2, "plain noise")).is_none());
        assert_eq!(
            r.counters.stats().records_ignored,
            1,
            "only fault lines count"
        );
        // The old fixed mark is a forgery; a genuine mark counts, once.
        assert!(r
            .on_record(&user(3, &format!("{forged} (injected by gpu-agent)")))
            .is_none());
        let drill = crate::drill::mark(b"test-key", forged);
        let report = r.on_record(&user(3, &drill)).expect("a gpu-agent drill");
        assert!(report.drill, "reported as a drill");
        assert!(r.on_record(&user(3, &drill)).is_none(), "a replayed drill");
        let long_ago = std::time::SystemTime::now() - Duration::from_secs(600);
        let stale = crate::drill::mark_at(b"test-key", forged, long_ago);
        assert!(r.on_record(&user(3, &stale)).is_none(), "a stale drill");
        assert!(r.on_record(&entry(4, forged)).is_some(), "the kernel's own");
        r.settings.accept_userspace = true;
        assert!(r.on_record(&user(5, forged)).is_some(), "replay rig");
    }

    /// Review 2026-12-03b L1: the newest drill nonce lived in memory only, so after an
    /// agent restart a genuine drill line copied from `dmesg` counted again.
    #[test]
    fn a_drill_read_before_a_restart_never_counts_again() {
        let body = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.";
        let drill = Record {
            facility: 1,
            ..entry(3, &crate::drill::mark(b"test-key", body))
        };
        // The restarted reader resumes after record 3, which it reads again from the ring.
        let mut r = reader(Some(3));
        assert!(r.on_record(&drill).is_none(), "before the cursor");
        let copy = Record { seq: 9, ..drill };
        assert!(
            r.on_record(&copy).is_none(),
            "a copy written after the restart"
        );
    }

    #[test]
    fn unparsed_records_are_counted() {
        let mut r = reader(None);
        r.on_unparsed(&record::RecordError::NoMessage);
        r.on_unparsed(&record::RecordError::NoMessage);
        assert_eq!(r.counters.stats().records_unparsed, 2);
    }

    #[test]
    fn sxid_follow_ups_detail_their_head_or_stand_alone() {
        let mut r = reader(None);
        let head = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 27";
        let severity =
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Severity 0 Engine instance 27";
        let data = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Data {0x0, 0x1}";
        assert!(r.on_record(&entry(1, head)).is_some());
        assert!(
            r.on_record(&entry(2, severity)).is_none(),
            "details the head"
        );
        assert!(r.on_record(&entry(3, data)).is_none(), "details the head");
        // Head not seen (overwritten, or before the cursor): the follow-up is the event,
        // classified by the catalog; its own further follow-ups detail it.
        let mut r = reader(None);
        let fatal = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Severity 1 Engine instance 48 Sub-engine instance 00";
        let report = r.on_record(&entry(40, fatal)).expect("reported alone");
        assert_eq!(report.code, FaultCode::Sxid(20034));
        assert_eq!(report.class.severity, Severity::Fatal, "{:?}", report.class);
        assert!(r
            .on_record(&entry(
                41,
                "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Data {0x1}"
            ))
            .is_none());
    }

    #[test]
    fn a_fallen_off_the_bus_notice_over_several_records_is_joined() {
        // As printed by recent drivers: the GPU named in one record, the verdict in the next
        // (source: GPUd PR #1209; a PCI-passthrough report quoting the same two lines).
        let mut r = reader(None);
        let head = "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1e07) installed in this";
        let tail = "NVRM: system has fallen off the bus and is not responding to commands.";
        assert!(r.on_record(&entry(10, head)).is_none());
        let report = r.on_record(&entry(11, tail)).expect("joined");
        assert_eq!(report.code, FaultCode::FallenOffBus);
        assert_eq!(
            report.component,
            Component::Gpu {
                pci: "0000:01:00.0".parse().expect("pci")
            }
        );
        // A tail with no GPU named before it is nobody's.
        let mut r = reader(None);
        assert!(r.on_record(&entry(20, tail)).is_none());
        // One record with the newline escaped by the kernel.
        let one = format!("{head}\\x0a{tail}");
        let report = r.on_record(&entry(21, &one)).expect("one record");
        assert!(!report.detail.contains("\\x0a"), "{}", report.detail);
    }

    #[test]
    fn long_details_are_truncated_on_a_char_boundary() {
        let long = "é".repeat(400);
        let t = truncate(&long, MAX_DETAIL);
        assert!(t.len() <= MAX_DETAIL + "…".len());
    }
}
