//! The real daemon with the test kubelet's pod-resources server (gRPC on a Unix socket), the
//! test API server and the fake NVML library: a GPU fault reaches the pods holding that GPU
//! (every ID shape the NVIDIA device plugin hands out), `status` names each GPU's holders,
//! and a missing or failing kubelet turns the lookup off with the reason, then on again.

use std::time::Duration;

use gpu_agent_e2e::kube_api::KubeApi;
use gpu_agent_e2e::kubelet::{Kubelet, Mode};
use gpu_agent_e2e::{inject, wait_until as wait, Host, NvmlScenario};
use serde_json::Value;

const NODE: &str = "gpu-node-3";

fn config(host: &Host, api: &KubeApi) -> String {
    format!(
        "node_name = \"{NODE}\"\n[kubernetes]\nkubeconfig = {:?}\n",
        api.kubeconfig(host.dir.path())
    )
}

fn pod_events(api: &KubeApi) -> Vec<Value> {
    api.events()
        .into_iter()
        .filter(|e| e["involvedObject"]["kind"] == "Pod")
        .collect()
}

fn events_on(api: &KubeApi, pod: &str) -> Vec<Value> {
    pod_events(api)
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == pod)
        .collect()
}

#[test]
fn an_xid_on_gpu_3_reaches_the_pod_holding_gpu_3_and_no_other() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let kubelet = Kubelet::start(&host.kubelet_socket());
    for (pod, uid) in [
        ("train-a", "uid-a"),
        ("train-b", "uid-b"),
        ("web", "uid-web"),
    ] {
        api.add_pod(if pod == "web" { "apps" } else { "ml" }, pod, uid, NODE);
    }
    kubelet.assign(
        "ml",
        "train-a",
        "trainer",
        "nvidia.com/gpu",
        &[&host.gpu_uuid(3), &host.gpu_uuid(2)],
    );
    kubelet.assign(
        "ml",
        "train-b",
        "trainer",
        "nvidia.com/gpu",
        &[&host.gpu_uuid(1)],
    );
    kubelet.assign("apps", "web", "nginx", "vpc.amazonaws.com/efa", &["efa0"]);
    let agent = host.start_with_nvml(&NvmlScenario::healthy(), &config(&host, &api));
    agent.wait_for(Duration::from_secs(10), |s| {
        s["gpus"][3]["nvml"]["uuid"] == host.gpu_uuid(3).as_str()
    });

    // Nothing happens, nothing is asked: no List while the node is healthy (the `status`
    // requests above each asked once).
    let asked = kubelet.list_calls();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        kubelet.list_calls(),
        asked,
        "the kubelet is asked only on demand"
    );

    let bdf = host.gpu_bdf(3);
    inject(&format!(
        "NVRM: Xid (PCI:{bdf}): 79, pid=1234, name=python, GPU has fallen off the bus."
    ));
    wait(Duration::from_secs(10), "the pod Event", || {
        !events_on(&api, "train-a").is_empty()
    });
    let event = events_on(&api, "train-a").remove(0);
    assert_eq!(event["metadata"]["namespace"], "ml");
    assert_eq!(
        event["involvedObject"],
        serde_json::json!({ "apiVersion": "v1", "kind": "Pod", "name": "train-a", "namespace": "ml", "uid": "uid-a" })
    );
    assert_eq!(event["reason"], "NvidiaXID79Error");
    assert_eq!(event["type"], "Warning");
    let message = event["message"].as_str().expect("message");
    for part in [
        "GPU 3",
        bdf.as_str(),
        host.gpu_uuid(3).as_str(),
        "container trainer",
        "fatal",
        "action reboot",
    ] {
        assert!(message.contains(part), "{part:?} missing from {message}");
    }
    // It names the Node Event it belongs to, which exists.
    let node_event = message
        .rsplit_once("Node Event default/")
        .map(|(_, n)| n.to_string())
        .expect("node event named");
    wait(Duration::from_secs(5), "the Node Event", || {
        api.events()
            .iter()
            .any(|e| e["metadata"]["name"] == node_event.as_str())
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        events_on(&api, "train-b").is_empty(),
        "train-b holds GPU 1 only"
    );
    assert!(events_on(&api, "web").is_empty(), "web holds no GPU");
    assert_eq!(pod_events(&api).len(), 1, "{:?}", pod_events(&api));

    // `status` names the holders; `--json` carries them.
    let (_, text) = agent.status(false);
    assert!(text.contains("held by ml/train-a (trainer)"), "{text}");
    let (_, json) = agent.status(true);
    let json: Value = serde_json::from_str(&json).expect("json");
    assert_eq!(json["gpus"][3]["holders"][0]["pod"], "train-a");
    assert_eq!(json["gpus"][1]["holders"][0]["pod"], "train-b");
    assert_eq!(json["gpus"][0]["holders"], serde_json::json!([]));
    wait(Duration::from_secs(3), "pod-resources on", || {
        agent.sink("pod-resources")["state"] == "on"
    });
    assert!(agent.stop().success());
}

#[test]
fn shared_mig_and_index_ids_each_reach_their_pods() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let kubelet = Kubelet::start(&host.kubelet_socket());
    let uuid = |i: usize| host.gpu_uuid(i);
    let mig = format!("MIG-{:08x}-5005", host.domain);
    // Time-slicing: replicas of GPU 3 in two pods; MIG: a slice of GPU 5; index strategy: 6.
    let pods = [
        (
            "slice-0",
            format!("{}::0", uuid(3)),
            "nvidia.com/gpu.shared",
        ),
        (
            "slice-1",
            format!("{}::1", uuid(3)),
            "nvidia.com/gpu.shared",
        ),
        ("mig", mig.clone(), "nvidia.com/mig-1g.10gb"),
        ("by-index", "6".to_string(), "nvidia.com/gpu"),
        ("other", format!("{}::2", uuid(0)), "nvidia.com/gpu.shared"),
        ("nvml-fault", uuid(7), "nvidia.com/gpu"),
    ];
    for (pod, id, resource) in &pods {
        api.add_pod("ml", pod, &format!("uid-{pod}"), NODE);
        kubelet.assign("ml", pod, "main", resource, &[id]);
    }
    // GPU 7's fault comes from NVML, not the kernel log.
    let scenario = NvmlScenario::healthy()
        .gpu(5, &format!("mig = [{mig:?}]"))
        .gpu(7, "remap.failure = true\nremap.uncorrectable = 9");
    let agent = host.start_with_nvml(&scenario, &config(&host, &api));
    agent.wait_for(Duration::from_secs(10), |s| {
        s["gpus"][5]["nvml"]["mig_uuids"][0] == mig.as_str()
    });
    for gpu in [3, 5, 6] {
        inject(&format!(
            "NVRM: Xid (PCI:{}): 48, pid=1, name=python, An uncorrectable double bit error",
            host.gpu_bdf(gpu)
        ));
    }
    for pod in ["slice-0", "slice-1", "mig", "by-index", "nvml-fault"] {
        if !events_on(&api, pod).is_empty() {
            continue;
        }
        std::thread::sleep(Duration::from_secs(10));
        assert!(
            !events_on(&api, pod).is_empty(),
            "{pod}: {}\n{:?}",
            agent.log(),
            api.events()
        );
    }
    let mig_event = events_on(&api, "mig").remove(0);
    assert!(
        mig_event["message"]
            .as_str()
            .is_some_and(|m| m.contains("GPU 5") && m.contains(&mig)),
        "{mig_event}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(events_on(&api, "other").is_empty(), "GPU 0 has no fault");
    assert_eq!(pod_events(&api).len(), 5);
    assert_eq!(
        events_on(&api, "nvml-fault")[0]["reason"],
        "NvidiaRowRemapFailure"
    );
    // A burst of faults costs a List or two (the answer is reused within cache_for), not one
    // per fault.
    assert!(kubelet.list_calls() <= 3, "{}", kubelet.list_calls());
    assert!(agent.stop().success());
}

#[test]
fn no_kubelet_is_off_with_the_reason_and_it_comes_back() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    // A short cache, so each step below sees the kubelet's latest answer.
    let config = format!(
        "{}[pod_resources]\nsocket = {:?}\ncache_for = \"200ms\"\n",
        config(&host, &api),
        host.kubelet_socket()
    );
    let agent = host.start_with_nvml(&NvmlScenario::healthy(), &config);

    // No socket: status says why, the rest of the agent is unchanged.
    let (_, text) = agent.status(false);
    assert!(
        text.contains("which pod holds each GPU is unknown: no pod-resources socket at"),
        "{text}"
    );
    wait(Duration::from_secs(3), "off", || {
        agent.sink("pod-resources")["state"] == "off"
    });
    assert!(agent.sink("pod-resources")["reason"]
        .as_str()
        .is_some_and(|r| r.contains("kubelet.sock")));

    // The kubelet starts: on, with holders (and a DRA claim shown as not mapped).
    let kubelet = Kubelet::start(&host.kubelet_socket());
    kubelet.assign(
        "ml",
        "train",
        "trainer",
        "nvidia.com/gpu",
        &[&host.gpu_uuid(4)],
    );
    kubelet.assign_dra("ml", "dra-pod", "main", "gpu-1");
    kubelet.assign(
        "ml",
        "stale",
        "main",
        "nvidia.com/gpu",
        &["GPU-not-on-this-node"],
    );
    let (_, text) = agent.status(false);
    assert!(text.contains("held by ml/train (trainer)"), "{text}");
    assert!(
        text.contains("DRA: ml/dra-pod (main) holds gpu-1 from gpu.nvidia.com"),
        "{text}"
    );
    assert!(
        text.contains("device ID not mapped to a GPU: GPU-not-on-this-node"),
        "{text}"
    );
    wait(Duration::from_secs(3), "on", || {
        agent.sink("pod-resources")["state"] == "on"
    });

    // UNAVAILABLE: failed with the kubelet's code.
    kubelet.set_mode(Mode::Unavailable);
    std::thread::sleep(Duration::from_millis(300)); // past the cache
    let (_, text) = agent.status(false);
    assert!(text.contains("Unavailable"), "{text}");
    wait(Duration::from_secs(3), "failed", || {
        agent.sink("pod-resources")["state"] == "failed"
    });

    // The kubelet restarts (socket gone, then back): on again, no agent restart.
    let state = kubelet.stop();
    state.lock().expect("state").mode = Mode::Normal;
    let (_, text) = agent.status(false);
    assert!(text.contains("no pod-resources socket"), "{text}");
    let _kubelet = Kubelet::restart(&host.kubelet_socket(), state);
    let (_, text) = agent.status(false);
    assert!(text.contains("held by ml/train (trainer)"), "{text}");
    wait(Duration::from_secs(3), "on again", || {
        agent.sink("pod-resources")["state"] == "on"
    });
    assert!(agent.stop().success());
}

/// Review 2026-12-03b L5: a pod Event the API server failed to take is tried again until it
/// is written, not only at the next change of the node's health (which may never come).
#[test]
fn a_pod_event_the_server_refused_is_retried_until_written() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let kubelet = Kubelet::start(&host.kubelet_socket());
    api.add_pod("retry", "train-r", "uid-r", NODE);
    kubelet.assign(
        "retry",
        "train-r",
        "trainer",
        "nvidia.com/gpu",
        &[&host.gpu_uuid(5)],
    );
    let agent = host.start_with_nvml(&NvmlScenario::healthy(), &config(&host, &api));
    agent.wait_for(Duration::from_secs(10), |s| {
        s["gpus"][5]["nvml"]["uuid"] == host.gpu_uuid(5).as_str()
    });
    api.fail_events_in(Some("retry"));
    let bdf = host.gpu_bdf(5);
    inject(&format!(
        "NVRM: Xid (PCI:{bdf}): 79, pid=1234, name=python, GPU has fallen off the bus."
    ));
    wait(Duration::from_secs(10), "a refused pod Event write", || {
        api.requests()
            .iter()
            .any(|r| r.method == "POST" && r.path.contains("/namespaces/retry/events"))
    });
    std::thread::sleep(Duration::from_secs(1));
    assert!(events_on(&api, "train-r").is_empty());
    // The server takes Event writes again; nothing else changes on the node.
    api.fail_events_in(None);
    wait(
        Duration::from_secs(10),
        "the pod Event written on retry",
        || !events_on(&api, "train-r").is_empty(),
    );
    assert!(agent.stop().success());
}

/// A slow GPU (busy under the power brake) is told to the pod holding it: a Pod Event with
/// the evidence, a warning that condemns nothing.
#[test]
fn the_pod_holding_a_slow_gpu_gets_an_event() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let kubelet = Kubelet::start(&host.kubelet_socket());
    api.add_pod("slow", "train-s", "uid-s", NODE);
    kubelet.assign(
        "slow",
        "train-s",
        "trainer",
        "nvidia.com/gpu",
        &[&host.gpu_uuid(4)],
    );
    let mut scenario = NvmlScenario::healthy();
    for i in 0..8 {
        scenario = scenario.gpu(i, "utilization = { gpu = 95, memory = 40 }");
    }
    let scenario = scenario.gpu(4, "clock_event_reasons = 128");
    let agent = host.start_with_nvml(&scenario, &config(&host, &api));
    wait(Duration::from_secs(10), "the slow GPU's pod Event", || {
        !events_on(&api, "train-s").is_empty()
    });
    let event = events_on(&api, "train-s").remove(0);
    assert_eq!(event["reason"], "NvidiaGPUSlow");
    assert_eq!(event["type"], "Warning");
    let message = event["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("power brake") && message.contains(&host.gpu_uuid(4)),
        "{message}"
    );
    assert!(agent.stop().success());
}

/// The funnel, per GPU and per pod: of the eight GPUs NVML sees, a pod holds two and keeps
/// one busy; its GPU-seconds grow with the time held (two GPUs) and busy (one), so
/// present >= allocated >= busy and the pod's allocated seconds are twice its busy ones.
#[test]
fn the_funnel_counts_gpus_held_and_busy_per_gpu_and_per_pod() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let kubelet = Kubelet::start(&host.kubelet_socket());
    api.add_pod("ml", "funnel-0", "uid-f", NODE);
    kubelet.assign(
        "ml",
        "funnel-0",
        "trainer",
        "nvidia.com/gpu",
        &[&host.gpu_uuid(2), &host.gpu_uuid(3)],
    );
    let port = gpu_agent_e2e::free_port();
    let scenario = NvmlScenario::healthy()
        .gpu(2, "utilization = { gpu = 95, memory = 40 }")
        .gpu(5, "utilization = { gpu = 99, memory = 40 }");
    let agent = host.start_with_nvml(
        &scenario,
        &format!(
            "{}[metrics]\nlisten = \"127.0.0.1:{port}\"\nfunnel_interval = \"1s\"\n",
            config(&host, &api)
        ),
    );
    let metric = |body: &str, name_and_labels: &str| -> Option<f64> {
        body.lines()
            .find(|l| l.starts_with(name_and_labels))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    let mut body = String::new();
    wait(Duration::from_secs(15), "three funnel ticks", || {
        body = gpu_agent_e2e::http_get(port, "/metrics");
        metric(
            &body,
            r#"gpu_agent_pod_gpu_seconds_total{namespace="ml",pod="funnel-0",state="busy"}"#,
        )
        .is_some_and(|s| s >= 2.0)
    });
    let stage = |gpu: u32, stage: &str| {
        metric(
            &body,
            &format!(r#"gpu_agent_gpu_stage{{gpu="{gpu}",stage="{stage}"}}"#),
        )
    };
    let count = |s: &str| (0..8).filter_map(|g| stage(g, s)).sum::<f64>();
    assert_eq!(
        (count("present"), count("allocated"), count("busy")),
        (8.0, 2.0, 1.0),
        "{body}"
    );
    assert_eq!(stage(2, "busy"), Some(1.0));
    assert_eq!(stage(3, "busy"), Some(0.0), "held, idle");
    assert_eq!(stage(5, "busy"), Some(0.0), "busy, but no pod holds it");
    let seconds = |state: &str| {
        metric(
            &body,
            &format!(
                r#"gpu_agent_pod_gpu_seconds_total{{namespace="ml",pod="funnel-0",state="{state}"}}"#
            ),
        )
        .unwrap_or_default()
    };
    let (allocated, busy) = (seconds("allocated"), seconds("busy"));
    assert!(
        (allocated - 2.0 * busy).abs() < 1e-6,
        "two GPUs held, one busy: {allocated} / {busy}"
    );
    assert!(agent.stop().success());
}

/// Held but not working: a pod that holds GPUs and keeps none busy for the window gets one
/// Pod Event naming its GPUs, `status` and the metric say so; a pod keeping one of its GPUs
/// busy gets nothing; busy again, the episode ends.
#[test]
fn a_pod_holding_idle_gpus_for_the_window_is_told_once() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let kubelet = Kubelet::start(&host.kubelet_socket());
    api.add_pod("ml", "idle-0", "uid-i", NODE);
    api.add_pod("ml", "busy-0", "uid-b", NODE);
    kubelet.assign(
        "ml",
        "idle-0",
        "notebook",
        "nvidia.com/gpu",
        &[&host.gpu_uuid(6), &host.gpu_uuid(7)],
    );
    kubelet.assign(
        "ml",
        "busy-0",
        "trainer",
        "nvidia.com/gpu",
        &[&host.gpu_uuid(0), &host.gpu_uuid(1)],
    );
    let port = gpu_agent_e2e::free_port();
    let busy = NvmlScenario::healthy().gpu(0, "utilization = { gpu = 95, memory = 40 }");
    let agent = host.start_with_nvml(
        &busy,
        &format!(
            "{}[metrics]\nlisten = \"127.0.0.1:{port}\"\nfunnel_interval = \"1s\"\nheld_idle_after = \"2s\"\n",
            config(&host, &api)
        ),
    );
    wait(Duration::from_secs(15), "the held-but-idle Event", || {
        !events_on(&api, "idle-0").is_empty()
    });
    let event = events_on(&api, "idle-0").remove(0);
    assert_eq!(event["reason"], "GPUHeldIdle");
    assert_eq!(event["type"], "Normal");
    let message = event["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("GPU 6, GPU 7 held by this pod and none of them busy")
            && message.contains("under 80 %"),
        "{message}"
    );
    let (_, text) = agent.status(false);
    assert!(
        text.contains("Held but not working: ml/idle-0 holds GPU 6, GPU 7, none busy"),
        "{text}"
    );
    let body = gpu_agent_e2e::http_get(port, "/metrics");
    assert!(
        body.contains(r#"gpu_agent_pod_held_idle{namespace="ml",pod="idle-0"} 1"#),
        "{body}"
    );
    assert!(
        !body.contains(r#"gpu_agent_pod_held_idle{namespace="ml",pod="busy-0"}"#),
        "{body}"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(events_on(&api, "idle-0").len(), 1, "once per episode");
    assert!(events_on(&api, "busy-0").is_empty(), "one busy GPU is work");

    // Busy again: the episode ends.
    busy.gpu(7, "utilization = { gpu = 90, memory = 40 }")
        .write(&host);
    wait(Duration::from_secs(10), "the episode over", || {
        !agent.status(false).1.contains("Held but not working")
    });
    assert!(agent.stop().success());
}

/// Busy is not productive: a pod whose two GPUs run resident kernels with no tensor work
/// (GPM) for the window gets one Event naming both, told apart from an idle one; a pod whose GPU does tensor work is
/// productive in the funnel and told nothing.
#[test]
fn a_pod_busy_without_tensor_work_is_told_and_a_productive_one_counted() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let kubelet = Kubelet::start(&host.kubelet_socket());
    api.add_pod("ml", "stuck-0", "uid-s", NODE);
    api.add_pod("ml", "train-0", "uid-t", NODE);
    kubelet.assign(
        "ml",
        "stuck-0",
        "rank",
        "nvidia.com/gpu",
        &[&host.gpu_uuid(3), &host.gpu_uuid(4)],
    );
    kubelet.assign(
        "ml",
        "train-0",
        "rank",
        "nvidia.com/gpu",
        &[&host.gpu_uuid(5)],
    );
    let port = gpu_agent_e2e::free_port();
    let waiting = "utilization = { gpu = 100, memory = 1 }\ngpm = { sm = 100.0, occupancy = 5.0, tensor = 0.0, dram_bw = 1.0 }";
    let scenario = NvmlScenario::healthy()
        .gpu(3, waiting)
        .gpu(4, waiting)
        .gpu(
            5,
            "utilization = { gpu = 98, memory = 60 }\ngpm = { sm = 95.0, occupancy = 50.0, tensor = 55.0, dram_bw = 40.0 }",
        );
    let agent = host.start_with_nvml(
        &scenario,
        &format!(
            "{}[metrics]\nlisten = \"127.0.0.1:{port}\"\nfunnel_interval = \"1s\"\nheld_idle_after = \"2s\"\n",
            config(&host, &api)
        ),
    );
    wait(Duration::from_secs(15), "the not-productive Event", || {
        !events_on(&api, "stuck-0").is_empty()
    });
    let event = events_on(&api, "stuck-0").remove(0);
    assert_eq!(event["reason"], "GPUHeldNotProductive");
    let message = event["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("GPU 3, GPU 4") && message.contains("busy but with no tensor work"),
        "{message}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(events_on(&api, "stuck-0").len(), 1, "one Event per episode");
    assert!(events_on(&api, "train-0").is_empty(), "tensor work is work");
    let body = gpu_agent_e2e::http_get(port, "/metrics");
    for line in [
        r#"gpu_agent_gpu_stage{gpu="5",stage="productive"} 1"#,
        r#"gpu_agent_gpu_stage{gpu="4",stage="productive"} 0"#,
        r#"gpu_agent_gpu_stage{gpu="4",stage="busy"} 1"#,
    ] {
        assert!(body.contains(line), "{line}: {body}");
    }
    assert!(
        !body.contains(r#"gpu_agent_gpu_stage{gpu="0",stage="productive"}"#),
        "no GPM: productive unknown, not 0"
    );
    assert!(
        body.contains(
            r#"gpu_agent_pod_gpu_seconds_total{namespace="ml",pod="train-0",state="productive"}"#
        ),
        "{body}"
    );
    assert!(agent.stop().success());
}

/// A GPU in MIG mode gives no utilisation: each MIG device's GPU instance has its own GPM
/// samples (`nvmlGpmMigSampleGet`), and each pod holding one is judged by its own instance,
/// not by its neighbour on the same GPU.
#[test]
fn pods_on_one_mig_gpu_are_judged_by_their_own_instances() {
    let host = Host::new();
    let api = KubeApi::start(&[NODE]);
    let kubelet = Kubelet::start(&host.kubelet_socket());
    let mig = |i: u32| format!("MIG-{:08x}-500{i}", host.domain);
    for (i, pod) in ["train-mig", "stuck-mig"].iter().enumerate() {
        api.add_pod("ml", pod, &format!("uid-{pod}"), NODE);
        kubelet.assign(
            "ml",
            pod,
            "rank",
            "nvidia.com/mig-3g.40gb",
            &[&mig(i as u32)],
        );
    }
    let port = gpu_agent_e2e::free_port();
    let scenario = NvmlScenario::healthy().gpu(
        5,
        &format!(
            "not_supported = [\"utilization\"]\nmig = [{:?}, {:?}]\n\
             gpm = {{ sm = 50.0, occupancy = 20.0, tensor = 20.0, dram_bw = 20.0 }}\n\
             mig_gpm = [{{ sm = 90.0, occupancy = 40.0, tensor = 45.0, dram_bw = 30.0 }}, \
             {{ sm = 95.0, occupancy = 5.0, tensor = 0.0, dram_bw = 1.0 }}]",
            mig(0),
            mig(1)
        ),
    );
    let agent = host.start_with_nvml(
        &scenario,
        &format!(
            "{}[metrics]\nlisten = \"127.0.0.1:{port}\"\nfunnel_interval = \"1s\"\nheld_idle_after = \"2s\"\n",
            config(&host, &api)
        ),
    );
    let s = agent.wait_for(Duration::from_secs(15), |s| {
        s["gpus"][5]["nvml"]["telemetry"]["mig_activity"][1]["tensor_active_percent"] == 0
    });
    let activity = &s["gpus"][5]["nvml"]["telemetry"]["mig_activity"];
    assert_eq!(activity[0]["uuid"], mig(0).as_str(), "{activity}");
    assert_eq!(activity[0]["tensor_active_percent"], 45, "{activity}");
    assert_eq!(activity[1]["sm_active_percent"], 95, "{activity}");
    wait(Duration::from_secs(15), "the not-productive Event", || {
        !events_on(&api, "stuck-mig").is_empty()
    });
    let event = events_on(&api, "stuck-mig").remove(0);
    assert_eq!(event["reason"], "GPUHeldNotProductive", "{event}");
    assert!(
        events_on(&api, "train-mig").is_empty(),
        "its own instance works"
    );
    let body = gpu_agent_e2e::http_get(port, "/metrics");
    for line in [
        format!(
            r#"gpu_agent_mig_activity_percent{{gpu="5",mig="{}",which="tensor"}} 45"#,
            mig(0)
        ),
        format!(
            r#"gpu_agent_mig_activity_percent{{gpu="5",mig="{}",which="sm"}} 95"#,
            mig(1)
        ),
        r#"gpu_agent_gpu_stage{gpu="5",stage="productive"} 1"#.to_string(),
    ] {
        assert!(body.contains(&line), "{line}: {body}");
    }
    let seconds = |pod: &str, state: &str| {
        body.lines()
            .find(|l| {
                l.starts_with(&format!(
                    r#"gpu_agent_pod_gpu_seconds_total{{namespace="ml",pod="{pod}",state="{state}"}}"#
                ))
            })
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse::<f64>().ok())
    };
    assert!(
        seconds("train-mig", "productive").is_some_and(|v| v > 0.0),
        "{body}"
    );
    assert!(
        seconds("stuck-mig", "busy").is_some_and(|v| v > 0.0),
        "{body}"
    );
    assert_eq!(seconds("stuck-mig", "productive"), None, "{body}");
    assert!(agent.stop().success());
}

/// A pod that asked for EFA devices, keeps its GPUs busy and moves no bytes on those devices
/// for the window gets one Event ("may not be using EFA": NCCL's silent fall-back to TCP);
/// a pod whose EFA device carries traffic is told nothing.
#[test]
fn a_busy_pod_whose_efa_devices_move_no_bytes_is_told_once() {
    let host = Host::new();
    let quiet_dev = host.add_efa(0, None);
    let talking_dev = host.add_efa(1, None);
    let api = KubeApi::start(&[NODE]);
    let kubelet = Kubelet::start(&host.kubelet_socket());
    for (pod, gpu, dev) in [("quiet-0", 3, &quiet_dev), ("talking-0", 4, &talking_dev)] {
        api.add_pod("ml", pod, &format!("uid-{pod}"), NODE);
        kubelet.assign("ml", pod, "rank", "nvidia.com/gpu", &[&host.gpu_uuid(gpu)]);
        kubelet.assign("ml", pod, "rank", "vpc.amazonaws.com/efa", &[dev]);
    }
    let working = "utilization = { gpu = 98, memory = 60 }\ngpm = { sm = 95.0, occupancy = 50.0, tensor = 55.0, dram_bw = 40.0 }";
    let scenario = NvmlScenario::healthy().gpu(3, working).gpu(4, working);
    let agent = host.start_with_nvml(
        &scenario,
        &format!(
            "{}[metrics]\nfunnel_interval = \"1s\"\nheld_idle_after = \"3s\"\n\
             [efa]\npoll_interval = \"1s\"\nwindow = \"10s\"\n",
            config(&host, &api)
        ),
    );
    // The talking pod's device sends and receives all along.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let stop = std::sync::Arc::clone(&stop);
        let dir = host
            .sysfs()
            .join("class/infiniband")
            .join(&talking_dev)
            .join("ports/1/hw_counters");
        std::thread::spawn(move || {
            let mut bytes = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                bytes += 1 << 20;
                for counter in ["tx_bytes", "rx_bytes"] {
                    std::fs::write(dir.join(counter), format!("{bytes}\n")).expect("counter");
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    wait(Duration::from_secs(20), "the EFA Event on quiet-0", || {
        !events_on(&api, "quiet-0").is_empty()
    });
    let event = events_on(&api, "quiet-0").remove(0);
    assert_eq!(event["reason"], "CollectivesMayNotUseEFA", "{event}");
    let message = event["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("GPU 3")
            && message.contains(&quiet_dev)
            && message.contains("moved no bytes"),
        "{message}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(events_on(&api, "quiet-0").len(), 1, "one Event per episode");
    assert!(
        events_on(&api, "talking-0").is_empty(),
        "traffic on its EFA device: {:?}",
        events_on(&api, "talking-0")
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = traffic.join();
    assert!(agent.stop().success());
}
