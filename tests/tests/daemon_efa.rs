//! The real daemon watching EFA devices in a fake sysfs of the real layout: the device count
//! against the instance type, the link as the carrier of a real network interface (a veth
//! whose far end the test takes down), error counters advanced while the agent runs, and
//! `NetworkingReady` through the test API server.

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

#[test]
fn a_p5_missing_one_of_32_devices_is_fatal_and_sets_networking_ready_false() {
    let host = Host::new();
    host.set_instance_type("p5.48xlarge");
    for i in 0..31 {
        host.add_efa(i, None);
    }
    let api = KubeApi::start(&[NODE]);
    let agent = Agent::start(
        &config(&host, &api, "startup_grace = \"0s\""),
        &host.socket(),
    );
    let s = agent.wait_for(Duration::from_secs(10), |s| {
        efa_faults(s).contains(&("efa-missing".into(), "fatal".into()))
    });
    assert_eq!(s["efa"].as_array().map(Vec::len), Some(31), "{}", s["efa"]);
    wait(Duration::from_secs(10), "NetworkingReady False", || {
        networking(&api) == Some(("False".into(), "EFADeviceMissing".into()))
    });
    let message = api.condition(NODE, NET).expect("condition")["message"].clone();
    assert!(
        message.as_str().is_some_and(|m| m.contains("31 of 32")),
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

#[test]
fn error_counters_warn_then_turn_fatal_and_a_counter_reset_is_no_rate() {
    let host = Host::new();
    let dev = host.add_efa(0, None);
    let api = KubeApi::start(&[NODE]);
    let agent = Agent::start(&config(&host, &api, ""), &host.socket());
    agent.wait_for_source_on(Duration::from_secs(5), "efa");
    let rate = |s: &Value| s["efa"][0]["rates"]["unresponsive_remote_events"].as_f64();
    agent.wait_for(Duration::from_secs(5), |s| rate(s) == Some(0.0));
    // 20 within the 10 s window: 120/min, past the warning's 60.
    host.set_efa_counter(&dev, "unresponsive_remote_events", 20);
    agent.wait_for(Duration::from_secs(5), |s| {
        efa_faults(s) == [("efa-errors".into(), "warning".into())]
    });
    assert_eq!(
        networking(&api).map(|n| n.0),
        Some("True".into()),
        "a warning"
    );
    // 200 more: 1,320/min, past the fatal 600.
    host.set_efa_counter(&dev, "unresponsive_remote_events", 220);
    agent.wait_for(Duration::from_secs(5), |s| {
        efa_faults(s) == [("efa-errors".into(), "fatal".into())]
    });
    wait(Duration::from_secs(5), "NetworkingReady False", || {
        networking(&api) == Some(("False".into(), "EFAErrorRateError".into()))
    });
    // The driver reloads: every counter starts from 0. No negative rate, no new fault; the
    // fault clears a window after its evidence stopped.
    host.set_efa_counter(&dev, "unresponsive_remote_events", 3);
    let s = agent.wait_for(Duration::from_secs(30), |s| efa_faults(s).is_empty());
    assert!(
        rate(&s).is_some_and(|r| r >= 0.0),
        "a reset is not a negative rate: {}",
        s["efa"]
    );
    wait(Duration::from_secs(5), "NetworkingReady True again", || {
        networking(&api).map(|n| n.0) == Some("True".into())
    });
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
