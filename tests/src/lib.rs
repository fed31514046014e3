//! Helpers for the end-to-end tests: run the real `gpu-agent` binary against a temporary
//! config, a fake sysfs/procfs tree and the real `/dev/kmsg`.
//!
//! The kernel log is shared by every test (and every earlier run) on the machine, so each
//! [`Agent`] gets its own PCI domain: its fake GPUs live there, lines are injected there, and
//! assertions look only there.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod dbus;
pub mod ec2;
pub mod efa;
pub mod http;
pub mod imds;
pub mod kube_api;
pub mod kubelet;
pub mod logind;
pub mod nspawn;
pub mod systemd;
pub mod trainer;

/// Bus numbers of the fake GPUs, in index order.
pub const GPU_BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
/// Bus number of the fake NVSwitch.
pub const NVSWITCH_BUS: u8 = 0x05;

/// The `gpu-agent` binary built by this workspace.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("GPU_AGENT_BIN") {
        return PathBuf::from(path);
    }
    // target/<profile>/deps/<test-binary> -> target/<profile>/gpu-agent
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = profile_dir.join("gpu-agent");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build -p gpu-agent` (cargo test --workspace builds it)",
        bin.display()
    );
    bin
}

/// The fake NVML library (`tests/fake-nvml`), built on first use. `cargo test` does not
/// produce a crate's `cdylib`, so it is built here, in its own target directory (the
/// workspace's is locked by the running `cargo test`).
pub fn fake_nvml() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("current exe");
            let target = exe
                .ancestors()
                .nth(3)
                .expect("target dir")
                .join("fake-nvml");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("fake-nvml/Cargo.toml");
            let status = Command::new(cargo)
                .args(["build", "--quiet", "--manifest-path"])
                .arg(&manifest)
                .arg("--target-dir")
                .arg(&target)
                .status()
                .expect("run cargo build for fake-nvml");
            assert!(status.success(), "building fake-nvml failed");
            target.join("debug/libfake_nvml.so")
        })
        .clone()
}

/// Run a tool to completion and return its stdout; panics with the command, both output
/// streams and `hint` (how to install the tool) if it cannot start or fails.
pub fn run_ok(cmd: &mut Command, hint: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} ({hint})"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Poll `pred` every 5 ms until it holds; panics naming `what` after `timeout`. Returns how
/// long it took.
pub fn wait_until(timeout: Duration, what: &str, mut pred: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !pred() {
        assert!(started.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
    started.elapsed()
}

/// CPU ticks (user + system, 1/100 s) a process has used, from `/proc/PID/stat`.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let after = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let get = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(11) + get(12)
}

/// CPU time, in nanoseconds, the process's live threads have used (`se.sum_exec_runtime` of
/// each `/proc/PID/task/TID/sched`, microsecond precision, where `/proc/PID/stat` counts
/// 10 ms ticks). Threads that exited are not counted.
pub fn cpu_ns_live_threads(pid: u32) -> u64 {
    cpu_by_thread(pid).values().sum()
}

/// Each live thread's CPU time (ns), summed by name (the runtime's workers share one).
pub fn cpu_by_thread(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(task.path().join("sched"))
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|l| l.starts_with("se.sum_exec_runtime"))
                    .and_then(|l| l.rsplit(':').next())
                    .and_then(|ms| ms.trim().parse::<f64>().ok())
            })
            .map_or(0, |ms| (ms * 1e6) as u64);
        *out.entry(comm.trim().to_string()).or_default() += ns;
    }
    out
}

/// A `kB` field of `/proc/PID/status` (`"VmRSS:"`, `"VmHWM:"`), in KiB; 0 if absent.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A PCI domain no other test uses while its lines may still be in the kernel log: the log
/// is shared by every test process, and a daemon reads it from the ring's first record, so
/// a domain drawn at random met other runs' faults now and then. Handed out in turn across
/// processes (a counter file under an exclusive lock), starting where chance puts it.
pub fn unique_domain() -> u32 {
    let random = || {
        std::process::id().wrapping_mul(2_654_435_761)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
    };
    let next = || -> std::io::Result<u32> {
        use std::io::{Read, Seek};
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(std::env::temp_dir().join("gpu-agent-tests-next-pci-domain"))?;
        file.lock()?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let n = text.trim().parse::<u32>().unwrap_or_else(|_| random());
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(n.wrapping_add(1).to_string().as_bytes())?;
        Ok(n)
    };
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = next().unwrap_or_else(|_| {
        random().wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed).wrapping_mul(7919))
    });
    0x1000 + n % 0xe000
}

/// Write one line into the real kernel log. A fresh open per line: the kernel rate-limits
/// writes per open file (10 lines per 5 s) and silently drops the rest.
pub fn inject(line: &str) {
    let mut kmsg = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .expect("open /dev/kmsg (tests run as root)");
    kmsg.write_all(format!("<3>{line}\n").as_bytes())
        .expect("write /dev/kmsg");
}

/// `p50 X ms, p99 Y ms, max Z ms` of latency samples (sorted here), to a tenth of a ms.
pub fn percentiles(samples: &mut [Duration]) -> String {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let pct = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
    format!(
        "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ms(pct(50)),
        ms(pct(99)),
        ms(samples[samples.len() - 1])
    )
}

/// Sink `name`'s entry (`state`, `reason`) in `snapshot`; `Null` if none.
pub fn sink_of(snapshot: &Value, name: &str) -> Value {
    snapshot["sinks"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["sink"] == name).cloned())
        .unwrap_or(Value::Null)
}

/// The fake host an agent runs on.
#[derive(Debug)]
pub struct Host {
    /// Temporary directory holding everything.
    pub dir: tempfile::TempDir,
    /// This host's PCI domain.
    pub domain: u32,
}

impl Host {
    /// A host with eight GPUs and one NVSwitch in a fresh PCI domain, and boot id `boot-1`.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = Self {
            dir,
            domain: unique_domain(),
        };
        for bus in GPU_BUSES {
            host.pci_device(bus, "0x030200");
        }
        host.pci_device(NVSWITCH_BUS, "0x068000");
        host.set_boot_id("boot-1");
        std::fs::write(host.procfs().join("sys/kernel/hostname"), "test-node\n").expect("hostname");
        host
    }

    fn pci_device(&self, bus: u8, class: &str) {
        let dev = self
            .sysfs()
            .join("bus/pci/devices")
            .join(format!("{:04x}:{bus:02x}:00.0", self.domain));
        std::fs::create_dir_all(&dev).expect("mkdir");
        std::fs::write(dev.join("vendor"), "0x10de\n").expect("vendor");
        std::fs::write(dev.join("class"), format!("{class}\n")).expect("class");
        std::fs::write(dev.join("numa_node"), "0\n").expect("numa");
    }

    /// Fake sysfs root.
    pub fn sysfs(&self) -> PathBuf {
        self.dir.path().join("sys")
    }

    /// Fake procfs root.
    pub fn procfs(&self) -> PathBuf {
        self.dir.path().join("proc")
    }

    /// Change the boot id (a "reboot").
    pub fn set_boot_id(&self, id: &str) {
        let dir = self.procfs().join("sys/kernel/random");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("boot_id"), format!("{id}\n")).expect("boot_id");
    }

    /// `dddd:bb:00` for GPU `index`, as Xid lines print it.
    pub fn gpu_bdf(&self, index: usize) -> String {
        format!("{:04x}:{:02x}:00", self.domain, GPU_BUSES[index])
    }

    /// `dddd:05:00.0`, the NVSwitch.
    pub fn nvswitch_bdf(&self) -> String {
        format!("{:04x}:{NVSWITCH_BUS:02x}:00.0", self.domain)
    }

    /// Does a PCI address (as status prints it) belong to this host?
    pub fn owns(&self, pci: &str) -> bool {
        pci.starts_with(&format!("{:04x}:", self.domain))
    }

    /// Write a config for this host; `extra` is appended (more TOML).
    pub fn config(&self, extra: &str) -> PathBuf {
        let path = self.dir.path().join("config.toml");
        // Top-level keys in `extra` (before its first table) must precede every table.
        let split = extra
            .lines()
            .position(|l| l.trim_start().starts_with('['))
            .unwrap_or(extra.lines().count());
        let top: Vec<&str> = extra.lines().take(split).collect();
        let rest: Vec<&str> = extra.lines().skip(split).collect();
        let (top, extra) = (top.join("\n"), rest.join("\n"));
        let text = format!(
            "{top}\nstate_dir = {state:?}\n\n[status]\nsocket = {sock:?}\n\n[sysfs]\nroot = {sys:?}\n\n{procfs}{extra}\n",
            state = self.dir.path().join("state"),
            sock = self.socket(),
            sys = self.sysfs(),
            // A test that needs real processes (checkpoint targets) sets its own [procfs].
            procfs = if extra.contains("[procfs]") { String::new() } else { format!("[procfs]\nroot = {:?}\n\n", self.procfs()) },
        );
        // The notice file goes into this host's directory, never the machine's /run.
        let notice = format!(
            "notice_file = {:?}\n",
            self.dir.path().join("run/notice.json")
        );
        let text = if extra.contains("notice_file") {
            text
        } else if text.contains("[checkpoint]\n") {
            text.replacen("[checkpoint]\n", &format!("[checkpoint]\n{notice}"), 1)
        } else {
            format!("{text}\n[checkpoint]\n{notice}")
        };
        // Tests inject fault lines from userspace (as root, through /dev/kmsg): a test rig
        // that replays lines, unless the test sets its own [kmsg].
        let text = if extra.contains("[kmsg]") {
            text
        } else {
            format!("{text}\n[kmsg]\naccept_userspace = true\n")
        };
        // The test kubelet's socket lives in this host's directory, never the machine's.
        let text = if extra.contains("[pod_resources]") {
            text
        } else {
            format!(
                "{text}\n[pod_resources]\nsocket = {:?}\n",
                self.kubelet_socket()
            )
        };
        let text = if extra.contains("[metrics]") {
            text
        } else {
            format!("{text}\n[metrics]\nenabled = false\n")
        };
        std::fs::write(&path, text).expect("config");
        path
    }

    /// A config for checkpoint tests: the real /proc (the trainers are real processes), the
    /// test IMDS with every notice path polled every 200 ms, the trainers' fake GPU devices
    /// under `<dir>/dev`, and `opt_in_env`. `extra` lines before its first table go at the top
    /// (`node_name`), the rest after the `[checkpoint]` keys (so its own first keys are
    /// checkpoint keys too).
    pub fn checkpoint_config(
        &self,
        imds: &crate::imds::FakeImds,
        opt_in: bool,
        extra: &str,
    ) -> PathBuf {
        let (top, rest) = match extra.split_once("\n[") {
            Some((top, rest)) if top.starts_with("node_name") => (top, format!("[{rest}")),
            _ => ("", extra.to_string()),
        };
        self.config(&format!(
            "{top}\n[procfs]\nroot = \"/proc\"\n\
             [imds]\nendpoint = {:?}\npoll_interval = \"200ms\"\n\
             rebalance_interval = \"200ms\"\nscheduled_interval = \"200ms\"\n\
             [checkpoint]\ndevice_glob = \"{}/nvidia[0-9]*\"\nopt_in_env = {opt_in}\n{rest}",
            imds.endpoint(),
            self.dir.path().join("dev").display()
        ))
    }

    /// Where this host's kubelet serves pod-resources (see [`kubelet::Kubelet`]).
    pub fn kubelet_socket(&self) -> PathBuf {
        self.dir.path().join("pod-resources/kubelet.sock")
    }

    /// The UUID the fake NVML library reports for GPU `index` (see [`NvmlScenario`]).
    pub fn gpu_uuid(&self, index: usize) -> String {
        format!("GPU-{:08x}-{index}", self.domain)
    }

    /// The status socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("admin/agent.sock")
    }
}

impl Default for Host {
    fn default() -> Self {
        Self::new()
    }
}

/// Run `gpu-agent ARGS`, returning (exit code, stdout, stderr).
pub fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(binary())
        .args(args)
        .output()
        .expect("run gpu-agent");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A running daemon.
#[derive(Debug)]
pub struct Agent {
    child: Option<Child>,
    config: PathBuf,
    socket: PathBuf,
    log: PathBuf,
}

impl Agent {
    /// Start `gpu-agent run` with `config` and wait until it answers on `socket` with its
    /// kernel-log source running.
    pub fn start(config: &Path, socket: &Path) -> Self {
        Self::start_with_env(config, socket, &[])
    }

    /// [`Agent::start`] with extra environment variables (`NOTIFY_SOCKET`, ...).
    pub fn start_with_env(config: &Path, socket: &Path, env: &[(&str, &str)]) -> Self {
        Self::spawn(config, socket, env, &[])
    }

    /// [`Agent::start`] under `wrapper`, a command that runs the rest of its command line
    /// (`setpriv ...`, to run the daemon as another user with given capabilities).
    pub fn start_under(config: &Path, socket: &Path, wrapper: &[String]) -> Self {
        Self::spawn(config, socket, &[], wrapper)
    }

    /// [`Agent::start_under`] with extra environment variables.
    pub fn start_under_with_env(
        config: &Path,
        socket: &Path,
        wrapper: &[String],
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn(config, socket, env, wrapper)
    }

    fn spawn(config: &Path, socket: &Path, env: &[(&str, &str)], wrapper: &[String]) -> Self {
        let log = config.with_file_name(format!(
            "agent-{}.log",
            Instant::now().elapsed().as_nanos() ^ u128::from(unique_domain())
        ));
        // systemd names the watched process in WATCHDOG_PID; `exec` keeps the shell's pid.
        let mut command = if env.iter().any(|(k, _)| *k == "WATCHDOG_USEC") {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("WATCHDOG_PID=$$ exec \"$0\" \"$@\"")
                .arg(binary());
            c
        } else if let Some((program, args)) = wrapper.split_first() {
            let mut c = Command::new(program);
            c.args(args).arg(binary());
            c
        } else {
            Command::new(binary())
        };
        let child = command
            .arg("--config")
            .arg(config)
            .arg("run")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn gpu-agent run");
        let agent = Self {
            child: Some(child),
            config: config.to_path_buf(),
            socket: socket.to_path_buf(),
            log,
        };
        agent.wait_for(Duration::from_secs(10), |s| {
            s["sources"]
                .as_array()
                .is_some_and(|a| a.iter().all(|src| src["state"] != "starting"))
        });
        agent
    }

    /// The daemon's snapshot, straight from the status socket; `None` if it does not answer.
    pub fn snapshot(&self) -> Option<Value> {
        let mut stream = UnixStream::connect(&self.socket).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        stream.write_all(b"{\"command\":\"status\"}\n").ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        let value: Value = serde_json::from_str(&answer).ok()?;
        Some(value["snapshot"].clone())
    }

    /// Sink `name`'s entry (`state`, `reason`) in the daemon's snapshot; `Null` if none.
    pub fn sink(&self, name: &str) -> Value {
        sink_of(&self.snapshot().unwrap_or_default(), name)
    }

    /// Poll the snapshot until source `source` is on; panics after `timeout`.
    pub fn wait_for_source_on(&self, timeout: Duration, source: &str) -> Value {
        self.wait_for(timeout, |s| {
            s["sources"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|x| x["source"] == source && x["state"] == "on")
            })
        })
    }

    /// Poll the snapshot until `pred` holds; panics with the last snapshot after `timeout`.
    pub fn wait_for(&self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let snapshot = self.snapshot();
            if let Some(s) = &snapshot {
                if pred(s) {
                    return s.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "condition not met within {timeout:?}; last snapshot: {snapshot:#?}\nlog:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `gpu-agent status ARGS` against this daemon.
    pub fn status(&self, json: bool) -> (i32, String) {
        let config = self.config.to_string_lossy().into_owned();
        let mut args = vec!["--config", config.as_str(), "status"];
        if json {
            args.push("--json");
        }
        let (code, out, _) = cli(&args);
        (code, out)
    }

    /// The daemon's PID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Everything the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL (no chance to clean up), then reap it.
    pub fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL");
            child.wait().expect("wait");
        }
    }

    /// SIGTERM, then wait for exit.
    pub fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A free loopback TCP port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// `GET path` on `127.0.0.1:port`; the whole raw response (status line, headers, body).
pub fn http_get(port: u16, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .expect("send");
    let mut out = String::new();
    stream.read_to_string(&mut out).expect("read");
    out
}

/// The faults in `snapshot` on this host's hardware.
pub fn faults_on<'a>(snapshot: &'a Value, host: &Host) -> Vec<&'a Value> {
    snapshot["faults"]
        .as_array()
        .map(|faults| {
            faults
                .iter()
                .filter(|f| f["component"]["pci"].as_str().is_some_and(|p| host.owns(p)))
                .collect()
        })
        .unwrap_or_default()
}

/// The fault with code `(type, code)` on this host, if present.
pub fn fault<'a>(
    snapshot: &'a Value,
    host: &Host,
    kind: &str,
    code: Option<u64>,
) -> Option<&'a Value> {
    faults_on(snapshot, host)
        .into_iter()
        .find(|f| f["code"]["type"] == kind && code.is_none_or(|c| f["code"]["code"] == c))
}

/// What the fake NVML library reports for a [`Host`]: eight H100s on an NVSwitch baseboard,
/// each with 18 NVLinks up, plus per-GPU TOML overrides.
#[derive(Debug, Clone, Default)]
pub struct NvmlScenario {
    extra: std::collections::BTreeMap<usize, String>,
    top: String,
}

impl NvmlScenario {
    /// All eight GPUs healthy.
    pub fn healthy() -> Self {
        Self::default()
    }

    /// Add TOML lines to GPU `index`'s table (e.g. `"remap.pending = true"`).
    pub fn gpu(mut self, index: usize, toml: &str) -> Self {
        let entry = self.extra.entry(index).or_default();
        entry.push_str(toml);
        entry.push('\n');
        self
    }

    /// Add top-level TOML lines (e.g. `"count_fails = true"`).
    pub fn top(mut self, toml: &str) -> Self {
        self.top.push_str(toml);
        self.top.push('\n');
        self
    }

    /// Write the scenario file for `host` (atomically, so the library never reads half).
    pub fn write(&self, host: &Host) {
        let mut text = format!("driver_version = \"570.133.20\"\n{}", self.top);
        for (i, bus) in GPU_BUSES.iter().enumerate() {
            text.push_str(&format!(
                "\n[[gpu]]\npci = \"{:04x}:{bus:02x}:00.0\"\nuuid = \"GPU-{:08x}-{i}\"\nname = \"NVIDIA H100 80GB HBM3\"\nserial = \"16520230{i:05}\"\n{}",
                host.domain,
                host.domain,
                self.extra.get(&i).map_or("", String::as_str)
            ));
            if !self
                .extra
                .get(&i)
                .is_some_and(|e| e.contains("nvlink.up") || e.contains("[gpu.nvlink]"))
            {
                text.push_str("nvlink.up = [true, true, true, true, true, true, true, true, true, true, true, true, true, true, true, true, true, true]\n");
            }
        }
        let path = host.nvml_scenario_path();
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write scenario");
        std::fs::rename(&tmp, &path).expect("rename scenario");
    }
}

impl Host {
    /// Where the fake NVML library reads its scenario.
    pub fn nvml_scenario_path(&self) -> PathBuf {
        self.dir.path().join("nvml.toml")
    }

    /// Config lines pointing `[nvml]` at the fake library, polling fast.
    pub fn nvml_config(&self) -> String {
        format!(
            "[nvml]\nlibrary = {:?}\npoll_interval = \"100ms\"\nexpected_gpus = 8\nclear_after = \"1s\"\n",
            fake_nvml()
        )
    }

    /// Start a daemon with the fake NVML library reading `scenario`.
    pub fn start_with_nvml(&self, scenario: &NvmlScenario, extra_config: &str) -> Agent {
        scenario.write(self);
        let config = self.config(&format!("{extra_config}\n{}", self.nvml_config()));
        let path = self.nvml_scenario_path();
        Agent::start_with_env(
            &config,
            &self.socket(),
            &[("FAKE_NVML_SCENARIO", &path.to_string_lossy())],
        )
    }
}
