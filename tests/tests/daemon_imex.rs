//! The real daemon watching the host's IMEX unit through a fake systemd manager on a private
//! D-Bus: watched only where IMEX is the host's job (an NVL72 type with the unit enabled),
//! never on a type without an NVLink domain, and not where IMEX runs per workload (the unit
//! not enabled). A failed unit is a warning on the node, never a GPU's fault, and clears when
//! the unit runs again.

use std::time::Duration;

use gpu_agent_e2e::systemd::FakeSystemd;
use gpu_agent_e2e::{Agent, Host};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(10);
const UNIT: &str = "nvidia-imex.service";

fn imex_config(host: &Host, bus: &str) -> std::path::PathBuf {
    host.config(&format!(
        "[kmsg]\nenabled = false\n[imex]\nbus_address = {bus:?}\nchannels_dir = {:?}\n\
         poll_interval = \"1s\"\nstartup_grace = \"0s\"\n",
        host.dir.path().join("imex-channels")
    ))
}

fn imex_faults(s: &Value) -> Vec<(String, String, String)> {
    s["faults"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["source"] == "imex")
        .map(|f| {
            (
                f["code"]["type"].as_str().unwrap_or_default().to_string(),
                f["severity"].as_str().unwrap_or_default().to_string(),
                f["component"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

fn imex_source(s: &Value) -> String {
    s["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["source"] == "imex")
        .map(|x| match x["reason"].as_str() {
            Some(reason) => format!("{}: {reason}", x["state"].as_str().unwrap_or_default()),
            None => x["state"].as_str().unwrap_or_default().to_string(),
        })
        .unwrap_or_default()
}

#[test]
fn an_nvl72_hosts_failed_imex_unit_is_a_node_warning_that_clears() {
    let host = Host::new();
    host.set_instance_type("p6e-gb200.36xlarge");
    let channels = host.dir.path().join("imex-channels");
    std::fs::create_dir_all(&channels).expect("channels dir");
    std::fs::write(channels.join("channel0"), "").expect("channel0");
    let systemd = FakeSystemd::start(host.dir.path(), Some((UNIT, "enabled", "active")));
    let agent = Agent::start(&imex_config(&host, &systemd.address), &host.socket());
    let s = agent.wait_for(WAIT, |s| s["imex"]["active_state"] == "active");
    assert_eq!(imex_source(&s), "on", "{s:#}");
    assert_eq!(s["imex"]["channels"], 1);
    assert!(imex_faults(&s).is_empty(), "{s:#}");
    let (_, table) = agent.status(false);
    assert!(
        table.contains("IMEX (multi-node NVLink): nvidia-imex.service active, 1 channel device"),
        "{table}"
    );

    systemd.set_active_state("failed");
    let s = agent.wait_for(WAIT, |s| !imex_faults(s).is_empty());
    assert_eq!(
        imex_faults(&s),
        [(
            "imex-down".to_string(),
            "warning".to_string(),
            "node".to_string()
        )],
        "the NVLink domain's signal, not a GPU's fatal: {s:#}"
    );
    assert_eq!(s["health"], "warning", "{s:#}");

    systemd.set_active_state("active");
    agent.wait_for(WAIT, |s| imex_faults(s).is_empty());

    // The daemon runs, but no channel device exists for workloads to open.
    std::fs::remove_file(channels.join("channel0")).expect("remove channel0");
    let s = agent.wait_for(WAIT, |s| !imex_faults(s).is_empty());
    assert_eq!(imex_faults(&s)[0].0, "imex-no-channels", "{s:#}");
    assert!(agent.stop().success());
}

#[test]
fn imex_is_never_checked_on_a_type_without_an_nvlink_domain_nor_where_it_runs_per_workload() {
    // p5: single-node NVSwitch, no NVLink domain. Even an enabled, failed unit is no fault.
    let host = Host::new();
    host.set_instance_type("p5.48xlarge");
    let systemd = FakeSystemd::start(host.dir.path(), Some((UNIT, "enabled", "failed")));
    let agent = Agent::start(&imex_config(&host, &systemd.address), &host.socket());
    let s = agent.wait_for(WAIT, |s| imex_source(s).starts_with("off"));
    assert!(
        imex_source(&s).contains("p5.48xlarge has no multi-node NVLink domain"),
        "{s:#}"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let s = agent.snapshot().expect("snapshot");
    assert!(imex_faults(&s).is_empty() && s["imex"].is_null(), "{s:#}");
    assert!(agent.stop().success());

    // GB200 whose IMEX runs per workload (DRA ComputeDomains): the host unit is installed but
    // not enabled, and not running. Not the host's job: off, no fault.
    let host = Host::new();
    host.set_instance_type("p6e-gb200.36xlarge");
    let systemd = FakeSystemd::start(host.dir.path(), Some((UNIT, "disabled", "inactive")));
    let agent = Agent::start(&imex_config(&host, &systemd.address), &host.socket());
    let s = agent.wait_for(WAIT, |s| imex_source(s).starts_with("off"));
    assert!(imex_source(&s).contains("not enabled"), "{s:#}");
    assert!(agent.stop().success());

    // No such unit at all.
    let host = Host::new();
    let systemd = FakeSystemd::start(host.dir.path(), None);
    let agent = Agent::start(&imex_config(&host, &systemd.address), &host.socket());
    let s = agent.wait_for(WAIT, |s| imex_source(s).starts_with("off"));
    assert!(imex_source(&s).contains("not installed"), "{s:#}");
    assert!(agent.stop().success());
}
