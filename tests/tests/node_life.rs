//! A p5.48xlarge-like node's life, in compressed time, against the real daemon and the
//! doubles: boot with NVLinks untrained until a fake Fabric Manager step finishes; the
//! kubelet appearing after the agent with a `--hostname-override` that is not the hostname;
//! userspace records with local syslog facilities in the kernel log; one NVML enumeration
//! failure; the API server accepting requests and never answering while a Spot notice
//! arrives; then host shutdown.
//!
//! At every step: the hardware condition never goes False on this healthy node, conditions
//! land on the kubelet's node name, the Spot notice signals the trainer once and in time
//! despite the hung API server, the kernel-log source stays on and finds an Xid written after
//! the noise, and once the API server answers again everything converges.
//!
//! Its own test binary: it writes odd records into the shared kernel log and starts a process
//! that looks like a kubelet in the real /proc.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use gpu_agent_e2e::imds::FakeImds;
use gpu_agent_e2e::kube_api::{KubeApi, Mode};
use gpu_agent_e2e::logind::FakeLogind;
use gpu_agent_e2e::trainer::{gpu_device, Trainer};
use gpu_agent_e2e::{wait_until, Agent, Host, NvmlScenario};
use serde_json::Value;

const HARDWARE: &str = "AcceleratedHardwareReady";
const INTERRUPTION: &str = "InterruptionPending";
const SPOT: &str = r#"{"action": "terminate", "time": "2099-01-01T00:00:00Z"}"#;

/// A process named `kubelet` (its `comm`, from the executable's file name) whose command
/// line is a kubelet's (`/usr/bin/kubelet ... --hostname-override`).
struct FakeKubelet {
    child: Child,
    _exe: tempfile::TempDir,
}

impl FakeKubelet {
    fn start(node: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let exe = dir.path().join("kubelet");
        std::fs::copy("/usr/bin/perl", &exe).expect("perl");
        let child = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "exec -a /usr/bin/kubelet {} -e 'sleep 120' -- \
                 --config /etc/kubernetes/kubelet/config.json --hostname-override={node}",
                exe.display()
            ))
            .spawn()
            .expect("bash and perl");
        Self { child, _exe: dir }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Inject a record with a raw syslog priority (as journald's `ForwardToKMsg` or `logger`
/// write them), bypassing `inject`'s `<3>`.
fn inject_raw(priority: u32, text: &str) {
    use std::io::Write;
    let mut kmsg = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .expect("open /dev/kmsg");
    kmsg.write_all(format!("<{priority}>{text}\n").as_bytes())
        .expect("write /dev/kmsg");
}

/// `state` (and `: reason`) of source or sink `name`; `key` is `sources` or `sinks`.
fn source_state(s: &Value, name: &str, key: &str) -> String {
    s[key]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["source"] == name || x["sink"] == name))
        .map(|x| match x["reason"].as_str() {
            Some(reason) => format!("{}: {reason}", x["state"].as_str().unwrap_or_default()),
            None => x["state"].as_str().unwrap_or_default().to_string(),
        })
        .unwrap_or_default()
}

/// Condition `type_` on `node` as the API server holds it.
fn condition_status(api: &KubeApi, node: &str, type_: &str) -> Option<String> {
    api.condition(node, type_)
        .and_then(|c| c["status"].as_str().map(str::to_string))
}

/// The sequence number of the newest record in the kernel log now.
fn last_kmsg_seq() -> u64 {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    const O_NONBLOCK: i32 = 0o4000;
    let mut kmsg = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open("/dev/kmsg")
        .expect("open /dev/kmsg");
    let (mut last, mut buf) = (0, vec![0u8; 16 * 1024]);
    loop {
        match kmsg.read(&mut buf) {
            Ok(n) if n > 0 => {
                let text = String::from_utf8_lossy(&buf[..n]);
                if let Some(seq) = text.split(',').nth(1).and_then(|s| s.parse().ok()) {
                    last = seq;
                }
            }
            Err(e) if e.raw_os_error() == Some(32) => {}
            _ => return last,
        }
    }
}

/// The machine's uptime. The agent runs in a time namespace of its own whose boot clock is
/// set back so that, to it, the machine booted a minute ago: the NVLink boot grace is a
/// few minutes from there, whatever the real uptime (config refuses a grace over a day).
fn uptime() -> Duration {
    let text = std::fs::read_to_string("/proc/uptime").expect("/proc/uptime");
    let secs: f64 = text
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("uptime");
    Duration::from_secs_f64(secs)
}

#[test]
fn a_gpu_nodes_life_never_condemns_it_and_never_silences_the_agent() {
    let host = Host::new();
    let node = format!("ip-10-0-{}-23.ec2.internal", host.domain);
    let api = KubeApi::start(&[&node]);
    let imds = FakeImds::start();
    let logind = FakeLogind::start(host.dir.path());
    let gpu = gpu_device(host.dir.path(), "nvidia0");
    // Checkpoints for 3 s after SIGUSR1, then exits (the instance is going away).
    let trainer = Trainer::start(host.dir.path(), "trainer", "usr1-exit", Some(&gpu), &[]);

    // Boot: nodeadm's config phase wrote the kubeconfig; the kubelet is not running yet, and
    // Fabric Manager has not trained the NVLinks.
    let kubeconfig = api.kubeconfig(host.dir.path());
    let untrained = (0..8).fold(NvmlScenario::healthy(), |s, i| {
        s.gpu(
            i,
            &format!("nvlink.up = [{}]", vec!["false"; 18].join(", ")),
        )
    });
    let grace = Duration::from_secs(300);
    let booted_a_minute_ago = vec![
        "unshare".to_string(),
        "--time".to_string(),
        "--boottime".to_string(),
        format!("-{}", uptime().as_secs().saturating_sub(60)),
    ];
    let extra = format!(
        "cordon = true\n\
         [logind]\nbus_address = {bus:?}\nmax_delay = \"30s\"\n\
         [kmsg]\naccept_userspace = false\n\
         [kubernetes]\nkubeconfig = {kubeconfig:?}\ntimeout = \"1s\"\nheartbeat_interval = \"2s\"\n\
         kubelet_environment = {env:?}\n\
         {nvml}nvlink_boot_grace = \"{grace}s\"\n",
        bus = logind.address,
        env = host.dir.path().join("eks-kubelet-environment"),
        nvml = host.nvml_config(),
        grace = grace.as_secs(),
    );
    untrained.write(&host);
    let config = host.checkpoint_config(&imds, false, &extra);
    // The kernel log is shared with every other test, whose Xid drills are still in the
    // ring: this agent starts from the newest record, as an agent restarted in this boot
    // would (its saved cursor), so only this test's records count.
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    std::fs::create_dir_all(host.dir.path().join("state")).expect("state dir");
    std::fs::write(
        host.dir.path().join("state/state.json"),
        serde_json::json!({
            "version": 1,
            "boot_id": boot_id.trim(),
            "kmsg_cursor": last_kmsg_seq(),
            "faults": [],
        })
        .to_string(),
    )
    .expect("state");
    let agent = Agent::start_under_with_env(
        &config,
        &host.socket(),
        &booted_a_minute_ago,
        &[(
            "FAKE_NVML_SCENARIO",
            &host.nvml_scenario_path().to_string_lossy(),
        )],
    );
    agent.wait_for(Duration::from_secs(5), |s| {
        source_state(s, "nvml", "sources") == "on"
            && source_state(s, "kmsg", "sources") == "on"
            && source_state(s, "logind", "sources") == "on"
    });

    // The kubelet starts a moment later, under its own name.
    std::thread::sleep(Duration::from_millis(700));
    let _kubelet = FakeKubelet::start(&node);
    let s = agent.wait_for(Duration::from_secs(15), |s| s["node_name"] == node.as_str());
    assert_eq!(s["node_name_source"], "kubelet-command-line", "{s}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while condition_status(&api, &node, HARDWARE).as_deref() != Some("True") {
        assert!(
            Instant::now() < deadline,
            "no hardware condition on the kubelet's node: {:?}\n{:?}\n{}",
            agent.snapshot().map(|s| s["sinks"].clone()),
            api.requests()
                .iter()
                .map(|r| format!("{} {} {}", r.method, r.path, r.body))
                .collect::<Vec<_>>(),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Userspace records with local facilities (journald ForwardToKMsg, logger): once the
    // kernel-log source's death after ten of them in a row.
    for i in 0..12 {
        inject_raw(
            134 + 8 * (i % 8),
            &format!("gpu-agent-node-life {} noise {i}", host.domain),
        );
    }
    // The kernel's lines count; so do drills. (Userspace can never write the kernel's
    // facility, so this test's Xid is a `gpu-agent inject` drill, marked with this host's
    // key; the other tests' lines in the shared log are ignored, as a forged line on a real
    // node would be.)
    let (code, out, err) = gpu_agent_e2e::cli(&[
        "--config",
        &config.to_string_lossy(),
        "inject",
        "xid",
        "13",
        "--pci",
        &format!("{}.0", host.gpu_bdf(0)),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        gpu_agent_e2e::fault(s, &host, "xid", Some(13)).is_some()
    });
    assert_eq!(source_state(&s, "kmsg", "sources"), "on", "{s}");

    // Fabric Manager finishes: the links come up. Nothing was reported while they trained.
    NvmlScenario::healthy().write(&host);
    std::thread::sleep(Duration::from_millis(500));
    let s = agent.snapshot().expect("snapshot");
    assert!(
        gpu_agent_e2e::fault(&s, &host, "nvlink-down", None).is_none()
            && gpu_agent_e2e::fault(&s, &host, "nvlink-inactive", None).is_none(),
        "untrained links at boot are no fault: {s}"
    );

    // One NVML enumeration failure: the source fails, no GPU goes missing.
    NvmlScenario::healthy()
        .top("count_fails = true")
        .write(&host);
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        source_state(s, "nvml", "sources").contains("cannot enumerate")
    });
    assert!(
        gpu_agent_e2e::fault(&s, &host, "gpu-missing", None).is_none(),
        "a failed enumeration is not a missing GPU: {s}"
    );
    NvmlScenario::healthy().write(&host);
    agent.wait_for(Duration::from_secs(5), |s| {
        source_state(s, "nvml", "sources") == "on"
    });

    // The API server hangs (accepts, never answers) longer than every timeout; a Spot notice
    // arrives meanwhile and is signalled at once: within a poll (200 ms), the one API
    // timeout the pods' declarations may take (1 s), and the scan and signal (up to 300 ms
    // on a loaded machine), never after the declarations' own 2 s limit or the Events'.
    api.set_mode(Mode::Hang);
    std::thread::sleep(Duration::from_millis(300));
    let notice_at = Instant::now();
    imds.set_spot(Some(SPOT));
    let took = wait_until(Duration::from_secs(5), "the Spot signal", || {
        !trainer.signals().is_empty()
    });
    assert!(
        took <= Duration::from_millis(200 + 300) + Duration::from_secs(1),
        "signalled {took:?} after the notice, with the API server hung"
    );
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        source_state(s, "kubernetes", "sinks").contains("no answer within")
    });
    assert!(
        source_state(&s, "kubernetes", "sinks").starts_with("failed"),
        "a hung API server shows as the sink failed: {s}"
    );
    while notice_at.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(trainer.signals(), ["SIGUSR1"], "one notice, one signal");

    // The API server answers again: everything converges on the kubelet's node.
    api.set_mode(Mode::Normal);
    wait_until(
        Duration::from_secs(40),
        "InterruptionPending on the node",
        || condition_status(&api, &node, INTERRUPTION).as_deref() == Some("True"),
    );
    agent.wait_for(Duration::from_secs(10), |s| {
        source_state(s, "kubernetes", "sinks") == "on"
    });

    // Host shutdown: handled (and logind's delay lock released) although the Spot notice's
    // cordon hung on the API server: Kubernetes work never holds up a later notice.
    logind.prepare_for_shutdown(true);
    wait_until(Duration::from_secs(10), "the shutdown handled", || {
        logind.held().is_empty()
    });
    let s = agent.wait_for(Duration::from_secs(2), |s| {
        s["checkpoints"].as_array().is_some_and(|c| {
            c.iter().any(|r| {
                r["notice_id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("shutdown"))
                    && r["covered_by"]
                        .as_str()
                        .is_some_and(|b| b.starts_with("spot"))
            })
        })
    });
    assert_eq!(
        trainer.signals(),
        ["SIGUSR1"],
        "one ending, one signal: {s}"
    );

    // Throughout: only the kubelet's node was written, and its hardware condition never
    // went False.
    let patches: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
        .collect();
    assert!(!patches.is_empty());
    for p in &patches {
        assert_eq!(p.path, format!("/api/v1/nodes/{node}/status"), "wrong node");
        let body: Value = serde_json::from_str(&p.body).expect("patch body");
        for c in body["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert!(
                !(c["type"] == HARDWARE && c["status"] == "False"),
                "the healthy node was condemned: {c}"
            );
        }
    }
    let s = agent.snapshot().expect("snapshot");
    assert_eq!(source_state(&s, "kmsg", "sources"), "on", "{s}");
    assert!(agent.stop().success());
}
