//! The current ending as a file, for trainers that poll instead of taking a signal (Ray,
//! Metaflow-style loops, rank-0-only callbacks): `[checkpoint] notice_file`, by default
//! `/run/gpu-agent/notice.json`, world-readable, replaced atomically, and absent when nothing
//! is pending. It appears when the ending is acted on (the moment the signal goes out), so a
//! loop that checkpoints when it exists checkpoints once, in time.

use std::path::Path;
use std::time::SystemTime;

use serde::Serialize;

use crate::model::Notice;

/// What the file holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Contents {
    /// The notice's stable id (the same ending keeps it).
    pub id: String,
    /// `spot`, `scheduled-maintenance`, `capacity-block` or `shutdown`.
    pub kind: String,
    /// When the instance goes (RFC 3339).
    #[serde(with = "crate::model::time")]
    pub deadline: SystemTime,
    /// The same, in seconds since the epoch.
    pub deadline_unix: u64,
    /// Seconds left when the file was written (compute it afresh from `deadline_unix`).
    pub seconds_left: u64,
    /// The notice's own words.
    pub detail: String,
    /// The checkpoint signal sent to handlers.
    pub signal: String,
    /// Where to confirm the checkpoint: write `done` (or its path) to `<ack_dir>/<pid>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack_dir: Option<std::path::PathBuf>,
    /// When the file was written (RFC 3339).
    #[serde(with = "crate::model::time")]
    pub written_at: SystemTime,
}

impl Contents {
    /// For `notice`, at `now`.
    pub fn new(notice: &Notice, signal: &str, ack_dir: Option<&Path>, now: SystemTime) -> Self {
        let unix = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        };
        Self {
            id: notice.id.clone(),
            kind: notice.kind.name().into(),
            deadline: notice.deadline,
            deadline_unix: unix(notice.deadline),
            seconds_left: notice
                .deadline
                .duration_since(now)
                .map_or(0, |d| d.as_secs()),
            detail: notice.detail.clone(),
            signal: signal.into(),
            ack_dir: ack_dir.map(Path::to_path_buf),
            written_at: now,
        }
    }
}

/// The `id|deadline_unix` of the ending a file left by an earlier run names, if any.
pub fn key_on_disk(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(format!(
        "{}|{}",
        value["id"].as_str()?,
        value["deadline_unix"].as_u64()?
    ))
}

/// Write `contents` to `path` (0644, atomically), or remove the file for `None`. Blocking:
/// call it on the blocking pool.
pub fn write(path: &Path, contents: Option<&Contents>) {
    use std::os::unix::fs::PermissionsExt;
    let result = match contents {
        Some(c) => {
            // A directory the agent makes is readable by trainers (the agent's umask is 0077).
            if let Some(dir) = path.parent().filter(|d| !d.exists()) {
                let _ = std::fs::create_dir_all(dir).and_then(|()| {
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                });
            }
            // 0644 from the moment it appears: a trainer polling for it never meets a file it
            // cannot read.
            crate::fsutil::write_json(path, c, Some(0o644))
        }
        // The atomic write keeps the previous version beside it: that goes too, first, so
        // once the file is gone no copy of the ending is left.
        None => [crate::fsutil::backup_path(path), path.to_path_buf()]
            .iter()
            .map(std::fs::remove_file)
            .find_map(|r| r.err().filter(|e| e.kind() != std::io::ErrorKind::NotFound))
            .map_or(Ok(()), |e| Err(e.to_string())),
    };
    if let Err(e) = result {
        tracing::warn!(path = %path.display(), error = %e, "Cannot update the notice file.");
    }
}

/// Keep `path` in line with the earliest ending acted on (absent when there is none; one an
/// earlier run left stays while `keep_inherited` and no ending is known).
pub(super) async fn update(
    path: &std::path::Path,
    settings: &super::Settings,
    snapshot: &crate::model::HealthSnapshot,
    record: &super::Record,
    written: &mut Option<String>,
    keep_inherited: bool,
) {
    let ending = snapshot
        .notices
        .iter()
        .filter(|n| n.kind.ends_instance() && record.done(&n.id))
        .min_by_key(|n| n.deadline);
    let key = ending.map(|n| {
        let unix = n
            .deadline
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        format!("{}|{unix}", n.id)
    });
    if key == *written {
        return;
    }
    if key.is_none() && keep_inherited {
        return;
    }
    let contents = ending.map(|n| {
        Contents::new(
            n,
            &crate::model::signal::name(settings.selection.signal),
            settings.ack_dir.as_deref(),
            SystemTime::now(),
        )
    });
    let path = path.to_path_buf();
    let _ = tokio::task::spawn_blocking(move || write(&path, contents.as_ref())).await;
    *written = key;
}
