//! Footprint with every source and sink on: start-to-READY time, then idle RSS and CPU over
//! `FOOTPRINT_SECS` (default 600 s). The daemon (release build) runs against test doubles for
//! what this machine lacks: the fake NVML library (8 GPUs x 18 NVLinks, polled every 10 s as
//! by default), the test IMDS (polled every second), the test EC2 API, the test Kubernetes
//! API server (conditions, heartbeat every minute) and a fake logind on a private D-Bus.
//!
//! `sudo tests/bench.sh footprint`, or
//! `sudo GPU_AGENT_BIN=target/release/gpu-agent FOOTPRINT_SECS=600 \
//!   cargo bench -p gpu-agent-e2e --bench footprint`

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use gpu_agent_e2e::ec2::FakeEc2;
use gpu_agent_e2e::imds::FakeImds;
use gpu_agent_e2e::kube_api::KubeApi;
use gpu_agent_e2e::logind::FakeLogind;
use gpu_agent_e2e::{cpu_ticks, fake_nvml, status_kib, Agent, Host, NvmlScenario};

fn main() {
    let secs: u64 = std::env::var("FOOTPRINT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let host = Host::new();
    let imds = FakeImds::start();
    let ec2 = FakeEc2::start();
    let api = KubeApi::start(&["bench-node"]);
    let logind = FakeLogind::start(host.dir.path());
    NvmlScenario::healthy().write(&host);
    let config = host.config(&format!(
        "node_name = \"bench-node\"\n\
         [nvml]\nlibrary = {:?}\nexpected_gpus = 8\n\
         [imds]\nendpoint = {:?}\n\
         [ec2]\nendpoint = {:?}\n\
         [kubernetes]\nkubeconfig = {:?}\n\
         [logind]\nbus_address = {:?}\n\
         [metrics]\nlisten = \"127.0.0.1:{}\"\n",
        fake_nvml(),
        imds.endpoint(),
        ec2.endpoint(),
        api.kubeconfig(host.dir.path()),
        logind.address,
        gpu_agent_e2e::free_port(),
    ));
    let notify_path = host.dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("bind notify socket");
    notify
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let scenario = host.nvml_scenario_path();
    let started = Instant::now();
    let agent = Agent::start_with_env(
        &config,
        &host.socket(),
        &[
            ("NOTIFY_SOCKET", &notify_path.to_string_lossy()),
            ("FAKE_NVML_SCENARIO", &scenario.to_string_lossy()),
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
        ],
    );
    let mut buf = [0u8; 4096];
    let ready = loop {
        let n = notify.recv(&mut buf).expect("READY=1 within 10 s");
        if String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
            // The datagram was queued when sent; the socket was read after the start-up
            // wait in Agent::start, so this bounds start-to-READY from above.
            break started.elapsed();
        }
    };
    let s = agent.snapshot().expect("snapshot");
    let sources: Vec<String> = s["sources"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    format!(
                        "{}={}",
                        x["source"].as_str().unwrap_or("?"),
                        x["state"].as_str().unwrap_or("?")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    println!(
        "start to READY=1: <= {:.0} ms; sources: {}",
        ready.as_secs_f64() * 1e3,
        sources.join(" ")
    );

    // Settle (first polls, first PATCH), then measure.
    std::thread::sleep(Duration::from_secs(5));
    let pid = agent.pid();
    let (ticks0, t0) = (cpu_ticks(pid), Instant::now());
    let mut rss_max = 0;
    while t0.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(1));
        rss_max = rss_max.max(status_kib(pid, "VmRSS:"));
    }
    let cpu = (cpu_ticks(pid) - ticks0) as f64 / 100.0 / t0.elapsed().as_secs_f64() * 100.0;
    println!(
        "idle {secs} s, all sources on: RSS {} KiB now, max {rss_max} KiB, VmHWM {} KiB; CPU {cpu:.3}% of one core; IMDS GETs {}, API requests {}",
        status_kib(pid, "VmRSS:"),
        status_kib(pid, "VmHWM:"),
        imds.gets(),
        api.requests().len()
    );
    drop(agent);
}
