//! `gpu-agent kubelet-config` against the fixture sysfs trees: golden plans, the validator's
//! rejections, targets, idempotency, stale checkpoints and a writer killed mid-write.
//!
//! Regenerate the golden files after an intended change with
//! `UPDATE_GOLDEN=1 cargo test -p gpu-agent --test kubelet_config`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gpu_agent::config::KubeletConfig;
use gpu_agent::kubelet_config::{self as kc, read_topology, validate, Version};

const HOSTS: [&str; 7] = [
    "p5.48xlarge",
    "p4d.24xlarge",
    "g5.xlarge",
    "numa-unknown",
    "smt-off",
    // Grace-Blackwell, coherent driver memory mode on (the EKS AMI's default): two NUMA
    // nodes, one per Grace, each with two GPUs and two EFA devices.
    "p6e-gb200.36xlarge",
    // The same host with coherent driver memory mode off: GPU memory as CPU-less NUMA nodes
    // (8 per GPU, 7 of them memoryless): 34 NUMA nodes.
    "p6e-gb200.36xlarge-gpu-numa",
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn sysfs(host: &str) -> PathBuf {
    fixtures().join("sysfs").join(host)
}

fn run(args: &[&str], config: &Path) -> (i32, String, String) {
    let config = config.to_string_lossy();
    let mut all = vec!["--config", config.as_ref()];
    all.extend_from_slice(args);
    gpu_agent_e2e::cli(&all)
}

/// A config whose [kubelet] paths live in `dir`, with nodeadm's drop-in directory present.
fn config(dir: &Path, extra: &str) -> PathBuf {
    for d in ["nodeadm.d", "kubelet.d", "kubelet"] {
        std::fs::create_dir_all(dir.join(d)).expect("mkdir");
    }
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            "[procfs]\nroot = {:?}\n[kubelet]\nnodeadm_dir = {:?}\nkubelet_config_dir = {:?}\nkubelet_root = {:?}\n{extra}\n",
            dir.join("proc"),
            dir.join("nodeadm.d"),
            dir.join("kubelet.d"),
            dir.join("kubelet")
        ),
    )
    .expect("config");
    std::fs::create_dir_all(dir.join("proc")).expect("proc");
    path
}

#[test]
fn golden_plans_for_every_fixture_host() {
    for host in HOSTS {
        let plan = kc::plan(&sysfs(host), &KubeletConfig::default()).expect("valid plan");
        let actual = serde_json::to_string_pretty(&plan).expect("json") + "\n";
        let golden = fixtures().join("golden").join(format!("{host}.json"));
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::create_dir_all(golden.parent().expect("dir")).expect("mkdir");
            std::fs::write(&golden, &actual).expect("write golden");
        }
        let want = std::fs::read_to_string(&golden)
            .unwrap_or_else(|_| panic!("{} missing: run with UPDATE_GOLDEN=1", golden.display()));
        assert_eq!(
            actual,
            want,
            "{host}: plan differs from {}",
            golden.display()
        );
    }
}

#[test]
fn plans_follow_the_topology() {
    let p5 = kc::plan(&sysfs("p5.48xlarge"), &KubeletConfig::default()).expect("plan");
    assert_eq!(
        p5.kubelet.topology_manager_policy, "best-effort",
        "8 GPUs over 2 NUMA nodes"
    );
    assert_eq!(
        p5.kubelet.reserved_system_cpus, "0-2,48-50,96-98,144-146",
        "whole cores on both nodes"
    );
    assert_eq!(
        p5.kubelet.kube_reserved["memory"], "1355Mi",
        "nodeadm's value for p5 (maxPods 100)"
    );
    assert_eq!(p5.topology.nodes[0].efa.len(), 16);
    let g5 = kc::plan(&sysfs("g5.xlarge"), &KubeletConfig::default()).expect("plan");
    assert_eq!(g5.kubelet.topology_manager_policy, "single-numa-node");
    assert_eq!(
        g5.kubelet.reserved_system_cpus, "0,2",
        "both siblings of core 0"
    );
    let smt_off = kc::plan(&sysfs("smt-off"), &KubeletConfig::default()).expect("plan");
    assert!(
        smt_off.kubelet.cpu_manager_policy_options.is_empty(),
        "full-pcpus-only is pointless without SMT"
    );
    let unknown = kc::plan(&sysfs("numa-unknown"), &KubeletConfig::default()).expect("plan");
    assert!(
        unknown.warnings.iter().any(|w| w.contains("numa_node -1")),
        "{:?}",
        unknown.warnings
    );
    // A stricter policy on split GPUs is allowed but warned about.
    let strict = KubeletConfig {
        topology_policy: "single-numa-node".into(),
        ..KubeletConfig::default()
    };
    let p = kc::plan(&sysfs("p5.48xlarge"), &strict).expect("plan");
    assert!(
        p.warnings
            .iter()
            .any(|w| w.contains("TopologyAffinityError")),
        "{:?}",
        p.warnings
    );
}

/// Grace-Blackwell: with coherent driver memory mode on and off, the plan is one the kubelet
/// accepts. CPU-less NUMA nodes (GPU memory, memoryless MIG nodes) get no core and no
/// reservedMemory share; more than 8 NUMA nodes take max-allowable-numa-nodes where the
/// kubelet has it, and no Topology Manager where it has not.
#[test]
fn grace_plans_pass_validation_in_both_memory_modes() {
    let coherent = kc::plan(&sysfs("p6e-gb200.36xlarge"), &KubeletConfig::default())
        .expect("valid plan, coherent driver memory mode");
    assert_eq!(coherent.topology.nodes.len(), 2);
    assert_eq!(coherent.kubelet.topology_manager_policy, "best-effort");
    assert!(coherent.kubelet.topology_manager_policy_options.is_empty());
    assert!(
        coherent.kubelet.cpu_manager_policy_options.is_empty(),
        "Grace has no SMT"
    );
    assert_eq!(coherent.kubelet.reserved_memory.len(), 2);

    let numa = kc::plan(
        &sysfs("p6e-gb200.36xlarge-gpu-numa"),
        &KubeletConfig::default(),
    )
    .expect("valid plan, GPU memory as NUMA nodes");
    assert_eq!(numa.topology.nodes.len(), 34);
    let nodes: Vec<u32> = numa
        .kubelet
        .reserved_memory
        .iter()
        .map(|r| r.numa_node)
        .collect();
    assert_eq!(nodes, [0, 1], "only the Grace nodes reserve memory");
    assert_eq!(
        coherent.kubelet.reserved_system_cpus, numa.kubelet.reserved_system_cpus,
        "CPU-less nodes add no reserved core"
    );
    assert_eq!(numa.kubelet.topology_manager_policy, "best-effort");
    assert_eq!(
        numa.kubelet.topology_manager_policy_options["max-allowable-numa-nodes"],
        "34"
    );

    // A kubelet before 1.31 has no max-allowable-numa-nodes: no Topology Manager at all,
    // rather than a kubelet that will not start.
    let old = KubeletConfig {
        kubelet_version: "1.30".into(),
        ..KubeletConfig::default()
    };
    let p = kc::plan(&sysfs("p6e-gb200.36xlarge-gpu-numa"), &old).expect("valid plan, 1.30");
    assert_eq!(p.kubelet.topology_manager_policy, "none");
    assert!(p.kubelet.topology_manager_policy_options.is_empty());
    assert!(
        p.warnings.iter().any(|w| w.contains("34 NUMA nodes")),
        "{:?}",
        p.warnings
    );

    // The old rule, an even split over every node, is what the validator refuses there.
    let topology = read_topology(&sysfs("p6e-gb200.36xlarge-gpu-numa")).expect("topology");
    let mut even = numa.kubelet.clone();
    even.reserved_memory = topology
        .nodes
        .iter()
        .map(|n| kc::ReservedMemory {
            numa_node: n.id,
            limits: [("memory".to_string(), "73Mi".to_string())].into(),
        })
        .collect();
    let violations = validate(&even, &topology, Version(1, 33));
    assert!(
        violations
            .iter()
            .any(|v| v.contains("more than the node's 0Mi")),
        "{violations:?}"
    );
}

#[test]
fn the_validator_rejects_each_known_bad_combination() {
    let topology = read_topology(&sysfs("p5.48xlarge")).expect("topology");
    let good = kc::plan(&sysfs("p5.48xlarge"), &KubeletConfig::default())
        .expect("plan")
        .kubelet;
    let v133 = Version(1, 33);
    assert!(validate(&good, &topology, v133).is_empty());
    type Mutation = Box<dyn Fn(&mut kc::KubeletFields)>;
    let cases: Vec<(&str, Mutation, Version)> = vec![
        (
            "can't use reservedSystemCPUs",
            Box::new(|f| f.kube_reserved_cgroup = "/runtime".into()),
            v133,
        ),
        (
            "do not exist or are offline",
            Box::new(|f| f.reserved_system_cpus = "0,500".into()),
            v133,
        ),
        (
            "needs a CPU reservation",
            Box::new(|f| f.reserved_system_cpus = String::new()),
            v133,
        ),
        (
            "whole physical cores",
            Box::new(|f| f.reserved_system_cpus = "0".into()),
            v133,
        ),
        (
            "is not equal to the value",
            Box::new(|f| {
                f.reserved_memory[0]
                    .limits
                    .insert("memory".into(), "1Mi".into());
            }),
            v133,
        ),
        (
            "is not equal to the value",
            Box::new(|f| f.reserved_memory.clear()),
            v133,
        ),
        (
            "no such NUMA node",
            Box::new(|f| f.reserved_memory[1].numa_node = 7),
            v133,
        ),
        (
            "must be Static or None",
            Box::new(|f| f.memory_manager_policy = "static".into()),
            v133,
        ),
        (
            "align-by-socket is incompatible",
            Box::new(|f| {
                f.topology_manager_policy = "single-numa-node".into();
                f.cpu_manager_policy_options
                    .insert("align-by-socket".into(), "true".into());
                f.feature_gates
                    .insert("CPUManagerPolicyAlphaOptions".into(), true);
            }),
            v133,
        ),
        (
            "cannot be combined",
            Box::new(|f| {
                f.cpu_manager_policy_options
                    .insert("distribute-cpus-across-cores".into(), "true".into());
                f.feature_gates
                    .insert("CPUManagerPolicyAlphaOptions".into(), true);
            }),
            v133,
        ),
        (
            "needs feature gate CPUManagerPolicyAlphaOptions",
            Box::new(|f| {
                f.cpu_manager_policy_options
                    .insert("align-by-socket".into(), "true".into());
            }),
            v133,
        ),
        ("needs kubelet 1.23", Box::new(|_| {}), Version(1, 22)),
        (
            "unknown option",
            Box::new(|f| {
                f.cpu_manager_policy_options
                    .insert("make-it-fast".into(), "true".into());
            }),
            v133,
        ),
        (
            "needs kubelet 1.31",
            Box::new(|f| {
                f.topology_manager_policy_options
                    .insert("max-allowable-numa-nodes".into(), "16".into());
            }),
            Version(1, 30),
        ),
        (
            "must be none, best-effort",
            Box::new(|f| f.topology_manager_policy = "strict".into()),
            v133,
        ),
    ];
    for (want, mutate, version) in cases {
        let mut bad = good.clone();
        mutate(&mut bad);
        let errors = validate(&bad, &topology, version);
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "expected {want:?} in {errors:?}"
        );
    }
}

#[test]
fn apply_writes_a_nodeadm_drop_in_once_and_is_idempotent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path(), "");
    let sys = sysfs("p5.48xlarge");
    let sys = sys.to_string_lossy();
    let (code, out, err) = run(&["kubelet-config", "apply", "--sysfs-root", &sys], &config);
    assert_eq!(code, 0, "{out}{err}");
    let file = dir.path().join("nodeadm.d/60-gpu-agent.json");
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("written")).expect("JSON");
    assert_eq!(written["kind"], "NodeConfig");
    let k = &written["spec"]["kubelet"]["config"];
    assert_eq!(
        (
            k["cpuManagerPolicy"].as_str(),
            k["kubeReservedCgroup"].as_str(),
            k["systemReservedCgroup"].as_str()
        ),
        (Some("static"), Some(""), Some(""))
    );
    assert_eq!(k["reservedSystemCPUs"], "0-2,48-50,96-98,144-146");
    assert_eq!(k["memoryManagerPolicy"], "Static");

    let (code, out, _) = run(&["kubelet-config", "apply", "--sysfs-root", &sys], &config);
    assert_eq!(
        (code, out.trim()),
        (0, format!("unchanged: {}", file.display()).as_str())
    );
    assert!(
        !file.with_extension("json.bak").exists(),
        "no rewrite, no backup"
    );

    // A changed setting: the diff first, then the write with the old file kept.
    let config = self::config(dir.path(), "reserved_cores = 8");
    let (code, diff, _) = run(
        &["kubelet-config", "apply", "--dry-run", "--sysfs-root", &sys],
        &config,
    );
    assert_eq!(code, 0);
    assert!(diff.contains("-        \"reservedSystemCPUs\": \"0-2,48-50,96-98,144-146\",\n+        \"reservedSystemCPUs\": \"0-3,48-51,96-99,144-147\","), "{diff}");
    let (code, _, _) = run(&["kubelet-config", "apply", "--sysfs-root", &sys], &config);
    assert_eq!(code, 0);
    assert!(Path::new(&format!("{}.bak", file.display())).exists());
}

#[test]
fn apply_writes_a_kubelet_drop_in_where_there_is_no_nodeadm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path(), "");
    std::fs::remove_dir(dir.path().join("nodeadm.d")).expect("rmdir");
    let (code, out, err) = run(
        &[
            "kubelet-config",
            "apply",
            "--sysfs-root",
            &sysfs("g5.xlarge").to_string_lossy(),
        ],
        &config,
    );
    assert_eq!(code, 0, "{out}{err}");
    let text =
        std::fs::read_to_string(dir.path().join("kubelet.d/60-gpu-agent.conf")).expect("written");
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        (v["apiVersion"].as_str(), v["kind"].as_str()),
        (
            Some("kubelet.config.k8s.io/v1beta1"),
            Some("KubeletConfiguration")
        )
    );
    assert_eq!(v["topologyManagerPolicy"], "single-numa-node");
}

#[test]
fn stale_checkpoints_are_removed_only_when_the_kubelet_is_stopped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path(), "");
    let state = dir.path().join("kubelet/cpu_manager_state");
    std::fs::write(
        &state,
        r#"{"policyName":"none","defaultCpuSet":"","checksum":1}"#,
    )
    .expect("state");
    // A running kubelet, as procfs shows it.
    let kubelet = dir.path().join("proc/4242");
    std::fs::create_dir_all(&kubelet).expect("mkdir");
    std::fs::write(
        kubelet.join("cmdline"),
        b"/usr/bin/kubelet\0--config\0/etc/kubernetes/kubelet/config.json\0",
    )
    .expect("cmdline");
    let sys = sysfs("p4d.24xlarge");
    let (code, _, err) = run(
        &[
            "kubelet-config",
            "apply",
            "--sysfs-root",
            &sys.to_string_lossy(),
        ],
        &config,
    );
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("drain the node, stop the kubelet"), "{err}");
    assert!(state.exists());
    assert!(
        !dir.path().join("nodeadm.d/60-gpu-agent.json").exists(),
        "nothing written"
    );

    std::fs::remove_dir_all(&kubelet).expect("kubelet stopped");
    let (code, out, err) = run(
        &[
            "kubelet-config",
            "apply",
            "--sysfs-root",
            &sys.to_string_lossy(),
        ],
        &config,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("removed stale kubelet checkpoint"), "{out}");
    assert!(!state.exists());
}

#[test]
fn a_writer_killed_mid_write_leaves_the_old_file_intact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path(), "");
    let sys = sysfs("p5.48xlarge");
    let (code, _, _) = run(
        &[
            "kubelet-config",
            "apply",
            "--sysfs-root",
            &sys.to_string_lossy(),
        ],
        &config,
    );
    assert_eq!(code, 0);
    let file = dir.path().join("nodeadm.d/60-gpu-agent.json");
    let before = std::fs::read_to_string(&file).expect("old");
    let config = self::config(dir.path(), "reserved_cores = 4");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-agent"))
        .arg("--config")
        .arg(&config)
        .args([
            "kubelet-config",
            "apply",
            "--sysfs-root",
            &sys.to_string_lossy(),
        ])
        .env("GPU_AGENT_FAILPOINT", "pause-before-rename")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Wait until the new contents are on disk in the temporary file, then kill.
    let mut stderr = child.stderr.take().expect("stderr");
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while !seen.contains("failpoint: paused") {
        let n = std::io::Read::read(&mut stderr, &mut buf).expect("read");
        assert!(n > 0, "writer exited before the failpoint: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    child.kill().expect("kill");
    child.wait().expect("wait");
    assert_eq!(
        std::fs::read_to_string(&file).expect("still there"),
        before,
        "the old file is intact"
    );
    serde_json::from_str::<serde_json::Value>(&before).expect("and whole");
    // The next run completes the change.
    let (code, _, _) = run(
        &[
            "kubelet-config",
            "apply",
            "--sysfs-root",
            &sys.to_string_lossy(),
        ],
        &config,
    );
    assert_eq!(code, 0);
    assert!(std::fs::read_to_string(&file)
        .expect("new")
        .contains("0-1,48-49,96-97,144-145"));
}

#[test]
fn plan_json_and_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path(), "");
    let (code, out, _) = run(
        &[
            "kubelet-config",
            "plan",
            "--json",
            "--sysfs-root",
            &sysfs("p5.48xlarge").to_string_lossy(),
        ],
        &config,
    );
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert!(v["reasoning"].as_array().is_some_and(|r| r.iter().any(|l| l
        .as_str()
        .is_some_and(|l| l.contains("TopologyAffinityError")))));
    let (code, out, _) = run(
        &[
            "kubelet-config",
            "plan",
            "--sysfs-root",
            &sysfs("p5.48xlarge").to_string_lossy(),
        ],
        &config,
    );
    assert_eq!(code, 0);
    assert!(
        out.contains("Why:") && out.contains("node 1: CPUs 48-95,144-191"),
        "{out}"
    );
    let (code, _, err) = run(
        &["kubelet-config", "plan", "--sysfs-root", "/nonexistent"],
        &config,
    );
    assert_eq!(code, 70);
    assert!(
        err.contains("/nonexistent/devices/system/cpu/online"),
        "{err}"
    );
}
