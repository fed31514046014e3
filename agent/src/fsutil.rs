//! Writing files so that a crash never leaves a half-written one.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Why a file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {source}")]
pub struct WriteError {
    /// The file (or its temporary sibling) that failed.
    pub path: PathBuf,
    /// The I/O error.
    pub source: std::io::Error,
}

/// Write `value` as pretty JSON (with a final newline) through [`write_atomic`], creating the
/// directory first; with `mode`, the file has that mode from the moment it appears (never
/// the process umask's). The error names the file.
pub fn write_json(
    path: &Path,
    value: &impl serde::Serialize,
    mode: Option<u32>,
) -> Result<(), String> {
    let mut body =
        serde_json::to_vec_pretty(value).map_err(|e| format!("{}: {e}", path.display()))?;
    body.push(b'\n');
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    write_atomic_mode(path, &body, mode).map_err(|e| e.to_string())
}

/// Replace `path` with `contents` atomically: write a temporary sibling, fsync it, keep the
/// old file as `<path>.bak`, rename the new one into place and fsync the directory. A crash
/// at any point leaves either the old or the new file, never a mix.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), WriteError> {
    write_atomic_mode(path, contents, None)
}

/// [`write_atomic`], the temporary file set to `mode` (if given) before it is renamed into
/// place.
fn write_atomic_mode(path: &Path, contents: &[u8], mode: Option<u32>) -> Result<(), WriteError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WriteError { path, source }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp).map_err(err(&tmp))?;
        if let Some(mode) = mode {
            file.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(err(&tmp))?;
        }
        file.write_all(contents).map_err(err(&tmp))?;
        file.sync_all().map_err(err(&tmp))?;
        if path.exists() {
            let backup = backup_path(path);
            // A hard link keeps the old contents reachable across the rename.
            let _ = std::fs::remove_file(&backup);
            std::fs::hard_link(path, &backup).map_err(err(&backup))?;
        }
        failpoint_before_rename(&tmp, path);
        std::fs::rename(&tmp, path).map_err(err(path))?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(err(dir))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Test-only failpoint: with `GPU_AGENT_FAILPOINT=pause-before-rename` (every file) or
/// `pause-before-rename:<file name>` (that one: a state disk that hangs under one writer)
/// the writer announces the written temporary file on stderr and stops there for a minute,
/// so a test can kill it mid-write or watch what goes on without it.
fn failpoint_before_rename(tmp: &Path, path: &Path) {
    let Some(point) = std::env::var_os("GPU_AGENT_FAILPOINT") else {
        return;
    };
    let point = point.to_string_lossy();
    let hit = match point.strip_prefix("pause-before-rename") {
        Some("") => true,
        Some(only) => only
            .strip_prefix(':')
            .is_some_and(|name| path.file_name().is_some_and(|n| n == name)),
        None => false,
    };
    if hit {
        eprintln!("failpoint: paused before renaming {}", tmp.display());
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

/// Read `path` as JSON, else the backup [`write_atomic`] keeps. A file that is missing or
/// unreadable is passed over; one that does not parse is moved aside to `<file>.corrupt` and
/// named; one `accept` refuses (a format it does not know) is passed over with its reason.
/// `what` names the contents in the log. Blocking.
pub fn read_json_or_backup<T: serde::de::DeserializeOwned>(
    path: &Path,
    what: &str,
    accept: impl Fn(&T) -> Result<(), String>,
) -> Option<T> {
    for candidate in [path.to_path_buf(), backup_path(path)] {
        let bytes = match std::fs::read(&candidate) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                tracing::warn!(path = %candidate.display(), error = %e, "Cannot read the {what}.");
                continue;
            }
        };
        match serde_json::from_slice::<T>(&bytes) {
            Ok(value) => match accept(&value) {
                Ok(()) => return Some(value),
                Err(why) => {
                    tracing::warn!(path = %candidate.display(), %why, "The {what} file is ignored.");
                }
            },
            Err(e) => {
                let aside = candidate.with_extension("corrupt");
                tracing::warn!(path = %candidate.display(), error = %e, moved_to = %aside.display(), "The {what} file is corrupt; moved aside, trying the backup.");
                let _ = std::fs::rename(&candidate, &aside);
            }
        }
    }
    None
}

/// Where [`write_atomic`] keeps the previous version.
pub fn backup_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".bak");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_and_keeps_a_backup() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        write_atomic(&path, b"one").expect("first write");
        assert!(!backup_path(&path).exists());
        write_atomic(&path, b"two").expect("second write");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        assert_eq!(
            std::fs::read(backup_path(&path)).expect("read backup"),
            b"one"
        );
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn failure_names_the_path_and_leaves_no_temp() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("missing-dir/state.json");
        let e = write_atomic(&path, b"x").expect_err("no such dir");
        assert!(e.to_string().contains("missing-dir"));
    }
}
