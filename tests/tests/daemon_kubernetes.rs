//! The real daemon against the test Kubernetes API server: conditions on the EKS contract,
//! events, latency, outages, auth failures, and the fault lifecycle.

use std::time::{Duration, Instant};

use gpu_agent_e2e::kube_api::{KubeApi, Mode};
use gpu_agent_e2e::{cli, inject, wait_until as wait, Agent, Host, NvmlScenario};
use serde_json::Value;

const NODE: &str = "gpu-node-1";
const HW: &str = "AcceleratedHardwareReady";

fn k8s_config(host: &Host, api: &KubeApi, extra: &str) -> String {
    format!(
        "node_name = \"{NODE}\"\n[kubernetes]\nkubeconfig = {:?}\nheartbeat_interval = \"1s\"\n{extra}",
        api.kubeconfig(host.dir.path())
    )
}

fn sink_state(agent: &Agent) -> Value {
    agent.sink("kubernetes")
}

fn kubernetes_sink(s: &Value) -> Value {
    gpu_agent_e2e::sink_of(s, "kubernetes")
}

#[test]
fn nvml_faults_set_and_clear_the_condition_on_the_eks_contract() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    // Kernel log off: this daemon's faults are only the ones this test makes.
    let config = k8s_config(&host, &api, "[kmsg]\nenabled = false\n");
    let agent = host.start_with_nvml(&NvmlScenario::healthy(), &config);
    wait(Duration::from_secs(5), "condition True", || {
        api.condition(NODE, HW)
            .is_some_and(|c| c["status"] == "True")
    });
    let c = api.condition(NODE, HW).expect("condition");
    assert_eq!(c["reason"], "NvidiaGPUIsReady");
    let healthy_since = c["lastTransitionTime"].clone();
    let interruption = api
        .condition(NODE, "InterruptionPending")
        .expect("interruption condition");
    assert_eq!(
        (
            interruption["status"].as_str(),
            interruption["reason"].as_str()
        ),
        (Some("False"), Some("NoInterruptionPending"))
    );

    NvmlScenario::healthy()
        .gpu(3, "remap.failure = true\nremap.uncorrectable = 9")
        .write(&host);
    wait(Duration::from_secs(3), "condition False", || {
        api.condition(NODE, HW)
            .is_some_and(|c| c["status"] == "False")
    });
    let c = api.condition(NODE, HW).expect("condition");
    assert_eq!(c["reason"], "NvidiaRowRemapFailure");
    let bdf = format!("{:04x}:5d:00.0", host.domain);
    assert_eq!(
        c["message"],
        format!("GPU 3 ({bdf}): remap-failure ROW_REMAP_FAILURE, action replace")
    );
    let failed_at = c["lastTransitionTime"].clone();
    let heartbeat = c["lastHeartbeatTime"].clone();

    // The heartbeat moves lastHeartbeatTime, never lastTransitionTime.
    wait(Duration::from_secs(4), "heartbeat", || {
        api.condition(NODE, HW)
            .is_some_and(|c| c["lastHeartbeatTime"] != heartbeat)
    });
    assert_eq!(
        api.condition(NODE, HW).expect("condition")["lastTransitionTime"],
        failed_at
    );

    // The kubelet's condition is untouched; every PATCH was a strategic merge.
    let ready = api.condition(NODE, "Ready").expect("Ready");
    assert_eq!(
        (
            ready["reason"].as_str(),
            ready["lastHeartbeatTime"].as_str()
        ),
        (Some("KubeletReady"), Some("2026-01-01T00:00:00Z"))
    );
    for r in api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
    {
        assert_eq!(r.content_type, "application/strategic-merge-patch+json");
    }

    // The fault is a Node Event with the same reason.
    wait(Duration::from_secs(3), "event", || {
        api.events()
            .iter()
            .any(|e| e["reason"] == "NvidiaRowRemapFailure")
    });
    let event = api
        .events()
        .into_iter()
        .find(|e| e["reason"] == "NvidiaRowRemapFailure")
        .expect("event");
    assert_eq!(
        (
            event["involvedObject"]["kind"].as_str(),
            event["involvedObject"]["name"].as_str()
        ),
        (Some("Node"), Some(NODE))
    );
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["involvedObject"]["uid"], "uid-0");

    // Healthy again: True, with a new transition time.
    NvmlScenario::healthy().write(&host);
    wait(Duration::from_secs(3), "condition True again", || {
        api.condition(NODE, HW)
            .is_some_and(|c| c["status"] == "True")
    });
    assert_ne!(
        api.condition(NODE, HW).expect("condition")["lastTransitionTime"],
        healthy_since
    );
    assert_eq!(sink_state(&agent)["state"], "on");
    assert!(agent.stop().success());
}

#[test]
fn a_kernel_log_xid_reaches_the_api_server_within_a_second_and_a_flood_is_one_patch() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let agent = Agent::start(&host.config(&k8s_config(&host, &api, "")), &host.socket());
    wait(Duration::from_secs(5), "first write", || {
        api.condition(NODE, HW).is_some()
    });
    let bdf = format!("{}.0", host.gpu_bdf(3));
    let ours =
        format!("GPU 3 ({bdf}): Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, action reboot");

    let started = Instant::now();
    inject(&format!(
        "NVRM: Xid (PCI:{}): 79, pid=1, name=x, GPU has fallen off the bus.",
        host.gpu_bdf(3)
    ));
    wait(
        Duration::from_secs(1),
        "Xid 79 on the condition within 1 s",
        || {
            api.condition(NODE, HW).is_some_and(|c| {
                c["status"] == "False" && c["message"].as_str().is_some_and(|m| m.contains(&ours))
            })
        },
    );
    eprintln!("kernel log -> node condition: {:?}", started.elapsed());
    // Issue 29: a GPU gone takes the whole node (the device plugin refuses every GPU pod
    // then), and both the condition and `status` say why.
    let message = api.condition(NODE, HW).expect("condition")["message"].clone();
    assert!(
        message
            .as_str()
            .is_some_and(|m| m.contains("the whole node is unfit")),
        "{message}"
    );
    let (_, table) = agent.status(false);
    assert!(table.contains("Whole node: a GPU is gone"), "{table}");

    // A flood of identical lines: no per-line requests.
    let patches_before = api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
        .count();
    let line = format!(
        "NVRM: Xid (PCI:{}): 95, pid=3, name=x, Uncontained",
        host.gpu_bdf(2)
    );
    for _ in 0..200 {
        inject(&line);
    }
    // One Event for the fault, its count aggregated (other tests' faults have their own).
    let ours95 = "GPU 2 Xid 95";
    let our_event = |api: &KubeApi| {
        api.events().into_iter().find(|e| {
            e["reason"] == "NvidiaXID95Error"
                && e["message"].as_str().is_some_and(|m| m.starts_with(ours95))
        })
    };
    wait(Duration::from_secs(3), "the Xid 95 Event", || {
        our_event(&api).is_some()
    });
    std::thread::sleep(Duration::from_millis(500));
    let patches = api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
        .count()
        - patches_before;
    let event = our_event(&api).expect("event");
    let name = event["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    let updates = api
        .requests()
        .iter()
        .filter(|r| r.path.ends_with(&format!("/events/{name}")))
        .count();
    assert!(
        updates <= 1,
        "{updates} updates of one Event during the flood (it is rate-limited, not per line)"
    );
    assert!(event["count"].as_u64().is_some_and(|c| c >= 1));
    assert!(
        patches <= 10,
        "{patches} PATCH requests for a 200-line flood"
    );
    assert!(agent.stop().success());
}

#[test]
fn outage_keeps_the_desired_state_and_converges() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let agent = Agent::start(&host.config(&k8s_config(&host, &api, "")), &host.socket());
    wait(Duration::from_secs(5), "first write", || {
        api.condition(NODE, HW).is_some()
    });
    let (addr, state) = api.stop();

    inject(&format!(
        "NVRM: Xid (PCI:{}): 79, pid=1, name=x, GPU has fallen off the bus.",
        host.gpu_bdf(5)
    ));
    let ours = format!("GPU 5 ({}.0): Xid 79", host.gpu_bdf(5));
    agent.wait_for(Duration::from_secs(2), |s| {
        s["sinks"].as_array().is_some_and(|a| {
            a.iter()
                .any(|x| x["sink"] == "kubernetes" && x["state"] == "failed")
        })
    });
    assert!(
        sink_state(&agent)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("API server unreachable")),
        "{}",
        sink_state(&agent)
    );
    std::thread::sleep(Duration::from_secs(1));

    let api = KubeApi::restart(addr, state);
    wait(
        Duration::from_secs(15),
        "convergence after the outage",
        || {
            api.condition(NODE, HW)
                .is_some_and(|c| c["message"].as_str().is_some_and(|m| m.contains(&ours)))
        },
    );
    agent.wait_for(Duration::from_secs(5), |s| {
        s["sinks"].as_array().is_some_and(|a| {
            a.iter()
                .any(|x| x["sink"] == "kubernetes" && x["state"] == "on")
        })
    });
    assert!(agent.stop().success());
}

#[test]
fn unauthorized_and_forbidden_are_reported_with_verb_and_resource() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    api.set_mode(Mode::Unauthorized);
    let agent = Agent::start(&host.config(&k8s_config(&host, &api, "")), &host.socket());
    agent.wait_for(Duration::from_secs(3), |s| {
        kubernetes_sink(s)["state"] == "failed"
    });
    let reason = sink_state(&agent)["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        reason.contains("GET nodes/gpu-node-1: 401 Unauthorized"),
        "{reason}"
    );

    api.set_mode(Mode::Forbidden);
    agent.wait_for(Duration::from_secs(5), |s| {
        kubernetes_sink(s)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("403"))
    });
    let reason = sink_state(&agent)["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        reason.contains("403 Forbidden")
            && reason.contains("nodes/gpu-node-1")
            && reason.contains("nodes/status"),
        "{reason}"
    );

    api.set_mode(Mode::Normal);
    agent.wait_for(Duration::from_secs(10), |s| {
        kubernetes_sink(s)["state"] == "on"
    });
    assert!(api.condition(NODE, HW).is_some());
    assert!(agent.stop().success());
}

#[test]
fn unknown_node_and_missing_kubeconfig_degrade() {
    let host = Host::new();
    let api = KubeApi::start(&["another-node"]);
    let agent = Agent::start(&host.config(&k8s_config(&host, &api, "")), &host.socket());
    agent.wait_for(Duration::from_secs(3), |s| {
        kubernetes_sink(s)["state"] == "failed"
    });
    assert!(
        sink_state(&agent)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("404 NotFound")),
        "{}",
        sink_state(&agent)
    );
    assert!(agent.stop().success());

    let config = host.config("[kubernetes]\nkubeconfig = \"/nonexistent/kubeconfig\"\n");
    let agent = Agent::start(&config, &host.socket());
    agent.wait_for(Duration::from_secs(3), |s| {
        kubernetes_sink(s)["state"] == "off"
    });
    assert!(sink_state(&agent)["reason"]
        .as_str()
        .is_some_and(|r| r.contains("standalone")));
    let (code, _) = agent.status(false);
    assert!(code <= 1, "status still works");
    assert!(agent.stop().success());
}

#[test]
fn a_fatal_fault_survives_restarts_and_an_operator_clears_it() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let config = host.config(&k8s_config(&host, &api, ""));
    let agent = Agent::start(&config, &host.socket());
    inject(&format!(
        "NVRM: Xid (PCI:{}): 54, pid=1, name=x, power reduced",
        host.gpu_bdf(6)
    ));
    let ours = format!("GPU 6 ({}.0): Xid 54", host.gpu_bdf(6));
    let has_ours = |api: &KubeApi| {
        api.condition(NODE, HW)
            .is_some_and(|c| c["message"].as_str().is_some_and(|m| m.contains(&ours)))
    };
    wait(Duration::from_secs(2), "Xid 54", || has_ours(&api));
    assert!(agent.stop().success());

    // Restart: still there (persisted), and still on the condition.
    let agent = Agent::start(&config, &host.socket());
    let s = agent.snapshot().expect("snapshot");
    assert!(gpu_agent_e2e::fault(&s, &host, "xid", Some(54)).is_some());

    // A new boot keeps a replace fault.
    assert!(agent.stop().success());
    host.set_boot_id("boot-2");
    let agent = Agent::start(&config, &host.socket());
    assert!(
        gpu_agent_e2e::fault(&agent.snapshot().expect("snapshot"), &host, "xid", Some(54))
            .is_some(),
        "replace faults survive a reboot"
    );
    // A new boot id restarts the kernel-log cursor, so this fake "reboot" replays the (real,
    // shared) kernel log, our Xid 54 line included. Wait until the reader is past it: a line
    // written now is read after it.
    inject(&format!(
        "NVRM: Xid (PCI:{}): 31, pid=1, name=x, MMU Fault",
        host.gpu_bdf(7)
    ));
    wait(Duration::from_secs(10), "the replay to catch up", || {
        gpu_agent_e2e::fault(&agent.snapshot().expect("snapshot"), &host, "xid", Some(31)).is_some()
    });

    // The operator repaired it.
    let (code, out, err) = cli(&[
        "--config",
        &config.to_string_lossy(),
        "clear",
        "GPU 6 Xid 54",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("cleared: GPU 6 Xid 54"), "{out}");
    wait(Duration::from_secs(3), "cleared from the condition", || {
        !has_ours(&api)
    });
    assert!(
        gpu_agent_e2e::fault(&agent.snapshot().expect("snapshot"), &host, "xid", Some(54))
            .is_none()
    );
    let (code, _, _) = cli(&[
        "--config",
        &config.to_string_lossy(),
        "clear",
        "GPU 6 Xid 54",
    ]);
    assert_eq!(code, 1, "nothing left to clear");
    assert!(agent.stop().success());
}

/// The kubeconfig's exec credential plugin (`aws eks get-token` on EKS) is a blocking
/// process call: it runs off the runtime thread (the daemon answers while it runs), only
/// while the one client is built (kube itself runs it up to three times then: auth layer,
/// TLS identity, expiry), and that client is shared by the conditions sink and the
/// checkpoint sink's cordon: no run after it exists.
#[test]
fn the_exec_credential_plugin_never_stalls_the_daemon_and_one_client_serves_both_sinks() {
    use gpu_agent_e2e::imds::FakeImds;
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let imds = FakeImds::start();
    let runs = host.dir.path().join("plugin-runs");
    let plugin = host.dir.path().join("get-token");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\nsleep 2\necho run >> {runs:?}\n\
             echo '{{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\",\
             \"status\":{{\"token\":\"{}\",\"expirationTimestamp\":\"2099-01-01T00:00:00Z\"}}}}'\n",
            gpu_agent_e2e::kube_api::TOKEN
        ),
    )
    .expect("plugin");
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let kubeconfig = host.dir.path().join("exec-kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\n\
             users:\n- name: test\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n\
             \x20     command: {}\n      interactiveMode: Never\n",
            api.addr,
            plugin.display()
        ),
    )
    .expect("kubeconfig");
    let dev = host.dir.path().join("dev");
    let config = host.config(&format!(
        "node_name = \"{NODE}\"\n[kubernetes]\nkubeconfig = {kubeconfig:?}\n\
         [imds]\nendpoint = {:?}\npoll_interval = \"200ms\"\n\
         [checkpoint]\ndevice_glob = \"{}/nvidia[0-9]*\"\ncordon = true\n",
        imds.endpoint(),
        dev.display()
    ));
    let agent = Agent::start(&config, &host.socket());
    // The daemon answers while the plugin is still running.
    let (code, _) = agent.status(false);
    assert!(code <= 1);
    assert!(
        !runs.exists(),
        "status answered only after the exec plugin finished: it ran on the runtime thread"
    );
    wait(Duration::from_secs(20), "conditions written", || {
        api.condition(NODE, HW).is_some()
    });
    let count = || {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let built = count();
    assert!(built >= 1);
    // A notice with cordon: the checkpoint sink uses the same client.
    imds.set_spot(Some(
        r#"{"action": "terminate", "time": "2099-01-01T00:00:00Z"}"#,
    ));
    wait(Duration::from_secs(10), "the node cordoned", || {
        api.node(NODE)
            .is_some_and(|n| n["spec"]["unschedulable"] == true)
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        count(),
        built,
        "the plugin ran again: a second client was built"
    );
    assert!(agent.stop().success());
}

/// Review 2026-12-03b L13: building the client, which runs the kubeconfig's exec credential
/// plugin, was awaited without a limit under the client's lock: a plugin that hangs held
/// every Kubernetes sink, and `status` said nothing.
#[test]
fn a_hung_exec_credential_plugin_shows_as_the_sink_failed() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let plugin = host.dir.path().join("get-token");
    std::fs::write(&plugin, "#!/bin/sh\nexec sleep 600\n").expect("plugin");
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let kubeconfig = host.dir.path().join("exec-kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\n\
             users:\n- name: test\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n\
             \x20     command: {}\n      interactiveMode: Never\n",
            api.addr,
            plugin.display()
        ),
    )
    .expect("kubeconfig");
    let config = host.config(&format!(
        "node_name = \"{NODE}\"\n[kubernetes]\nkubeconfig = {kubeconfig:?}\ntimeout = \"1s\"\n"
    ));
    let agent = Agent::start(&config, &host.socket());
    agent.wait_for(Duration::from_secs(10), |s| {
        s["sinks"].as_array().is_some_and(|a| {
            a.iter().any(|x| {
                x["sink"] == "kubernetes"
                    && x["state"] == "failed"
                    && x["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("exec credential plugin"))
            })
        })
    });
    assert!(agent.stop().success());
    // The hung plugin is the daemon's child: gone with it or left to the test's end.
    let _ = std::process::Command::new("pkill")
        .args(["-f", &plugin.to_string_lossy()])
        .status();
}

/// Issue 20, seen from outside: with a far scheduled maintenance pending, a later Spot notice
/// left InterruptionPending False with the maintenance message (the pending end was the one
/// with the earliest deadline, not the one acted on first). The heartbeat here is the
/// default minute: the Spot notice must show long before it.
#[test]
fn a_spot_notice_after_a_far_scheduled_maintenance_turns_interruption_pending_at_once() {
    use gpu_agent_e2e::imds::{scheduled_reboot, FakeImds};
    let host = Host::new();
    let imds = FakeImds::start();
    let api = KubeApi::start(&[NODE]);
    let config = host.config(&format!(
        "node_name = \"{NODE}\"\n[kubernetes]\nkubeconfig = {:?}\n\
         [imds]\nendpoint = {:?}\npoll_interval = \"200ms\"\n\
         rebalance_interval = \"200ms\"\nscheduled_interval = \"200ms\"\n",
        api.kubeconfig(host.dir.path()),
        imds.endpoint()
    ));
    let agent = Agent::start(&config, &host.socket());
    imds.set_scheduled(&scheduled_reboot(
        std::time::SystemTime::now() + Duration::from_secs(3 * 86_400),
    ));
    let reason = |api: &KubeApi| {
        api.condition(NODE, "InterruptionPending")
            .map(|c| (c["status"].clone(), c["reason"].clone()))
    };
    wait(Duration::from_secs(5), "the far maintenance", || {
        reason(&api).is_some_and(|(_, r)| r == "ScheduledMaintenanceScheduled")
    });
    // A Spot notice is acted on at once whatever its time says; this one's lies after the
    // maintenance (the pending end was the earliest deadline, not the earliest act).
    imds.set_spot(Some(
        r#"{"action": "terminate", "time": "2099-01-01T00:00:00Z"}"#,
    ));
    let took = wait(
        Duration::from_secs(10),
        "InterruptionPending for the Spot notice",
        || reason(&api).is_some_and(|(s, r)| s == "True" && r == "SpotPending"),
    );
    eprintln!("InterruptionPending True {took:?} after the Spot notice was set");
    assert!(agent.stop().success());
}

/// Issue 22: a Node Event that expired on the API server (update answers 404) left the
/// Kubernetes sink failed; it is created again.
#[test]
fn an_expired_node_event_is_created_again() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let agent = Agent::start(&host.config(&k8s_config(&host, &api, "")), &host.socket());
    let line = format!(
        "NVRM: Xid (PCI:{}): 13, pid=1, name=python3, Graphics Exception",
        host.gpu_bdf(2)
    );
    let xid13 = |api: &KubeApi, count: u64| {
        api.events().iter().any(|e| {
            e["involvedObject"]["kind"] == "Node"
                && e["message"].as_str().is_some_and(|m| m.contains("Xid 13"))
                && e["count"] == count
        })
    };
    inject(&line);
    wait(Duration::from_secs(5), "the Node Event", || xid13(&api, 1));
    api.expire_events();
    // Updates of one Event come at most every 10 s.
    std::thread::sleep(Duration::from_millis(10_500));
    inject(&line);
    wait(
        Duration::from_secs(10),
        "the Node Event created again",
        || xid13(&api, 2),
    );
    assert_eq!(sink_state(&agent)["state"], "on", "{}", sink_state(&agent));
    assert!(agent.stop().success());
}

/// A 1 s heartbeat, and IMDS's notices (scheduled events included) polled every 200 ms.
fn lifecycle_config(
    host: &Host,
    api: &KubeApi,
    imds: &gpu_agent_e2e::imds::FakeImds,
) -> std::path::PathBuf {
    host.config(&format!(
        "node_name = \"{NODE}\"\n[kubernetes]\nkubeconfig = {:?}\nheartbeat_interval = \"1s\"\n\
         [imds]\nendpoint = {:?}\npoll_interval = \"200ms\"\n\
         rebalance_interval = \"200ms\"\nscheduled_interval = \"200ms\"\n",
        api.kubeconfig(host.dir.path()),
        imds.endpoint()
    ))
}

/// Issue 29: the node lifecycle conditions (KEP-5683). A scheduled maintenance three days
/// ahead sets MaintenancePlanned True at once, with the deadline in the message and in the
/// annotation (the condition has no time field), and MaintenanceInProgress stays False; one
/// whose act time (deadline - the checkpoint lead) comes during the test turns
/// MaintenanceInProgress True then; canceled, both go back to False and the annotation is
/// removed. Before any end the agent writes neither (they are admin-managed: another writer
/// may own them). The kubelet's own lifecycle types are never written.
#[test]
fn scheduled_maintenance_is_planned_at_once_in_progress_at_its_act_time_and_cleared_when_canceled()
{
    use gpu_agent_e2e::imds::{scheduled_reboot, FakeImds};
    const ANNOTATION: &str = "gpu-agent.io/maintenance-deadline";
    let host = Host::new();
    let imds = FakeImds::start();
    let api = KubeApi::start(&[NODE]);
    let config = lifecycle_config(&host, &api, &imds);
    let agent = Agent::start(&config, &host.socket());
    let condition = |type_: &str| {
        api.condition(NODE, type_).map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
    };
    let annotation = || {
        api.node(NODE).and_then(|n| {
            n["metadata"]["annotations"][ANNOTATION]
                .as_str()
                .map(str::to_string)
        })
    };
    wait(Duration::from_secs(5), "the GPU condition written", || {
        condition("AcceleratedHardwareReady").is_some()
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(condition("MaintenancePlanned"), None, "no end: not written");
    assert_eq!(
        condition("MaintenanceInProgress"),
        None,
        "no end: not written"
    );
    assert_eq!(annotation(), None);

    // Three days ahead: planned at once, not in progress.
    let far = std::time::SystemTime::now() + Duration::from_secs(3 * 86_400);
    imds.set_scheduled(&scheduled_reboot(far));
    wait(Duration::from_secs(5), "MaintenancePlanned True", || {
        condition("MaintenancePlanned").is_some_and(|c| c.0 == "True") && annotation().is_some()
    });
    let (_, reason, message) = condition("MaintenancePlanned").expect("planned");
    let deadline = annotation().expect("annotation");
    assert_eq!(reason, "ScheduledMaintenance");
    assert!(message.contains(&deadline), "{message} / {deadline}");
    // `status` shows the conditions written.
    wait(
        Duration::from_secs(3),
        "status shows the conditions",
        || {
            agent
                .status(false)
                .1
                .contains("MaintenancePlanned=True (ScheduledMaintenance)")
        },
    );
    // The notice's own deadline, to the second, as RFC 3339.
    assert_eq!(deadline, gpu_agent_e2e::trainer::rfc3339(far), "annotation");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        condition("MaintenanceInProgress").map(|c| c.0),
        None,
        "three days ahead is not in progress"
    );

    // One whose act time (deadline - 10 min lead) is 3 s away.
    let soon = std::time::SystemTime::now() + Duration::from_secs(600 + 3);
    imds.set_scheduled(&scheduled_reboot(soon));
    let took = wait(
        Duration::from_secs(10),
        "MaintenanceInProgress True",
        || condition("MaintenanceInProgress").is_some_and(|c| c.0 == "True"),
    );
    assert!(
        took >= Duration::from_millis(1500),
        "in progress only at the act time, not {took:?} after the notice"
    );
    assert_eq!(
        condition("MaintenanceInProgress").map(|c| c.1).as_deref(),
        Some("ScheduledMaintenance")
    );

    // Canceled: the agent takes back its own True of both, the annotation gone.
    imds.set_scheduled("[]");
    wait(Duration::from_secs(5), "both False again", || {
        condition("MaintenancePlanned").is_some_and(|c| c.0 == "False")
            && condition("MaintenanceInProgress").is_some_and(|c| c.0 == "False")
            && annotation().is_none()
    });
    let node = api.node(NODE).expect("node");
    for c in node["status"]["conditions"].as_array().expect("conditions") {
        assert!(
            ![
                "GracefulNodeShutdownInProgress",
                "DrainInProgress",
                "Drained"
            ]
            .contains(&c["type"].as_str().unwrap_or_default()),
            "the kubelet's own lifecycle types are never written: {c}"
        );
    }
    assert!(agent.stop().success());
}

/// KEP-5683's lifecycle conditions are admin-managed: another writer's
/// `MaintenancePlanned=True` (a maintenance operator's) survives the agent's heartbeats, and
/// the agent's own `True`, once its end is gone, is taken back only while it is still the
/// agent's on the server.
#[test]
fn another_writers_maintenance_planned_survives_ten_heartbeats() {
    use gpu_agent_e2e::imds::{scheduled_reboot, FakeImds};
    let host = Host::new();
    let imds = FakeImds::start();
    let api = KubeApi::start(&[NODE]);
    let config = lifecycle_config(&host, &api, &imds);
    let theirs = serde_json::json!({
        "type": "MaintenancePlanned", "status": "True", "reason": "OSPatching",
        "message": "kernel update tonight", "lastHeartbeatTime": "2026-12-01T00:00:00Z",
        "lastTransitionTime": "2026-12-01T00:00:00Z"
    });
    api.set_condition(NODE, theirs.clone());
    let agent = Agent::start(&config, &host.socket());
    let planned = || api.condition(NODE, "MaintenancePlanned").expect("planned");
    wait(Duration::from_secs(5), "the GPU condition written", || {
        api.condition(NODE, "AcceleratedHardwareReady").is_some()
    });
    // Ten heartbeats.
    std::thread::sleep(Duration::from_secs(11));
    assert_eq!(planned(), theirs, "never clobbered");

    // The agent's own end: its True; then the operator writes theirs over it, and the
    // agent's end goes: the operator's stays.
    let far = std::time::SystemTime::now() + Duration::from_secs(3 * 86_400);
    imds.set_scheduled(&scheduled_reboot(far));
    wait(Duration::from_secs(5), "the agent's True", || {
        planned()["reason"] == "ScheduledMaintenance"
    });
    api.set_condition(NODE, theirs.clone());
    imds.set_scheduled("[]");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(planned(), theirs, "not the agent's to take back");
    assert!(agent.stop().success());
}
