//! `/dev/kmsg` records and the one reader that `run` and `check` share.
//!
//! A record is `PRIORITY,SEQUENCE,MICROSECONDS,FLAGS[,...];MESSAGE`, followed by optional
//! continuation lines (` KEY=value`, dictionary data) that carry no header. The priority is
//! `facility * 8 + level` and userspace may write any facility (journald's
//! `ForwardToKMsg=yes`, loggers writing `<134>...` get local0..local7), so the header is
//! parsed here rather than through rmesg, whose facility enum stops at 11 and turned such a
//! record into a read error. A record that cannot be parsed is skipped and counted; only I/O
//! errors concern the reader.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

/// The kernel's own facility: printk lines (NVRM, nvidia-nvswitch). Userspace can never
/// write it: a `<0>` or missing prefix becomes facility 1 (user).
pub const KERNEL_FACILITY: u32 = 0;

/// One kernel-log record's header and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Syslog facility (0 = kernel).
    pub facility: u32,
    /// Syslog level (0 = emerg .. 7 = debug).
    pub level: u8,
    /// The kernel's sequence number.
    pub seq: u64,
    /// Time since boot.
    pub since_boot: Duration,
    /// The message (the kernel escapes non-printable bytes, newlines included, as `\xNN`).
    pub message: String,
}

/// Why a line is not a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// No `;` between header and message.
    #[error("no ';' after the record header")]
    NoMessage,
    /// A header field is not a number.
    #[error("header field {field} is not a number: {value:?}")]
    Field {
        /// `priority`, `sequence` or `timestamp`.
        field: &'static str,
        /// What was there.
        value: String,
    },
}

/// Parse one record line (without its trailing newline).
pub fn parse(line: &str) -> Result<Record, RecordError> {
    let (header, message) = line.split_once(';').ok_or(RecordError::NoMessage)?;
    let mut fields = header.split(',');
    let mut number = |field: &'static str| {
        let value = fields.next().unwrap_or_default();
        value.parse::<u64>().map_err(|_| RecordError::Field {
            field,
            value: value.chars().take(32).collect(),
        })
    };
    let priority = number("priority")?;
    let seq = number("sequence")?;
    let usec = number("timestamp")?;
    Ok(Record {
        facility: u32::try_from(priority >> 3).unwrap_or(u32::MAX),
        level: (priority & 7) as u8,
        seq,
        since_boot: Duration::from_micros(usec),
        message: message.to_string(),
    })
}

/// What one step of the reader gives.
#[derive(Debug)]
pub enum Next {
    /// A record.
    Record(Record),
    /// A line that is not a record (its error); the caller counts it.
    Unparsed(RecordError),
    /// The kernel overwrote records before they were read (`EPIPE`); reading goes on from the
    /// oldest surviving record, and the sequence gap says how many were lost.
    Overrun,
    /// Nothing more now: end of a dump file, or no record waiting on a non-blocking open.
    End,
}

/// Reads records from `/dev/kmsg` (one record per `read(2)`) or from a file holding a dump of
/// it (arbitrary chunks), the same way.
#[derive(Debug)]
pub struct Reader {
    file: File,
    buf: Vec<u8>,
    pending: String,
}

/// Larger than the longest record the kernel hands out (a smaller buffer gets `EINVAL`).
const READ_BUFFER: usize = 16 * 1024;

impl Reader {
    /// Open `path`; `blocking = false` makes `read_next` return [`Next::End`] when no record waits.
    pub fn open(path: &Path, blocking: bool) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let flags = if blocking {
            0
        } else {
            rustix::fs::OFlags::NONBLOCK.bits() as i32
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path)?;
        Ok(Self::from_file(file))
    }

    /// Read records from an open file (a dump of the log, or one held in memory).
    pub fn from_file(file: File) -> Self {
        Self {
            file,
            buf: vec![0; READ_BUFFER],
            pending: String::new(),
        }
    }

    /// The next record, skipping continuation lines. Errors are I/O errors other than an
    /// overrun.
    pub fn read_next(&mut self) -> std::io::Result<Next> {
        loop {
            while let Some(end) = self.pending.find('\n') {
                let line: String = self.pending.drain(..=end).collect();
                let line = line.trim_end_matches('\n');
                // Continuation lines (` KEY=value`) and blank lines belong to the record before.
                if line.is_empty() || line.starts_with(' ') {
                    continue;
                }
                return Ok(match parse(line) {
                    Ok(record) => Next::Record(record),
                    Err(e) => Next::Unparsed(e),
                });
            }
            match self.file.read(&mut self.buf) {
                Ok(0) => return Ok(Next::End),
                Ok(n) => self
                    .pending
                    .push_str(&String::from_utf8_lossy(&self.buf[..n])),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Next::End),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::PIPE.raw_os_error()) => {
                    return Ok(Next::Overrun)
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_and_userspace_headers() {
        let r = parse("4,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1").expect("record");
        assert_eq!(
            (r.facility, r.level, r.seq, r.since_boot),
            (0, 4, 1234, Duration::from_micros(5_678_901))
        );
        assert_eq!(r.message, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1");
        // local0.info, as journald's ForwardToKMsg or `logger` writes: rmesg rejected it.
        let r = parse("134,77,1,-;systemd[1]: Started foo.").expect("record");
        assert_eq!((r.facility, r.level), (16, 6));
        // Extra header fields (caller id on newer kernels) are ignored.
        let r = parse("6,9,10,-,caller=T1;hello").expect("record");
        assert_eq!(r.message, "hello");
        // The message may hold ';' and ','.
        assert_eq!(parse("6,9,10,-;a;b,c").expect("record").message, "a;b,c");
    }

    #[test]
    fn malformed_headers_are_errors_not_panics() {
        assert_eq!(parse("no header here"), Err(RecordError::NoMessage));
        assert!(matches!(
            parse("x,1,2,-;m"),
            Err(RecordError::Field {
                field: "priority",
                ..
            })
        ));
        assert!(matches!(
            parse("6,,2,-;m"),
            Err(RecordError::Field {
                field: "sequence",
                ..
            })
        ));
        assert!(matches!(
            parse("6,1;m"),
            Err(RecordError::Field {
                field: "timestamp",
                ..
            })
        ));
        assert!(parse("99999999999999999999999,1,2,-;m").is_err());
    }

    #[test]
    fn a_dump_file_reads_like_the_device() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kmsg");
        std::fs::write(
            &path,
            "6,1,10,-;first\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\ngarbage line\n134,2,20,-;second\n",
        )
        .expect("write");
        let mut reader = Reader::open(&path, true).expect("open");
        let mut seen = Vec::new();
        loop {
            match reader.read_next().expect("read") {
                Next::Record(r) => seen.push(format!("{}:{}", r.seq, r.message)),
                Next::Unparsed(_) => seen.push("unparsed".into()),
                Next::Overrun => seen.push("overrun".into()),
                Next::End => break,
            }
        }
        assert_eq!(seen, ["1:first", "unparsed", "2:second"]);
    }
}
