//! Real child processes for the checkpoint tests: a python3 "trainer" that holds a device
//! file and handles SIGUSR1 or SIGUSR2 (or nothing), recording each signal it gets.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime};

const TRAINER: &str = r#"
import os, signal, sys, time
mode, marker, device = sys.argv[1], sys.argv[2], sys.argv[3]
held = open(device) if device != "-" else None
got = []
def handler(signum, frame):
    got.append(signum)
    with open(marker, "a") as f:
        f.write(signal.Signals(signum).name + "\n")
if mode.startswith("usr1"):
    signal.signal(signal.SIGUSR1, handler)
elif mode == "usr2":
    signal.signal(signal.SIGUSR2, handler)
if mode == "usr1-fork":
    # A DataLoader-style worker: forked after the handler was installed, holding the same
    # device file; it records what it gets in its own file.
    if os.fork() == 0:
        marker = marker + ".child"
        open(marker + ".ready", "w").close()
        while True:
            time.sleep(0.02)
    while not os.path.exists(marker + ".child.ready"):
        time.sleep(0.01)
open(marker + ".ready", "w").close()
while True:
    time.sleep(0.02)
    if mode == "usr1-exit" and got:
        time.sleep(3)  # writing the checkpoint
        sys.exit(0)
"#;

/// A running trainer process.
pub struct Trainer {
    /// The process.
    pub child: Child,
    marker: PathBuf,
}

impl Trainer {
    /// Start one: `mode` is usr1, usr2, none, usr1-exit (exits 3 s after SIGUSR1, as after
    /// writing a checkpoint) or usr1-fork (forks a worker that inherits the handler and the
    /// device); `device` is held open.
    pub fn start(
        dir: &Path,
        name: &str,
        mode: &str,
        device: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_as(dir, name, mode, device, env, None)
    }

    /// [`Trainer::start`], as user and group `uid` when given (`dir` must let it write).
    pub fn start_as(
        dir: &Path,
        name: &str,
        mode: &str,
        device: Option<&Path>,
        env: &[(&str, &str)],
        uid: Option<u32>,
    ) -> Self {
        use std::os::unix::process::CommandExt;
        let script = dir.join("trainer.py");
        std::fs::write(&script, TRAINER).expect("script");
        let marker = dir.join(format!("{name}.signals"));
        let mut command = Command::new("python3");
        if let Some(uid) = uid {
            command.uid(uid).gid(uid);
        }
        // Its own process group, so a forked worker goes with it.
        let child = command
            .process_group(0)
            .arg(&script)
            .arg(mode)
            .arg(&marker)
            .arg(device.map_or_else(|| "-".into(), |d| d.to_string_lossy().into_owned()))
            .envs(env.iter().copied())
            .spawn()
            .expect("python3");
        let ready = marker.with_extension("signals.ready");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "trainer {name} did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { child, marker }
    }

    /// Signals received so far, in order.
    pub fn signals(&self) -> Vec<String> {
        std::fs::read_to_string(&self.marker)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Signals its forked worker (`usr1-fork`) received, in order.
    pub fn child_signals(&self) -> Vec<String> {
        std::fs::read_to_string(self.marker.with_extension("signals.child"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }
}

impl Drop for Trainer {
    fn drop(&mut self) {
        if let Some(group) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fake GPU device file `<dir>/dev/<name>` for `device_glob` to match.
pub fn gpu_device(dir: &Path, name: &str) -> PathBuf {
    let dev = dir.join("dev");
    std::fs::create_dir_all(&dev).expect("mkdir dev");
    let path = dev.join(name);
    std::fs::write(&path, "").expect("device file");
    path
}

/// RFC 3339 (UTC, seconds) without a date library.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after epoch")
        .as_secs();
    let days = secs / 86_400;
    // civil_from_days
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// A container's cgroup in a kubepods pod cgroup (v1 `pids` hierarchy, the cgroupfs driver's
/// layout `kubepods/burstable/pod<uid>/<container id>`), as the kubelet and containerd make
/// it; its processes are moved out and it is removed when dropped.
pub struct PodCgroup(PathBuf);

impl PodCgroup {
    /// Make it; `None` where this machine cannot.
    pub fn create(uid: &str, container: &str) -> Option<Self> {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/pids/kubepods/burstable/pod{uid}/{container}"
        ));
        std::fs::create_dir_all(&dir).ok()?;
        Some(Self(dir))
    }

    /// Make it and move `pid` into it.
    pub fn enter(uid: &str, container: &str, pid: u32) -> Option<Self> {
        let cgroup = Self::create(uid, container)?;
        std::fs::write(cgroup.procs(), pid.to_string()).ok()?;
        Some(cgroup)
    }

    /// Its `cgroup.procs`: a process that writes its PID there moves in (its children follow).
    pub fn procs(&self) -> PathBuf {
        self.0.join("cgroup.procs")
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.procs()) {
            for pid in procs.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/pids/cgroup.procs", pid);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
        if let Some(pod) = self.0.parent() {
            let _ = std::fs::remove_dir(pod);
        }
    }
}
