//! The real daemon following the real `/dev/kmsg`: classification, GPU mapping, restarts,
//! floods, degraded start-up and the CLI around it.

use std::time::Duration;

use gpu_agent_e2e::{cli, fault, faults_on, inject, Agent, Host};
use serde_json::Value;

const SECOND: Duration = Duration::from_secs(1);

fn gpu_of(f: &Value) -> Option<u64> {
    f["gpu_index"].as_u64()
}

#[test]
fn classifies_every_line_format_against_the_right_gpu_within_a_second() {
    let host = Host::new();
    let agent = Agent::start(&host.config(""), &host.socket());
    let sw = host.nvswitch_bdf();
    let lines = [
        format!("NVRM: Xid (PCI:{}): 79, pid=1234, name=python3, GPU has fallen off the bus.", host.gpu_bdf(3)),
        format!("NVRM: Xid ({}): 13, Graphics Exception on (GPC 0, TPC 1, SM 0)", host.gpu_bdf(0)),
        format!("NVRM: Xid (PCI:{}): 31, pid='<unknown>', name=<unknown>, Ch 00000008, intr 10000000. MMU Fault", host.gpu_bdf(1)),
        format!("NVRM: Xid (PCI:{}): 48, pid=0, Ch 00000010, DBE", host.gpu_bdf(2)),
        format!("NVRM: GPU at PCI:{}: GPU has fallen off the bus.", host.gpu_bdf(4)),
        format!("NVRM: Xid (PCI:{}): 9999, pid=77, name=train, something new", host.gpu_bdf(5)),
        format!("nvidia-nvswitch2: SXid (PCI:{sw}): 12028, Non-fatal, Link 27 egress non-posted PRIV error"),
        format!("nvidia-nvswitch2: SXid (PCI:{sw}): 12028, Severity 0 Engine instance 27 Sub-engine instance 00"),
        format!("NVRM: Xid (PCI:{}): 144, SAW_MVB Fatal XC0 i0 Link 04 (0x00000001 0x00000002 0x0 0x0 0x0 0x0 0x0)", host.gpu_bdf(7)),
    ];
    // Look-alikes: quoted inside another message, or not an Xid number.
    inject(&format!(
        "audit: comm=\"grep\" args=\"NVRM: Xid (PCI:{}): 79, pid=1\"",
        host.gpu_bdf(6)
    ));
    inject(&format!(
        "NVRM: Xid (PCI:{}): seventy-nine, pid=1",
        host.gpu_bdf(6)
    ));
    for line in &lines[..5] {
        inject(line);
    }
    std::thread::sleep(Duration::from_millis(20)); // second batch: a fresh rate-limit window per open
    for line in &lines[5..] {
        inject(line);
    }

    let s = agent.wait_for(SECOND, |s| faults_on(s, &host).len() == 8);

    let f = fault(&s, &host, "xid", Some(79)).expect("Xid 79");
    assert_eq!(
        (gpu_of(f), f["severity"].as_str(), f["action"].as_str()),
        (Some(3), Some("fatal"), Some("reboot"))
    );
    assert_eq!(f["name"], "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS");
    assert_eq!(f["nvidia_action"], "RESTART_BM");

    let f = fault(&s, &host, "xid", Some(13)).expect("Xid 13");
    assert_eq!(
        (gpu_of(f), f["severity"].as_str(), f["action"].as_str()),
        (Some(0), Some("warning"), Some("restart-app"))
    );
    let f = fault(&s, &host, "xid", Some(31)).expect("Xid 31");
    assert_eq!(
        (gpu_of(f), f["severity"].as_str()),
        (Some(1), Some("warning"))
    );
    let f = fault(&s, &host, "xid", Some(48)).expect("Xid 48");
    assert_eq!(
        (gpu_of(f), f["severity"].as_str(), f["action"].as_str()),
        (Some(2), Some("fatal"), Some("reset-gpu"))
    );
    let f = fault(&s, &host, "fallen-off-bus", None).expect("fallen off the bus");
    assert_eq!(
        (gpu_of(f), f["severity"].as_str()),
        (Some(4), Some("fatal"))
    );
    let f = fault(&s, &host, "xid", Some(9999)).expect("unknown Xid");
    assert_eq!(
        (gpu_of(f), f["name"].as_str(), f["severity"].as_str()),
        (Some(5), Some("UNKNOWN_XID"), Some("warning"))
    );
    let f = fault(&s, &host, "sxid", Some(12028)).expect("SXid");
    assert_eq!(
        (
            f["component"]["kind"].as_str(),
            f["severity"].as_str(),
            f["count"].as_u64()
        ),
        (Some("nvswitch"), Some("warning"), Some(1)),
        "follow-up line is not a second event"
    );
    let f = fault(&s, &host, "xid", Some(144)).expect("NVLink5 Xid 144");
    assert_eq!(
        (gpu_of(f), f["severity"].as_str(), f["action"].as_str()),
        (Some(7), Some("fatal"), Some("reset-gpu"))
    );
    assert!(f["nvidia_action"]
        .as_str()
        .is_some_and(|a| a.contains("SAW_MVB")));

    // The look-alikes left GPU 6 alone.
    let gpus = s["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 8);
    assert_eq!(gpus[6]["health"], "healthy");
    assert_eq!(gpus[3]["health"], "fatal");
    assert_eq!(gpus[3]["pci"], format!("{}.0", host.gpu_bdf(3)));

    // The CLI shows the same model and exits 1 (unhealthy).
    let (code, out) = agent.status(true);
    assert_eq!(code, 1, "{out}");
    let cli_view: Value = serde_json::from_str(&out).expect("status --json is JSON");
    assert_eq!(faults_on(&cli_view, &host).len(), 8);
    let (code, table) = agent.status(false);
    assert_eq!(code, 1);
    assert!(table.contains("Health: FATAL"), "{table}");
    assert!(
        table.contains("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"),
        "{table}"
    );
    assert!(agent.stop().success());
}

#[test]
fn restart_does_not_count_twice_and_a_new_boot_resets() {
    let host = Host::new();
    let config = host.config("");
    let line = format!(
        "NVRM: Xid (PCI:{}): 48, pid=9, name=x, DBE",
        host.gpu_bdf(0)
    );
    let count = |s: &Value| fault(s, &host, "xid", Some(48)).and_then(|f| f["count"].as_u64());

    let agent = Agent::start(&config, &host.socket());
    inject(&line);
    inject(&line);
    agent.wait_for(SECOND, |s| count(s) == Some(2));
    assert!(agent.stop().success());

    // Same boot: the two records are behind the persisted cursor.
    let agent = Agent::start(&config, &host.socket());
    std::thread::sleep(Duration::from_millis(300));
    let s = agent.snapshot().expect("snapshot");
    assert_eq!(count(&s), Some(2), "restart re-counted records");
    inject(&line);
    agent.wait_for(SECOND, |s| count(s) == Some(3));
    assert!(agent.stop().success());

    // New boot id: the cursor restarts and this boot's log is read afresh; the old boot's
    // reset-gpu fault does not carry over, so the count is what the log holds, not 3 + 3.
    host.set_boot_id("boot-2");
    let agent = Agent::start(&config, &host.socket());
    let s = agent.wait_for(SECOND, |s| count(s) == Some(3));
    assert_eq!(s["boot_id"], "boot-2");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(count(&agent.snapshot().expect("snapshot")), Some(3));
    assert!(agent.stop().success());
}

#[test]
fn a_flood_of_identical_lines_is_one_fault_with_a_count_and_two_log_lines() {
    let host = Host::new();
    let agent = Agent::start(&host.config(""), &host.socket());
    let line = format!(
        "NVRM: Xid (PCI:{}): 95, pid=3, name=x, Uncontained: FBHUB. RST: Yes, D-RST: No",
        host.gpu_bdf(2)
    );
    const FLOOD: u64 = 300;
    for _ in 0..FLOOD {
        inject(&line);
    }
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        let lost = s["kmsg"]["records_lost"].as_u64().unwrap_or(0);
        fault(s, &host, "xid", Some(95))
            .and_then(|f| f["count"].as_u64())
            .is_some_and(|c| c + lost >= FLOOD)
    });
    assert_eq!(faults_on(&s, &host).len(), 1);
    let mentions = agent
        .log()
        .lines()
        .filter(|l| l.contains(&host.gpu_bdf(2)))
        .count();
    assert!(mentions <= 2, "the journal was flooded: {mentions} lines");
    assert!(agent.stop().success());
}

#[test]
fn check_reads_this_boot_without_a_daemon() {
    let host = Host::new();
    let config = host.config("");
    let config = config.to_string_lossy();
    inject(&format!(
        "NVRM: Xid (PCI:{}): 79, pid=1, name=x, GPU has fallen off the bus.",
        host.gpu_bdf(1)
    ));
    let (code, out, err) = cli(&["--config", &config, "check", "--json"]);
    assert_eq!(code, 1, "{err}");
    let s: Value = serde_json::from_str(&out).expect("JSON");
    let f = fault(&s, &host, "xid", Some(79)).expect("Xid 79 found by check");
    assert_eq!(gpu_of(f), Some(1));
}

#[test]
fn status_without_a_daemon_exits_2() {
    let host = Host::new();
    let config = host.config("");
    let (code, _, err) = cli(&["--config", &config.to_string_lossy(), "status"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot reach the gpu-agent daemon"), "{err}");
}

#[test]
fn bad_config_names_file_key_and_reason() {
    let host = Host::new();
    let path = host.dir.path().join("bad.toml");
    std::fs::write(&path, "[kmsg]\nenabled = true\nfollow = 3\n").expect("write");
    let (code, _, err) = cli(&["--config", &path.to_string_lossy(), "run"]);
    assert_eq!(code, 78, "{err}");
    assert!(
        err.contains(&*path.to_string_lossy()) && err.contains("follow") && err.contains("line 3"),
        "{err}"
    );
    std::fs::write(&path, "[metrics]\nlisten = \"everywhere\"\n").expect("write");
    let (code, _, err) = cli(&["--config", &path.to_string_lossy(), "check"]);
    assert_eq!(code, 78);
    assert!(err.contains("metrics.listen"), "{err}");
}

#[test]
fn unreadable_kmsg_and_missing_sysfs_degrade_without_crashing() {
    let host = Host::new();
    let config = host.config("[kmsg]\npath = \"/nonexistent/kmsg\"\n");
    std::fs::remove_dir_all(host.sysfs()).expect("remove sysfs");
    let agent = Agent::start(&config, &host.socket());
    let s = agent.snapshot().expect("daemon answers");
    assert_eq!(s["sources"][0]["state"], "failed");
    assert!(s["sources"][0]["reason"]
        .as_str()
        .is_some_and(|r| r.contains("/nonexistent/kmsg")));
    assert_eq!(s["summary"], "no GPUs, healthy; kmsg failed");
    let (code, table) = agent.status(false);
    assert_eq!(code, 0);
    assert!(
        table.contains("FAILED: cannot open kernel log /nonexistent/kmsg"),
        "{table}"
    );
    assert!(agent.stop().success());

    let (code, _, err) = cli(&["--config", &config.to_string_lossy(), "check"]);
    assert_eq!(code, 2, "check cannot check: {err}");
    assert!(err.contains("/nonexistent/kmsg"));
}

#[test]
fn metrics_endpoint_serves_faults() {
    let host = Host::new();
    let port = gpu_agent_e2e::free_port();
    let config = host.config(&format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    let agent = Agent::start(&config, &host.socket());
    inject(&format!(
        "NVRM: Xid (PCI:{}): 79, pid=1, name=x, GPU has fallen off the bus.",
        host.gpu_bdf(3)
    ));
    agent.wait_for(SECOND, |s| fault(s, &host, "xid", Some(79)).is_some());
    let response = gpu_agent_e2e::http_get(port, "/metrics");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response
            .to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{response}"
    );
    assert!(response.contains(r#"gpu_agent_fault_active{gpu="3",component="gpu",code="xid-79",severity="fatal",action="reboot"} 1"#), "{response}");
    assert!(response.contains("gpu_agent_gpus 8"));
    assert!(agent.stop().success());
}

/// Standalone (no kubeconfig, not in a pod) the Kubernetes sink is off, and off is not an
/// API error: nothing is counted in `gpu_agent_kubernetes_api_errors_total` while the sink
/// looks for a kubeconfig again (the third review counted 8 `CONNECT` errors in 30 s).
#[test]
fn standalone_counts_no_kubernetes_api_errors() {
    let host = Host::new();
    let port = gpu_agent_e2e::free_port();
    let missing = host.dir.path().join("no-kubeconfig");
    let config = host.config(&format!(
        "[metrics]\nlisten = \"127.0.0.1:{port}\"\n[kubernetes]\nkubeconfig = {missing:?}\n"
    ));
    let agent = Agent::start(&config, &host.socket());
    agent.wait_for(Duration::from_secs(5), |s| {
        s["sinks"].as_array().is_some_and(|a| {
            a.iter()
                .any(|x| x["sink"] == "kubernetes" && x["state"] == "off")
        })
    });
    // Several of its retries (200 ms, doubling).
    std::thread::sleep(Duration::from_secs(4));
    let response = gpu_agent_e2e::http_get(port, "/metrics");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let counted: Vec<&str> = response
        .lines()
        .filter(|l| l.starts_with("gpu_agent_kubernetes_api_errors_total{") && !l.ends_with(" 0"))
        .collect();
    assert!(counted.is_empty(), "{counted:?}");
    assert!(agent.stop().success());
}

/// A notify socket for the daemon in `host`'s directory, read with `timeout`, and its path
/// for `NOTIFY_SOCKET`.
fn notify_socket(host: &Host, timeout: Duration) -> (std::os::unix::net::UnixDatagram, String) {
    let path = host.dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind notify socket");
    socket.set_read_timeout(Some(timeout)).expect("timeout");
    (socket, path.to_string_lossy().into_owned())
}

#[test]
fn tells_systemd_ready_status_and_watchdog() {
    let host = Host::new();
    let (notify, notify_env) = notify_socket(&host, Duration::from_secs(5));
    let agent = Agent::start_with_env(
        &host.config(""),
        &host.socket(),
        &[("NOTIFY_SOCKET", &notify_env), ("WATCHDOG_USEC", "200000")],
    );
    let mut messages = Vec::new();
    let mut buf = [0u8; 4096];
    let mut recv_until = |messages: &mut Vec<String>, want: &dyn Fn(&str) -> bool| loop {
        // Watchdog pings arrive every 100 ms, so bound the wait by time, not by silence.
        assert!(
            messages.len() < 500,
            "expected message never came: {messages:?}"
        );
        let n = notify.recv(&mut buf).expect("a notify message within 5 s");
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        messages.push(m.clone());
        if want(&m) {
            return;
        }
    };
    recv_until(&mut messages, &|m| m.contains("READY=1"));
    let ready = messages.last().expect("ready").clone();
    // (The shared kernel log may hold other tests' faults on other PCI domains.)
    assert!(ready.contains("STATUS=8 GPUs, "), "{ready}");
    recv_until(&mut messages, &|m| m.contains("WATCHDOG=1"));

    inject(&format!(
        "NVRM: Xid (PCI:{}): 79, pid=1, name=x, GPU has fallen off the bus.",
        host.gpu_bdf(3)
    ));
    // The summary names the worst fault on the node (the shared kernel log may hold worse
    // ones from other tests): once the daemon has the fault, its summary reaches systemd.
    agent.wait_for(SECOND, |s| fault(s, &host, "xid", Some(79)).is_some());
    let current = || {
        format!(
            "STATUS={}\n",
            agent
                .snapshot()
                .map(|s| s["summary"].as_str().unwrap_or_default().to_string())
                .unwrap_or_default()
        )
    };
    recv_until(&mut messages, &|m| {
        m.starts_with("STATUS=") && m == current()
    });
    assert!(agent.stop().success());
    recv_until(&mut messages, &|m| m.contains("STOPPING=1"));
}

/// When the fault path's lock starts watching what the daemon maps, the systemd sink sends
/// the status it last sent once more: a fault's `STATUS=` then runs on locked pages.
#[test]
fn the_lock_watch_sends_systemd_the_same_status_once_more() {
    let host = Host::new();
    let (notify, notify_env) = notify_socket(&host, Duration::from_secs(10));
    let agent = Agent::start_with_env(
        &host.config("page_out_after = \"300ms\"\nfault_path_watch = \"1s\"\n"),
        &host.socket(),
        &[("NOTIFY_SOCKET", &notify_env)],
    );
    let mut buf = [0u8; 4096];
    // The status changes only when the summary does (the shared kernel log may hold other
    // tests' faults, so it may change a few times at start): the same one twice in a row
    // is the sink's part of the rehearsal.
    let mut last = String::new();
    let mut statuses = Vec::new();
    loop {
        let n = notify.recv(&mut buf).expect("a notify message within 10 s");
        let message = String::from_utf8_lossy(&buf[..n]).into_owned();
        // READY=1 carries the status too, read apart from the sink's.
        let Some(status) = message
            .lines()
            .find(|l| l.starts_with("STATUS="))
            .filter(|_| !message.contains("READY=1"))
        else {
            continue;
        };
        statuses.push(status.to_string());
        if status == last {
            break;
        }
        assert!(statuses.len() < 50, "no status sent twice: {statuses:?}");
        last = status.to_string();
    }
    agent.wait_for(Duration::from_secs(10), |s| {
        s["fault_path_lock"]["state"] != "watching"
    });
    assert!(agent.stop().success());
}

/// Anything that can write to `/dev/kmsg` (a privileged pod, a stray logger) could forge an
/// Xid 79 and get the node replaced: with `[kmsg] accept_userspace = false` (the default) a
/// userspace fault line is ignored and counted, and a `gpu-agent inject` drill still counts.
#[test]
fn a_forged_userspace_line_is_ignored_and_a_drill_is_accepted() {
    let host = Host::new();
    let config = host.config("[kmsg]\naccept_userspace = false\n");
    let agent = Agent::start(&config, &host.socket());
    let before = agent.snapshot().expect("snapshot")["kmsg"]["records_ignored"]
        .as_u64()
        .unwrap_or(0);
    inject(&format!(
        "NVRM: Xid (PCI:{}): 79, pid=1, name=x, GPU has fallen off the bus.",
        host.gpu_bdf(2)
    ));
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        s["kmsg"]["records_ignored"].as_u64().unwrap_or(0) > before
    });
    assert!(fault(&s, &host, "xid", Some(79)).is_none(), "forged: {s}");
    let metrics = agent.status(false).1;
    assert!(
        metrics.contains("userspace fault lines ignored"),
        "{metrics}"
    );

    let pci = format!("{}.0", host.gpu_bdf(2));
    let (code, out, err) = cli(&[
        "--config",
        &config.to_string_lossy(),
        "inject",
        "xid",
        "79",
        "--pci",
        &pci,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        fault(s, &host, "xid", Some(79)).is_some()
    });
    assert_eq!(s["health"], "fatal");
    assert!(agent.stop().success());
}

/// Issue 22: the drill mark was a fixed string any userspace writer could append. Now it is
/// keyed per boot (a root-only file in the state dir): the old mark, an altered drill line
/// and a replayed one are ignored; drills never escalate and are gone at the next boot.
#[test]
fn the_drill_mark_cannot_be_forged_altered_or_replayed() {
    let host = Host::new();
    let config = host.config("[kmsg]\naccept_userspace = false\n");
    let agent = Agent::start(&config, &host.socket());
    let ignored = |s: &Value| s["kmsg"]["records_ignored"].as_u64().unwrap_or(0);
    let before = ignored(&agent.snapshot().expect("snapshot"));
    // The old fixed mark.
    inject(&format!(
        "NVRM: Xid (PCI:{}): 79, pid=1, name=x, GPU has fallen off the bus. (injected by gpu-agent)",
        host.gpu_bdf(3)
    ));
    agent.wait_for(Duration::from_secs(5), |s| ignored(s) > before);
    // A genuine drill of Xid 48, then the same line with another code, then the same line.
    let pci = format!("{}.0", host.gpu_bdf(3));
    let (code, out, err) = cli(&[
        "--config",
        &config.to_string_lossy(),
        "inject",
        "xid",
        "48",
        "--pci",
        &pci,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let drill = out.trim().to_string();
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        fault(s, &host, "xid", Some(48)).is_some()
    });
    let after_drill = ignored(&s);
    inject(&drill.replace(": 48,", ": 79,"));
    inject(&drill);
    let s = agent.wait_for(Duration::from_secs(5), |s| ignored(s) >= after_drill + 2);
    assert!(
        fault(&s, &host, "xid", Some(79)).is_none(),
        "an altered drill: {s}"
    );
    let f = fault(&s, &host, "xid", Some(48)).expect("the drill");
    assert_eq!(f["count"], 1, "a replayed drill: {f}");
    assert_eq!(f["drill"], true, "{f}");
    assert!(agent.stop().success());
    // Restarted in the same boot: the drill, copied again, is still a replay (review
    // 2026-12-03b L1), and `check` leaves the daemon's key as it is.
    // `check` run where another boot id shows (as inside systemd-nspawn).
    let key = std::fs::read(host.dir.path().join("state/drill.key")).expect("drill key");
    host.set_boot_id("container-boot");
    let (code, out, err) = cli(&["--config", &config.to_string_lossy(), "check"]);
    host.set_boot_id("boot-1");
    assert!(code == 0 || code == 1, "{out}{err}");
    assert_eq!(
        std::fs::read(host.dir.path().join("state/drill.key")).expect("drill key"),
        key,
        "check rotated the key"
    );
    let agent = Agent::start(&config, &host.socket());
    let before = ignored(&agent.snapshot().expect("snapshot"));
    inject(&drill);
    let s = agent.wait_for(Duration::from_secs(5), |s| ignored(s) > before);
    let f = fault(&s, &host, "xid", Some(48)).expect("the drill");
    assert_eq!(f["count"], 1, "a drill replayed after a restart: {f}");
    assert!(agent.stop().success());
    // The next boot: drills do not survive it, whatever their action.
    host.set_boot_id("boot-2");
    let agent = Agent::start(&config, &host.socket());
    let s = agent.snapshot().expect("snapshot");
    assert!(fault(&s, &host, "xid", Some(48)).is_none(), "{s}");
    assert!(agent.stop().success());
}

/// Issue 22: the kernel-log cursor moved only on fault lines. On a quiet node the ring rolls
/// far past the last fault, and every restart counted all records since as lost (firing the
/// shipped alert on `gpu_agent_kmsg_records_lost_total`). A clean stop now saves the
/// newest record read.
#[test]
fn a_clean_restart_reports_no_lost_records() {
    let host = Host::new();
    // This boot's state, its cursor an old fault (long overwritten in a busy ring).
    std::fs::create_dir_all(host.dir.path().join("state")).expect("state dir");
    std::fs::write(
        host.dir.path().join("state/state.json"),
        serde_json::json!({"version": 1, "boot_id": "boot-1", "kmsg_cursor": 1, "faults": []})
            .to_string(),
    )
    .expect("state");
    let config = host.config("");
    let read = |s: &Value| s["kmsg"]["records_read"].as_u64().unwrap_or(0);
    let agent = Agent::start(&config, &host.socket());
    agent.wait_for(Duration::from_secs(5), |s| read(s) > 0);
    assert!(agent.stop().success());
    let saved: Value = serde_json::from_str(
        &std::fs::read_to_string(host.dir.path().join("state/state.json")).expect("state"),
    )
    .expect("json");
    assert!(
        saved["kmsg_cursor"].as_u64().unwrap_or(0) > 1,
        "the cursor moved to the newest record read: {saved}"
    );
    let agent = Agent::start(&config, &host.socket());
    let s = agent.wait_for(Duration::from_secs(5), |s| read(s) > 0);
    assert_eq!(s["kmsg"]["records_lost"], 0, "{}", s["kmsg"]);
    assert!(agent.stop().success());
}

/// Issue 21: every "fallen off the bus" report without an Xid, in each of the driver's
/// wordings, on a host whose PCI domain is not 0000 (hosts with several PCI segments),
/// becomes a fatal Xid-79-class fault on that GPU.
#[test]
fn every_fallen_off_the_bus_wording_on_another_pci_domain_is_fatal_on_its_gpu() {
    let host = Host::new();
    let agent = Agent::start(&host.config(""), &host.socket());
    let bdf = |i: usize| format!("{}.0", host.gpu_bdf(i));
    inject(&format!(
        "NVRM: GPU {}: GPU has fallen off the bus.",
        bdf(0)
    ));
    inject(&format!(
        "NVRM: GPU at PCI:{}: GPU has fallen off the bus.",
        bdf(1)
    ));
    inject(&format!(
        "NVRM: The NVIDIA GPU {} (PCI ID: 10de:2330) installed in this system has fallen off the bus and is not responding to commands.",
        bdf(2)
    ));
    inject(&format!(
        "NVRM: GPU 0000{}: GPU has fallen off the bus.",
        bdf(6)
    ));
    // The two-record notice: the first names the GPU, the next says what happened.
    inject(&format!(
        "NVRM: The NVIDIA GPU {} (PCI ID: 10de:2330) installed in this",
        bdf(5)
    ));
    inject("NVRM: system has fallen off the bus and is not responding to commands.");
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        faults_on(s, &host)
            .iter()
            .filter(|f| f["code"]["type"] == "fallen-off-bus")
            .count()
            == 5
    });
    for gpu in [0, 1, 2, 5, 6] {
        let f = faults_on(&s, &host)
            .into_iter()
            .find(|f| f["gpu_index"] == gpu)
            .unwrap_or_else(|| panic!("GPU {gpu}: {:#}", s["faults"]));
        assert_eq!(
            (f["severity"].as_str(), f["code"]["type"].as_str()),
            (Some("fatal"), Some("fallen-off-bus")),
            "GPU {gpu}: {f:#}"
        );
    }
    assert!(agent.stop().success());
}
