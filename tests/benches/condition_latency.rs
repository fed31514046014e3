//! Kernel-log line to Kubernetes API request latency: the real daemon, the real
//! `/dev/kmsg`, the test API server. For each sample a fresh fatal Xid is injected and the
//! clock stops when the first request naming that GPU (the status PATCH, or its Event)
//! reaches the server.
//!
//! `sudo cargo bench -p gpu-agent-e2e --bench condition_latency`

use std::time::{Duration, Instant};

use gpu_agent_e2e::kube_api::KubeApi;
use gpu_agent_e2e::{inject, Agent, Host};

fn main() {
    let host = Host::new();
    let api = KubeApi::start(&["bench-node"]);
    let config = host.config(&format!(
        "node_name = \"bench-node\"\n[kubernetes]\nkubeconfig = {:?}\n",
        api.kubeconfig(host.dir.path())
    ));
    let agent = Agent::start(&config, &host.socket());
    // Let the start-up sync (conditions and Events for what the kernel log already holds) finish.
    std::thread::sleep(Duration::from_secs(3));
    let mut samples = Vec::new();
    for i in 0..100u32 {
        let bdf = format!("{:04x}:{:02x}:00", host.domain ^ 0x8000, i + 1);
        let seen_before = api.requests().len();
        let started = Instant::now();
        inject(&format!(
            "NVRM: Xid (PCI:{bdf}): 79, pid=1, name=bench, GPU has fallen off the bus."
        ));
        let arrived = api.wait_for_request_naming(seen_before, &bdf);
        samples.push(arrived.duration_since(started));
        std::thread::sleep(Duration::from_millis(150));
    }
    println!(
        "kernel-log line -> API server request: {} ({} samples, debounce 100 ms)",
        gpu_agent_e2e::percentiles(&mut samples),
        samples.len()
    );
    drop(agent);
}
