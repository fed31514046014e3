//! Footprint with every source and sink on: start-to-READY time, then idle RSS and CPU over
//! `FOOTPRINT_SECS` (default 600 s). The daemon (release build) runs against test doubles for
//! what this machine lacks: the fake NVML library (8 GPUs x 18 NVLinks, polled every 10 s as
//! by default), the test IMDS (a Spot instance: polled every second; `FOOTPRINT_LIFE_CYCLE`
//! sets what its `instance-life-cycle` answers, `on-demand` for an instance no Spot notice
//! can come to), the test EC2 API, the test Kubernetes
//! API server (conditions, heartbeat every minute), the test kubelet's pod-resources server
//! (with the Kubernetes sink: eight pods, one per GPU), a fake logind on a private D-Bus, and
//! a p5's 32 EFA devices in the fake sysfs (read every 5 s).
//!
//! `FOOTPRINT_CONFIG` picks fewer sources, to see what each costs: `kmsg` (the kernel log
//! only), `kmsg+imds` (and IMDS polled every second), `kmsg+imds+kube` (and the Kubernetes
//! sink), `...+efa` (the EFA devices), or `all` (default). Besides RSS and CPU it prints where the resident memory is, from
//! `/proc/PID/smaps`: the binary's own pages, shared libraries, heap and other anonymous
//! memory, stacks, and `smaps_rollup`'s RSS, PSS and anonymous memory. The idle window opens
//! once the daemon has handed start-up's pages back to the kernel and locked its fault path
//! (its defaults `page_out_after = "1m"` and `fault_path_watch = "2m"`: about 3 minutes after
//! start; `FOOTPRINT_PAGE_OUT_AFTER` and `FOOTPRINT_FAULT_PATH_WATCH` set them: a
//! `page_out_after` of "0s" measures what stays mapped without the hand-back).
//!
//! `sudo tests/bench.sh footprint`, or
//! `sudo GPU_AGENT_BIN=target/release/gpu-agent FOOTPRINT_SECS=600 \
//!   cargo bench -p gpu-agent-e2e --bench footprint`

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use gpu_agent_e2e::ec2::FakeEc2;
use gpu_agent_e2e::imds::FakeImds;
use gpu_agent_e2e::kube_api::KubeApi;
use gpu_agent_e2e::kubelet::Kubelet;
use gpu_agent_e2e::logind::FakeLogind;
use gpu_agent_e2e::{
    cpu_by_thread, cpu_ns_live_threads, cpu_ticks, fake_nvml, status_kib, Agent, Host, NvmlScenario,
};

fn main() {
    let secs: u64 = std::env::var("FOOTPRINT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let host = Host::new();
    let imds = FakeImds::start();
    if let Ok(life_cycle) = std::env::var("FOOTPRINT_LIFE_CYCLE") {
        imds.set_life_cycle(&life_cycle);
    }
    let ec2 = FakeEc2::start();
    let api = KubeApi::start(&["bench-node"]);
    let logind = FakeLogind::start(host.dir.path());
    let kubelet = Kubelet::start(&host.kubelet_socket());
    for gpu in 0..8 {
        let pod = format!("train-{gpu}");
        kubelet.assign(
            "ml",
            &pod,
            "trainer",
            "nvidia.com/gpu",
            &[&host.gpu_uuid(gpu)],
        );
    }
    NvmlScenario::healthy().write(&host);
    let which = std::env::var("FOOTPRINT_CONFIG").unwrap_or_else(|_| "all".into());
    let on = |part: &str| which == "all" || which.split('+').any(|p| p == part);
    // A p5's 32 EFA devices, read every 5 s (without them the source turns itself off).
    if on("efa") {
        for i in 0..32 {
            host.add_efa(i, None);
        }
    }
    let off = |section: &str| format!("[{section}]\nenabled = false\n");
    // FOOTPRINT_PAGE_OUT_AFTER sets `page_out_after` (default "1m", as the daemon's default;
    // "0s" to measure without the start-up hand-back).
    let page_out_value = std::env::var("FOOTPRINT_PAGE_OUT_AFTER").unwrap_or_else(|_| "1m".into());
    let hand_back = page_out_value != "0s";
    let watch = std::env::var("FOOTPRINT_FAULT_PATH_WATCH").unwrap_or_else(|_| "2m".into());
    let page_out = format!("page_out_after = {page_out_value:?}\nfault_path_watch = {watch:?}\n");
    let config = host.config(&format!(
        "node_name = \"bench-node\"\n{page_out}{}{}{}{}{}{}",
        if on("nvml") {
            format!("[nvml]\nlibrary = {:?}\nexpected_gpus = 8\n", fake_nvml())
        } else {
            off("nvml")
        },
        if on("imds") {
            format!("[imds]\nendpoint = {:?}\n", imds.endpoint())
        } else {
            off("imds")
        },
        if on("ec2") {
            format!("[ec2]\nendpoint = {:?}\n", ec2.endpoint())
        } else {
            off("ec2")
        },
        if on("kube") {
            format!(
                "[kubernetes]\nkubeconfig = {:?}\n",
                api.kubeconfig(host.dir.path())
            )
        } else {
            off("kubernetes")
        },
        if on("logind") {
            format!("[logind]\nbus_address = {:?}\n", logind.address)
        } else {
            off("logind")
        },
        // The metrics endpoint is on in every configuration, as it is by default.
        format_args!(
            "[metrics]\nlisten = \"127.0.0.1:{}\"\n",
            gpu_agent_e2e::free_port()
        ),
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

    // Settle (first polls, first PATCH), then measure. With the default config the daemon
    // hands start-up's pages back to the kernel a minute after start (`page_out_after`):
    // the idle window starts after that, as a node sees it for the rest of its life.
    std::thread::sleep(Duration::from_secs(5));
    let pid = agent.pid();
    println!(
        "after start-up (5 s after READY): RSS {} KiB",
        status_kib(pid, "VmRSS:")
    );
    // The hand-back, then the lock (or its refusal), each as the log says.
    let logged = |what: &str, within: Duration| {
        let until = Instant::now() + within;
        loop {
            if let Some(l) = agent.log().lines().find(|l| l.contains(what)) {
                break l.trim().to_string();
            }
            if Instant::now() > until {
                break format!("no {what:?} within {} s", within.as_secs());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    if hand_back {
        let within = Duration::from_secs(660);
        println!("page-out: {}", logged("Start-up pages", within));
        println!("fault path: {}", logged("fault path's pages", within));
    } else {
        println!("page-out: none (page_out_after = 0s)");
    }
    // The window opens 70 s after start at the earliest (after the lock, when there is one).
    let opens = started + Duration::from_secs(70);
    std::thread::sleep(
        opens
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(5)),
    );
    let lists0 = kubelet.list_calls();
    let group = CpuGroup::join(pid);
    let all0 = group.as_ref().and_then(CpuGroup::usage_ns);
    let by_thread0 = cpu_by_thread(pid);
    let (ticks0, ns0, t0) = (cpu_ticks(pid), cpu_ns_live_threads(pid), Instant::now());
    let mut rss_max = 0;
    while t0.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(1));
        rss_max = rss_max.max(status_kib(pid, "VmRSS:"));
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = (cpu_ticks(pid) - ticks0) as f64 / 100.0 / elapsed * 100.0;
    let cpu_precise = cpu_ns_live_threads(pid).saturating_sub(ns0) as f64 / 1e9 / elapsed * 100.0;
    let cpu_all = group
        .as_ref()
        .and_then(CpuGroup::usage_ns)
        .zip(all0)
        .map_or("unavailable".to_string(), |(now, then)| {
            format!(
                "{:.4}%",
                now.saturating_sub(then) as f64 / 1e9 / elapsed * 100.0
            )
        });
    println!(
        "idle {secs} s, {which}: RSS {} KiB now, max {rss_max} KiB, VmHWM {} KiB; CPU {cpu:.3}% of one core (10 ms ticks; live threads, to the microsecond: {cpu_precise:.4}%; every thread, exited ones too, from its own cgroup: {cpu_all}); IMDS GETs {}, API requests {}, kubelet pod-resources Lists while idle {}",
        status_kib(pid, "VmRSS:"),
        status_kib(pid, "VmHWM:"),
        imds.gets(),
        api.requests().len(),
        kubelet.list_calls() - lists0
    );
    let mut by_thread: Vec<(String, f64)> = cpu_by_thread(pid)
        .into_iter()
        .map(|(comm, ns)| {
            let before = by_thread0.get(&comm).copied().unwrap_or(0);
            (comm, ns.saturating_sub(before) as f64 / 1e6)
        })
        .filter(|(_, ms)| *ms > 0.0)
        .collect();
    by_thread.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!(
        "CPU by live thread over the window (ms): {}",
        by_thread
            .iter()
            .map(|(comm, ms)| format!("{comm} {ms:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("resident memory by mapping (KiB): {}", breakdown(pid));
    println!(
        "smaps_rollup at the end of the window (KiB): {}",
        rollup(pid)
    );

    // The first fault after the idle window: its code was handed back with start-up's and
    // is read back from the page cache or the disk on the way.
    let injected = Instant::now();
    gpu_agent_e2e::inject(&format!(
        "NVRM: Xid (PCI:{}): 79, pid=1, name=bench, GPU has fallen off the bus.",
        host.gpu_bdf(0)
    ));
    let mut to_patch = None;
    let to_status = loop {
        let shown = agent
            .snapshot()
            .is_some_and(|s| !gpu_agent_e2e::faults_on(&s, &host).is_empty());
        if shown {
            break injected.elapsed();
        }
        assert!(
            injected.elapsed() < Duration::from_secs(10),
            "the Xid was not shown"
        );
        std::thread::sleep(Duration::from_micros(200));
    };
    if on("kube") {
        let deadline = Instant::now() + Duration::from_secs(10);
        while to_patch.is_none() && Instant::now() < deadline {
            to_patch = api
                .requests()
                .iter()
                .find(|r| r.method == "PATCH" && r.at > injected && r.body.contains("Xid"))
                .map(|r| r.at - injected);
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    println!(
        "first Xid after the idle window: in status after {:.1} ms{}; RSS then {} KiB",
        to_status.as_secs_f64() * 1e3,
        to_patch.map_or(String::new(), |d| format!(
            ", node condition PATCH after {:.1} ms",
            d.as_secs_f64() * 1e3
        )),
        status_kib(pid, "VmRSS:")
    );
    drop(agent);
}

/// `Rss`, `Pss` and `Anonymous` from `/proc/PID/smaps_rollup` (KiB).
fn rollup(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    ["Rss:", "Pss:", "Anonymous:"]
        .iter()
        .map(|key| {
            let kib = text
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .unwrap_or("?");
            format!("{} {kib}", key.trim_end_matches(':'))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Resident KiB per kind of mapping in `/proc/PID/smaps`: the binary's own pages, shared
/// libraries, heap, other anonymous memory (allocator arenas, thread stacks), the main stack.
fn breakdown(pid: u32) -> String {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut groups: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    let mut kind = "anonymous";
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or_default();
        if first.contains('-') && first.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            let path = line.split_whitespace().nth(5).unwrap_or("");
            kind = match path {
                "" => "anonymous",
                "[heap]" => "heap",
                "[stack]" => "stack",
                p if p.ends_with("/gpu-agent") => "binary",
                p if p.starts_with('[') => "kernel",
                _ => "libraries",
            };
        } else if first == "Rss:" {
            *groups.entry(kind).or_default() +=
                fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        }
    }
    groups
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A cgroup of the daemon's own, for its CPU time to the nanosecond over every thread it
/// ran, those that ended included (the blocking pool's come and go): cgroup v2's `cpu.stat`
/// where mounted, else v1's `cpuacct`. `None` where neither can be made (not root).
struct CpuGroup {
    dir: std::path::PathBuf,
    v2: bool,
}

impl CpuGroup {
    fn join(pid: u32) -> Option<Self> {
        let name = format!("gpu-agent-footprint-{pid}");
        let candidates = [
            ("/sys/fs/cgroup/unified", true),
            ("/sys/fs/cgroup", true),
            ("/sys/fs/cgroup/cpuacct", false),
        ];
        candidates.iter().find_map(|(root, v2)| {
            let root = std::path::Path::new(root);
            let marker = if *v2 {
                "cgroup.controllers"
            } else {
                "cpuacct.usage"
            };
            if !root.join(marker).exists() {
                return None;
            }
            let dir = root.join(&name);
            std::fs::create_dir(&dir).ok()?;
            let group = Self { dir, v2: *v2 };
            std::fs::write(group.dir.join("cgroup.procs"), pid.to_string()).ok()?;
            group.usage_ns().map(|_| group)
        })
    }

    fn usage_ns(&self) -> Option<u64> {
        if self.v2 {
            let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
            stat.lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|us| us * 1000)
        } else {
            std::fs::read_to_string(self.dir.join("cpuacct.usage"))
                .ok()?
                .trim()
                .parse()
                .ok()
        }
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        // Empty once the daemon has exited; a cgroup with no process can be removed.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
