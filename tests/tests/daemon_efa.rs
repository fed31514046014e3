//! The real daemon watching EFA devices in a fake sysfs of the real layout: the device count
//! against what this launch had after the start-up grace (never the instance type's
//! maximum), the link as the carrier of a real network interface (a veth whose far end the
//! test takes down), error counters advanced while the agent runs, and `NetworkingReady`
//! through the test API server.

use std::time::Duration;

use gpu_agent_e2e::efa::Veth;
use gpu_agent_e2e::kube_api::KubeApi;
use gpu_agent_e2e::{wait_until as wait, Agent, Host};
use serde_json::Value;

const NODE: &str = "efa-node-1";
const NET: &str = "NetworkingReady";

/// Fast polls and the shortest window; no start-up grace unless a test sets one. The kernel
/// log is off: it is shared with the other tests, whose Xid lines are not this host's.
fn config(host: &Host, api: &KubeApi, efa: &str) -> std::path::PathBuf {
    host.config(&format!(
        "node_name = \"{NODE}\"\n[kubernetes]\nkubeconfig = {:?}\nheartbeat_interval = \"1s\"\n\
         [kmsg]\nenabled = false\n[efa]\npoll_interval = \"1s\"\nwindow = \"10s\"\n{efa}\n",
        api.kubeconfig(host.dir.path())
    ))
}

/// The EFA faults in a snapshot, as `(code, severity)`.
fn efa_faults(s: &Value) -> Vec<(String, String)> {
    s["faults"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["source"] == "efa")
        .map(|f| {
            (
                f["code"]["type"].as_str().unwrap_or_default().to_string(),
                f["severity"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn networking(api: &KubeApi) -> Option<(String, String)> {
    api.condition(NODE, NET).map(|c| {
        (
            c["status"].as_str().unwrap_or_default().to_string(),
            c["reason"].as_str().unwrap_or_default().to_string(),
        )
    })
}

/// A p5 launched with 16 of the 32 EFA interfaces its type allows is healthy (the same
/// launch template gives the same count: judging it against the type's maximum would be a
/// repair loop). One of the 16 going away is fatal, also across an agent restart.
#[test]
fn a_p5_with_16_of_32_efa_interfaces_is_healthy_and_losing_one_is_fatal() {
    let host = Host::new();
    host.set_instance_type("p5.48xlarge");
    for i in 0..16 {
        host.add_efa(i, None);
    }
    let api = KubeApi::start(&[NODE]);
    let config = config(&host, &api, "startup_grace = \"0s\"");
    let agent = Agent::start(&config, &host.socket());
    agent.wait_for_source_on(Duration::from_secs(5), "efa");
    wait(Duration::from_secs(10), "NetworkingReady True", || {
        networking(&api) == Some(("True".into(), "EFAIsReady".into()))
    });
    std::thread::sleep(Duration::from_secs(3));
    let s = agent.snapshot().expect("snapshot");
    assert!(efa_faults(&s).is_empty(), "{}", s["faults"]);
    assert_eq!(s["efa"].as_array().map(Vec::len), Some(16), "{}", s["efa"]);

    host.remove_efa("rdmap15s0");
    let s = agent.wait_for(Duration::from_secs(10), |s| {
        efa_faults(s).contains(&("efa-missing".into(), "fatal".into()))
    });
    assert_eq!(s["efa"].as_array().map(Vec::len), Some(15), "{}", s["efa"]);
    wait(Duration::from_secs(10), "NetworkingReady False", || {
        networking(&api) == Some(("False".into(), "EFADeviceMissing".into()))
    });
    let message = api.condition(NODE, NET).expect("condition")["message"].clone();
    assert!(
        message.as_str().is_some_and(|m| m.contains("15 of 16")),
        "{message}"
    );
    // GPU health is another condition: an EFA fault does not make the GPUs unready.
    let hw = api.condition(NODE, "AcceleratedHardwareReady").expect("hw");
    assert_eq!(hw["status"], "True", "{hw}");
    wait(Duration::from_secs(5), "a Node Event", || {
        api.events()
            .iter()
            .any(|e| e["reason"] == "EFADeviceMissing")
    });
    let (code, text) = agent.status(false);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("rdmap0s0"),
        "status names the devices: {text}"
    );
    assert!(agent.stop().success());

    // Restarted in the same boot, the agent still knows this launch had 16.
    let agent = Agent::start(&config, &host.socket());
    agent.wait_for(Duration::from_secs(10), |s| {
        efa_faults(s).contains(&("efa-missing".into(), "fatal".into()))
    });
    assert!(agent.stop().success());
}

#[test]
fn a_p5en_device_that_appears_during_the_grace_is_no_fault() {
    let host = Host::new();
    host.set_instance_type("p5en.48xlarge");
    for i in 0..15 {
        host.add_efa(i, None);
    }
    let api = KubeApi::start(&[NODE]);
    let agent = Agent::start(
        &config(&host, &api, "startup_grace = \"4s\""),
        &host.socket(),
    );
    agent.wait_for_source_on(Duration::from_secs(5), "efa");
    std::thread::sleep(Duration::from_secs(1));
    host.add_efa(15, None);
    // Past the grace and a few polls: 16 of 16, healthy.
    std::thread::sleep(Duration::from_secs(5));
    let s = agent.snapshot().expect("snapshot");
    assert!(efa_faults(&s).is_empty(), "{}", s["faults"]);
    assert_eq!(s["efa"].as_array().map(Vec::len), Some(16));
    wait(Duration::from_secs(5), "NetworkingReady True", || {
        networking(&api) == Some(("True".into(), "EFAIsReady".into()))
    });
    assert!(agent.stop().success());
}

/// The Node's status PATCHes (condition writes) the API server has received.
fn status_patches(api: &KubeApi) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with(&format!("/nodes/{NODE}/status")))
        .count()
}

/// Raise `counter` by `step` every 500 ms for `for_`, from `from`; returns where it ended.
fn keep_rising(host: &Host, dev: &str, counter: &str, from: u64, step: u64, for_: Duration) -> u64 {
    let mut value = from;
    let until = std::time::Instant::now() + for_;
    while std::time::Instant::now() < until {
        value += step;
        host.set_efa_counter(dev, counter, value);
        std::thread::sleep(Duration::from_millis(500));
    }
    value
}

/// A local error counter past the fatal rate condemns the node only once it has lasted a
/// whole window; when the rate falls back the condition stays False, unchanged, for a whole
/// window after the last fatal reading: one transition each way, and no Node write per poll.
#[test]
fn an_error_rate_over_the_fatal_limit_for_a_window_is_fatal_and_does_not_decay() {
    let host = Host::new();
    let dev = host.add_efa(0, None);
    let api = KubeApi::start(&[NODE]);
    // A heartbeat far apart: any Node write in the test's window is a change, not a beat.
    let config = host.config(&format!(
        "node_name = \"{NODE}\"\n[kubernetes]\nkubeconfig = {:?}\nheartbeat_interval = \"60s\"\n\
         [kmsg]\nenabled = false\n[efa]\npoll_interval = \"1s\"\nwindow = \"10s\"\n",
        api.kubeconfig(host.dir.path())
    ));
    let agent = Agent::start(&config, &host.socket());
    agent.wait_for_source_on(Duration::from_secs(5), "efa");
    let counter = "rdma_write_wr_err";
    let rate = |s: &Value| s["efa"][0]["rates"][counter].as_f64();
    agent.wait_for(Duration::from_secs(5), |s| rate(s) == Some(0.0));
    wait(Duration::from_secs(5), "NetworkingReady True", || {
        networking(&api) == Some(("True".into(), "EFAIsReady".into()))
    });
    // 60 a second: 3,600/min, past the fatal 600. For the first window a warning.
    let value = keep_rising(&host, &dev, counter, 0, 30, Duration::from_secs(4));
    let s = agent.snapshot().expect("snapshot");
    assert_eq!(efa_faults(&s), [("efa-errors".into(), "warning".into())]);
    assert_eq!(networking(&api).map(|n| n.0), Some("True".into()));
    keep_rising(&host, &dev, counter, value, 30, Duration::from_secs(8));
    agent.wait_for(Duration::from_secs(5), |s| {
        efa_faults(s) == [("efa-errors".into(), "fatal".into())]
    });
    wait(Duration::from_secs(5), "NetworkingReady False", || {
        networking(&api) == Some(("False".into(), "EFAErrorRateError".into()))
    });
    let condition = api.condition(NODE, NET).expect("condition");
    let (since, message) = (
        condition["lastTransitionTime"].clone(),
        condition["message"].clone(),
    );
    assert!(
        message
            .as_str()
            .is_some_and(|m| m.contains("rising past 600/min")),
        "{message}"
    );
    // The counter stops: the measured rate falls through the warning band to 0 over the
    // next window (8 polls). The condition stays False with the same message and transition
    // time, and the Node is not written at all meanwhile (no heartbeat is due).
    let patches = status_patches(&api);
    let stopped = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(8));
    let condition = api.condition(NODE, NET).expect("condition");
    assert_eq!(condition["status"], "False", "{condition}");
    assert_eq!(condition["lastTransitionTime"], since, "{condition}");
    assert_eq!(condition["message"], message, "{condition}");
    assert_eq!(
        status_patches(&api) - patches,
        0,
        "no Node write per poll while the rate falls"
    );
    // Cleared a window after the last fatal reading (the rate leaves the fatal band within
    // a few seconds of the stop; the fault holds 10 s after it).
    let s = agent.wait_for(Duration::from_secs(30), |s| efa_faults(s).is_empty());
    assert!(
        stopped.elapsed() >= Duration::from_secs(10),
        "{:?}",
        stopped.elapsed()
    );
    wait(Duration::from_secs(5), "NetworkingReady True again", || {
        networking(&api).map(|n| n.0) == Some("True".into())
    });
    // The driver reloads: every counter starts from 0. No negative rate, no new fault.
    host.set_efa_counter(&dev, counter, 3);
    std::thread::sleep(Duration::from_secs(2));
    let s2 = agent.snapshot().expect("snapshot");
    assert!(
        rate(&s2).is_some_and(|r| r >= 0.0) && efa_faults(&s2).is_empty(),
        "a reset is not a negative rate: {} {}",
        s2["efa"],
        s["faults"]
    );
    assert!(agent.stop().success());
}

/// A burst of a peer's trouble (every node talking to a dead peer counts
/// `unresponsive_remote_events`) is a warning on this node, never `NetworkingReady=False`.
#[test]
fn a_burst_of_unresponsive_remote_events_is_only_a_warning() {
    let host = Host::new();
    let dev = host.add_efa(0, None);
    let api = KubeApi::start(&[NODE]);
    let agent = Agent::start(&config(&host, &api, ""), &host.socket());
    agent.wait_for_source_on(Duration::from_secs(5), "efa");
    wait(Duration::from_secs(5), "NetworkingReady True", || {
        networking(&api) == Some(("True".into(), "EFAIsReady".into()))
    });
    keep_rising(
        &host,
        &dev,
        "unresponsive_remote_events",
        0,
        5_000,
        Duration::from_secs(14),
    );
    let s = agent.snapshot().expect("snapshot");
    assert_eq!(efa_faults(&s), [("efa-errors".into(), "warning".into())]);
    assert_eq!(
        networking(&api),
        Some(("True".into(), "EFAIsReady".into())),
        "a peer's trouble never condemns the observer"
    );
    assert!(agent.stop().success());
}

#[test]
fn the_link_is_the_carrier_of_the_devices_real_interface() {
    let veth = Veth::new();
    let host = Host::new();
    let dev = host.add_efa(0, Some(&veth.host));
    host.add_efa(1, None);
    let api = KubeApi::start(&[NODE]);
    let agent = Agent::start(&config(&host, &api, ""), &host.socket());
    let link = |s: &Value| s["efa"][0]["link_up"].as_bool();
    agent.wait_for(Duration::from_secs(5), |s| link(s) == Some(true));
    wait(Duration::from_secs(5), "NetworkingReady True", || {
        networking(&api).map(|n| n.0) == Some("True".into())
    });
    veth.set_peer(false);
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        efa_faults(s) == [("efa-link-down".into(), "fatal".into())]
    });
    assert_eq!(s["efa"][0]["name"], dev.as_str());
    assert!(s["efa"][1]["link_up"].is_null(), "EFA-only: no interface");
    wait(Duration::from_secs(5), "NetworkingReady False", || {
        networking(&api) == Some(("False".into(), "EFALinkDown".into()))
    });
    // Back up: the fault stays a whole window (10 s) after the link returned, then clears.
    veth.set_peer(true);
    agent.wait_for(Duration::from_secs(5), |s| link(s) == Some(true));
    std::thread::sleep(Duration::from_secs(5));
    assert!(!efa_faults(&agent.snapshot().expect("snapshot")).is_empty());
    agent.wait_for(Duration::from_secs(15), |s| efa_faults(s).is_empty());

    // Taken down on purpose (administratively): not watched, no fault, the link unknown.
    veth.set_admin(false);
    agent.wait_for(Duration::from_secs(5), |s| s["efa"][0]["link_up"].is_null());
    std::thread::sleep(Duration::from_secs(3));
    let s = agent.snapshot().expect("snapshot");
    assert!(efa_faults(&s).is_empty(), "{}", s["faults"]);
    assert_eq!(networking(&api).map(|n| n.0), Some("True".into()));
    assert!(agent.stop().success());
}

#[test]
fn without_efa_devices_the_source_is_off_and_networking_ready_is_not_written() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let agent = Agent::start(&config(&host, &api, ""), &host.socket());
    let s = agent.snapshot().expect("snapshot");
    let efa = s["sources"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["source"] == "efa").cloned())
        .expect("efa source");
    assert_eq!(efa["state"], "off", "{efa}");
    assert!(efa["reason"]
        .as_str()
        .is_some_and(|r| r.contains("no EFA device")));
    wait(Duration::from_secs(5), "the GPU condition written", || {
        api.condition(NODE, "AcceleratedHardwareReady").is_some()
    });
    assert!(api.condition(NODE, NET).is_none(), "not ours to write here");
    assert!(agent.stop().success());
}

/// The pods holding EFA devices (the kubelet's pod-resources: `vpc.amazonaws.com/efa`) get the
/// Event of an EFA fault; a pod holding only a GPU does not.
#[test]
fn a_pod_holding_the_efa_device_gets_the_event() {
    use gpu_agent_e2e::kubelet::Kubelet;
    let veth = Veth::new();
    let host = Host::new();
    let dev = host.add_efa(0, Some(&veth.host));
    let api = KubeApi::start(&[NODE]);
    let kubelet = Kubelet::start(&host.kubelet_socket());
    api.add_pod("ml", "train-0", "uid-train", NODE);
    api.add_pod("ml", "infer-0", "uid-infer", NODE);
    kubelet.assign("ml", "train-0", "trainer", "vpc.amazonaws.com/efa", &[&dev]);
    kubelet.assign("ml", "infer-0", "server", "nvidia.com/gpu", &["0"]);
    let agent = Agent::start(&config(&host, &api, ""), &host.socket());
    agent.wait_for(Duration::from_secs(5), |s| s["efa"][0]["link_up"] == true);
    veth.set_peer(false);
    let on = |pod: &str| {
        api.events()
            .into_iter()
            .filter(|e| e["involvedObject"]["kind"] == "Pod" && e["involvedObject"]["name"] == pod)
            .collect::<Vec<_>>()
    };
    wait(Duration::from_secs(10), "the pod Event", || {
        !on("train-0").is_empty()
    });
    let event = on("train-0").remove(0);
    assert_eq!(event["reason"], "EFALinkDown");
    let message = event["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&host.efa_pci(0)) && message.contains("container trainer"),
        "{message}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(on("infer-0").is_empty(), "a GPU-only pod gets no EFA Event");
    // `status` names the device, its link and the pod holding it.
    let (_, text) = agent.status(false);
    assert!(text.contains(&dev) && text.contains("DOWN"), "{text}");
    assert!(text.contains("held by ml/train-0 (trainer)"), "{text}");
    assert!(agent.stop().success());
}

/// The `efa` driver's own kernel-log line for a device that stopped answering its admin
/// queue is a fatal EFA fault on that device (latched: the line is an occurrence).
#[test]
fn the_efa_drivers_admin_timeout_line_is_a_fatal_fault_on_that_device() {
    let host = Host::new();
    host.add_efa(0, None);
    let api = KubeApi::start(&[NODE]);
    let config = host.config(&format!(
        "node_name = \"{NODE}\"\n[kubernetes]\nkubeconfig = {:?}\nheartbeat_interval = \"1s\"\n\
         [efa]\npoll_interval = \"1s\"\nwindow = \"10s\"\n",
        api.kubeconfig(host.dir.path())
    ));
    let agent = Agent::start(&config, &host.socket());
    agent.wait_for_source_on(Duration::from_secs(5), "efa");
    let pci = host.efa_pci(0);
    gpu_agent_e2e::inject(&format!(
        "efa {pci} rdmap0s0: The device didn't send any completion for admin cmd CREATE_QP(1) status 1 (id: 4, sq producer: 7, sq consumer: 6, cq consumer: 6)"
    ));
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        s["faults"].as_array().is_some_and(|a| {
            a.iter().any(|f| {
                f["code"]["type"] == "efa-driver-error" && f["component"]["pci"] == pci.as_str()
            })
        })
    });
    assert!(
        efa_faults(&s).is_empty(),
        "the line is the kernel log's, not the poll's: {}",
        s["faults"]
    );
    wait(Duration::from_secs(10), "NetworkingReady False", || {
        networking(&api) == Some(("False".into(), "EFADriverError".into()))
    });
    assert!(agent.stop().success());
}

/// On EC2 the expected count is what this launch attached, from the EC2 API (network
/// interfaces of type `efa`): a device already missing when the agent starts is found at
/// once, which the count seen after the grace could not tell.
#[test]
fn the_ec2_apis_efa_interfaces_are_the_expected_count() {
    use gpu_agent_e2e::ec2::FakeEc2;
    use gpu_agent_e2e::imds::FakeImds;
    let host = Host::new();
    host.set_instance_type("p5.48xlarge");
    for i in 0..15 {
        host.add_efa(i, None);
    }
    let imds = FakeImds::start();
    let ec2 = FakeEc2::start();
    ec2.state.lock().expect("state").efa_interfaces = 16;
    let api = KubeApi::start(&[NODE]);
    let config = config(
        &host,
        &api,
        &format!(
            "startup_grace = \"0s\"\n[imds]\nendpoint = {:?}\n[ec2]\nendpoint = {:?}\npoll_interval = \"1s\"\n",
            imds.endpoint(),
            ec2.endpoint()
        ),
    );
    let agent = gpu_agent_e2e::Agent::start_with_env(
        &config,
        &host.socket(),
        &[
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("AWS_EC2_METADATA_DISABLED", "false"),
        ],
    );
    agent.wait_for(Duration::from_secs(10), |s| {
        efa_faults(s).contains(&("efa-missing".into(), "fatal".into()))
    });
    wait(Duration::from_secs(10), "NetworkingReady False", || {
        networking(&api) == Some(("False".into(), "EFADeviceMissing".into()))
    });
    let message = api.condition(NODE, NET).expect("condition")["message"].clone();
    assert!(
        message
            .as_str()
            .is_some_and(|m| m.contains("15 of 16") && m.contains("EC2 API")),
        "{message}"
    );
    assert!(ec2
        .state
        .lock()
        .expect("state")
        .actions
        .contains(&"DescribeInstances".to_string()));
    assert!(agent.stop().success());
}
