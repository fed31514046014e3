//! Load: a flood of kernel-log lines (default 100,000 lines/s for 60 s) through the real
//! `/dev/kmsg` into the real daemon. Every 5 s a fresh fatal Xid on its own GPU is written in
//! the middle of the flood; the run reports how many of them the daemon found and how fast,
//! its peak memory and CPU, what the kernel overwrote before it was read, and how many lines
//! the daemon itself logged (the journal must not be flooded).
//!
//! Run alone (it overwrites the shared kernel log): `sudo tests/bench.sh flood`, or
//! `sudo GPU_AGENT_BIN=target/release/gpu-agent FLOOD_RATE=100000 FLOOD_SECS=60 \
//!   cargo bench -p gpu-agent-e2e --bench kmsg_flood`.
//!
//! Writes go through one descriptor with `kernel.printk_devkmsg=on` (the per-open-file rate
//! limit off; restored afterwards) at level 6 (info: below the console log level, so the
//! kernel does not print them to a serial console).

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_agent_e2e::{cpu_ticks, fault, status_kib, Agent, Host};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `(VmRSS, VmHWM)` in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"))
}

/// Restores `kernel.printk_devkmsg` on drop.
struct DevkmsgRatelimit(String);

impl DevkmsgRatelimit {
    fn off() -> Self {
        let path = "/proc/sys/kernel/printk_devkmsg";
        let old = std::fs::read_to_string(path).unwrap_or_else(|_| "ratelimit".into());
        std::fs::write(path, "on\n").expect("set printk_devkmsg (run as root)");
        Self(old.trim().to_string())
    }
}

impl Drop for DevkmsgRatelimit {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/printk_devkmsg", format!("{}\n", self.0));
    }
}

fn main() {
    let rate = env_u64("FLOOD_RATE", 100_000);
    let secs = env_u64("FLOOD_SECS", 60);
    let host = Host::new();
    let agent = Agent::start(&host.config(""), &host.socket());
    let pid = agent.pid();
    std::thread::sleep(Duration::from_secs(1));
    let log_lines_before = agent.log().lines().count();
    let (_, hwm_before) = memory_kib(pid);
    let lost_before = agent.snapshot().expect("snapshot")["kmsg"]["records_lost"]
        .as_u64()
        .unwrap_or(0);
    let _ratelimit = DevkmsgRatelimit::off();

    let written = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (written, refused, done) = (
            Arc::clone(&written),
            Arc::clone(&refused),
            Arc::clone(&done),
        );
        let noise_bdf = host.gpu_bdf(7);
        std::thread::spawn(move || {
            let mut kmsg = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/kmsg")
                .expect("open /dev/kmsg");
            let started = Instant::now();
            let mut n: u64 = 0;
            while !done.load(Ordering::Relaxed) {
                // Pace to the rate in 1 ms slices.
                let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                if n >= due {
                    std::thread::sleep(Duration::from_micros(500));
                    continue;
                }
                let batch_end = due.min(n + 1000);
                while n < batch_end {
                    // Mostly noise; every 1000th line a repeating warning Xid (a storm of
                    // the same fault must stay one fault and few log lines).
                    let line = if n.is_multiple_of(1000) {
                        format!("<4>NVRM: Xid (PCI:{noise_bdf}): 13, pid=7, name=flood, Graphics Exception: ESR 0x{n:x}\n")
                    } else {
                        format!("<6>gpu-agent-flood: eth0 rx queue {n}: noise record from a busy driver\n")
                    };
                    if kmsg.write_all(line.as_bytes()).is_err() {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    n += 1;
                }
                written.store(n, Ordering::Relaxed);
            }
        })
    };

    // Markers: a fresh fatal Xid every 5 s, through its own descriptor, timed to detection.
    let started = Instant::now();
    let mut detections = Vec::new();
    let mut missed = 0;
    let mut peak_rss = 0;
    let mut marker = 0usize;
    let ticks_before = cpu_ticks(pid);
    while started.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(4));
        let bdf = format!("{:04x}:{:02x}:00", host.domain ^ 0x4000, marker + 1);
        marker += 1;
        let at = Instant::now();
        {
            let mut kmsg = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/kmsg")
                .expect("open /dev/kmsg");
            let _ = kmsg.write_all(
                format!("<4>NVRM: Xid (PCI:{bdf}): 79, pid=1, name=bench, GPU has fallen off the bus.\n")
                    .as_bytes(),
            );
        }
        let mut found = None;
        while at.elapsed() < Duration::from_secs(1) {
            if let Some(s) = agent.snapshot() {
                let hit = s["faults"].as_array().is_some_and(|f| {
                    f.iter().any(|f| {
                        f["component"]["pci"]
                            .as_str()
                            .is_some_and(|p| p.starts_with(&bdf))
                    })
                });
                if hit {
                    found = Some(at.elapsed());
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        match found {
            Some(d) => detections.push(d),
            None => missed += 1,
        }
        peak_rss = peak_rss.max(memory_kib(pid).0);
    }
    done.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = (cpu_ticks(pid) - ticks_before) as f64 / 100.0 / elapsed * 100.0;
    std::thread::sleep(Duration::from_secs(2));
    let s = agent
        .snapshot()
        .expect("the daemon answers after the flood");
    let lost = s["kmsg"]["records_lost"].as_u64().unwrap_or(0) - lost_before;
    let read = s["kmsg"]["records_read"].as_u64().unwrap_or(0);
    let storm = fault(&s, &host, "xid", Some(13)).and_then(|f| f["count"].as_u64());
    let (_, hwm) = memory_kib(pid);
    let log_lines = agent.log().lines().count() - log_lines_before;
    let n = written.load(Ordering::Relaxed);
    detections.sort();
    let pct = |p: usize| {
        detections
            .get((detections.len() * p / 100).min(detections.len().saturating_sub(1)))
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
    };
    println!(
        "flood: {n} lines in {elapsed:.0} s ({:.0} lines/s, target {rate}; {} writes refused); daemon read {read}, kernel overwrote {lost} unread",
        n as f64 / elapsed,
        refused.load(Ordering::Relaxed)
    );
    println!(
        "markers: {} of {} fatal Xids found during the flood, detection p50 {:.1} ms, max {:.1} ms",
        detections.len(),
        detections.len() + missed,
        pct(50),
        pct(100)
    );
    println!(
        "daemon: peak RSS {} KiB (VmHWM {hwm_before} -> {hwm} KiB), CPU {cpu:.0}% of one core, {log_lines} log lines; storm Xid 13 seen as one fault, count {storm:?}",
        peak_rss
    );
    drop(agent);
}
