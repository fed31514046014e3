//! The real daemon polling the fake NVML library (`tests/fake-nvml`) through the real
//! nvml-wrapper: every scenario raises the expected fault on the right GPU, and clears when
//! the scenario is healthy again.

use std::time::Duration;

use gpu_agent_e2e::{cli, fault, faults_on, inject, Host, NvmlScenario};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(5);

fn nvml_faults(s: &Value, host: &Host) -> Vec<Value> {
    let mut faults: Vec<Value> = faults_on(s, host)
        .into_iter()
        .filter(|f| f["source"] == "nvml")
        .cloned()
        .collect();
    // Node-level findings (no address) belong to this host's daemon too.
    faults.extend(
        s["faults"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["source"] == "nvml" && f["component"]["kind"] == "node")
            .cloned(),
    );
    faults
}

#[test]
fn healthy_nvswitch_host_shows_eight_named_gpus_and_no_faults() {
    let host = Host::new();
    let port = gpu_agent_e2e::free_port();
    let agent = host.start_with_nvml(
        &NvmlScenario::healthy(),
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    let s = agent.wait_for(WAIT, |s| s["gpus"][7]["nvml"]["name"].is_string());
    assert!(
        nvml_faults(&s, &host).is_empty(),
        "{:#?}",
        nvml_faults(&s, &host)
    );
    assert_eq!(s["driver_version"], "570.133.20");
    let gpus = s["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 8);
    for (i, g) in gpus.iter().enumerate() {
        assert_eq!(g["index"], i);
        assert_eq!(g["nvml"]["name"], "NVIDIA H100 80GB HBM3");
        assert_eq!(g["nvml"]["telemetry"]["nvlink_up"], 18);
        assert_eq!(g["nvml"]["pci"], g["pci"], "NVML's bus id joins sysfs's");
    }
    let (code, table) = agent.status(false);
    assert!(
        table.contains("NVIDIA H100 80GB HBM3") && table.contains("NVIDIA driver 570.133.20"),
        "{table}"
    );
    assert!(code <= 1);

    let body = gpu_agent_e2e::http_get(port, "/metrics");
    assert!(
        body.contains(r#"gpu_agent_gpu_nvlink_links{gpu="0",state="up"} 18"#),
        "{body}"
    );
    assert!(
        body.contains(r#"gpu_agent_gpu_pcie_link_width{gpu="7",which="max"} 16"#),
        "{body}"
    );
    assert!(
        body.contains(r#"gpu_agent_gpu_ecc_uncorrected_errors{gpu="3",counter="volatile"} 0"#),
        "{body}"
    );
    assert!(
        body.contains(r#"gpu_agent_source_up{source="nvml"} 1"#),
        "{body}"
    );
    assert!(agent.stop().success());
}

#[test]
fn every_scenario_raises_its_fault_on_the_right_gpu_and_clears() {
    let host = Host::new();
    let agent = host.start_with_nvml(&NvmlScenario::healthy(), "");
    agent.wait_for(WAIT, |s| {
        s["gpus"][7]["nvml"]["name"].is_string() && nvml_faults(s, &host).is_empty()
    });

    // (scenario, fault code, GPU index or None for the node, severity, action)
    let cases: [(NvmlScenario, &str, Option<u64>, &str, &str); 8] = [
        (NvmlScenario::healthy().gpu(5, "missing = true"), "gpu-missing", Some(5), "fatal", "reboot"),
        (NvmlScenario::healthy().gpu(1, "ecc.volatile_uncorrected = 3\necc.aggregate_uncorrected = 3\necc.volatile_uncorrected_dram = 3"), "ecc-uncorrected-volatile", Some(1), "fatal", "reset-gpu"),
        (NvmlScenario::healthy().gpu(2, "remap.pending = true\nremap.uncorrectable = 1"), "remap-pending", Some(2), "fatal", "reset-gpu"),
        (NvmlScenario::healthy().gpu(3, "remap.failure = true\nremap.uncorrectable = 12"), "remap-failure", Some(3), "fatal", "replace"),
        (NvmlScenario::healthy().gpu(4, "nvlink.up = [true, true, true, true, true, true, true, false, true, true, true, true, true, true, true, true, true, true]"), "nvlink-down", Some(4), "fatal", "reset-gpu"),
        (NvmlScenario::healthy().gpu(6, "pcie.width = 8"), "pcie-degraded", Some(6), "warning", "none"),
        (NvmlScenario::healthy().gpu(7, "lost = true"), "gpu-lost", Some(7), "fatal", "reboot"),
        (NvmlScenario::healthy().gpu(0, "reset_required = true"), "reset-required", Some(0), "fatal", "reset-gpu"),
    ];
    for (scenario, code, gpu, severity, action) in cases {
        scenario.write(&host);
        let s = agent.wait_for(WAIT, |s| {
            nvml_faults(s, &host)
                .iter()
                .any(|f| f["code"]["type"] == code)
        });
        let faults = nvml_faults(&s, &host);
        assert_eq!(
            faults.len(),
            1,
            "{code}: exactly one fault, others unaffected: {faults:#?}"
        );
        let f = &faults[0];
        assert_eq!(
            (
                f["gpu_index"].as_u64(),
                f["severity"].as_str(),
                f["action"].as_str()
            ),
            (gpu, Some(severity), Some(action)),
            "{code}: {f:#}"
        );
        if let Some(i) = gpu {
            assert_eq!(
                s["gpus"][i as usize]["health"],
                if severity == "fatal" {
                    "fatal"
                } else {
                    "warning"
                }
            );
        }
        NvmlScenario::healthy().write(&host);
        agent.wait_for(WAIT, |s| nvml_faults(s, &host).is_empty());
    }

    // An unsupported API is not a fault; the other checks still run on that GPU.
    NvmlScenario::healthy()
        .gpu(
            0,
            "not_supported = [\"remapped_rows\", \"nvlink_state\", \"memory_error_counter\"]",
        )
        .gpu(0, "pcie.width = 4")
        .write(&host);
    let s = agent.wait_for(WAIT, |s| !nvml_faults(s, &host).is_empty());
    let faults = nvml_faults(&s, &host);
    assert_eq!(faults.len(), 1, "{faults:#?}");
    assert_eq!(faults[0]["code"]["type"], "pcie-degraded");
    assert!(s["gpus"][0]["nvml"]["telemetry"]["remapped_rows_correctable"].is_null());
    assert!(agent.stop().success());
}

#[test]
fn nvml_and_kernel_log_faults_join_on_the_bus_id() {
    let host = Host::new();
    let agent = host.start_with_nvml(
        &NvmlScenario::healthy().gpu(1, "ecc.volatile_uncorrected = 1"),
        "",
    );
    inject(&format!(
        "NVRM: Xid (PCI:{}): 48, pid=1, name=x, DBE",
        host.gpu_bdf(1)
    ));
    let s = agent.wait_for(WAIT, |s| {
        fault(s, &host, "xid", Some(48)).is_some()
            && fault(s, &host, "ecc-uncorrected-volatile", None).is_some()
    });
    assert_eq!(
        fault(&s, &host, "xid", Some(48)).expect("xid")["gpu_index"],
        1
    );
    assert_eq!(
        fault(&s, &host, "ecc-uncorrected-volatile", None).expect("ecc")["gpu_index"],
        1
    );
    let faults = s["gpus"][1]["faults"].as_array().expect("faults");
    assert_eq!(faults.len(), 2, "{faults:?}");
    assert!(agent.stop().success());
}

#[test]
fn no_driver_turns_the_source_off_with_the_reason() {
    let host = Host::new();
    let config = host.config("[nvml]\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\n");
    let agent = gpu_agent_e2e::Agent::start(&config, &host.socket());
    let s = agent.snapshot().expect("snapshot");
    let nvml = s["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .find(|x| x["source"] == "nvml")
        .expect("nvml source")
        .clone();
    assert_eq!(nvml["state"], "off");
    assert!(
        nvml["reason"]
            .as_str()
            .is_some_and(|r| r.contains("NVIDIA driver not available")
                && r.contains("/nonexistent/libnvidia-ml.so.1")),
        "{nvml}"
    );
    assert!(agent.stop().success());
}

#[test]
fn check_polls_nvml_once_and_shows_gpu_rows() {
    let host = Host::new();
    NvmlScenario::healthy()
        .gpu(3, "remap.failure = true")
        .write(&host);
    let config = host.config(&host.nvml_config());
    let out = std::process::Command::new(gpu_agent_e2e::binary())
        .args(["--config", &config.to_string_lossy(), "check", "--json"])
        .env("FAKE_NVML_SCENARIO", host.nvml_scenario_path())
        .output()
        .expect("run check");
    assert_eq!(out.status.code(), Some(1));
    let s: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(s["gpus"][3]["nvml"]["name"], "NVIDIA H100 80GB HBM3");
    assert_eq!(s["gpus"][3]["health"], "fatal");
    let f = fault(&s, &host, "remap-failure", None).expect("remap failure");
    assert_eq!(f["action"], "replace");
    let _ = cli; // the plain CLI helper is used by the kernel-log tests
}

/// The driver's own verdict (NVML field 230, R565+) is a fault with that action; NVML's
/// critical Xid events reach the agent besides the kernel log, and the same Xid seen by both
/// is one fault; both join the kernel log's faults on the same GPU row.
#[test]
fn the_drivers_recovery_action_and_nvml_xid_events_join_the_kernel_log() {
    let host = Host::new();
    let scenario = NvmlScenario::healthy()
        .gpu(3, "recovery_action = 2")
        .top("[[event]]\ngpu = 5\nxid = 79\n");
    let agent = host.start_with_nvml(&scenario, "");
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        fault(s, &host, "recovery-action", None).is_some()
            && fault(s, &host, "xid", Some(79)).is_some()
    });
    let verdict = fault(&s, &host, "recovery-action", None).expect("recovery action");
    assert_eq!(
        (verdict["severity"].as_str(), verdict["action"].as_str()),
        (Some("fatal"), Some("reboot")),
        "{verdict}"
    );
    assert!(verdict["component"]["pci"]
        .as_str()
        .is_some_and(|p| p.starts_with(&host.gpu_bdf(3))));
    let event = fault(&s, &host, "xid", Some(79)).expect("xid event");
    assert_eq!(event["source"], "nvml", "{event}");
    assert!(event["component"]["pci"]
        .as_str()
        .is_some_and(|p| p.starts_with(&host.gpu_bdf(5))));

    // The kernel log prints the same Xid: one fault, one occurrence.
    inject(&format!(
        "NVRM: Xid (PCI:{}): 79, pid=1, name=x, GPU has fallen off the bus.",
        host.gpu_bdf(5)
    ));
    // ... and an Xid on GPU 3, whose row then shows it beside the driver's verdict.
    inject(&format!(
        "NVRM: Xid (PCI:{}): 48, pid=1, name=x, An uncorrectable double bit error",
        host.gpu_bdf(3)
    ));
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        fault(s, &host, "xid", Some(48)).is_some()
    });
    let xid79: Vec<&Value> = faults_on(&s, &host)
        .into_iter()
        .filter(|f| f["code"]["type"] == "xid" && f["code"]["code"] == 79)
        .collect();
    assert_eq!(xid79.len(), 1, "{xid79:?}");
    assert_eq!(
        xid79[0]["count"], 1,
        "one occurrence seen twice: {}",
        xid79[0]
    );
    let row = s["gpus"]
        .as_array()
        .and_then(|g| {
            g.iter().find(|g| {
                g["pci"]
                    .as_str()
                    .is_some_and(|p| p.starts_with(&host.gpu_bdf(3)))
            })
        })
        .cloned()
        .expect("GPU 3 row");
    let labels = row["faults"].to_string();
    assert!(
        labels.contains("Xid 48") && labels.contains("recovery-action"),
        "{row}"
    );
    assert!(agent.stop().success());
}

/// Issue 22: the NVLink baseline (links seen up in this boot) lived in memory only. After an
/// agent restart, a link that had been up and went down was "never up": a fatal link-down
/// became a warning (or nothing while booting) and the condition flipped back to True.
#[test]
fn the_nvlink_baseline_survives_an_agent_restart() {
    let host = Host::new();
    let agent = host.start_with_nvml(&NvmlScenario::healthy(), "");
    agent.wait_for(WAIT, |s| {
        s["gpus"][4]["nvml"]["telemetry"]["nvlink_up"] == 18
    });
    // Two polls, so the baseline is on disk.
    std::thread::sleep(Duration::from_millis(300));
    assert!(agent.stop().success());
    let down = "nvlink.up = [true, true, true, true, true, true, true, false, true, true, true, true, true, true, true, true, true, true]";
    let agent = host.start_with_nvml(&NvmlScenario::healthy().gpu(4, down), "");
    let s = agent.wait_for(WAIT, |s| {
        nvml_faults(s, &host)
            .iter()
            .any(|f| f["code"]["type"] == "nvlink-down")
    });
    let f = fault(&s, &host, "nvlink-down", None).expect("nvlink-down");
    assert_eq!(
        (f["gpu_index"].as_u64(), f["severity"].as_str()),
        (Some(4), Some("fatal")),
        "{f:#}"
    );
    assert!(agent.stop().success());
}

/// Issue 26 (M2): NVML's Xid event comes first (it knows only the code: a warning), the
/// kernel log's decoded line makes it fatal; hours later (here: past the same-occurrence
/// window) the same code again, NVML first, then a Nonfatal line. The fault stays fatal:
/// a later, milder occurrence never softens what an earlier one latched.
#[test]
fn a_milder_later_nvlink5_line_never_downgrades_a_latched_fatal_fault() {
    let host = Host::new();
    let event = "[[event]]\ngpu = 2\nxid = 144\n";
    let scenario = NvmlScenario::healthy().top(event);
    let agent = host.start_with_nvml(&scenario, "");
    let xid144 = |s: &Value| fault(s, &host, "xid", Some(144)).cloned();
    agent.wait_for(Duration::from_secs(5), |s| xid144(s).is_some());
    inject(&format!(
        "NVRM: Xid (PCI:{}): 144, SAW_MVB Fatal XC0 i0 Link 04 (0x00000021 0x00000002 0x0 0x0 0x0 0x0 0x0)",
        host.gpu_bdf(2)
    ));
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        xid144(s).is_some_and(|f| f["severity"] == "fatal")
    });
    assert_eq!(xid144(&s).expect("fault")["count"], 1);

    // A second occurrence, past the window in which two paths' reports are one.
    std::thread::sleep(Duration::from_secs(11));
    NvmlScenario::healthy()
        .top(&format!("{event}{event}"))
        .write(&host);
    agent.wait_for(Duration::from_secs(5), |s| {
        xid144(s).is_some_and(|f| f["count"] == 2)
    });
    inject(&format!(
        "NVRM: Xid (PCI:{}): 144, SAW_MVB Nonfatal XC0 i0 Link 04 (0x00000021 0x00000001 0x0 0x0 0x0 0x0 0x0)",
        host.gpu_bdf(2)
    ));
    // The line is merged into this occurrence (its evidence is the fault's detail now).
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        xid144(s).is_some_and(|f| f["detail"].as_str().is_some_and(|d| d.contains("Nonfatal")))
    });
    let f = xid144(&s).expect("fault");
    assert_eq!(
        (f["severity"].as_str(), f["count"].as_u64()),
        (Some("fatal"), Some(2)),
        "{f}"
    );
    assert!(agent.stop().success());
}

/// Review 2026-12-03b L12: an NVML call that never returns (a driver hung on a GPU fallen off
/// the bus) left the source `on` in `status` while nothing was looked at. Now the poll's
/// watchdog shows it `failed` with how long it has been stuck, the faults NVML saw stay, and
/// the source is back `on` when the call returns.
#[test]
fn a_hung_nvml_poll_shows_the_source_failed_and_keeps_its_faults() {
    let host = Host::new();
    let sick = NvmlScenario::healthy().gpu(3, "remap.pending = true");
    let agent = host.start_with_nvml(&sick, "");
    agent.wait_for(WAIT, |s| !nvml_faults(s, &host).is_empty());
    let nvml_state = |s: &Value| {
        s["sources"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["source"] == "nvml").cloned())
            .unwrap_or(Value::Null)
    };
    sick.clone().gpu(3, "hangs = [\"pcie\"]").write(&host);
    let s = agent.wait_for(Duration::from_secs(15), |s| {
        nvml_state(s)["state"] == "failed"
    });
    assert!(
        nvml_state(&s)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("has not returned")),
        "{}",
        nvml_state(&s)
    );
    assert_eq!(nvml_faults(&s, &host).len(), 1, "the fault is kept: {s}");
    NvmlScenario::healthy().write(&host);
    agent.wait_for(WAIT, |s| {
        nvml_state(s)["state"] == "on" && nvml_faults(s, &host).is_empty()
    });
    assert!(agent.stop().success());
}

/// A GB200/GB300 NVL72 host: each GPU's NVLink fabric registration (the fake library's
/// `nvmlDeviceGetGpuFabricInfoV`, real struct layout and versioning) names its NVLink
/// domain in `status` and the metrics; a registration that never completes, completes with
/// an error, or reports degraded health is a fault on that GPU, and clears with it. A driver
/// that knows only the v2 struct is read through v2.
#[test]
fn nvlink_fabric_registration_names_the_domain_and_faults_where_it_fails() {
    const CLUSTER: &str = "5e1f002a-7b3c-4d01-8e9f-a0b1c2d3e4f5";
    // Healthy as a GB200 reports it: every two-state health field "false", configuration
    // "none", summary healthy.
    let registered = |clique: u32| {
        format!(
            "fabric.state = \"completed\"\nfabric.clique_id = {clique}\n\
             fabric.cluster_uuid = \"{CLUSTER}\"\nfabric.health_mask = {}\n\
             fabric.health_summary = 1\n",
            2 | (2 << 2) | (2 << 4) | (2 << 6) | (1 << 8)
        )
    };
    let nvl72 = |overrides: &[(usize, &str)]| {
        (0..8).fold(NvmlScenario::healthy(), |s, i| {
            let extra = overrides
                .iter()
                .filter(|(gpu, _)| *gpu == i)
                .map(|(_, toml)| *toml)
                .collect::<String>();
            s.gpu(i, &format!("{}{extra}", registered(7)))
        })
    };
    let host = Host::new();
    let port = gpu_agent_e2e::free_port();
    nvl72(&[(1, "fabric.max_version = 2\n")]).write(&host);
    // No boot grace: this machine booted long ago, as a node does whose agent restarts.
    let config = host.config(&format!(
        "[metrics]\nlisten = \"127.0.0.1:{port}\"\n{}nvlink_boot_grace = \"0s\"\n",
        host.nvml_config()
    ));
    let agent = gpu_agent_e2e::Agent::start_with_env(
        &config,
        &host.socket(),
        &[(
            "FAKE_NVML_SCENARIO",
            &host.nvml_scenario_path().to_string_lossy(),
        )],
    );
    let s = agent.wait_for(WAIT, |s| s["gpus"][7]["nvml"]["fabric"].is_object());
    assert!(
        nvml_faults(&s, &host).is_empty(),
        "{:#?}",
        nvml_faults(&s, &host)
    );
    for g in s["gpus"].as_array().expect("gpus") {
        let f = &g["nvml"]["fabric"];
        assert_eq!(
            (&f["state"], &f["cluster_uuid"], &f["clique_id"]),
            (
                &Value::from("completed"),
                &Value::from(CLUSTER),
                &Value::from(7)
            ),
            "every GPU, the v2-only driver's included: {g:#}"
        );
    }
    let (_, table) = agent.status(false);
    assert!(
        table.contains(&format!(
            "NVLink fabric completed: cluster {CLUSTER} clique 7"
        )),
        "{table}"
    );
    let body = gpu_agent_e2e::http_get(port, "/metrics");
    assert!(
        body.contains(&format!(
            r#"gpu_agent_gpu_fabric_info{{gpu="3",cluster_uuid="{CLUSTER}",clique_id="7",state="completed"}} 1"#
        )),
        "{body}"
    );

    // (scenario override, fault code, GPU, severity, action)
    let cases = [
        (
            (2, "fabric.state = \"in-progress\"\n"),
            "fabric-unregistered",
            2,
            "fatal",
            "reboot",
        ),
        (
            (5, "fabric.status = 999\n"),
            "fabric-registration-failed",
            5,
            "fatal",
            "reboot",
        ),
        (
            (3, "fabric.health_mask = 425\n"),
            "fabric-degraded",
            3,
            "warning",
            "none",
        ),
        (
            (6, "fabric.health_summary = 2\n"),
            "fabric-unhealthy",
            6,
            "fatal",
            "reset-gpu",
        ),
    ];
    for ((gpu, toml), code, index, severity, action) in cases {
        // Later keys of a table win in no TOML; the override replaces the GPU's whole table.
        let scenario = (0..8).fold(NvmlScenario::healthy(), |s, i| {
            let fabric = if i == gpu {
                registered(7)
                    .lines()
                    .filter(|l| {
                        let key = toml.split('=').next().unwrap_or_default().trim();
                        !l.starts_with(key)
                    })
                    .map(|l| format!("{l}\n"))
                    .collect::<String>()
                    + toml
            } else {
                registered(7)
            };
            s.gpu(i, &fabric)
        });
        scenario.write(&host);
        let s = agent.wait_for(WAIT, |s| {
            nvml_faults(s, &host)
                .iter()
                .any(|f| f["code"]["type"] == code)
        });
        let faults = nvml_faults(&s, &host);
        assert_eq!(faults.len(), 1, "{code}: {faults:#?}");
        assert_eq!(
            (
                faults[0]["gpu_index"].as_u64(),
                faults[0]["severity"].as_str(),
                faults[0]["action"].as_str()
            ),
            (Some(index), Some(severity), Some(action)),
            "{code}: {:#}",
            faults[0]
        );
        nvl72(&[]).write(&host);
        agent.wait_for(WAIT, |s| nvml_faults(s, &host).is_empty());
    }
    assert!(agent.stop().success());
}

/// Each GPU's utilisation, as NVML's last sample period saw it, and the evidence a slow GPU
/// leaves (its SM clock against its maximum, its power limit against the default, PCIe
/// replays), in `status --json` and the metrics; a GPU (or driver) that does not support a
/// call shows none: unknown, never 0.
#[test]
fn utilisation_clocks_and_power_limits_per_gpu_and_unknown_where_not_supported() {
    let host = Host::new();
    let port = gpu_agent_e2e::free_port();
    let scenario = NvmlScenario::healthy()
        .gpu(
            2,
            "utilization = { gpu = 97, memory = 41 }\ngpm = { sm = 90.0, occupancy = 45.0, tensor = 60.4, dram_bw = 30.0 }",
        )
        .gpu(
            4,
            "clocks = { sm = 1100, sm_max = 1980 }\npower = { limit_mw = 400000, default_limit_mw = 700000 }\npcie.replay = 12",
        )
        .gpu(5, "not_supported = [\"utilization\", \"clocks\", \"power\"]");
    let agent = host.start_with_nvml(
        &scenario,
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    // GPM needs two samples, a poll apart.
    let s = agent.wait_for(WAIT, |s| {
        s["gpus"][2]["nvml"]["telemetry"]["utilization_gpu"] == 97
            && s["gpus"][2]["nvml"]["telemetry"]["tensor_active_percent"] == 60
    });
    let t = |i: usize| s["gpus"][i]["nvml"]["telemetry"].clone();
    assert_eq!(t(2)["utilization_memory"], 41);
    assert_eq!(t(0)["utilization_gpu"], 0, "idle");
    assert!(
        t(5)["utilization_gpu"].is_null(),
        "not supported: unknown, not 0"
    );
    let body = gpu_agent_e2e::http_get(port, "/metrics");
    for line in [
        r#"gpu_agent_gpu_utilization_percent{gpu="2",which="gpu"} 97"#,
        r#"gpu_agent_gpu_utilization_percent{gpu="2",which="memory"} 41"#,
        r#"gpu_agent_gpu_utilization_percent{gpu="0",which="gpu"} 0"#,
    ] {
        assert!(body.contains(line), "{line}: {body}");
    }
    assert!(
        !body.contains(r#"gpu_agent_gpu_utilization_percent{gpu="5""#),
        "{body}"
    );
    assert_eq!(
        (
            t(2)["sm_active_percent"].clone(),
            t(2)["sm_occupancy_percent"].clone(),
            t(2)["dram_bw_percent"].clone()
        ),
        (90.into(), 45.into(), 30.into())
    );
    assert!(
        t(0)["tensor_active_percent"].is_null(),
        "no GPM (before Hopper): unknown, never 0"
    );
    assert_eq!(t(4)["sm_clock_mhz"], 1100);
    assert_eq!(t(4)["sm_clock_max_mhz"], 1980);
    assert_eq!(t(4)["power_limit_mw"], 400_000);
    assert_eq!(t(4)["power_limit_default_mw"], 700_000);
    assert_eq!(t(4)["pcie_replay_errors"], 12);
    assert!(t(5)["sm_clock_mhz"].is_null() && t(5)["power_limit_mw"].is_null());
    for line in [
        r#"gpu_agent_gpu_sm_clock_mhz{gpu="4",which="current"} 1100"#,
        r#"gpu_agent_gpu_sm_clock_mhz{gpu="4",which="max"} 1980"#,
        r#"gpu_agent_gpu_power_limit_milliwatts{gpu="4",which="enforced"} 400000"#,
        r#"gpu_agent_gpu_power_limit_milliwatts{gpu="4",which="default"} 700000"#,
        r#"gpu_agent_gpu_pcie_replay_errors_total{gpu="4",counter="replay"} 12"#,
        r#"gpu_agent_gpu_activity_percent{gpu="2",which="tensor"} 60"#,
        r#"gpu_agent_gpu_activity_percent{gpu="2",which="sm"} 90"#,
    ] {
        assert!(body.contains(line), "{line}: {body}");
    }
    assert!(agent.stop().success());
}

/// Slow but not broken, judged only while busy and over polls: a busy GPU under the power
/// brake and one at 60 % of its busy peers' SM clock are `gpu-slow` (warnings on the GPU;
/// the node stays healthy); an idle GPU with low clocks and a Gen1 link never is, nor a busy
/// Gen6 GPU at Gen5 in a Gen5 slot (its best on this host); the power brake released, the
/// verdict clears.
#[test]
fn a_busy_gpu_held_back_is_slow_and_an_idle_one_never() {
    let host = Host::new();
    let mut scenario = NvmlScenario::healthy();
    for i in 0..8 {
        if i != 6 {
            scenario = scenario.gpu(i, "utilization = { gpu = 95, memory = 40 }");
        }
    }
    // A Gen6 GPU in a Gen5 slot, busy at Gen5: as fast as this host lets it be.
    scenario = scenario.gpu(5, "pcie.max_gen = 6\npcie.bus_max_gen = 5");
    let held = scenario
        .clone()
        .gpu(3, "clock_event_reasons = 128")
        .gpu(1, "clocks = { sm = 1188, sm_max = 1980 }")
        .gpu(6, "clocks = { sm = 345, sm_max = 1980 }\npcie.gen = 1");
    let agent = host.start_with_nvml(&held, "");
    let slow = |s: &Value| -> Vec<(u64, String, String)> {
        nvml_faults(s, &host)
            .iter()
            .filter(|f| f["code"]["type"] == "gpu-slow")
            .map(|f| {
                (
                    f["gpu_index"].as_u64().unwrap_or(99),
                    f["severity"].as_str().unwrap_or_default().to_string(),
                    f["detail"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    };
    let s = agent.wait_for(WAIT, |s| slow(s).len() == 2);
    let found = slow(&s);
    assert_eq!(
        found
            .iter()
            .map(|f| (f.0, f.1.as_str()))
            .collect::<Vec<_>>(),
        [(1, "warning"), (3, "warning")],
        "{found:#?}"
    );
    assert!(found[0].2.contains("SM clock 1188 MHz"), "{found:#?}");
    assert!(found[1].2.contains("power brake"), "{found:#?}");
    assert!(
        nvml_faults(&s, &host)
            .iter()
            .all(|f| f["severity"] != "fatal"),
        "a warning, never a fatal: {:#?}",
        nvml_faults(&s, &host)
    );
    // Still never the idle GPU nor the one at its slot's best, a second later.
    std::thread::sleep(Duration::from_secs(1));
    let s = agent.snapshot().expect("snapshot");
    assert!(
        slow(&s).iter().all(|f| f.0 != 6 && f.0 != 5),
        "{:#?}",
        slow(&s)
    );
    let link = &s["gpus"][5]["nvml"]["telemetry"];
    assert_eq!(
        (link["pcie_gen"].as_u64(), link["pcie_gen_max"].as_u64()),
        (Some(5), Some(5)),
        "the slot's best, not the GPU's own: {link:#}"
    );

    // The brake released (and the clock back): cleared once a poll shows no evidence and
    // the hold has passed.
    scenario
        .gpu(6, "clocks = { sm = 345, sm_max = 1980 }\npcie.gen = 1")
        .write(&host);
    agent.wait_for(WAIT, |s| slow(s).is_empty());
    assert!(agent.stop().success());
}
