//! The packaged unit's user and capabilities are enough for the job (issue 21): the real
//! daemon, run as an unprivileged user with exactly the unit's `AmbientCapabilities` (by
//! `setpriv`, as systemd would), finds a trainer of another user that holds a GPU through its
//! /proc, signals it and leaves alone one that does not handle the signal, and reaches the
//! kubelet's pod-resources socket, which is root's with mode 0755 as the kubelet makes it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use gpu_agent_e2e::imds::FakeImds;
use gpu_agent_e2e::kubelet::Kubelet;
use gpu_agent_e2e::trainer::{gpu_device, Trainer};
use gpu_agent_e2e::{wait_until as wait, Agent, Host};

/// The agent's user in this test (the package makes `gpu-agent`; any uid but root will do).
const AGENT_UID: u32 = 4343;
/// The trainers' user: another one.
const TRAINER_UID: u32 = 4242;

/// `AmbientCapabilities=` of the packaged unit, in setpriv's spelling (`+kill,+syslog`).
fn unit_capabilities() -> String {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd/gpu-agent.service");
    let text = std::fs::read_to_string(unit).expect("unit");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .expect("the unit names its ambient capabilities");
    let caps: Vec<String> = line
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    assert!(!caps.is_empty());
    caps.join(",")
}

#[test]
fn the_units_user_and_capabilities_signal_another_users_trainer_and_reach_the_kubelet() {
    let host = Host::new();
    // The trainers' user writes its signal record next to its script.
    std::fs::set_permissions(host.dir.path(), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod");
    let imds = FakeImds::start();
    let gpu = gpu_device(host.dir.path(), "nvidia0");
    let handler = Trainer::start_as(
        host.dir.path(),
        "handler",
        "usr1",
        Some(&gpu),
        &[],
        Some(TRAINER_UID),
    );
    let mut bystander = Trainer::start_as(
        host.dir.path(),
        "bystander",
        "none",
        Some(&gpu),
        &[],
        Some(TRAINER_UID),
    );
    // The kubelet's socket: root's, and others may not write it (the umask the kubelet has).
    let kubelet = Kubelet::start(&host.kubelet_socket());
    let socket_mode = std::fs::metadata(host.kubelet_socket())
        .expect("socket")
        .permissions()
        .mode();
    std::fs::set_permissions(
        host.kubelet_socket(),
        std::fs::Permissions::from_mode(socket_mode & !0o022),
    )
    .expect("chmod socket");
    kubelet.assign(
        "ml",
        "train",
        "trainer",
        "nvidia.com/gpu",
        &[&host.gpu_uuid(0)],
    );
    let config = host.checkpoint_config(
        &imds,
        false,
        &format!("[pod_resources]\nsocket = {:?}\n", host.kubelet_socket()),
    );

    let caps = unit_capabilities();
    let id = AGENT_UID.to_string();
    let wrapper: Vec<String> = [
        "setpriv",
        "--reuid",
        &id,
        "--regid",
        &id,
        "--clear-groups",
        "--no-new-privs",
        &format!("--bounding-set=-all,{caps}"),
        &format!("--inh-caps=-all,{caps}"),
        &format!("--ambient-caps=-all,{caps}"),
        "--",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let agent = Agent::start_under(&config, &host.socket(), &wrapper);
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).expect("status");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.contains(&id)),
        "{status}"
    );
    agent.wait_for_source_on(Duration::from_secs(5), "imds");

    imds.spot_terminate_in(Duration::from_secs(120));
    wait(
        Duration::from_secs(5),
        "SIGUSR1 at the other user's trainer",
        || handler.signals() == ["SIGUSR1"],
    );
    agent.wait_for(Duration::from_secs(3), |s| {
        s["pending_end"]["signalled"] == 1
    });
    assert!(
        bystander.alive(),
        "a process without a handler is never signalled"
    );
    assert!(bystander.signals().is_empty());

    // The pod-resources lookup went through the root-owned socket.
    let (_, text) = agent.status(false);
    assert!(
        !text.contains("Permission denied") && !text.contains("no pod-resources socket"),
        "{text}"
    );
    let s = agent.snapshot().expect("snapshot");
    let pod_resources = s["sinks"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["sink"] == "pod-resources").cloned())
        .unwrap_or_default();
    assert_eq!(pod_resources["state"], "on", "{pod_resources}");
    assert!(agent.stop().success());
}
