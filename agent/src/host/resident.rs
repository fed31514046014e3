//! Hand back what start-up touched: once the daemon has settled, the pages of the agent's
//! own program are unmapped from it (`madvise(MADV_DONTNEED)`), so that code that ran once
//! (parsing the config, building clients, the first poll of each source) does not stay in
//! its resident set for the life of the node. What the idle loop needs is mapped again on
//! its next use: the working set, not the start-up set, stays resident.
//!
//! Only mappings that hold nothing but the file's own bytes are advised: the program's
//! read-only and executable mappings with no anonymous (copy-on-write) page, as
//! `/proc/self/smaps` says. Dropping those loses nothing: the pages stay in the page cache,
//! clean and mapped by no one (the first the kernel reclaims under pressure), and come back
//! by a minor fault in microseconds. Not `MADV_PAGEOUT`, which also evicts them from the page
//! cache: the first fault after it read its code back from the disk, 25 ms to 1.3 s on this
//! project's test machine, and a fatal Xid must reach the node condition in milliseconds.
//! Writable mappings and the relocated read-only data (RELRO) are never touched.

use std::path::{Path, PathBuf};

/// Why the pages could not be handed back.
#[derive(Debug, thiserror::Error)]
pub enum ResidentError {
    /// `/proc/self/maps` or `/proc/self/exe` could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// `/proc/self/smaps` lists no clean mapping of the program to hand back.
    #[error("no clean mapping of {0} in /proc/self/smaps")]
    NoMappings(PathBuf),
    /// The kernel refused the advice.
    #[error("madvise(MADV_DONTNEED) failed: {0}")]
    Advise(rustix::io::Errno),
}

/// What one hand-back did, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedOut {
    /// The process's resident set before, KiB.
    pub rss_before_kib: u64,
    /// And after, KiB.
    pub rss_after_kib: u64,
    /// Bytes of the program's mappings advised.
    pub advised: usize,
}

/// One mapping of `/proc/self/smaps`: its address range, permissions, path and how much of
/// it is anonymous (copied on write: relocated, or written).
#[derive(Debug, PartialEq, Eq)]
struct Mapping<'a> {
    start: usize,
    end: usize,
    perms: &'a str,
    path: &'a str,
    anonymous_kib: u64,
}

/// Parse a mapping's header line (`start-end perms offset dev inode path`); `None` for
/// anonymous mappings and lines that are not headers.
fn parse_header(line: &str) -> Option<Mapping<'_>> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    let path = fields.nth(3)?.trim_start();
    (!path.is_empty()).then_some(())?;
    Some(Mapping {
        start,
        end,
        perms,
        path,
        // Unknown until its `Anonymous:` line says.
        anonymous_kib: u64::MAX,
    })
}

/// The mappings of `exe` in a smaps file's text that hold only the file's bytes: not
/// writable, no anonymous page. A program replaced on disk by an upgrade is listed with
/// ` (deleted)` after its path.
fn clean_program_mappings<'a>(smaps: &'a str, exe: &Path) -> Vec<Mapping<'a>> {
    let exe = exe.to_string_lossy();
    let mut all: Vec<Mapping<'a>> = Vec::new();
    let mut current: Option<Mapping<'a>> = None;
    for line in smaps.lines() {
        if let Some(kib) = line.strip_prefix("Anonymous:") {
            if let Some(m) = current.as_mut() {
                m.anonymous_kib = kib
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .unwrap_or(u64::MAX);
            }
        } else if line.contains('-') && line.as_bytes().first().is_some_and(u8::is_ascii_hexdigit) {
            // A header line (the key lines start with a capital letter).
            all.extend(current.take());
            current = parse_header(line).or(Some(Mapping {
                start: 0,
                end: 0,
                perms: "",
                path: "",
                anonymous_kib: u64::MAX,
            }));
        }
    }
    all.extend(current);
    all.into_iter()
        .filter(|m| m.path.strip_suffix(" (deleted)").unwrap_or(m.path) == exe)
        .filter(|m| m.perms.starts_with('r') && !m.perms.contains('w') && m.anonymous_kib == 0)
        .collect()
}

/// `VmRSS` of this process, KiB (0 if unreadable).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Hand the resident pages of this program's own mappings back to the kernel.
pub fn page_out_program() -> Result<PagedOut, ResidentError> {
    let exe = std::fs::read_link("/proc/self/exe").map_err(|source| ResidentError::Read {
        path: "/proc/self/exe".into(),
        source,
    })?;
    let exe = exe
        .to_string_lossy()
        .strip_suffix(" (deleted)")
        .map_or_else(|| exe.clone(), PathBuf::from);
    let smaps =
        std::fs::read_to_string("/proc/self/smaps").map_err(|source| ResidentError::Read {
            path: "/proc/self/smaps".into(),
            source,
        })?;
    let mappings = clean_program_mappings(&smaps, &exe);
    if mappings.is_empty() {
        return Err(ResidentError::NoMappings(exe));
    }
    let rss_before_kib = rss_kib();
    let mut advised = 0;
    for m in &mappings {
        let len = m.end - m.start;
        advise_dont_need(m.start, len).map_err(ResidentError::Advise)?;
        advised += len;
    }
    Ok(PagedOut {
        rss_before_kib,
        rss_after_kib: rss_kib(),
        advised,
    })
}

/// `madvise(start, len, MADV_DONTNEED)` on one of this program's clean file mappings.
#[allow(unsafe_code)]
fn advise_dont_need(start: usize, len: usize) -> Result<(), rustix::io::Errno> {
    // SAFETY: the range is a whole mapping of this program, read from /proc/self/smaps a
    // moment ago (the program's own mappings are never unmapped while it runs), neither
    // writable nor holding any anonymous page: every page in it is the file's own bytes.
    // MADV_DONTNEED on such a private file mapping only unmaps pages; the next access maps
    // the same bytes again from the file, so no value any Rust reference points to changes.
    // (A copied-on-write page would be lost: mappings with one are never advised.)
    unsafe {
        rustix::mm::madvise(
            start as *mut std::ffi::c_void,
            len,
            rustix::mm::Advice::LinuxDontNeed,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
5581a2c00000-5581a2e00000 r--p 00000000 fd:01 1234 /usr/bin/gpu-agent
Rss:                 800 kB
Anonymous:             0 kB
5581a2e00000-5581a3c00000 r-xp 00200000 fd:01 1234 /usr/bin/gpu-agent
Rss:                4000 kB
Anonymous:             0 kB
5581a3c00000-5581a3d00000 r--p 01000000 fd:01 1234 /usr/bin/gpu-agent
Rss:                 700 kB
Anonymous:           700 kB
5581a3d00000-5581a3e00000 rw-p 01100000 fd:01 1234 /usr/bin/gpu-agent
Anonymous:             0 kB
5581a4000000-5581a4100000 rw-p 00000000 00:00 0 
Anonymous:            12 kB
7f0000000000-7f0000200000 r-xp 00000000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
7f0000300000-7f0000301000 r--p 00000000 fd:01 1235 /usr/bin/gpu-agent-old
Anonymous:             0 kB
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
Anonymous:             0 kB
";

    #[test]
    fn only_the_programs_clean_read_only_mappings_are_chosen() {
        // Not the relocated read-only data (anonymous pages), not the writable data, not
        // libraries, anonymous memory or the vDSO.
        let chosen = clean_program_mappings(SMAPS, Path::new("/usr/bin/gpu-agent"));
        let ranges: Vec<(usize, usize, &str)> =
            chosen.iter().map(|m| (m.start, m.end, m.perms)).collect();
        assert_eq!(
            ranges,
            vec![
                (0x5581_a2c0_0000, 0x5581_a2e0_0000, "r--p"),
                (0x5581_a2e0_0000, 0x5581_a3c0_0000, "r-xp"),
            ]
        );
    }

    #[test]
    fn a_mapping_whose_anonymous_line_is_missing_or_odd_is_left_alone() {
        let smaps =
            "5581a2e00000-5581a3c00000 r-xp 00200000 fd:01 1234 /usr/bin/gpu-agent\nRss: 4 kB\n";
        assert!(clean_program_mappings(smaps, Path::new("/usr/bin/gpu-agent")).is_empty());
        let smaps = "5581a2e00000-5581a3c00000 r-xp 00200000 fd:01 1234 /usr/bin/gpu-agent\nAnonymous: x kB\n";
        assert!(clean_program_mappings(smaps, Path::new("/usr/bin/gpu-agent")).is_empty());
    }

    #[test]
    fn a_program_replaced_by_an_upgrade_is_still_its_own() {
        let smaps = "5581a2c00000-5581a2e00000 r-xp 00000000 fd:01 1234 /usr/bin/gpu-agent (deleted)\nAnonymous: 0 kB\n";
        assert_eq!(
            clean_program_mappings(smaps, Path::new("/usr/bin/gpu-agent")).len(),
            1
        );
    }

    #[test]
    fn paging_out_this_test_program_keeps_it_running() {
        // This test binary is its own program: its code is unmapped under it.
        let out = page_out_program().expect("madvise");
        assert!(out.advised > 0);
        assert!(out.rss_after_kib <= out.rss_before_kib, "{out:?}");
        // Code handed back comes back on use: the parser runs, and runs right.
        let chosen =
            clean_program_mappings(SMAPS, Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert_eq!(chosen.len(), 1);
    }
}
