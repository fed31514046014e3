//! Notice-to-signal latency and the idle cost of polling IMDS every second: the real daemon
//! (release build), the test IMDS, and a python3 trainer that handles SIGUSR1. For each
//! sample a new Spot notice is posted and the clock stops when the trainer records the
//! signal. Expect the poll interval to dominate (uniform over 0-1 s). Each sample is a new
//! ending of the instance only because `[checkpoint] ending_window = "0s"` (by default a
//! second Spot notice within the hour is the same ending, signalled once).
//!
//! `cargo build --release -p gpu-agent && sudo cargo bench -p gpu-agent-e2e --bench notice_latency`

use std::time::{Duration, Instant, SystemTime};

use gpu_agent_e2e::imds::FakeImds;
use gpu_agent_e2e::trainer::{gpu_device, rfc3339, Trainer};
use gpu_agent_e2e::{cpu_ticks, Agent, Host};

fn main() {
    let host = Host::new();
    let imds = FakeImds::start();
    let gpu = gpu_device(host.dir.path(), "nvidia0");
    let trainer = Trainer::start(host.dir.path(), "bench", "usr1", Some(&gpu), &[]);
    let config = host.config(&format!(
        "[procfs]\nroot = \"/proc\"\n[imds]\nendpoint = {:?}\npoll_interval = \"1s\"\n[checkpoint]\ndevice_glob = \"{}/nvidia[0-9]*\"\nending_window = \"0s\"\n[ec2]\nenabled = false\n[logind]\nenabled = false\n",
        imds.endpoint(),
        host.dir.path().join("dev").display()
    ));
    let agent = Agent::start(&config, &host.socket());
    let pid = agent.pid();

    // Idle: polling IMDS every second, nothing happening.
    let idle = Duration::from_secs(
        std::env::var("BENCH_IDLE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    );
    let before = cpu_ticks(pid);
    std::thread::sleep(idle);
    let cpu = (cpu_ticks(pid) - before) as f64 / (idle.as_secs_f64() * 100.0) * 100.0;
    println!("idle daemon polling IMDS every 1 s (plus kmsg, NVML off, no API server) over {idle:?}: CPU {cpu:.3} % of one core");

    let mut samples = Vec::new();
    for i in 0..20u64 {
        let seen = trainer.signals().len();
        let time = rfc3339(SystemTime::now() + Duration::from_secs(120 + i));
        let started = Instant::now();
        imds.set_spot(Some(&format!(
            r#"{{"action": "terminate", "time": "{time}"}}"#
        )));
        while trainer.signals().len() == seen {
            assert!(started.elapsed() < Duration::from_secs(10), "no signal");
            std::thread::sleep(Duration::from_millis(1));
        }
        samples.push(started.elapsed());
        // Land the next notice at a random point of the poll cycle.
        std::thread::sleep(Duration::from_millis(137 * (i % 7)));
    }
    samples.sort();
    let pct = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
    println!(
        "Spot notice -> SIGUSR1 at the trainer (poll 1 s): p50 {:.0} ms, p99 {:.0} ms, min {:.0} ms ({} samples)",
        pct(50).as_secs_f64() * 1e3,
        pct(99).as_secs_f64() * 1e3,
        samples[0].as_secs_f64() * 1e3,
        samples.len()
    );
}
