//! Fault injection against the real daemon: the API server down, slow, failing and refusing
//! during faults; IMDS slow, failing, malformed and expiring its tokens; NVML failing on one
//! GPU; the agent SIGKILLed in the middle of a state write; a full state disk; a flood of
//! status-socket clients. After each, the agent is up, its state is right, and nothing that
//! should have been reported or signalled was lost.
//!
//! (The kernel-log overrun under a flood has its own test binary, `kmsg_overrun.rs`: it
//! overwrites the shared kernel log, so it must not run beside other tests.)

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use gpu_agent_e2e::imds::{FakeImds, ImdsFault};
use gpu_agent_e2e::kube_api::{KubeApi, Mode};
use gpu_agent_e2e::trainer::{gpu_device, Trainer};
use gpu_agent_e2e::{fault, inject, wait_until as wait, Agent, Host, NvmlScenario};
use serde_json::Value;

const NODE: &str = "fault-node";
const HW: &str = "AcceleratedHardwareReady";

fn source_state(s: &Value, source: &str) -> String {
    s["sources"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["source"] == source))
        .map(|x| x["state"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

fn xid(host: &Host, gpu: usize, code: u32) {
    inject(&format!(
        "NVRM: Xid (PCI:{}): {code}, pid=1, name=train, injected fault",
        host.gpu_bdf(gpu)
    ));
}

/// One fault arrives in each way the API server can fail; every one ends up on the condition
/// and as an Event once it is back, and the daemon answers locally throughout.
#[test]
fn api_server_down_slow_failing_or_refusing_during_faults_loses_nothing() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let kubeconfig = api.kubeconfig(host.dir.path());
    let config = host.config(&format!(
        "node_name = \"{NODE}\"\n[kubernetes]\nkubeconfig = {kubeconfig:?}\nheartbeat_interval = \"1s\"\n"
    ));
    let agent = Agent::start(&config, &host.socket());
    wait(Duration::from_secs(5), "the first condition", || {
        api.condition(NODE, HW).is_some()
    });

    // A new fault arrives while the API server fails in each way in turn; the daemon itself
    // knows at once, whatever the API server does.
    let arrives = |gpu: usize, code: u32, how: &str| {
        xid(&host, gpu, code);
        agent.wait_for(Duration::from_secs(2), |s| {
            fault(s, &host, "xid", Some(u64::from(code))).is_some()
        });
        let (status, _) = agent.status(false);
        assert_eq!(status, 1, "status answers while the API server is {how}");
    };
    api.set_mode(Mode::ServerError);
    arrives(0, 79, "failing (5xx)");
    api.set_mode(Mode::Unauthorized);
    arrives(1, 48, "refusing (401)");
    api.set_mode(Mode::Normal);
    api.state.lock().expect("state").delay = Duration::from_secs(3);
    arrives(2, 94, "slow");
    let (addr, state) = api.stop();
    arrives(3, 63, "down");
    // The API server is back, healthy.
    let api = KubeApi::restart(addr, state);
    api.state.lock().expect("state").delay = Duration::ZERO;
    api.set_mode(Mode::Normal);
    // The condition is written again (its message lists every fault in the shared kernel
    // log, so ours are checked through their Events, one per fault).
    let before = api.requests().len();
    wait(
        Duration::from_secs(15),
        "the condition written again",
        || {
            api.requests()
                .iter()
                .skip(before)
                .any(|r| r.method == "PATCH" && r.path.ends_with("/status"))
                && api
                    .condition(NODE, HW)
                    .is_some_and(|c| c["status"] == "False")
        },
    );
    wait(Duration::from_secs(15), "an Event for each fault", || {
        let events = api.events();
        (0..4).all(|g| {
            events.iter().any(|e| {
                e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(&host.gpu_bdf(g)))
            })
        })
    });
    assert!(agent.stop().success());
}

/// IMDS failing in every way it can: the source says so, keeps what it knew, and the Spot
/// notice that comes after still reaches the training process in time.
#[test]
fn imds_slow_failing_malformed_and_expired_tokens_still_deliver_the_notice() {
    let host = Host::new();
    let imds = FakeImds::start();
    let gpu = gpu_device(host.dir.path(), "nvidia0");
    let trainer = Trainer::start(host.dir.path(), "trainer", "usr1", Some(&gpu), &[]);
    let config = host.checkpoint_config(&imds, false, "");
    let agent = Agent::start(&config, &host.socket());
    agent.wait_for(Duration::from_secs(5), |s| source_state(s, "imds") == "on");

    // 5xx: the source is failed, with the reason.
    imds.set_fault(ImdsFault::ServerError);
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        source_state(s, "imds") == "failed"
    });
    assert!(
        s["summary"]
            .as_str()
            .is_some_and(|l| l.contains("imds failed")),
        "{}",
        s["summary"]
    );
    // Slow (beyond the client's 1 s timeouts): failed too, and the daemon still answers.
    imds.set_fault(ImdsFault::Slow(Duration::from_secs(3)));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        source_state(&agent.snapshot().expect("answers"), "imds"),
        "failed"
    );
    imds.set_fault(ImdsFault::None);
    agent.wait_for(Duration::from_secs(10), |s| source_state(s, "imds") == "on");

    // Malformed JSON: reported, and nothing is signalled on garbage.
    imds.set_spot(Some(r#"{"action": "terminate", "time": "#));
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        source_state(s, "imds") == "failed"
    });
    let reason = s["sources"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["source"] == "imds"))
        .map(|x| x["reason"].to_string())
        .unwrap_or_default();
    assert!(
        reason.contains("instance-action"),
        "reason names the body: {reason}"
    );
    assert!(
        trainer.signals().is_empty(),
        "no signal on a malformed notice"
    );
    imds.set_spot(None);
    agent.wait_for(Duration::from_secs(5), |s| source_state(s, "imds") == "on");

    // The token expires mid-run (the service forgets it): the client must fetch a new one.
    imds.expire_tokens();
    imds.spot_terminate_in(Duration::from_secs(120));
    let deadline = Instant::now() + Duration::from_secs(10);
    while trainer.signals() != ["SIGUSR1"] {
        assert!(
            Instant::now() < deadline,
            "no SIGUSR1 after the token expired: {:?}\n{}",
            agent.snapshot().map(|s| s["sources"].clone()),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    agent.wait_for(Duration::from_secs(5), |s| {
        s["pending_end"]["kind"] == "spot"
    });
    assert!(agent.stop().success());
}

/// A malformed rebalance body (one path) is reported, and never hides a valid Spot notice
/// (another path); a failing path keeps its client: no new token per failed poll.
#[test]
fn a_bad_imds_body_on_one_path_never_hides_a_spot_notice() {
    let host = Host::new();
    let imds = FakeImds::start();
    let gpu = gpu_device(host.dir.path(), "nvidia0");
    let trainer = Trainer::start(host.dir.path(), "trainer", "usr1", Some(&gpu), &[]);
    // The Capacity Block source has its own IMDS session: off, to count this one's.
    let config = host.checkpoint_config(&imds, false, "[ec2]\nenabled = false\n");
    imds.set_rebalance(Some(r#"{"noticeTime": "#));
    let agent = Agent::start(&config, &host.socket());
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        source_state(s, "imds") == "failed"
    });
    assert!(
        s.to_string().contains("rebalance"),
        "the reason names the path: {s}"
    );
    imds.spot_terminate_in(Duration::from_secs(120));
    wait(Duration::from_secs(5), "the Spot signal", || {
        trainer.signals() == ["SIGUSR1"]
    });
    agent.wait_for(Duration::from_secs(5), |s| {
        s["pending_end"]["kind"] == "spot"
    });
    // Ten polls of a failing path: one session token, not one per poll.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(imds.tokens_issued(), 1, "a new token PUT per failed poll");
    assert!(agent.stop().success());
}

/// Every NVML call for one GPU fails: the others are still watched, the failing one is not
/// reported as broken hardware, and once its calls work again it is watched too.
#[test]
fn nvml_failing_on_one_gpu_leaves_the_others_watched() {
    let host = Host::new();
    let failing = r#"errors = ["ecc_mode", "total_ecc_errors", "memory_error_counter", "retired_pages_pending", "remapped_rows", "nvlink_state", "nvlink_errors", "pcie", "clock_events"]"#;
    let agent = host.start_with_nvml(&NvmlScenario::healthy().gpu(2, failing), "");
    let s = agent.wait_for(Duration::from_secs(5), |s| source_state(s, "nvml") == "on");
    assert!(
        gpu_agent_e2e::faults_on(&s, &host).is_empty(),
        "failing calls are not a hardware fault: {:#}",
        s["faults"]
    );
    // A real fault on another GPU is still found.
    NvmlScenario::healthy()
        .gpu(2, failing)
        .gpu(
            5,
            "ecc.volatile_uncorrected = 2\necc.aggregate_uncorrected = 2",
        )
        .write(&host);
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        fault(s, &host, "ecc-uncorrected-volatile", None).is_some()
    });
    assert_eq!(
        fault(&s, &host, "ecc-uncorrected-volatile", None).expect("ecc")["gpu_index"],
        5
    );
    // GPU 2's calls work again and it has a fault of its own: found.
    NvmlScenario::healthy()
        .gpu(2, "remap.pending = true")
        .gpu(
            5,
            "ecc.volatile_uncorrected = 2\necc.aggregate_uncorrected = 2",
        )
        .write(&host);
    agent.wait_for(Duration::from_secs(5), |s| {
        gpu_agent_e2e::faults_on(s, &host)
            .iter()
            .any(|f| f["gpu_index"] == 2)
    });
    assert!(agent.stop().success());
}

/// SIGKILL while the state file is being replaced: the previous state is whole, and the
/// restarted agent has everything (the unsaved fault comes back from the kernel log, since
/// the cursor was not saved either).
#[test]
fn sigkill_during_a_state_write_leaves_whole_state_and_loses_nothing() {
    let host = Host::new();
    let config = host.config("");
    let state_file = host.dir.path().join("state/state.json");
    let agent = Agent::start(&config, &host.socket());
    xid(&host, 0, 79);
    agent.wait_for(Duration::from_secs(2), |s| {
        fault(s, &host, "xid", Some(79)).is_some()
    });
    assert!(agent.stop().success());
    let before = std::fs::read_to_string(&state_file).expect("state written");

    // The next write pauses after the temporary file is complete, before the rename.
    xid(&host, 1, 48);
    let agent = Agent::start_with_env(
        &config,
        &host.socket(),
        &[("GPU_AGENT_FAILPOINT", "pause-before-rename")],
    );
    wait(Duration::from_secs(10), "the write to pause", || {
        agent.log().contains("failpoint: paused")
    });
    // The write is stuck, the daemon is not: saves run beside the core.
    assert!(
        agent.snapshot().is_some(),
        "the daemon answers while its state write is stuck"
    );
    agent.kill();
    let after = std::fs::read_to_string(&state_file).expect("state still there");
    assert_eq!(after, before, "the old state is intact, not half-written");
    serde_json::from_str::<Value>(&after).expect("and parses");

    let agent = Agent::start(&config, &host.socket());
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        fault(s, &host, "xid", Some(48)).is_some()
    });
    assert!(
        fault(&s, &host, "xid", Some(79)).is_some(),
        "the saved fault is back"
    );
    assert_eq!(
        fault(&s, &host, "xid", Some(48)).expect("48")["count"],
        1,
        "the replayed line is counted once"
    );
    assert!(agent.stop().success());
}

/// The state directory's filesystem fills up: the agent warns, keeps the state in memory, the
/// old file stays whole, and the state is saved once there is room again.
#[test]
fn a_full_state_disk_keeps_state_in_memory_and_saves_when_there_is_room() {
    let host = Host::new();
    let state_dir = host.dir.path().join("state");
    std::fs::create_dir_all(&state_dir).expect("mkdir");
    let mount = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=1m",
            "gpu-agent-test",
            &state_dir.to_string_lossy(),
        ])
        .status()
        .expect("mount");
    assert!(mount.success(), "mount tmpfs (tests run as root)");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(state_dir.clone());

    let config = host.config("");
    let agent = Agent::start(&config, &host.socket());
    xid(&host, 0, 79);
    agent.wait_for(Duration::from_secs(2), |s| {
        fault(s, &host, "xid", Some(79)).is_some()
    });
    let state_file = state_dir.join("state.json");
    wait(Duration::from_secs(5), "the first save", || {
        std::fs::read_to_string(&state_file).is_ok_and(|t| t.contains("\"xid\""))
    });
    let before = std::fs::read_to_string(&state_file).expect("state");

    // Fill the disk.
    let filler = state_dir.join("filler");
    let mut file = std::fs::File::create(&filler).expect("filler");
    let chunk = vec![0u8; 4096];
    while file.write_all(&chunk).is_ok() {}
    drop(file);

    xid(&host, 1, 48);
    agent.wait_for(Duration::from_secs(2), |s| {
        fault(s, &host, "xid", Some(48)).is_some()
    });
    wait(Duration::from_secs(5), "the warning", || {
        agent.log().contains("Cannot save state")
    });
    assert_eq!(
        std::fs::read_to_string(&state_file).expect("state"),
        before,
        "the old state is whole"
    );
    let (code, out) = agent.status(false);
    assert_eq!(code, 1, "status still answers: {out}");

    std::fs::remove_file(&filler).expect("make room");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&state_file).is_ok_and(|t| {
        serde_json::from_str::<Value>(&t).is_ok_and(|v| {
            v["faults"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["code"]["code"] == 48))
        })
    }) {
        assert!(
            Instant::now() < deadline,
            "state not saved again: {:?}\n{}",
            std::fs::read_dir(&state_dir)
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>()),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while !agent.log().contains("State saved again.") {
        assert!(
            Instant::now() < deadline,
            "no all-clear in the log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(agent.stop().success());
}

/// Hundreds of clients hold the status socket open, send garbage or never finish: the agent
/// stays up with bounded memory and file descriptors, keeps detecting faults, and answers
/// again as soon as the flood ends.
#[test]
fn a_flood_of_status_clients_is_bounded_and_the_agent_keeps_working() {
    let host = Host::new();
    let config = host.config("");
    let agent = Agent::start(&config, &host.socket());
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", agent.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let rss_kib = || gpu_agent_e2e::status_kib(agent.pid(), "VmRSS:");
    let (fds_before, rss_before) = (fds(), rss_kib());

    let mut held = Vec::new();
    for i in 0..500 {
        let Ok(mut stream) = UnixStream::connect(host.socket()) else {
            continue;
        };
        // The first hundred say nothing: they hold every one of the daemon's client slots
        // until its per-client timeout.
        match if i < 100 { 0 } else { i % 3 } {
            // Never sends anything.
            0 => {}
            // A request line that never ends.
            1 => {
                let _ = stream.write_all(&[b'x'; 8192]);
            }
            // Garbage, then waits.
            _ => {
                let _ = stream.write_all(b"{\"command\": 42}\n");
            }
        }
        held.push(stream);
    }
    // While flooded, a fault is still detected and the daemon is bounded.
    xid(&host, 0, 79);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        fds() < fds_before + 100,
        "file descriptors bounded: {} -> {}",
        fds_before,
        fds()
    );
    assert!(
        rss_kib() < rss_before + 32 * 1024,
        "memory bounded: {rss_before} -> {} KiB",
        rss_kib()
    );
    // `gpu-agent status` still answers while the socket is flooded (the client asks again
    // when it is turned away at the limit).
    let (code, out) = agent.status(false);
    assert_eq!(code, 1, "status answers during the flood: {out}");
    drop(held);

    let s = agent.wait_for(Duration::from_secs(5), |s| {
        fault(s, &host, "xid", Some(79)).is_some()
    });
    assert_eq!(s["health"], "fatal");
    let (code, _) = agent.status(false);
    assert_eq!(code, 1, "answers after the flood");
    assert!(agent.stop().success());
}

/// `/metrics` may be bound beyond loopback: idle clients that never send a request hold at
/// most the endpoint's connection limit, are closed after the header timeout, and a real
/// scrape still gets through.
#[test]
fn idle_metrics_clients_are_bounded_and_timed_out() {
    use std::io::Read;
    let host = Host::new();
    let port = gpu_agent_e2e::free_port();
    let config = host.config(&format!(
        "[metrics]\nlisten = \"127.0.0.1:{port}\"\n[kmsg]\nenabled = false\n"
    ));
    let agent = Agent::start(&config, &host.socket());
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", agent.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let before = fds();
    let mut idle: Vec<std::net::TcpStream> = (0..48)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = fds();
    assert!(
        during <= before + 16 + 2,
        "idle clients hold {} descriptors (limit 16)",
        during - before
    );
    // A scrape waits at most for the header timeout to free a slot.
    let response = gpu_agent_e2e::http_get(port, "/metrics");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    // The idle clients the endpoint accepted were closed by it.
    let mut closed = 0;
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_millis(50))).ok();
        closed += usize::from(matches!(s.read(&mut [0u8; 16]), Ok(0)));
    }
    assert!(closed >= 16, "only {closed} idle clients were closed");
    assert!(agent.stop().success());
}

/// Issue 22: a GPU's failed NVML read cleared the faults latched on it (a remap failure
/// vanished while its read failed, then came back): a flapping condition auto repair never
/// sees sustained. A partial read keeps that GPU's faults as they were.
#[test]
fn a_failed_read_keeps_the_faults_latched_on_that_gpu() {
    let host = Host::new();
    let broken = "remap.failure = true\nremap.uncorrectable = 12";
    let agent = host.start_with_nvml(&NvmlScenario::healthy().gpu(3, broken), "");
    agent.wait_for(Duration::from_secs(5), |s| {
        fault(s, &host, "remap-failure", None).is_some()
    });
    // Every call for GPU 3 fails now; the fault must stay through many polls.
    let failing = r#"errors = ["ecc_mode", "total_ecc_errors", "memory_error_counter", "retired_pages_pending", "remapped_rows", "nvlink_state", "nvlink_errors", "pcie", "clock_events"]"#;
    NvmlScenario::healthy().gpu(3, failing).write(&host);
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < until {
        let s = agent.snapshot().expect("snapshot");
        assert!(
            fault(&s, &host, "remap-failure", None).is_some(),
            "the fault was cleared by a failed read: {:#}",
            s["faults"]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Read again and healthy: now it clears.
    NvmlScenario::healthy().write(&host);
    agent.wait_for(Duration::from_secs(5), |s| {
        fault(s, &host, "remap-failure", None).is_none()
    });
    assert!(agent.stop().success());
}

/// Review 2026-12-03b L8: one call failing on every poll (here the DRAM/SRAM split, which
/// some GPU and driver pairs refuse) made the whole GPU "partially read", so its other NVML
/// faults could never clear: a `remap-pending` fixed by the GPU reset the agent recommends
/// stayed fatal until the next boot. Only the faults judged from the failed call are kept.
#[test]
fn a_call_that_always_fails_pins_only_its_own_faults() {
    let host = Host::new();
    let refuses = r#"errors = ["memory_error_counter"]"#;
    let agent = host.start_with_nvml(
        &NvmlScenario::healthy().gpu(3, &format!("{refuses}\nremap.pending = true")),
        "",
    );
    agent.wait_for(Duration::from_secs(5), |s| {
        fault(s, &host, "remap-pending", None).is_some()
    });
    // The GPU was reset: no remap pending; the split still fails on every poll.
    NvmlScenario::healthy().gpu(3, refuses).write(&host);
    agent.wait_for(Duration::from_secs(5), |s| {
        fault(s, &host, "remap-pending", None).is_none()
    });
    assert!(agent.stop().success());
}
