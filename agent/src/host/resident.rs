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
//!
//! The fault path stays: under page-cache pressure the kernel evicts unmapped pages first,
//! and a fault whose code had been handed back read it from the disk (BENCHMARKS.md). So the
//! build lays out what the daemon runs at steady state and on a fault (`agent/hot-path.order`,
//! profiled by `scripts/hot-path-order.sh`) as one region between two marker functions
//! (`agent/build.rs`), and the hand-back locks that region and the program's read-only data
//! (`.rodata`, where its ELF headers say: the literals and tables a fault reads) with `mlock`,
//! and unmaps only the rest.
//! A build without the layout (another target, linker or profile, or an order so stale that
//! little of it is left) keeps all its pages: the fault path's latency comes first.

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
    /// The program's ELF headers could not be read, or name no read-only data where this
    /// process maps it: the data the fault path reads could not be kept.
    #[error("cannot find the read-only data of {path}: {why}")]
    ReadOnlyData {
        /// The program.
        path: PathBuf,
        /// What was wrong.
        why: String,
    },
    /// This build has no fault-path region to keep: handing its code back would leave the
    /// first fault to read it from the disk under page-cache pressure.
    #[error("{0}")]
    NoLayout(NoLayout),
}

/// Why this build has no fault-path region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoLayout {
    /// Built without `cfg(hot_layout)` (not an x86_64 release build, or
    /// `GPU_AGENT_HOT_LAYOUT=off`).
    #[error("this build does not lay out its fault path (only x86_64 release builds do)")]
    NotBuilt,
    /// The markers are out of order or too close: the link order named too few of this
    /// build's functions (regenerate `agent/hot-path.order`).
    #[error("the fault-path region is {kib} KiB, under {MIN_HOT_KIB} KiB: agent/hot-path.order is stale")]
    TooSmall {
        /// The region between the markers, KiB (0 if they are out of order).
        kib: usize,
    },
}

/// A fault-path region smaller than this is a stale order, not a layout (it was about
/// 1 MiB when profiled).
const MIN_HOT_KIB: usize = 256;

/// First in `agent/hot-path.order`: where the fault path's region starts.
#[allow(unsafe_code)] // `no_mangle`: the link order names it.
#[no_mangle]
#[inline(never)]
pub extern "C" fn gpu_agent_hot_start() -> u32 {
    0x5eed_0001
}

/// Last in `agent/hot-path.order`: the fault path's region ends after it.
#[allow(unsafe_code)] // `no_mangle`: the link order names it.
#[no_mangle]
#[inline(never)]
pub extern "C" fn gpu_agent_hot_end() -> u32 {
    0x5eed_0002
}

/// The page-aligned address range the link order put the fault path in.
fn hot_region() -> Result<std::ops::Range<usize>, NoLayout> {
    if !cfg!(hot_layout) {
        return Err(NoLayout::NotBuilt);
    }
    let start = gpu_agent_hot_start as *const () as usize;
    // The end marker's own code is in the region too.
    let end = gpu_agent_hot_end as *const () as usize + 1;
    let region = whole_pages(start..end);
    let kib = region.end.saturating_sub(region.start) / 1024;
    if kib < MIN_HOT_KIB {
        return Err(NoLayout::TooSmall { kib });
    }
    Ok(region)
}

/// The page size the ranges are aligned to (4 KiB on x86_64, the only layout built).
const PAGE: usize = 4096;

/// The pages `range` touches: its start rounded down and its end up to a page boundary.
fn whole_pages(range: std::ops::Range<usize>) -> std::ops::Range<usize> {
    range.start & !(PAGE - 1)..(range.end + PAGE - 1) & !(PAGE - 1)
}

/// The parts of `mapping` outside every range of `keep` (sorted, not overlapping): what is
/// handed back of one mapping.
fn outside(
    mapping: std::ops::Range<usize>,
    keep: &[std::ops::Range<usize>],
) -> Vec<std::ops::Range<usize>> {
    let mut parts = Vec::new();
    let mut from = mapping.start;
    for k in keep {
        if k.start > from {
            parts.push(from..k.start.min(mapping.end));
        }
        from = from.max(k.end);
    }
    parts.push(from..mapping.end);
    parts.retain(|r| r.start < r.end);
    parts
}

/// Where this process maps the program's read-only data (`.rodata`: the string literals,
/// tables and format strings the fault path reads), page-aligned: the section's address in
/// the ELF headers plus where the mapping of the file's first page lies.
fn rodata_region(
    exe: &Path,
    mappings: &[Mapping<'_>],
) -> Result<std::ops::Range<usize>, ResidentError> {
    use object::{Object, ObjectSection, ObjectSegment};
    let fail = |why: String| ResidentError::ReadOnlyData {
        path: exe.to_path_buf(),
        why,
    };
    let file = std::fs::File::open("/proc/self/exe").map_err(|e| fail(e.to_string()))?;
    // Only the headers are read, on demand, not the whole program.
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).map_err(|e| fail(e.to_string()))?;
    let section = elf
        .section_by_name(".rodata")
        .ok_or_else(|| fail("no .rodata section".into()))?;
    let first_vaddr = elf
        .segments()
        .find(|s| s.file_range().0 == 0)
        .map(|s| s.address())
        .ok_or_else(|| fail("no segment loads the file's first page".into()))?;
    let first = mappings
        .iter()
        .find(|m| m.offset == 0)
        .ok_or_else(|| fail("the file's first page is not mapped clean".into()))?;
    let start = (first.start as u64)
        .checked_sub(first_vaddr)
        .and_then(|bias| bias.checked_add(section.address()))
        .and_then(|start| usize::try_from(start).ok())
        .ok_or_else(|| fail("the section's address does not fit this mapping".into()))?;
    let end = start + usize::try_from(section.size()).map_err(|e| fail(e.to_string()))?;
    let region = whole_pages(start..end);
    if !mappings
        .iter()
        .any(|m| m.start <= region.start && region.end <= m.end)
    {
        return Err(fail(format!(
            "{:#x}..{:#x} is not within one clean mapping",
            region.start, region.end
        )));
    }
    Ok(region)
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
    /// What was kept for the fault path (its code and the program's read-only data), KiB.
    pub kept_kib: usize,
    /// Why the kept region could not be locked (it stays mapped, not locked), if it could not.
    pub lock_failed: Option<rustix::io::Errno>,
}

/// One mapping of `/proc/self/smaps`: its address range, permissions, path and how much of
/// it is anonymous (copied on write: relocated, or written).
#[derive(Debug, PartialEq, Eq)]
struct Mapping<'a> {
    start: usize,
    end: usize,
    perms: &'a str,
    offset: u64,
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
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let path = fields.nth(2)?.trim_start();
    (!path.is_empty()).then_some(())?;
    Some(Mapping {
        start,
        end,
        perms,
        offset,
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
                offset: 0,
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

/// After `delay` (zero: never), hand the program's start-up pages back ([`page_out_program`])
/// on the blocking pool, and log what was kept locked, or why nothing was handed back.
pub fn hand_back_after(delay: std::time::Duration) {
    if delay.is_zero() {
        return;
    }
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        match tokio::task::spawn_blocking(page_out_program).await {
            Ok(Ok(out)) => match out.lock_failed {
                None => tracing::info!(
                    rss_before_kib = out.rss_before_kib,
                    rss_after_kib = out.rss_after_kib,
                    fault_path_locked_kib = out.kept_kib,
                    "Start-up pages handed back (unmapped; kept in the page cache); the fault path's code and read-only data stay locked in memory."
                ),
                Some(errno) => tracing::warn!(
                    rss_before_kib = out.rss_before_kib,
                    rss_after_kib = out.rss_after_kib,
                    fault_path_mapped_kib = out.kept_kib,
                    error = %errno,
                    "Start-up pages handed back; the fault path's code and read-only data could not be locked (LimitMEMLOCK?) and stay mapped only."
                ),
            },
            Ok(Err(e)) => tracing::info!(error = %e, "Start-up pages stay resident."),
            Err(e) => tracing::warn!(error = %e, "Page-out task failed."),
        }
    });
}

/// Lock the fault path's region and hand the resident pages of the rest of this program's
/// own mappings back to the kernel.
pub fn page_out_program() -> Result<PagedOut, ResidentError> {
    let hot = hot_region().map_err(ResidentError::NoLayout)?;
    keep_and_page_out(|exe, mappings| {
        let mut keep = vec![hot, rodata_region(exe, mappings)?];
        keep.sort_by_key(|r| r.start);
        Ok(keep)
    })
}

/// Lock the ranges `keep` chooses (page-aligned, sorted, within the program's clean
/// mappings) and hand back the rest of the program.
fn keep_and_page_out(
    keep: impl FnOnce(&Path, &[Mapping<'_>]) -> Result<Vec<std::ops::Range<usize>>, ResidentError>,
) -> Result<PagedOut, ResidentError> {
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
    let keep = keep(&exe, &mappings)?;
    let rss_before_kib = rss_kib();
    // Locked first: it maps every page of the ranges (from the page cache, where start-up
    // left them), and a locked page is neither advised nor reclaimed.
    let lock_failed = keep
        .iter()
        .map(lock)
        .fold(None, |first, locked| first.or(locked.err()));
    let mut advised = 0;
    for m in &mappings {
        for part in outside(m.start..m.end, &keep) {
            advise_dont_need(part.start, part.len()).map_err(ResidentError::Advise)?;
            advised += part.len();
        }
    }
    Ok(PagedOut {
        rss_before_kib,
        rss_after_kib: rss_kib(),
        advised,
        kept_kib: keep.iter().map(|k| k.len()).sum::<usize>() / 1024,
        lock_failed,
    })
}

/// `mlock` one range the fault path needs.
#[allow(unsafe_code)]
fn lock(region: &std::ops::Range<usize>) -> Result<(), rustix::io::Errno> {
    // SAFETY: mlock changes no byte of memory; it only keeps the pages of the range, part
    // of one of this program's own clean mappings, in memory.
    unsafe { rustix::mm::mlock(region.start as *mut std::ffi::c_void, region.len()) }
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
        // This test binary is its own program: its code is unmapped under it, but for the
        // page of this function, locked as the fault path's region would be, and its
        // read-only data, found from its ELF headers.
        let here =
            paging_out_this_test_program_keeps_it_running as *const () as usize & !(PAGE - 1);
        let mut rodata = 0..0;
        let out = keep_and_page_out(|exe, mappings| {
            rodata = rodata_region(exe, mappings)?;
            let mut keep = vec![here..here + PAGE, rodata.clone()];
            keep.sort_by_key(|r| r.start);
            Ok(keep)
        })
        .expect("madvise");
        assert!(out.advised > 0);
        assert!(!rodata.is_empty());
        assert_eq!(out.kept_kib, 4 + rodata.len() / 1024);
        assert_eq!(out.lock_failed, None, "{out:?}");
        // The string literals are where the headers said: this one is in the range.
        let literal = "a string literal of this test".as_ptr() as usize;
        assert!(rodata.contains(&literal), "{literal:#x} not in {rodata:x?}");
        assert!(out.rss_after_kib <= out.rss_before_kib, "{out:?}");
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let locked: u64 = smaps
            .lines()
            .filter_map(|l| l.strip_prefix("Locked:"))
            .filter_map(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .sum();
        assert!(locked >= 4, "nothing locked");
        // Code handed back comes back on use: the parser runs, and runs right.
        let chosen =
            clean_program_mappings(SMAPS, Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert_eq!(chosen.len(), 1);
    }

    #[test]
    fn a_build_without_the_layout_keeps_its_pages() {
        // Tests are not release builds: no fault-path region, so no hand-back.
        assert_eq!(hot_region(), Err(NoLayout::NotBuilt));
        assert!(matches!(
            page_out_program(),
            Err(ResidentError::NoLayout(NoLayout::NotBuilt))
        ));
    }

    #[test]
    fn the_kept_region_is_cut_out_of_each_mapping() {
        let keep = [0x3000..0x5000, 0x9000..0xa000];
        let parts = |m: std::ops::Range<usize>| outside(m, &keep);
        assert_eq!(parts(0x1000..0x8000), vec![0x1000..0x3000, 0x5000..0x8000]);
        assert_eq!(
            parts(0x1000..0xc000),
            vec![0x1000..0x3000, 0x5000..0x9000, 0xa000..0xc000]
        );
        assert_eq!(parts(0x4000..0x9800), vec![0x5000..0x9000]);
        assert_eq!(parts(0x1000..0x3000), vec![0x1000..0x3000]);
        assert_eq!(parts(0x4000..0x8000), vec![0x5000..0x8000]);
        assert_eq!(parts(0x3000..0x5000), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(parts(0x6000..0x7000), vec![0x6000..0x7000]);
    }
}
