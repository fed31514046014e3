//! The drill mark: what makes a userspace kernel-log record written by `gpu-agent inject`
//! count as a fault, and nothing else. Any root process (or a privileged pod) can write
//! kernel-log records, so a fixed mark could be forged to condemn a node. The mark carries a
//! nonce and an HMAC-SHA256 of the nonce and the line, keyed by a per-boot secret in the
//! root-only state directory (`<state_dir>/drill.key`): only a process that can read that
//! file can mark a line, a marked line cannot be changed, and a line seen before (its nonce
//! no newer than the last accepted, or than any drill the kernel log still holds from before
//! an agent restart) is a replay and does not count, nor does one marked more than two
//! minutes from when the agent reads it.

use std::path::Path;

use ring::hmac;

/// The mark's fixed part: `<line> (injected by gpu-agent <nonce>:<mac>)`.
pub const MARK: &str = "(injected by gpu-agent";

/// Bytes of the HMAC kept in the mark (128 bits).
const MAC_BYTES: usize = 16;

/// Why the drill key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum DrillError {
    /// Reading or writing the key failed.
    #[error("drill key {path}: {source}")]
    Io {
        /// The key file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Who asks for the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The daemon: a key made in another boot is replaced (old drills stop counting).
    Daemon,
    /// `gpu-agent inject`: the daemon's key, whatever boot it names (a process may see
    /// another boot id than the service does: systemd-nspawn gives a container's processes
    /// a boot id of its own); made only when there is none.
    Drill,
    /// `gpu-agent check`: the daemon's key as it is, whatever boot it names; never made or
    /// replaced (a one-shot check must not rotate the running daemon's key).
    Reader,
}

/// The drill key in `<state_dir>/drill.key`; made (from the kernel's random source) and
/// saved, 0600 from its creation, when there is none, or, for the daemon, when it was made in
/// another boot. A [`Holder::Reader`] gets `NotFound` where there is no key to read.
pub fn key(state_dir: &Path, boot_id: &str, holder: Holder) -> Result<Vec<u8>, DrillError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = state_dir.join("drill.key");
    let io = |source| DrillError::Io {
        path: path.clone(),
        source,
    };
    if let Ok(text) = std::fs::read_to_string(&path) {
        if let Some((boot, hex)) = text.trim().split_once(' ') {
            if boot == boot_id || holder != Holder::Daemon {
                if let Some(key) = from_hex(hex) {
                    return Ok(key);
                }
            }
        }
    }
    if holder == Holder::Reader {
        return Err(io(std::io::Error::from(std::io::ErrorKind::NotFound)));
    }
    let mut key = vec![0u8; 32];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").map_err(io)?,
        &mut key,
    )
    .map_err(io)?;
    std::fs::create_dir_all(state_dir).map_err(io)?;
    let tmp = state_dir.join(".drill.key.tmp");
    // A temp file an earlier run left may have any mode: it goes, and the new one is made
    // 0600 (`O_CREAT | O_EXCL`, which follows no link), never readable under the umask.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    file.write_all(format!("{boot_id} {}\n", to_hex(&key)).as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(key)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    text.len()
        .is_multiple_of(2)
        .then(|| {
            (0..text.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
                .collect()
        })
        .flatten()
}

fn mac(key: &[u8], nonce: u128, body: &str) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    let tag = hmac::sign(&key, format!("{nonce}|{body}").as_bytes());
    to_hex(&tag.as_ref()[..MAC_BYTES])
}

/// `body` with its drill mark (the nonce: nanoseconds since the epoch, fresh per line).
pub fn mark(key: &[u8], body: &str) -> String {
    mark_at(key, body, std::time::SystemTime::now())
}

/// `body` with the drill mark it would have been given at `at`.
pub fn mark_at(key: &[u8], body: &str, at: std::time::SystemTime) -> String {
    let nonce = at
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{body} {MARK} {nonce}:{})", mac(key, nonce, body))
}

/// The nonce of a line whose drill mark is genuine; `None` for an unmarked, forged or
/// altered line.
pub fn verify(key: &[u8], message: &str) -> Option<u128> {
    let message = message.trim_end();
    let at = message.rfind(MARK)?;
    let body = message[..at].trim_end();
    let rest = message[at + MARK.len()..].trim().strip_suffix(')')?;
    let (nonce, tag) = rest.split_once(':')?;
    let nonce: u128 = nonce.parse().ok()?;
    let expected = mac(key, nonce, body);
    // Compared in constant time: every byte, whatever differs first.
    let differ = expected
        .bytes()
        .zip(tag.bytes())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    (expected.len() == tag.len() && differ == 0).then_some(nonce)
}

/// Whether a message carries a drill mark at all (genuine or not).
pub fn is_marked(message: &str) -> bool {
    message.contains(MARK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_keys_holder_marks_a_line_and_it_cannot_be_changed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key_a = key(dir.path(), "boot-1", Holder::Daemon).expect("key");
        assert_eq!(
            key(dir.path(), "boot-1", Holder::Daemon).expect("same boot"),
            key_a
        );
        // A drill uses the daemon's key even where it sees another boot id.
        assert_eq!(
            key(dir.path(), "container-boot", Holder::Drill).expect("drill"),
            key_a
        );
        let body = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=gpu-agent-inject, GPU has fallen off the bus.";
        let line = mark(&key_a, body);
        assert!(verify(&key_a, &line).is_some(), "{line}");
        // The old fixed mark, and a mark copied onto another line, are forgeries.
        assert!(verify(&key_a, &format!("{body} (injected by gpu-agent)")).is_none());
        let copied = line.replace(": 79,", ": 48,");
        assert!(verify(&key_a, &copied).is_none());
        // `check` reads the key, whatever boot it names, and never replaces it.
        assert_eq!(
            key(dir.path(), "container-boot", Holder::Reader).expect("reader"),
            key_a
        );
        let empty = tempfile::tempdir().expect("tempdir");
        assert!(key(empty.path(), "boot-1", Holder::Reader).is_err());
        assert!(
            !empty.path().join("drill.key").exists(),
            "a reader makes none"
        );
        // A new boot, a new key: yesterday's drills do not verify.
        let key_b = key(dir.path(), "boot-2", Holder::Daemon).expect("key");
        assert_ne!(key_a, key_b);
        assert!(verify(&key_b, &line).is_none());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("drill.key"))
            .expect("key file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
