//! A real systemd boot: a Debian bookworm rootfs booted in `systemd-nspawn`, commands run
//! inside it with `nsenter`.
//!
//! The rootfs is made once by `debootstrap` and cached outside the repository
//! (`GPU_AGENT_TEST_ROOTFS`, default `/var/cache/gpu-agent-tests/bookworm-<packages>`, named
//! for what it holds beyond minbase, so that a new package makes a new cache); every boot runs
//! on a throwaway overlay (`--volatile=overlay`), so the cache stays pristine. It has polkitd,
//! as the package depends on it: logind asks polkit before it gives the agent's system user
//! its shutdown delay lock.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The cached rootfs, made on first use (about a minute from the Debian mirror apt uses).
pub fn rootfs() -> PathBuf {
    const PACKAGES: &str = "systemd-sysv,dbus,libpam-systemd,polkitd";
    let root = std::env::var_os("GPU_AGENT_TEST_ROOTFS").map_or_else(
        || {
            PathBuf::from(format!(
                "/var/cache/gpu-agent-tests/bookworm-{}",
                PACKAGES.replace(',', "-")
            ))
        },
        PathBuf::from,
    );
    if root.join("usr/lib/systemd/systemd").exists() {
        return root;
    }
    let partial = root.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(root.parent().expect("rootfs parent")).expect("cache dir");
    crate::run_ok(
        Command::new("debootstrap")
            .arg("--variant=minbase")
            .arg(format!("--include={PACKAGES}"))
            .arg("bookworm")
            .arg(&partial),
        "apt install debootstrap, or run the suite with scripts/test.sh, which installs it",
    );
    std::fs::rename(&partial, &root).expect("publish rootfs");
    root
}

/// A booted container; powered off (or killed) on drop.
#[derive(Debug)]
pub struct Container {
    nspawn: Child,
    init: u32,
    log: PathBuf,
}

impl Container {
    /// Boot `rootfs` with `/dev/kmsg` readable (as on a host), a private network (loopback
    /// only: nothing inside can reach the outside), and each `(host, container)` directory
    /// bound read-only. `log` receives the console.
    pub fn boot(rootfs: &Path, binds: &[(&Path, &str)], log: &Path) -> Container {
        let tag = format!("{}-{}", std::process::id(), crate::unique_domain());
        let console = std::fs::File::create(log).expect("console log");
        let mut cmd = Command::new("systemd-nspawn");
        cmd.args([
            "--boot",
            "--register=no",
            "--keep-unit",
            "--volatile=overlay",
        ])
        .args(["--private-network", "--console=passive"])
        .args(["--bind=/dev/kmsg", "--capability=CAP_SYSLOG"])
        .arg(format!("--machine=gpu-agent-test-{tag}"))
        .arg(format!("--setenv=GPU_AGENT_TEST_BOOT={tag}"))
        .arg("--directory")
        .arg(rootfs);
        for (host, inside) in binds {
            cmd.arg(format!("--bind-ro={}:{inside}", host.display()));
        }
        let nspawn = cmd
            .stdin(Stdio::null())
            .stdout(console.try_clone().expect("log"))
            .stderr(console)
            .spawn()
            .expect("systemd-nspawn (apt install systemd-container, or run the suite with scripts/test.sh)");
        let mut container = Container {
            nspawn,
            init: 0,
            log: log.to_path_buf(),
        };
        container.init = container.find_init(&tag);
        container
    }

    /// The container's PID 1, seen from the host: the process whose environment carries our
    /// tag and whose PID in its own namespace is 1.
    fn find_init(&mut self, tag: &str) -> u32 {
        let needle = format!("GPU_AGENT_TEST_BOOT={tag}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.nspawn.try_wait() {
                panic!("systemd-nspawn exited ({status}): {}", self.console());
            }
            for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|p| p.parse::<u32>().ok())
                else {
                    continue;
                };
                let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
                let tagged = environ
                    .split(|b| *b == 0)
                    .any(|var| var == needle.as_bytes());
                let status =
                    std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
                let is_init = status
                    .lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .is_some_and(|ids| ids.split_whitespace().last() == Some("1"));
                if tagged && is_init {
                    return pid;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("container init not found: {}", self.console());
    }

    /// What the container printed on its console so far.
    pub fn console(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Run a command inside the container (all its namespaces), as root.
    pub fn exec(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg(format!("--target={}", self.init))
            .args([
                "--mount", "--uts", "--ipc", "--net", "--pid", "--cgroup", "--",
            ])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::null())
            .output()
            .expect("nsenter")
    }

    /// Like [`Container::exec`], returning trimmed stdout.
    pub fn stdout(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.exec(args).stdout)
            .trim()
            .to_string()
    }

    /// Wait until systemd reached its default target (running or degraded).
    pub fn wait_booted(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let state = self.stdout(&["systemctl", "is-system-running"]);
            if state == "running" || state == "degraded" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "boot did not finish (state {state:?}): {}",
                self.console()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Power off and wait for `systemd-nspawn` to exit; its exit status.
    pub fn poweroff(mut self) -> std::process::ExitStatus {
        let _ = self.exec(&["systemctl", "poweroff"]);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.nspawn.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "poweroff hung: {}",
                self.console()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Container {
    /// A test that failed half-way still shuts the container down: SIGTERM makes nspawn
    /// power the container off; if that hangs, SIGKILL to the container's PID 1 ends its
    /// whole PID namespace. (Killing only nspawn would leave the booted system running.)
    fn drop(&mut self) {
        if !matches!(self.nspawn.try_wait(), Ok(None)) {
            return;
        }
        if let Some(nspawn) = rustix::process::Pid::from_raw(self.nspawn.id() as i32) {
            let _ = rustix::process::kill_process(nspawn, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(init) = rustix::process::Pid::from_raw(self.init as i32) {
            let _ = rustix::process::kill_process(init, rustix::process::Signal::KILL);
        }
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
    }
}
