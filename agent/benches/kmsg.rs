//! Benchmarks for the kernel-log path, with the numbers recorded in `BENCHMARKS.md`.
//!
//! `cargo bench -p gpu-agent --bench kmsg` (as root: it writes to `/dev/kmsg`). Measures:
//! 1. lines parsed and classified per second (a realistic mix, and the all-fault worst case);
//! 2. kernel-log-line-to-status latency through the real daemon, p50/p99;
//! 3. the idle daemon's RSS and CPU (`BENCH_IDLE_SECS`, default 60).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use gpu_agent::catalog::DriverBranch;
use gpu_agent::sources::kmsg;

fn main() {
    parse_throughput();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path());
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_gpu-agent"))
        .arg("--config")
        .arg(&config)
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start daemon");
    let socket = dir.path().join("agent.sock");
    wait_for(&socket, |s| s.contains("\"state\":\"on\""));
    latency(&socket);
    idle(daemon.id());
    let _ = daemon.kill();
    let _ = daemon.wait();
}

fn parse_throughput() {
    let noise = [
        "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
        "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode. Quota mode: none.",
        "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
        "nvidia-uvm: Loaded the UVM driver, major device number 510.",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.133.20  Release Build",
    ];
    let faults = [
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception on (GPC 0, TPC 1, SM 0)",
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 27 egress non-posted PRIV error",
    ];
    let mix: Vec<String> = (0..100_000)
        .map(|i| {
            if i % 10 == 0 {
                faults[i % 3]
            } else {
                noise[i % 5]
            }
        })
        .enumerate()
        .map(|(seq, m)| format!("3,{seq},{},-;{m}", seq * 10))
        .collect();
    for (name, lines) in [
        ("mixed (10% faults)", mix.clone()),
        (
            "all faults",
            mix.iter()
                .map(|l| l.replace("usb 1-1", "x"))
                .filter(|l| l.contains("Xid") || l.contains("SXid"))
                .cycle()
                .take(100_000)
                .collect::<Vec<_>>(),
        ),
    ] {
        let started = Instant::now();
        let mut found = 0usize;
        for _ in 0..5 {
            let counters = std::sync::Arc::new(gpu_agent::model::KmsgCounters::default());
            let settings = kmsg::Settings {
                path: "/dev/null".into(),
                resume_after: None,
                branch: DriverBranch::Unknown,
                boot_time: Some(SystemTime::now()),
                accept_userspace: true,
                drill_key: None,
            };
            let mut reader = kmsg::RecordReader::new(settings, counters);
            for line in &lines {
                let record = kmsg::record::parse(line).expect("record");
                found += usize::from(reader.on_record(&record).is_some());
            }
        }
        let per_sec = (5 * lines.len()) as f64 / started.elapsed().as_secs_f64();
        println!("parse+classify, {name}: {per_sec:.0} lines/s ({found} faults)");
    }
}

fn write_config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("config.toml");
    let text = format!(
        "state_dir = {:?}\n[status]\nsocket = {:?}\n[metrics]\nenabled = false\n[kmsg]\naccept_userspace = true\n",
        dir.join("state"),
        dir.join("agent.sock")
    );
    std::fs::write(&path, text).expect("config");
    path
}

fn snapshot(socket: &Path) -> Option<String> {
    let mut stream = UnixStream::connect(socket).ok()?;
    stream.write_all(b"{\"command\":\"status\"}\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

fn wait_for(socket: &Path, pred: impl Fn(&str) -> bool) -> Duration {
    let started = Instant::now();
    loop {
        if snapshot(socket).is_some_and(|s| pred(&s)) {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(10), "timed out");
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn latency(socket: &Path) {
    let mut samples = Vec::new();
    for i in 0..200u32 {
        // A fresh PCI address per sample, so each is a new fault the status must show.
        let domain = 0xb000 + i;
        let pci = format!("{domain:04x}:3b:00");
        let started = Instant::now();
        let mut kmsg = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/kmsg")
            .expect("open /dev/kmsg (root)");
        kmsg.write_all(
            format!(
                "<3>NVRM: Xid (PCI:{pci}): 79, pid=1, name=bench, GPU has fallen off the bus.\n"
            )
            .as_bytes(),
        )
        .expect("write");
        drop(kmsg);
        wait_for(socket, |s| s.contains(&format!("{pci}.0")));
        samples.push(started.elapsed());
    }
    samples.sort();
    let pct = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
    println!(
        "kernel-log line -> status socket: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} samples; includes status polling every 0.2 ms)",
        pct(50).as_secs_f64() * 1e3,
        pct(99).as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3,
        samples.len()
    );
}

fn idle(pid: u32) {
    let secs: u64 = std::env::var("BENCH_IDLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let ticks_before = gpu_agent_e2e::cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(secs));
    let (rss_kb, ticks_after) = (
        gpu_agent_e2e::status_kib(pid, "VmRSS:"),
        gpu_agent_e2e::cpu_ticks(pid),
    );
    // USER_HZ is 100 on Linux.
    let cpu_pct = (ticks_after - ticks_before) as f64 / (secs as f64 * 100.0) * 100.0;
    println!(
        "idle daemon over {secs} s: RSS {:.1} MiB, CPU {cpu_pct:.3} % of one core",
        rss_kb as f64 / 1024.0
    );
}
