//! EFA poll cost: one full poll of 32 devices (a p5's: each with its PCI function, NUMA node,
//! nine port counters, seven judged and the two byte counters, and two admin counters,
//! turned into rates and judged) against a fake
//! sysfs of the real layout on tmpfs-like storage; real sysfs attribute reads cost about the
//! same (a kernel `show` callback per file).
//!
//! ```sh
//! cargo bench -p gpu-agent --bench efa
//! ```

use std::time::{Duration, Instant};

use gpu_agent::sources::efa::{sysfs, Poller, Settings, Thresholds};

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..32u32 {
        sysfs::fake::device(
            dir.path(),
            &format!("rdmap{i}s0"),
            &format!("0000:{:02x}:00.0", 0x40 + i),
            i / 16,
        )
        .expect("fake device");
    }
    let mut poller = Poller::new(Settings {
        sysfs_root: dir.path().to_path_buf(),
        procfs_root: dir.path().to_path_buf(),
        poll_interval: Duration::from_secs(5),
        window: Duration::from_secs(60),
        startup_grace: Duration::ZERO,
        expected_devices: 32,
        thresholds: Thresholds {
            errors_warning: 60.0,
            errors_fatal: 600.0,
            retrans_warning: 60_000.0,
        },
        baseline: None,
        launch: None,
    });
    let start = Instant::now();
    for i in 0..10 {
        poller.poll(start + Duration::from_secs(i));
    }
    let rounds = 1_000u32;
    let started = Instant::now();
    for i in 0..rounds {
        poller.poll(start + Duration::from_secs(u64::from(i) * 5));
    }
    let per_poll = started.elapsed() / rounds;
    println!(
        "EFA poll, 32 devices x 11 counters, fake sysfs: {:.1} µs per poll ({:.4} % of one core at the 5 s interval)",
        per_poll.as_secs_f64() * 1e6,
        per_poll.as_secs_f64() / 5.0 * 100.0
    );
}
