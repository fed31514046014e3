//! Hand back what start-up touched: once the daemon has settled, the resident pages of the
//! agent's own program are returned to the kernel (`madvise(MADV_PAGEOUT)`), so that code
//! that ran once (parsing the config, building clients, the first poll of each source) does
//! not stay in memory for the life of the node. What the idle loop needs comes back on its
//! next use: the working set, not the start-up set, stays resident.
//!
//! `MADV_PAGEOUT` (Linux 5.4) reclaims clean file pages mapped only by this process (the
//! kernel skips pages another process maps, and anonymous pages have nowhere to go without
//! swap); it never changes what memory holds. Only the executable's own mappings are
//! advised: shared libraries are mostly shared, and NVML's is polled every few seconds.

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
    /// The kernel refused the advice (before Linux 5.4: no `MADV_PAGEOUT`).
    #[error("madvise(MADV_PAGEOUT) failed: {0}")]
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

/// One mapping of `/proc/self/maps`: its address range and path.
#[derive(Debug, PartialEq, Eq)]
struct Mapping<'a> {
    start: usize,
    end: usize,
    path: &'a str,
}

/// Parse a `/proc/PID/maps` line (`start-end perms offset dev inode path`); `None` for
/// anonymous mappings and lines that do not parse.
fn parse_line(line: &str) -> Option<Mapping<'_>> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let path = fields.nth(4)?.trim_start();
    (!path.is_empty()).then_some(())?;
    Some(Mapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        path,
    })
}

/// The mappings of `exe` in a maps file's text. A program replaced on disk by an upgrade
/// is listed with ` (deleted)` after its path.
fn program_mappings<'a>(maps: &'a str, exe: &Path) -> Vec<Mapping<'a>> {
    let exe = exe.to_string_lossy();
    maps.lines()
        .filter_map(parse_line)
        .filter(|m| m.path.strip_suffix(" (deleted)").unwrap_or(m.path) == exe)
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
    let read = |path: &str| ResidentError::Read {
        path: path.into(),
        source: std::io::Error::other("unreadable"),
    };
    let exe = std::fs::read_link("/proc/self/exe").map_err(|source| ResidentError::Read {
        path: "/proc/self/exe".into(),
        source,
    })?;
    let exe = PathBuf::from(
        exe.to_string_lossy()
            .strip_suffix(" (deleted)")
            .map_or_else(|| exe.clone(), PathBuf::from),
    );
    let maps =
        std::fs::read_to_string("/proc/self/maps").map_err(|source| ResidentError::Read {
            path: "/proc/self/maps".into(),
            source,
        })?;
    let mappings = program_mappings(&maps, &exe);
    if mappings.is_empty() {
        return Err(read("/proc/self/maps"));
    }
    let rss_before_kib = rss_kib();
    let mut advised = 0;
    for m in &mappings {
        let len = m.end - m.start;
        advise_page_out(m.start, len).map_err(ResidentError::Advise)?;
        advised += len;
    }
    Ok(PagedOut {
        rss_before_kib,
        rss_after_kib: rss_kib(),
        advised,
    })
}

/// `madvise(start, len, MADV_PAGEOUT)` on one of this process's own mappings.
#[allow(unsafe_code)]
fn advise_page_out(start: usize, len: usize) -> Result<(), rustix::io::Errno> {
    // SAFETY: the range is a whole mapping of this process, read from /proc/self/maps a
    // moment ago (the program's own mappings are never unmapped while it runs).
    // MADV_PAGEOUT only asks the kernel to reclaim pages: what the memory holds is unchanged
    // (a reclaimed page is read back from its file, or not reclaimed at all), so no value any
    // Rust reference points to can change.
    unsafe {
        rustix::mm::madvise(
            start as *mut std::ffi::c_void,
            len,
            rustix::mm::Advice::LinuxPageOut,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
5581a2c00000-5581a2e00000 r--p 00000000 fd:01 1234 /usr/bin/gpu-agent
5581a2e00000-5581a3c00000 r-xp 00200000 fd:01 1234 /usr/bin/gpu-agent
5581a4000000-5581a4100000 rw-p 00000000 00:00 0 
5581a4100000-5581a4200000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000200000 r-xp 00000000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000300000-7f0000301000 r--p 00000000 fd:01 1235 /usr/bin/gpu-agent-old
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn only_the_programs_own_mappings_are_chosen() {
        let chosen = program_mappings(MAPS, Path::new("/usr/bin/gpu-agent"));
        assert_eq!(
            chosen,
            vec![
                Mapping {
                    start: 0x5581_a2c0_0000,
                    end: 0x5581_a2e0_0000,
                    path: "/usr/bin/gpu-agent"
                },
                Mapping {
                    start: 0x5581_a2e0_0000,
                    end: 0x5581_a3c0_0000,
                    path: "/usr/bin/gpu-agent"
                },
            ]
        );
    }

    #[test]
    fn a_program_replaced_by_an_upgrade_is_still_its_own() {
        let maps =
            "5581a2c00000-5581a2e00000 r-xp 00000000 fd:01 1234 /usr/bin/gpu-agent (deleted)\n";
        assert_eq!(
            program_mappings(maps, Path::new("/usr/bin/gpu-agent")).len(),
            1
        );
    }

    #[test]
    fn paging_out_this_test_program_keeps_it_running() {
        // This test binary is its own program: its code is paged out under it.
        let out = page_out_program().expect("MADV_PAGEOUT (Linux 5.4 or later)");
        assert!(out.advised > 0);
        assert!(out.rss_after_kib <= out.rss_before_kib, "{out:?}");
        // Code paged out comes back on use: the parser runs, and runs right.
        let chosen = program_mappings(MAPS, Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert_eq!(chosen.len(), 1);
    }
}
