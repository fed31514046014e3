//! Real trainers under the real agent: a torchrun job of two gloo workers, a PyTorch Lightning
//! fit, and a torch process that handles no signal, each with the test IMDS and (for the
//! pods) the test API server; and an NVRx-style health-check client. The scripts are
//! `tests/python/`. Torch runs on the CPU; an open
//! file under the test's directory stands in for the CUDA context the agent finds GPU
//! processes by. The Python packages come from `scripts/test.sh`'s tool cache
//! (`GPU_AGENT_TRAINER_PYTHON`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use gpu_agent_e2e::imds::{scheduled_reboot, FakeImds};
use gpu_agent_e2e::kube_api::KubeApi;
use gpu_agent_e2e::trainer::{gpu_device, rfc3339, PodCgroup, Trainer};
use gpu_agent_e2e::{wait_until as wait, Agent, Host};
use serde_json::Value;

const NODE: &str = "gpu-node-7";

/// The Python with torch, pytorch-lightning and grpcio: `GPU_AGENT_TRAINER_PYTHON`, else the
/// environment `scripts/test.sh` installs in its default tool cache.
pub fn python() -> PathBuf {
    let path = std::env::var_os("GPU_AGENT_TRAINER_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            let tools = Path::new("/var/cache/gpu-agent-tests/tools");
            std::fs::read_dir(tools).ok()?.flatten().find_map(|e| {
                let dir = e.path();
                let named = e.file_name().to_string_lossy().starts_with("trainers-");
                (named && dir.join(".complete").exists()).then(|| dir.join("bin/python"))
            })
        })
        .unwrap_or_else(|| PathBuf::from("python3"));
    let ok = Command::new(&path)
        .args(["-c", "import torch, pytorch_lightning, grpc"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the real-trainer tests need torch, pytorch-lightning and grpcio in {}: run \
         `sudo scripts/test.sh` once (it installs tests/python/requirements.txt into its tool \
         cache), or set GPU_AGENT_TRAINER_PYTHON to a Python that has them",
        path.display()
    );
    path
}

/// A script of `tests/python/`.
fn script(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// A job: its own process group (killed when dropped), output in `<out>/log`.
struct Job(Child);

impl Job {
    /// Run `program args` with `env`; inside `cgroup` from its first instruction when given
    /// (a shell moves itself in, then execs the program: every process it starts is in the
    /// pod, as in a container).
    fn start(
        program: &Path,
        args: &[&str],
        env: &[(&str, &Path)],
        cgroup: Option<&PodCgroup>,
        out: &Path,
    ) -> Self {
        let log = std::fs::File::create(out.join("log")).expect("log");
        let mut cmd = match cgroup {
            Some(c) => {
                let mut sh = Command::new("sh");
                sh.args(["-c", "echo $$ > \"$1\" && shift && exec \"$@\"", "sh"])
                    .arg(c.procs())
                    .arg(program);
                sh
            }
            None => Command::new(program),
        };
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        let child = std::os::unix::process::CommandExt::process_group(&mut cmd, 0)
            .spawn()
            .expect("spawn the job");
        Self(child)
    }

    /// Still running?
    fn alive(&mut self) -> bool {
        self.0.try_wait().expect("wait").is_none()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(group) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent's config: the real /proc, the test IMDS, acks in `<dir>/ack`, the test API
/// server when given (this node is `gpu-node-7`), and the `tables` (TOML) at the end.
fn agent_config(host: &Host, imds: &FakeImds, api: Option<&KubeApi>, tables: &str) -> PathBuf {
    let config = host.checkpoint_config(imds, false, "");
    let ack = host.dir.path().join("ack");
    let mut text = std::fs::read_to_string(&config).expect("config").replacen(
        "[checkpoint]\n",
        &format!("[checkpoint]\nack_dir = {ack:?}\n"),
        1,
    ) + "\n"
        + tables;
    if let Some(api) = api {
        text = format!(
            "node_name = \"{NODE}\"\n{text}\n[kubernetes]\nkubeconfig = {:?}\n",
            api.kubeconfig(host.dir.path())
        );
    }
    std::fs::write(&config, text).expect("config");
    config
}

/// A pod UID of this host's own (the kernel log and cgroups are shared by parallel tests).
fn pod_uid(host: &Host, n: u8) -> String {
    format!("{:08x}-2f6d-4c1e-9a0b-3d5e7f9a1c{n:02x}", host.domain)
}

/// A trainer's pod on this node: its fake GPU, its output directory, its container's cgroup.
struct Pod {
    gpu: PathBuf,
    out: PathBuf,
    cgroup: PodCgroup,
}

/// Pod `ml/<name>` (the `n`th of this host) with `annotations`, known to the API server;
/// `None` where this machine cannot make a kubepods cgroup.
fn pod(host: &Host, api: &KubeApi, n: u8, name: &str, annotations: &[(&str, &str)]) -> Option<Pod> {
    let uid = pod_uid(host, n);
    let container = format!("{n:02x}").repeat(32);
    let Some(cgroup) = PodCgroup::create(&uid, &container) else {
        eprintln!("skipping: cannot create a kubepods cgroup here");
        return None;
    };
    api.add_pod_with_containers("ml", name, &uid, NODE, &[("trainer", &container)]);
    for (key, value) in annotations {
        api.annotate_pod("ml", name, key, value);
    }
    let out = host.dir.path().join(name);
    std::fs::create_dir_all(&out).expect("out");
    Some(Pod {
        gpu: gpu_device(host.dir.path(), &format!("nvidia{n}")),
        out,
        cgroup,
    })
}

/// The first checkpoint report in a snapshot.
fn report(s: &Value) -> &Value {
    &s["checkpoints"][0]
}

/// Files in `dir` whose names start with `prefix`.
fn saved(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn torchrun_workers_save_on_the_signal_their_pod_declares_and_the_launcher_is_spared() {
    let python = python();
    let host = Host::new();
    let imds = FakeImds::start();
    let api = KubeApi::start(&[NODE]);
    let Some(Pod { gpu, out, cgroup }) = pod(
        &host,
        &api,
        1,
        "ddp-0",
        &[("gpu-agent.io/checkpoint-signal", "SIGTERM")],
    ) else {
        return;
    };
    let agent = Agent::start(&agent_config(&host, &imds, Some(&api), ""), &host.socket());

    let torchrun = python.with_file_name("torchrun");
    let ack = host.dir.path().join("ack");
    let mut job = Job::start(
        &torchrun,
        &[
            "--standalone",
            "--nproc-per-node",
            "2",
            &script("train_ddp.py"),
            &out.to_string_lossy(),
        ],
        &[("FAKE_GPU_DEVICE", &gpu), ("GPU_AGENT_ACK_DIR", &ack)],
        Some(&cgroup),
        &out,
    );
    wait(Duration::from_secs(90), "both ranks training", || {
        out.join("rank0.ready").exists() && out.join("rank1.ready").exists()
    });

    imds.spot_terminate_in(Duration::from_secs(120));
    wait(Duration::from_secs(30), "both ranks' torch.save", || {
        saved(&out, "rank0-step").len() == 1 && saved(&out, "rank1-step").len() == 1
    });
    let s = agent.wait_for(Duration::from_secs(15), |s| {
        report(s)["confirmed"] == 2 && !report(s)["confirmed_in_ms"].is_null()
    });
    assert_eq!(
        (
            report(&s)["signalled"].as_u64(),
            report(&s)["pods"].as_u64()
        ),
        (Some(2), Some(1)),
        "{s}"
    );
    let (_, text) = agent.status(false);
    assert!(
        text.contains("signalled 2 processes in 1 pod, 2 confirmed in"),
        "{text}"
    );
    // The launcher was not signalled (torchrun would have torn the job down): the job trains
    // on and ends cleanly when asked.
    std::thread::sleep(Duration::from_secs(1));
    assert!(job.alive(), "torchrun went down: {}", read_log(&out));
    std::fs::write(out.join("stop"), "").expect("stop");
    let status = wait_exit(&mut job, Duration::from_secs(60));
    assert!(status.success(), "torchrun: {status}: {}", read_log(&out));
    // The checkpoints are real: torch loads them.
    let loaded = Command::new(&python)
        .args([
            "-c",
            "import sys, torch; print(torch.load(sys.argv[1])['step'] > 0)",
            &out.join(&saved(&out, "rank0-step")[0]).to_string_lossy(),
        ])
        .output()
        .expect("python");
    assert_eq!(String::from_utf8_lossy(&loaded.stdout).trim(), "True");
    wait(
        Duration::from_secs(10),
        "the CheckpointConfirmed Event",
        || {
            api.events().iter().any(|e| {
                e["reason"] == "CheckpointConfirmed"
                    && e["involvedObject"]["name"] == "ddp-0"
                    && e["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("all 2 signalled processes confirmed"))
            })
        },
    );
    assert!(agent.stop().success());
}

#[test]
fn a_lightning_fit_saves_on_its_declared_signal_at_deadline_minus_its_declared_lead() {
    let python = python();
    let host = Host::new();
    let imds = FakeImds::start();
    let api = KubeApi::start(&[NODE]);
    let Some(Pod { gpu, out, cgroup }) = pod(
        &host,
        &api,
        2,
        "fit-0",
        &[
            ("gpu-agent.io/checkpoint-signal", "SIGUSR2"),
            ("gpu-agent.io/checkpoint-lead", "60s"),
        ],
    ) else {
        return;
    };
    // The configured lead is 1 s: the pod's 60 s decide.
    let config = agent_config(
        &host,
        &imds,
        Some(&api),
        "[checkpoint.lead]\nscheduled-maintenance = \"1s\"\n",
    );
    let agent = Agent::start(&config, &host.socket());
    let ack = host.dir.path().join("ack");
    let mut job = Job::start(
        &python,
        &[&script("fit_lightning.py"), &out.to_string_lossy()],
        &[("FAKE_GPU_DEVICE", &gpu), ("GPU_AGENT_ACK_DIR", &ack)],
        Some(&cgroup),
        &out,
    );
    wait(Duration::from_secs(90), "the fit training", || {
        out.join("fit.ready").exists()
    });

    // A GPU process outside that pod that handles the signal: the node's lead is its lead.
    let other = Trainer::start(
        host.dir.path(),
        "other",
        "usr1",
        Some(&gpu_device(host.dir.path(), "nvidia6")),
        &[],
    );
    // A reboot 68 s from now: the pod's processes are due 8 s from now (68 - 60); the node
    // (InterruptionPending, NVRx, every other pod) keeps the configured lead: 67 s (review
    // M3: one tenant's annotation never moves the node).
    let not_before = SystemTime::now() + Duration::from_secs(68);
    imds.set_scheduled(&scheduled_reboot(not_before));
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        s["pending_end"]["lead_from"]
            .as_str()
            .is_some_and(|w| w.contains("pod ml/fit-0 declares a 1m checkpoint"))
    });
    let act_at = s["pending_end"]["act_at"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(act_at, rfc3339(not_before - Duration::from_secs(1)), "{s}");
    let pod_at = rfc3339(not_before - Duration::from_secs(60));
    assert!(
        s["pending_end"]["lead_from"]
            .as_str()
            .is_some_and(|w| w.contains(&format!("its own processes are signalled at {pod_at}"))),
        "{s}"
    );
    let (_, text) = agent.status(false);
    assert!(
        text.contains("Checkpoint lead: pod ml/fit-0 declares a 1m checkpoint"),
        "{text}"
    );
    let names_the_lead = |c: &Value| {
        c["status"] == "False"
            && c["message"]
                .as_str()
                .is_some_and(|m| m.contains("declares a 1m checkpoint"))
    };
    let mut last = None;
    for _ in 0..100 {
        last = api.condition(NODE, "InterruptionPending");
        if last.as_ref().is_some_and(names_the_lead) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        last.as_ref().is_some_and(names_the_lead),
        "InterruptionPending does not name the lead: {last:?}"
    );
    assert!(
        saved(&out, "lightning-step").is_empty(),
        "not before its time"
    );
    wait(Duration::from_secs(20), "the Lightning checkpoint", || {
        saved(&out, "lightning-step").len() == 1
    });
    let signalled_at = SystemTime::now();
    assert!(
        signalled_at < not_before - Duration::from_secs(40),
        "signalled at deadline - declared lead, not at deadline - configured lead"
    );
    assert!(
        other.signals().is_empty(),
        "another pod's lead never moves this process's signal"
    );
    let node = api.condition(NODE, "InterruptionPending");
    assert!(
        node.as_ref().is_some_and(|c| c["status"] == "False"),
        "the node is not pending on one pod's lead: {node:?}"
    );
    let s = agent.wait_for(Duration::from_secs(10), |s| report(s)["confirmed"] == 1);
    assert_eq!(report(&s)["signalled"], 1, "{s}");
    assert!(job.alive(), "the fit goes on: {}", read_log(&out));
    std::fs::write(out.join("stop"), "").expect("stop");
    let status = wait_exit(&mut job, Duration::from_secs(60));
    assert!(status.success(), "fit: {status}: {}", read_log(&out));
    assert!(agent.stop().success());
}

#[test]
fn a_torch_process_that_handles_nothing_is_not_signalled_and_status_says_why() {
    let python = python();
    let host = Host::new();
    let imds = FakeImds::start();
    let gpu = gpu_device(host.dir.path(), "nvidia2");
    let out = host.dir.path().join("idle");
    std::fs::create_dir_all(&out).expect("out");
    let agent = Agent::start(&agent_config(&host, &imds, None, ""), &host.socket());
    let mut job = Job::start(
        &python,
        &[&script("idle_worker.py"), &out.to_string_lossy()],
        &[("FAKE_GPU_DEVICE", &gpu)],
        None,
        &out,
    );
    wait(Duration::from_secs(60), "the worker", || {
        out.join("idle.ready").exists()
    });
    imds.spot_terminate_in(Duration::from_secs(120));
    let s = agent.wait_for(Duration::from_secs(10), |s| {
        !report(s)["not_signalled"].is_null()
    });
    assert_eq!(report(&s)["signalled"], 0, "{s}");
    let why = report(&s)["not_signalled"][0].as_str().unwrap_or_default();
    assert!(
        why.contains(&format!("pid {}", job.0.id()))
            && why.contains("does not handle SIGUSR1 (it would be killed)"),
        "{why}"
    );
    let (_, text) = agent.status(false);
    assert!(
        text.contains("signalled 0 processes, 1 not signalled"),
        "{text}"
    );
    assert!(text.contains("not signalled: pid"), "{text}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(job.alive(), "it was not killed");
    assert!(agent.stop().success());
}

/// An NVRx-style client (grpcio, stubs from the restated proto) asks the agent's node health
/// check as ft_launcher does before rendezvous: healthy, then unhealthy after a fatal Xid.
#[test]
fn an_nvrx_client_hears_healthy_then_unhealthy_after_a_fatal_xid() {
    use std::os::unix::fs::PermissionsExt;
    let python = python();
    let host = Host::new();
    let imds = FakeImds::start();
    let socket = host.dir.path().join("run/nvhcd.sock");
    let config = agent_config(
        &host,
        &imds,
        None,
        &format!("[nvrx]\nsocket = {socket:?}\ngroup = \"0\"\n"),
    );
    // Only the kernel's lines and this host's own drills count (the kernel log is shared
    // with every other test): as shipped.
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        text.replace("accept_userspace = true", "accept_userspace = false"),
    )
    .expect("config");
    let agent = Agent::start(&config, &host.socket());
    agent.wait_for(Duration::from_secs(5), |s| {
        s["sinks"].as_array().is_some_and(|a| {
            a.iter()
                .any(|x| x["sink"] == "nvrx-health" && x["state"] == "on")
        })
    });
    let mode = std::fs::metadata(&socket)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660, "root's socket, 0660");
    let ask = || -> Value {
        let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/proto");
        let out = Command::new(&python)
            .arg(script("nvhcd_client.py"))
            .arg(&proto)
            .arg(&socket)
            .output()
            .expect("python");
        assert!(
            out.status.success(),
            "the client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let healthy = ask();
    assert_eq!(healthy["success"], true, "{healthy}");
    assert_eq!(healthy["output"]["fail_count"], 0, "{healthy}");

    let (code, _, err) =
        gpu_agent_e2e::cli(&["--config", &config.to_string_lossy(), "inject", "xid", "79"]);
    assert_eq!(code, 0, "{err}");
    agent.wait_for(Duration::from_secs(5), |s| s["health"] == "fatal");
    let sick = ask();
    assert_eq!(
        (sick["success"].as_bool(), sick["exit_code"].as_i64()),
        (Some(false), Some(1)),
        "{sick}"
    );
    assert_eq!(sick["output"]["fail_count"], 1, "{sick}");
    // This host's GPU 0 (`inject` picks the first GPU on the bus).
    assert!(
        sick["error"]
            .as_str()
            .is_some_and(|e| e.contains("GPU 0 Xid 79")),
        "{sick}"
    );
    assert!(agent.stop().success());
}

fn read_log(out: &Path) -> String {
    std::fs::read_to_string(out.join("log")).unwrap_or_default()
}

fn wait_exit(job: &mut Job, limit: Duration) -> std::process::ExitStatus {
    let mut status = None;
    wait(limit, "the job to end", || {
        status = job.0.try_wait().expect("wait");
        status.is_some()
    });
    status.expect("exited")
}
