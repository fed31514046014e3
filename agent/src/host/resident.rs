//! Hand back what start-up touched, and keep what a fault runs locked in memory.
//!
//! Once the daemon has settled (`page_out_after`), the pages of the agent's own program are
//! unmapped from it (`madvise(MADV_DONTNEED)`), so that code that ran once (parsing the
//! config, building clients, the first poll of each source) does not stay in its resident
//! set for the life of the node. Only mappings that hold nothing but the file's own bytes
//! are advised: the program's read-only and executable mappings with no anonymous
//! (copy-on-write) page, as `/proc/self/smaps` says. Dropping those loses nothing: the pages
//! stay in the page cache and come back by a minor fault. Not `MADV_PAGEOUT`, which also
//! evicts them from the page cache.
//!
//! But a page that is mapped by no one is the first the kernel evicts under page-cache
//! pressure, and a fault whose code had been evicted reads it from the disk (25 ms to 1.3 s
//! measured on this project's test machine, 2026-12-03) when a fatal Xid must reach the node
//! condition in milliseconds. So the fault path's pages are locked (`mlock`), and they are
//! found at run time, not from a link order: after the hand-back the agent rehearses every
//! fault path once (each source's parser and classifier on a made-up fault, the core's
//! verdict, each sink's rendering and request, the checkpoint scan and signal checks, with
//! no effect outside this process: see `commands::rehearse`), keeps running its steady state
//! for `[agent] fault_path_watch`, and then locks every page of the program that is mapped
//! again (`/proc/self/pagemap`), and every page mapped of its shared libraries' clean
//! mappings (not handed back: others map them too; but what a fault runs of the C library
//! or NVML must not be evicted either). From then on it looks again every `fault_path_watch`: a
//! page mapped since, outside the lock, is code the rehearsal and the watch missed (a poll
//! slower than the watch, a rarer branch); it is locked too and counted (`status`,
//! `gpu_agent_fault_path_locked_bytes`). The CI test drops the page cache after the lock and
//! fails when a kernel-log fault or a Spot notice then reads a page from the disk (the
//! daemon's major page faults): a fault path the rehearsal no longer covers.
//!
//! If the working set cannot be locked (`LimitMEMLOCK`), nothing is handed back: every page
//! is mapped again and `status` says the fault path is not locked. Nothing here depends on
//! the linker, the profile or the architecture.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::model::FaultPathLock;

/// Why the pages could not be handed back, or the working set locked.
#[derive(Debug, thiserror::Error)]
pub enum ResidentError {
    /// `/proc/self/maps`, `/proc/self/pagemap` or `/proc/self/exe` could not be read.
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
    /// `/proc/self/smaps` shows none of the running program's code resident: not the
    /// kernel's own accounting (an emulator's, such as qemu-user's), which cannot say which
    /// pages are the file's own bytes.
    #[error("/proc/self/smaps shows none of this program's code resident while it runs (not the kernel's accounting: an emulator?)")]
    NotAccounted,
    /// The kernel refused the advice.
    #[error("madvise(MADV_DONTNEED) failed: {0}")]
    Advise(rustix::io::Errno),
    /// The working set could not be locked.
    #[error("cannot lock {kib} KiB of the fault path: mlock: {source} (LimitMEMLOCK too low?)")]
    Lock {
        /// The working set, KiB.
        kib: usize,
        /// The error.
        source: rustix::io::Errno,
    },
}

/// When to hand back, and how long to watch the working set before locking it.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// After start-up, this long (zero: never hand back, every page kept).
    pub after: Duration,
    /// How long the steady state runs before its pages are locked, and how often pages
    /// mapped since outside the lock are looked for.
    pub watch: Duration,
}

/// Every fault path run once, with no effect outside this process (`commands::rehearse`).
pub type Rehearsal =
    Box<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// Hand the program's start-up pages back after `settings.after`, rehearse, watch, and lock
/// the working set; `report` hears each state ([`FaultPathLock`]).
pub async fn run(settings: Settings, rehearse: Rehearsal, report: impl Fn(FaultPathLock) + Send) {
    if settings.after.is_zero() {
        report(FaultPathLock::Kept {
            reason: "page_out_after = 0".into(),
        });
        return;
    }
    tokio::time::sleep(settings.after).await;
    let program = match blocking(Program::hand_back).await {
        Ok(program) => program,
        Err(e) => {
            tracing::info!(error = %e, "Start-up pages stay resident.");
            report(FaultPathLock::Kept {
                reason: e.to_string(),
            });
            return;
        }
    };
    tracing::info!(
        watch_s = settings.watch.as_secs(),
        "Start-up pages handed back (unmapped; kept in the page cache); the pages the daemon maps again, rehearsing every fault path and running its steady state, are locked once the watch ends."
    );
    report(FaultPathLock::Watching);
    rehearse().await;
    tokio::time::sleep(settings.watch).await;
    let mut program = match blocking(move || program.lock_working_set()).await {
        Ok(program) => program,
        Err((program, e)) => {
            let kept = blocking(move || program.keep_everything()).await;
            tracing::warn!(error = %e, kept_mapped_kib = kept / 1024, "The fault path's pages could not be locked; nothing is handed back.");
            report(FaultPathLock::Refused {
                reason: e.to_string(),
            });
            return;
        }
    };
    let first_kib = program.locked_bytes() / 1024;
    tracing::info!(
        rss_kib = rss_kib(),
        fault_path_locked_kib = first_kib,
        "The fault path's pages are locked in memory; the rest of the program stays handed back."
    );
    report(FaultPathLock::Locked {
        locked_kib: as_u64(first_kib),
        grown_kib: 0,
    });
    loop {
        tokio::time::sleep(settings.watch).await;
        let (next, grown) = blocking(move || {
            let grown = program.lock_new_pages();
            (program, grown)
        })
        .await;
        program = next;
        match grown {
            Ok(0) => {}
            Ok(bytes) => {
                let locked_kib = program.locked_bytes() / 1024;
                // A poll slower than the watch, or a branch the rehearsal did not take.
                tracing::info!(
                    added_kib = bytes / 1024,
                    fault_path_locked_kib = locked_kib,
                    "Code outside the locked working set ran; its pages are locked too."
                );
                report(FaultPathLock::Locked {
                    locked_kib: as_u64(locked_kib),
                    grown_kib: as_u64(locked_kib.saturating_sub(first_kib)),
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "Cannot lock the pages mapped since the working set was locked.");
                report(FaultPathLock::Refused {
                    reason: e.to_string(),
                });
            }
        }
    }
}

/// `f` on the blocking pool (it reads procfs and makes system calls that may block).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

fn as_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The page size the ranges are aligned to.
fn page() -> usize {
    rustix::param::page_size()
}

/// The program's clean mappings, handed back, and which of their pages are locked.
#[derive(Debug)]
struct Program {
    /// Each mapping's address range.
    mappings: Vec<std::ops::Range<usize>>,
    /// Per mapping, per page: locked.
    locked: Vec<Vec<bool>>,
    /// How many of the mappings, first, are the program's own (handed back); the rest are
    /// the shared libraries'.
    handed_back: usize,
}

impl Program {
    /// Find the program's clean mappings and unmap all of their pages; the shared
    /// libraries' clean mappings are kept mapped, and watched for the lock with them.
    fn hand_back() -> Result<Self, ResidentError> {
        let (program, libraries) = clean_mappings()?;
        for m in &program {
            advise(m.start, m.len(), rustix::mm::Advice::LinuxDontNeed)
                .map_err(ResidentError::Advise)?;
        }
        // The shared libraries' pages are not handed back (others map them too), but what
        // the fault path runs of them (the C library, the NVIDIA driver's NVML) is locked
        // with the program's: a page of theirs mapped by no one is evicted like any other.
        let handed_back = program.len();
        let mappings: Vec<_> = program.into_iter().chain(libraries).collect();
        let locked = mappings
            .iter()
            .map(|m| vec![false; m.len() / page()])
            .collect();
        Ok(Self {
            mappings,
            locked,
            handed_back,
        })
    }

    /// Lock every page mapped since the hand-back. On failure nothing stays handed back.
    fn lock_working_set(mut self) -> Result<Self, (Self, ResidentError)> {
        match self.lock_new_pages() {
            Ok(_) => Ok(self),
            Err(e) => Err((self, e)),
        }
    }

    /// Lock the pages mapped now and not locked yet; the bytes newly locked.
    fn lock_new_pages(&mut self) -> Result<usize, ResidentError> {
        let pagemap =
            std::fs::File::open("/proc/self/pagemap").map_err(|source| ResidentError::Read {
                path: "/proc/self/pagemap".into(),
                source,
            })?;
        let mut added = 0;
        for (m, locked) in self.mappings.iter().zip(self.locked.iter_mut()) {
            let present = present_pages(&pagemap, m.clone())?;
            for run in runs(&present, locked) {
                let (start, len) = (m.start + run.start * page(), run.len() * page());
                lock(start, len).map_err(|source| ResidentError::Lock {
                    kib: len / 1024,
                    source,
                })?;
                tracing::debug!(
                    start = format_args!("{start:#x}"),
                    kib = len / 1024,
                    "Locked pages."
                );
                locked[run].iter_mut().for_each(|l| *l = true);
                added += len;
            }
        }
        Ok(added)
    }

    /// Bytes locked.
    fn locked_bytes(&self) -> usize {
        self.locked.iter().flatten().filter(|l| **l).count() * page()
    }

    /// Undo the hand-back: unlock everything, and map every page of the program again (the
    /// bytes mapped).
    fn keep_everything(self) -> usize {
        self.mappings.iter().for_each(|m| unlock(m.start, m.len()));
        self.mappings[..self.handed_back]
            .iter()
            .map(|m| {
                populate(m.start, m.len());
                m.len()
            })
            .sum()
    }
}

/// Address ranges of mappings.
type Ranges = Vec<std::ops::Range<usize>>;

/// The program's clean mappings, and the shared libraries' (`/proc/self/smaps`).
fn clean_mappings() -> Result<(Ranges, Ranges), ResidentError> {
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
    let program = to_hand_back(&smaps, &exe)?;
    let libraries = clean_file_mappings(&smaps)
        .into_iter()
        .filter(|m| {
            let path = Path::new(m.path);
            // A regular file of another name: not a device, not a memfd or the vDSO.
            path != exe && !m.path.starts_with("/dev/") && path.is_file()
        })
        .map(|m| m.start..m.end)
        .collect();
    Ok((program, libraries))
}

/// The ranges of `exe`'s clean mappings in a smaps file's text, where that text is the
/// kernel's accounting.
fn to_hand_back(smaps: &str, exe: &Path) -> Result<Vec<std::ops::Range<usize>>, ResidentError> {
    let clean = clean_program_mappings(smaps, exe);
    if clean.is_empty() {
        return Err(ResidentError::NoMappings(exe.to_path_buf()));
    }
    // The code running now is resident: where smaps says none is, its figures (the
    // anonymous pages above all) are not the kernel's, and nothing is handed back on them.
    if !clean.iter().any(|m| m.perms.contains('x') && m.rss_kib > 0) {
        return Err(ResidentError::NotAccounted);
    }
    Ok(clean.iter().map(|m| m.start..m.end).collect())
}

/// Per page of `range`: mapped in this process now (`/proc/self/pagemap`'s bit 63).
fn present_pages(
    pagemap: &std::fs::File,
    range: std::ops::Range<usize>,
) -> Result<Vec<bool>, ResidentError> {
    let pages = range.len() / page();
    let mut raw = vec![0u8; pages * 8];
    pagemap
        .read_exact_at(&mut raw, as_u64(range.start / page() * 8))
        .map_err(|source| ResidentError::Read {
            path: "/proc/self/pagemap".into(),
            source,
        })?;
    Ok(raw
        .chunks_exact(8)
        .map(|entry| entry[7] & 0x80 != 0)
        .collect())
}

/// The runs of consecutive pages present and not yet locked, as page index ranges.
fn runs(present: &[bool], locked: &[bool]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, (&p, &l)) in present.iter().zip(locked).enumerate() {
        match (p && !l, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                runs.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push(s..present.len().min(locked.len()));
    }
    runs
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
    rss_kib: u64,
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
        // Unknown until its `Anonymous:` and `Rss:` lines say.
        anonymous_kib: u64::MAX,
        rss_kib: 0,
    })
}

/// The mappings of `exe` in a smaps file's text that hold only the file's bytes: not
/// writable, no anonymous page. A program replaced on disk by an upgrade is listed with
/// ` (deleted)` after its path.
fn clean_program_mappings<'a>(smaps: &'a str, exe: &Path) -> Vec<Mapping<'a>> {
    let exe = exe.to_string_lossy();
    clean_file_mappings(smaps)
        .into_iter()
        .filter(|m| m.path.strip_suffix(" (deleted)").unwrap_or(m.path) == exe)
        .collect()
}

/// The file mappings in a smaps file's text that hold only their file's bytes: not
/// writable, no anonymous page.
fn clean_file_mappings<'a>(smaps: &'a str) -> Vec<Mapping<'a>> {
    let mut all: Vec<Mapping<'a>> = Vec::new();
    let mut current: Option<Mapping<'a>> = None;
    for line in smaps.lines() {
        let kib = |v: &str| v.trim().trim_end_matches("kB").trim().parse().ok();
        if let Some(v) = line.strip_prefix("Anonymous:") {
            if let Some(m) = current.as_mut() {
                m.anonymous_kib = kib(v).unwrap_or(u64::MAX);
            }
        } else if let Some(v) = line.strip_prefix("Rss:") {
            if let Some(m) = current.as_mut() {
                m.rss_kib = kib(v).unwrap_or(0);
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
                rss_kib: 0,
            }));
        }
    }
    all.extend(current);
    all.into_iter()
        .filter(|m| m.path.starts_with('/'))
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

/// `mlock` a range of this program's clean mappings.
#[allow(unsafe_code)]
fn lock(start: usize, len: usize) -> Result<(), rustix::io::Errno> {
    // SAFETY: mlock changes no byte of memory; it only keeps the pages of the range, part
    // of one of this program's own clean mappings, in memory.
    unsafe { rustix::mm::mlock(start as *mut std::ffi::c_void, len) }
}

/// `munlock` a range of this program's clean mappings (pages not locked are left as they are).
#[allow(unsafe_code)]
fn unlock(start: usize, len: usize) {
    // SAFETY: as for `lock`: no byte of memory changes.
    let _ = unsafe { rustix::mm::munlock(start as *mut std::ffi::c_void, len) };
}

/// Map every page of a range of this program's clean mappings again.
#[allow(unsafe_code)]
fn populate(start: usize, len: usize) {
    if advise(start, len, rustix::mm::Advice::LinuxPopulateRead).is_ok() {
        return;
    }
    // Before Linux 5.14: read one byte of each page.
    for at in (start..start + len).step_by(page()) {
        // SAFETY: the address is within one of this program's own readable mappings, which
        // stay mapped while it runs.
        let _ = unsafe { std::ptr::read_volatile(at as *const u8) };
    }
}

/// `madvise` on a range of one of this program's clean file mappings: `DONTNEED` (unmap)
/// or `POPULATE_READ` (map again).
#[allow(unsafe_code)]
fn advise(start: usize, len: usize, advice: rustix::mm::Advice) -> Result<(), rustix::io::Errno> {
    // SAFETY: the range is within a mapping of this program, read from /proc/self/smaps
    // (the program's own mappings are never unmapped while it runs), neither writable nor
    // holding any anonymous page: every page in it is the file's own bytes. MADV_DONTNEED on
    // such a private file mapping only unmaps pages; the next access maps the same bytes
    // again from the file, so no value any Rust reference points to changes (a
    // copied-on-write page would be lost: mappings with one are never advised).
    // MADV_POPULATE_READ only maps pages.
    unsafe { rustix::mm::madvise(start as *mut std::ffi::c_void, len, advice) }
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
    fn the_libraries_clean_mappings_are_locked_with_the_program() {
        let paths: Vec<&str> = clean_file_mappings(SMAPS).iter().map(|m| m.path).collect();
        assert_eq!(
            paths,
            vec![
                "/usr/bin/gpu-agent",
                "/usr/bin/gpu-agent",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "/usr/bin/gpu-agent-old"
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
    fn smaps_that_shows_the_running_code_not_resident_is_not_believed() {
        let exe = Path::new("/usr/bin/gpu-agent");
        assert_eq!(
            to_hand_back(SMAPS, exe)
                .expect("the kernel's figures")
                .len(),
            2
        );
        // qemu-user writes `Rss: 0 kB` and `Anonymous: 0 kB` for every mapping: the
        // relocated read-only data would look clean, and unmapping it loses its pointers.
        let emulated = SMAPS.replace("Rss:                4000 kB", "Rss:                   0 kB");
        assert!(matches!(
            to_hand_back(&emulated, exe),
            Err(ResidentError::NotAccounted)
        ));
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
    fn runs_are_the_present_pages_not_yet_locked() {
        let t = true;
        let f = false;
        assert_eq!(
            runs(&[t, t, f, t, t, t, f, t], &[f, f, f, f, t, f, f, f]),
            vec![0..2, 3..4, 5..6, 7..8]
        );
        assert_eq!(runs(&[f, f], &[f, f]), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(runs(&[t, t], &[t, t]), Vec::<std::ops::Range<usize>>::new());
    }

    #[test]
    fn this_test_program_hands_back_locks_what_it_runs_and_keeps_running() {
        // This test binary is its own program: its code is unmapped under it, what it runs
        // next is mapped again, and that is what gets locked.
        let before = rss_kib();
        let program = Program::hand_back().expect("madvise");
        let here =
            this_test_program_hands_back_locks_what_it_runs_and_keeps_running as *const () as usize;
        let literal = "a string literal of this test".as_ptr() as usize;
        // Code handed back comes back on use: the parser runs, and runs right.
        let chosen =
            clean_program_mappings(SMAPS, Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert_eq!(chosen.len(), 1);
        let mut program = program
            .lock_working_set()
            .map_err(|(_, e)| e)
            .expect("mlock");
        let locked = program.locked_bytes();
        assert!(locked > 0);
        assert!(rss_kib() <= before + 1024, "{} > {before}", rss_kib());
        let is_locked = |program: &Program, addr: usize| {
            program
                .mappings
                .iter()
                .zip(&program.locked)
                .any(|(m, l)| m.contains(&addr) && l[(addr - m.start) / page()])
        };
        assert!(is_locked(&program, here), "this function's page");
        assert!(is_locked(&program, literal), "its read-only data");
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        let vm_lck: usize = status
            .lines()
            .find_map(|l| l.strip_prefix("VmLck:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmLck");
        assert!(
            vm_lck * 1024 >= locked,
            "{vm_lck} KiB locked, {locked} B said"
        );
        // Nothing new ran that was not locked, or what did is added.
        let added = program.lock_new_pages().expect("mlock");
        assert_eq!(program.locked_bytes(), locked + added);
        // Undone: every page mapped again, nothing locked.
        let mapped = program.keep_everything();
        assert!(mapped >= locked);
    }
}
