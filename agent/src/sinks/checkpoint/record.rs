//! What the checkpoint sink remembers across restarts (`<state_dir>/checkpoint.json`), and
//! the one-signal-per-incident rule.
//!
//! - Every notice acted on is remembered by id: a restarted agent never acts on it again.
//! - The last *ending* signalled (Spot, scheduled maintenance, Capacity Block, shutdown) with
//!   the processes it signalled: a later ending within `ending_window` is the same ending of
//!   the same instance (the shutdown two minutes after a Spot notice) and covers them: they
//!   are not signalled again.
//! - The last fatal-fault incident likewise, within `incident_window` (an Xid 79, NVML's GPU
//!   lost and the bus line are one incident; a flap is too).
//!
//! The record is saved right after signalling, before anything else: if the agent dies
//! between the signal and the save (milliseconds), a restart signals that notice once more.

use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::model::{Notice, NoticeKind};

/// Notice ids remembered (most recent).
const REMEMBERED: usize = 256;

/// One signalling: which notice, when, and the processes signalled (PID, start time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sent {
    /// The notice id.
    pub id: String,
    /// When the signals went out.
    #[serde(with = "crate::model::time")]
    pub at: SystemTime,
    /// `(pid, start time)` of each process signalled.
    pub targets: Vec<(i32, u64)>,
}

/// How long one signalling covers later notices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// For a later ending of the instance.
    pub ending: Duration,
    /// For a later fatal fault.
    pub incident: Duration,
}

/// The sink's memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Notice ids acted on.
    signalled: Vec<String>,
    /// The last ending signalled.
    #[serde(default)]
    last_ending: Option<Sent>,
    /// The last fatal-fault incident signalled.
    #[serde(default)]
    last_fatal: Option<Sent>,
    /// Pods whose processes were signalled ahead of a notice, on their own declared lead,
    /// before the notice is acted on for the node.
    #[serde(default)]
    early: Vec<Early>,
}

/// The pods signalled ahead of one notice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Early {
    /// The notice id.
    notice: String,
    /// Their pod UIDs.
    pods: Vec<String>,
    /// `(pid, start time)` of each process signalled.
    targets: Vec<(i32, u64)>,
}

/// Notices with pods signalled ahead remembered at once.
const EARLY_REMEMBERED: usize = 16;

impl Record {
    /// Load `path`; a missing or unreadable file is an empty record.
    pub fn load(path: &Path) -> Self {
        crate::fsutil::read_json_or_backup(path, "signalled notices", |_: &Self| Ok(()))
            .unwrap_or_default()
    }

    /// Save to `path` atomically (blocking: call it on the blocking pool). A failure is the
    /// caller's to surface (`status`, the metric), since a restart may then signal a notice
    /// again.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        crate::fsutil::write_json(path, self, None).map_err(|e| e.to_string())
    }

    /// Was `id` acted on?
    pub fn done(&self, id: &str) -> bool {
        self.signalled.iter().any(|s| s == id)
    }

    /// The signalling that covers `notice` at `now`, if one does.
    pub fn covering(&self, notice: &Notice, now: SystemTime, windows: Windows) -> Option<&Sent> {
        let (last, window) = if notice.kind.ends_instance() {
            (self.last_ending.as_ref(), windows.ending)
        } else if notice.kind == NoticeKind::FatalFault {
            (self.last_fatal.as_ref(), windows.incident)
        } else {
            return None;
        };
        last.filter(|sent| {
            sent.id != notice.id
                && now
                    .duration_since(sent.at)
                    .is_ok_and(|since| since <= window)
        })
    }

    /// Remember that `notice` was acted on, with `sent`: what was signalled for it (for a
    /// covered notice, the covering signalling's targets plus any new ones).
    pub fn remember(&mut self, notice: &Notice, sent: Sent) {
        self.early.retain(|e| e.notice != notice.id);
        self.signalled.push(notice.id.clone());
        if self.signalled.len() > REMEMBERED {
            self.signalled.remove(0);
        }
        if notice.kind.ends_instance() {
            self.last_ending = Some(sent);
        } else if notice.kind == NoticeKind::FatalFault {
            self.last_fatal = Some(sent);
        }
    }

    /// The pods signalled ahead of notice `id`, and their processes.
    pub fn early(&self, id: &str) -> (&[String], &[(i32, u64)]) {
        self.early
            .iter()
            .find(|e| e.notice == id)
            .map_or((&[], &[]), |e| (e.pods.as_slice(), e.targets.as_slice()))
    }

    /// Remember `targets`, signalled for notice `id` after its first round (their files
    /// answered late): with its early pods' while the notice waits for the node's time, else
    /// with the signalling `sent` (its own or the one covering it).
    pub fn remember_late(&mut self, id: &str, sent: &str, targets: &[(i32, u64)]) {
        if !self.done(id) {
            self.remember_early(id, &[], targets);
            return;
        }
        for last in [&mut self.last_ending, &mut self.last_fatal]
            .into_iter()
            .flatten()
        {
            if last.id == sent {
                last.targets.extend(targets.iter().copied());
            }
        }
    }

    /// Remember that `pods` of notice `id` were signalled ahead (`targets`).
    pub fn remember_early(&mut self, id: &str, pods: &[String], targets: &[(i32, u64)]) {
        let at = match self.early.iter().position(|e| e.notice == id) {
            Some(at) => at,
            None => {
                if self.early.len() >= EARLY_REMEMBERED {
                    self.early.remove(0);
                }
                self.early.push(Early {
                    notice: id.to_string(),
                    ..Early::default()
                });
                self.early.len() - 1
            }
        };
        let entry = &mut self.early[at];
        entry.pods.extend(pods.iter().cloned());
        entry.targets.extend(targets.iter().copied());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SourceKind;

    fn notice(id: &str, kind: NoticeKind) -> Notice {
        Notice {
            id: id.into(),
            kind,
            deadline: SystemTime::UNIX_EPOCH,
            detail: String::new(),
            source: SourceKind::Imds,
        }
    }

    const WINDOWS: Windows = Windows {
        ending: Duration::from_secs(3600),
        incident: Duration::from_secs(600),
    };

    #[test]
    fn one_ending_one_signal_and_one_incident_one_signal() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut r = Record::default();
        let spot = notice("spot:1", NoticeKind::Spot);
        assert!(r.covering(&spot, t0, WINDOWS).is_none());
        let sent = Sent {
            id: spot.id.clone(),
            at: t0,
            targets: vec![(42, 7)],
        };
        r.remember(&spot, sent.clone());
        assert!(r.done("spot:1"));
        // The shutdown two minutes later: covered by the Spot signal.
        let shutdown = notice("shutdown:1", NoticeKind::Shutdown);
        let later = t0 + Duration::from_secs(120);
        assert_eq!(r.covering(&shutdown, later, WINDOWS), Some(&sent));
        // A rebalance recommendation is not an ending; a fatal fault is another incident.
        assert!(r
            .covering(&notice("r", NoticeKind::Rebalance), later, WINDOWS)
            .is_none());
        assert!(r
            .covering(&notice("f", NoticeKind::FatalFault), later, WINDOWS)
            .is_none());
        // Past the window: a new ending.
        let much_later = t0 + Duration::from_secs(3601);
        assert!(r.covering(&shutdown, much_later, WINDOWS).is_none());

        // Fatal faults: the second within ten minutes is the same incident.
        let xid = notice("fatal-fault:GPU 1 Xid 79", NoticeKind::FatalFault);
        r.remember(
            &xid,
            Sent {
                id: xid.id.clone(),
                at: t0,
                targets: Vec::new(),
            },
        );
        let lost = notice("fatal-fault:GPU 1 gpu-lost", NoticeKind::FatalFault);
        assert!(r
            .covering(&lost, t0 + Duration::from_secs(5), WINDOWS)
            .is_some());
        assert!(r
            .covering(&lost, t0 + Duration::from_secs(601), WINDOWS)
            .is_none());
    }

    #[test]
    fn an_old_record_file_still_loads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("checkpoint.json");
        std::fs::write(&path, r#"{"signalled": ["spot:1"]}"#).expect("write");
        let r = Record::load(&path);
        assert!(r.done("spot:1") && r.last_ending.is_none());
        r.save(&path).expect("save");
        assert_eq!(Record::load(&path), r);
    }

    /// Issue 22 (Low): a corrupt file loaded silently as empty.
    #[test]
    fn a_corrupt_record_falls_back_to_its_backup_and_is_kept_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("checkpoint.json");
        let mut record = Record::default();
        let sent = |id: &str| Sent {
            id: id.into(),
            at: SystemTime::UNIX_EPOCH,
            targets: Vec::new(),
        };
        record.remember(&notice("spot-1", NoticeKind::Spot), sent("spot-1"));
        record.save(&path).expect("save");
        record.remember(&notice("spot-2", NoticeKind::Spot), sent("spot-2"));
        record.save(&path).expect("save");
        std::fs::write(&path, b"{ half").expect("corrupt it");
        let loaded = Record::load(&path);
        assert!(loaded.done("spot-1"), "the backup's notices");
        assert!(path.with_extension("corrupt").exists(), "kept for a look");
    }
}
