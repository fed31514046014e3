//! The fault path's pages, found at run time and locked (`host::resident`): after the
//! hand-back and a dropped page cache, a kernel-log fault reaching the API server and the
//! pod holding the GPU, a Spot notice reaching a trainer, an EFA device gone (NetworkingReady
//! False) and a `status` read nothing from
//! the disk (the daemon's major page faults say so); where the lock cannot be had, nothing
//! is handed back and `status` and the metrics say so. Runs the binary `GPU_AGENT_BIN`
//! names, else the test build: `scripts/test.sh` runs this file again on the release
//! build, where the fault path must read nothing from the disk.

use std::path::PathBuf;
use std::time::Duration;

use gpu_agent_e2e::imds::FakeImds;
use gpu_agent_e2e::kube_api::KubeApi;
use gpu_agent_e2e::kubelet::Kubelet;
use gpu_agent_e2e::trainer::{gpu_device, Trainer};
use gpu_agent_e2e::{free_port, inject, status_kib, wait_until as wait, Agent, Host, NvmlScenario};

const NODE: &str = "ip-10-0-0-7.ec2.internal";

/// `fault_path_watch`: how long the daemon watches what it maps again before the lock, and
/// then how often it locks what it mapped since.
const WATCH: Duration = Duration::from_secs(2);

/// Hand back half a second after start, lock after a watch of [`WATCH`]; NVML (the test library),
/// Kubernetes (heartbeat every second) and the checkpoint sink on, metrics on `port`. Every
/// periodic task runs within the watch (the funnel and EFA every second), as the default
/// watch outlasts the default intervals. The EC2 API and logind sources
/// are off: their polls and retries (minutes apart) are not the fault path, and their first
/// run after the lock would be counted with it.
fn config(host: &Host, imds: &FakeImds, api: &KubeApi, port: u16) -> PathBuf {
    host.checkpoint_config(
        imds,
        false,
        &format!(
            "node_name = \"{NODE}\"\npage_out_after = \"500ms\"\nfault_path_watch = \"{}s\"\n\
             [kubernetes]\nkubeconfig = {:?}\nheartbeat_interval = \"1s\"\n\
             [metrics]\nlisten = \"127.0.0.1:{port}\"\nfunnel_interval = \"1s\"\n\
             [efa]\npoll_interval = \"1s\"\n\
             [ec2]\nenabled = false\n[logind]\nenabled = false\n{}",
            WATCH.as_secs(),
            api.kubeconfig(host.dir.path()),
            host.nvml_config()
        ),
    )
}

/// The process's major page faults (`/proc/PID/stat`'s 12th field): pages read from the disk.
fn major_faults(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = stat.rsplit_once(") ").expect("comm").1;
    after
        .split_whitespace()
        .nth(9)
        .and_then(|v| v.parse().ok())
        .expect("majflt")
}

/// Size and Rss (KiB) of the daemon's own program's mappings, from `/proc/PID/smaps`.
fn program_mapped_kib(pid: u32) -> (u64, u64) {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
    let exe = exe.to_string_lossy().to_string();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let (mut size, mut rss, mut ours) = (0, 0, false);
    for line in smaps.lines() {
        let kib = |rest: &str| -> u64 {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .unwrap_or(0)
        };
        if let Some(rest) = line.strip_prefix("Size:") {
            size += if ours { kib(rest) } else { 0 };
        } else if let Some(rest) = line.strip_prefix("Rss:") {
            rss += if ours { kib(rest) } else { 0 };
        } else if line.split_whitespace().count() >= 5
            && line.as_bytes().first().is_some_and(u8::is_ascii_hexdigit)
            && line.contains('-')
        {
            // A mapping's header: read-only or executable, of the program.
            let perms = line.split_whitespace().nth(1).unwrap_or_default();
            ours = line.ends_with(exe.as_str()) && !perms.contains('w');
        }
    }
    (size, rss)
}

/// The page cache dropped: every clean page mapped by no one is gone, so a page the daemon
/// handed back and needs again is read from the disk.
fn drop_page_cache() {
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop_caches (root)");
}

#[test]
fn after_the_hand_back_and_a_dropped_page_cache_a_fault_and_a_notice_read_nothing_from_the_disk() {
    let host = Host::new();
    let imds = FakeImds::start();
    let api = KubeApi::start(&[NODE]);
    let gpu = gpu_device(host.dir.path(), "nvidia0");
    let handler = Trainer::start(host.dir.path(), "handler", "usr1", Some(&gpu), &[]);
    let port = free_port();
    // The pod holding GPU 1, where the fault happens: its Event is on the fault path too.
    let kubelet = Kubelet::start(&host.kubelet_socket());
    api.add_pod("ml", "train", "uid-train", NODE);
    kubelet.assign(
        "ml",
        "train",
        "trainer",
        "nvidia.com/gpu",
        &[&host.gpu_uuid(1)],
    );
    // An EFA device, gone after the lock: its fault is on the fault path too.
    let efa = host.add_efa(0, None);
    NvmlScenario::healthy().write(&host);
    let scenario = host.nvml_scenario_path();
    let agent = Agent::start_with_env(
        &config(&host, &imds, &api, port),
        &host.socket(),
        &[("FAKE_NVML_SCENARIO", &scenario.to_string_lossy())],
    );
    agent.wait_for_source_on(Duration::from_secs(5), "imds");
    agent.wait_for_source_on(Duration::from_secs(5), "efa");
    let pid = agent.pid();

    let s = agent.wait_for(Duration::from_secs(30), |s| {
        s["fault_path_lock"]["state"] == "locked"
    });
    let locked_kib = s["fault_path_lock"]["locked_kib"]
        .as_u64()
        .expect("locked_kib");
    assert!(locked_kib > 0, "{}", s["fault_path_lock"]);
    assert!(
        status_kib(pid, "VmLck:") >= locked_kib,
        "VmLck {} KiB, {locked_kib} KiB said",
        status_kib(pid, "VmLck:")
    );
    let (size, rss) = program_mapped_kib(pid);
    assert!(rss < size, "handed back: {rss} of {size} KiB mapped");
    let (_, text) = agent.status(false);
    assert!(
        text.contains(&format!(
            "Fault path: {locked_kib} KiB of code and data locked"
        )),
        "{text}"
    );
    let metrics = gpu_agent_e2e::http_get(port, "/metrics");
    assert!(
        metrics.contains(r#"gpu_agent_fault_path_lock{state="locked"} 1"#)
            && metrics.contains(&format!(
                "gpu_agent_fault_path_locked_bytes {}",
                locked_kib * 1024
            )),
        "{metrics}"
    );

    // One more watch: a branch the daemon runs at steady state, but not in every watch,
    // is locked at the next one, as on a node, where the first watch alone is two minutes.
    std::thread::sleep(WATCH);
    drop_page_cache();
    let before = major_faults(pid);
    inject(&format!(
        "NVRM: Xid (PCI:{}): 79, pid=1234, name=python3, GPU has fallen off the bus.",
        host.gpu_bdf(1)
    ));
    wait(
        Duration::from_secs(10),
        "AcceleratedHardwareReady False",
        || {
            api.condition(NODE, "AcceleratedHardwareReady")
                .is_some_and(|c| c["status"] == "False")
        },
    );
    wait(
        Duration::from_secs(10),
        "the Event on the pod holding GPU 1",
        || {
            api.events()
                .iter()
                .any(|e| e["involvedObject"]["name"] == "train")
        },
    );
    imds.spot_terminate_in(Duration::from_secs(120));
    wait(Duration::from_secs(10), "SIGUSR1 at the trainer", || {
        handler.signals() == ["SIGUSR1"]
    });
    host.remove_efa(&efa);
    wait(Duration::from_secs(10), "NetworkingReady False", || {
        api.condition(NODE, "NetworkingReady")
            .is_some_and(|c| c["status"] == "False")
    });
    let (code, text) = agent.status(false);
    assert_eq!(code, 1, "{text}");
    let after = major_faults(pid);
    let s = agent.snapshot().expect("snapshot");
    // The test build is not optimised: each generic instance its own, debug checks in every
    // copy, three times the code; a branch the rehearsal did not take often lands on a page
    // of its own there. The release build (scripts/test.sh) must read nothing.
    if std::env::var_os("GPU_AGENT_BIN").is_some() {
        assert_eq!(
            after - before,
            0,
            "pages read from the disk on the fault path; the lock is now {}",
            s["fault_path_lock"]
        );
    } else {
        eprintln!(
            "test build: {} pages read from the disk on the fault path",
            after - before
        );
    }
    assert!(agent.stop().success());
}

/// Without `CAP_IPC_LOCK` and with `LimitMEMLOCK=0`, the working set cannot be locked: the
/// daemon maps its whole program again (nothing stays handed back), and says so.
#[test]
fn a_lock_that_cannot_be_had_hands_nothing_back_and_says_so() {
    let host = Host::new();
    let imds = FakeImds::start();
    let api = KubeApi::start(&[NODE]);
    let port = free_port();
    let wrapper: Vec<String> = [
        "setpriv",
        "--bounding-set=-ipc_lock",
        "--inh-caps=-ipc_lock",
        "prlimit",
        "--memlock=0:0",
        "--",
    ]
    .map(String::from)
    .to_vec();
    let agent = Agent::start_under(&config(&host, &imds, &api, port), &host.socket(), &wrapper);
    let pid = agent.pid();
    let s = agent.wait_for(Duration::from_secs(30), |s| {
        s["fault_path_lock"]["state"] == "refused"
    });
    let reason = s["fault_path_lock"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("mlock"), "{reason}");
    assert_eq!(status_kib(pid, "VmLck:"), 0);
    let (size, rss) = program_mapped_kib(pid);
    assert_eq!(rss, size, "every page of the program mapped again");
    let (_, text) = agent.status(false);
    assert!(text.contains("Fault path: NOT LOCKED ("), "{text}");
    let metrics = gpu_agent_e2e::http_get(port, "/metrics");
    assert!(
        metrics.contains(r#"gpu_agent_fault_path_lock{state="refused"} 1"#),
        "{metrics}"
    );
    assert!(
        agent.log().contains("could not be locked"),
        "{}",
        agent.log()
    );
    assert!(agent.stop().success());
}
