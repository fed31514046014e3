//! The first fault after the start-up page hand-back, under page-cache pressure: is the
//! kernel-log line -> node condition PATCH still fast, or does the fault path's code have to
//! be read back from the disk?
//!
//! For each run a fresh daemon (release build, kernel log + Kubernetes sink) hands its
//! start-up pages back (`page_out_after`, here 3 s instead of a minute) and locks what its
//! rehearsal and steady state map again (`fault_path_watch`, here 5 s), then its binary is
//! evicted from the page cache (`posix_fadvise(DONTNEED)`: nothing maps those pages any
//! more, so they go) while another thread streams a file through the page cache from the
//! same disk, evicting it after every pass (a process reading more than memory holds). One
//! fatal Xid is injected and the clock stops at the first API request naming it. The runs
//! with `page_out_after = "0s"` (no hand-back: the code stays mapped) are the baseline.
//! (This machine cannot hold a file larger than its memory on its disk; evicting the binary
//! itself is the worst such pressure can do to it.)
//!
//! `sudo GPU_AGENT_BIN=target/release/gpu-agent PRESSURE_RUNS=20 \
//!   cargo bench -p gpu-agent-e2e --bench pressure_latency`

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_agent_e2e::kube_api::KubeApi;
use gpu_agent_e2e::{binary, inject, Agent, Host};

/// Drop `path`'s clean pages from the page cache.
fn evict(path: &std::path::Path) {
    if let Ok(file) = std::fs::File::open(path) {
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed);
    }
}

/// Stream a 1 GiB file through the page cache until `stop`, evicting it after each pass.
fn stream(dir: &std::path::Path, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let path = dir.join("stream.bin");
    std::thread::spawn(move || {
        let block = vec![0x5au8; 1 << 20];
        if let Ok(mut f) = std::fs::File::create(&path) {
            for _ in 0..1024 {
                let _ = f.write_all(&block);
            }
            let _ = f.sync_all();
        }
        let mut passes = 0;
        let mut buf = vec![0u8; 1 << 20];
        while !stop.load(Ordering::Relaxed) {
            evict(&path);
            if let Ok(mut f) = std::fs::File::open(&path) {
                while !stop.load(Ordering::Relaxed) && f.read(&mut buf).is_ok_and(|n| n > 0) {}
            }
            passes += 1;
        }
        let _ = std::fs::remove_file(&path);
        passes
    })
}

/// One fresh daemon: the first fatal Xid after the hand-back, line -> first API request.
fn run(page_out_after: &str, pressure: bool, n: u32) -> Duration {
    let host = Host::new();
    let api = KubeApi::start(&["bench-node"]);
    let config = host.config(&format!(
        "node_name = \"bench-node\"\npage_out_after = {page_out_after:?}\nfault_path_watch = \"5s\"\n[kubernetes]\nkubeconfig = {:?}\n",
        api.kubeconfig(host.dir.path())
    ));
    let agent = Agent::start(&config, &host.socket());
    // The start-up sync, then the hand-back and the lock (when on) and a quiet second.
    let deadline = Instant::now() + Duration::from_secs(20);
    if page_out_after != "0s" {
        while !agent.log().contains("fault path's pages") {
            assert!(Instant::now() < deadline, "no hand-back:\n{}", agent.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        if n == 1 {
            let log = agent.log();
            let line = log.lines().find(|l| l.contains("fault path's pages"));
            println!("page-out: {}", line.unwrap_or_default().trim());
        }
    } else {
        std::thread::sleep(Duration::from_secs(4));
    }
    std::thread::sleep(Duration::from_secs(1));
    if pressure {
        evict(&binary());
        std::thread::sleep(Duration::from_millis(200));
    }
    let bdf = format!("{:04x}:{:02x}:00", host.domain ^ 0x8000, n % 250 + 1);
    let seen_before = api.requests().len();
    let started = Instant::now();
    inject(&format!(
        "NVRM: Xid (PCI:{bdf}): 79, pid=1, name=bench, GPU has fallen off the bus."
    ));
    let arrived = api.wait_for_request_naming(seen_before, &bdf);
    drop(agent);
    arrived.duration_since(started)
}

fn report(what: &str, mut samples: Vec<Duration>) {
    println!(
        "{what}: {} ({} runs)",
        gpu_agent_e2e::percentiles(&mut samples),
        samples.len()
    );
}

fn main() {
    let runs: u32 = std::env::var("PRESSURE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let scratch = tempfile::tempdir().expect("tempdir");
    let stop = Arc::new(AtomicBool::new(false));
    let streamer = stream(scratch.path(), Arc::clone(&stop));
    let mut kept = Vec::new();
    let mut handed_back = Vec::new();
    for n in 0..runs {
        kept.push(run("0s", true, 2 * n));
        handed_back.push(run("3s", true, 2 * n + 1));
    }
    stop.store(true, Ordering::Relaxed);
    let passes = streamer.join().unwrap_or(0);
    println!("page-cache pressure: a 1 GiB file streamed and evicted {passes} times; the daemon's binary evicted before each fault");
    report(
        "first Xid, code kept mapped (page_out_after = 0s): line -> API request",
        kept,
    );
    report(
        "first Xid after the hand-back, fault path locked (page_out_after = 3s): line -> API request",
        handed_back,
    );
}
