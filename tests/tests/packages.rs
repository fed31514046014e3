//! The .deb and the .rpm, as `packaging/build-packages.sh` builds them (from the binary this
//! test run built): the .rpm's file list and scriptlets, and the .deb installed on a real
//! systemd boot (Debian bookworm in `systemd-nspawn`), where the daemon must run, say what it
//! sees in `systemctl status` and the journal, react to a kernel-log Xid, and stop cleanly.
//!
//! Needs root, cargo-deb, cargo-generate-rpm, rpm, debootstrap and systemd-container;
//! `scripts/test.sh` installs them (the cargo tools into /var/cache/gpu-agent-tests/tools).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use gpu_agent_e2e::nspawn::Container;

/// Build both packages once per test binary, from the binary `cargo test` built.
fn packages() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = gpu_agent_e2e::binary();
        let profile_dir = bin.parent().expect("profile dir");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(other) => other,
            None => panic!("odd binary path {}", bin.display()),
        };
        let target = profile_dir.parent().expect("target dir");
        gpu_agent_e2e::run_ok(
            Command::new(repo().join("packaging/build-packages.sh"))
                .args(["--profile", profile, "--no-build", "--fast", "--out"])
                .arg(dir.path())
                .env("CARGO_TARGET_DIR", target),
            "cargo-deb and cargo-generate-rpm: run the suite with scripts/test.sh, which installs them into /var/cache/gpu-agent-tests/tools and puts them on PATH",
        );
        dir
    })
    .path()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn package(ext: &str) -> PathBuf {
    std::fs::read_dir(packages())
        .expect("packages dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == ext))
        .unwrap_or_else(|| panic!("no .{ext} built"))
}

fn run(cmd: &mut Command) -> String {
    gpu_agent_e2e::run_ok(
        cmd,
        "apt install rpm dpkg binutils, or run the suite with scripts/test.sh",
    )
}

#[test]
fn rpm_has_the_files_config_and_scriptlets() {
    let rpm = package("rpm");
    let files = run(Command::new("rpm").arg("-qlp").arg(&rpm));
    for path in [
        "/usr/bin/gpu-agent",
        "/etc/gpu-agent/config.toml",
        "/usr/lib/systemd/system/gpu-agent.service",
        "/usr/lib/systemd/system/gpu-agent-kubelet-config.service",
        "/usr/lib/systemd/logind.conf.d/50-gpu-agent.conf",
        "/usr/lib/sysusers.d/gpu-agent.conf",
        "/usr/share/polkit-1/rules.d/50-gpu-agent.rules",
        "/usr/share/doc/gpu-agent/README.md",
        "/usr/share/doc/gpu-agent/CONFIGURATION.md",
        "/usr/share/doc/gpu-agent/kubernetes/device-taints-rbac.yaml",
        "/usr/share/doc/gpu-agent/kubernetes/device-taints-admission.yaml",
        "/usr/share/licenses/gpu-agent/LICENSE",
    ] {
        assert!(files.lines().any(|l| l == path), "{path} not in: {files}");
    }
    // The config is a config file kept on upgrade (%config(noreplace)).
    let configs = run(Command::new("rpm").arg("-qcp").arg(&rpm));
    assert_eq!(configs.trim(), "/etc/gpu-agent/config.toml");
    let scripts = run(Command::new("rpm").arg("-qp").arg("--scripts").arg(&rpm));
    for expected in [
        "postinstall scriptlet",
        "systemd-sysusers gpu-agent.conf",
        "systemctl enable gpu-agent.service gpu-agent-kubelet-config.service",
        "preuninstall scriptlet",
        "systemctl disable --now",
        "postuninstall scriptlet",
        "systemctl try-restart gpu-agent.service",
    ] {
        assert!(scripts.contains(expected), "{expected:?} not in: {scripts}");
    }
    let info = run(Command::new("rpm").arg("-qip").arg(&rpm));
    assert!(info.contains("License     : Apache-2.0"), "{info}");
    let requires = run(Command::new("rpm").arg("-qRp").arg(&rpm));
    for needed in ["systemd", "polkit"] {
        assert!(
            requires.lines().any(|l| l.starts_with(needed)),
            "{needed} not in: {requires}"
        );
    }
}

#[test]
fn deb_declares_conffile_and_enables_units() {
    let deb = package("deb");
    // The control archive holds conffiles and the maintainer scripts.
    let dir = tempfile::tempdir().expect("tempdir");
    run(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(dir.path()));
    let listed = std::fs::read_to_string(dir.path().join("conffiles")).expect("conffiles");
    assert_eq!(listed.trim(), "/etc/gpu-agent/config.toml");
    let postinst = std::fs::read_to_string(dir.path().join("postinst")).expect("postinst");
    assert!(postinst.contains("gpu-agent.service") && postinst.contains("deb-systemd-helper"));
    // The system user is made before the unit is started.
    let sysusers = postinst
        .find("systemd-sysusers gpu-agent.conf")
        .expect("sysusers");
    let start = postinst.find("deb-systemd-invoke").expect("start");
    assert!(sysusers < start, "{postinst}");
    let control = std::fs::read_to_string(dir.path().join("control")).expect("control");
    assert!(control.contains("polkitd | policykit-1"), "{control}");
    let contents = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    for path in [
        "./usr/bin/gpu-agent",
        "./usr/lib/systemd/system/gpu-agent.service",
        "./usr/lib/systemd/system/gpu-agent-kubelet-config.service",
        "./usr/lib/sysusers.d/gpu-agent.conf",
        "./usr/share/polkit-1/rules.d/50-gpu-agent.rules",
        "./usr/share/doc/gpu-agent/copyright",
        "./usr/share/doc/gpu-agent/kubernetes/device-taints-admission.yaml",
    ] {
        assert!(contents.contains(path), "{path} not in: {contents}");
    }
}

/// Poll `f` until it returns `Some`, or panic with `what` after `secs`.
fn wait<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn deb_installs_and_runs_on_a_real_systemd_boot() {
    let deb = package("deb");
    let rootfs = gpu_agent_e2e::nspawn::rootfs();
    let work = tempfile::tempdir().expect("tempdir");
    let container = Container::boot(
        &rootfs,
        &[(packages(), "/mnt/packages")],
        &work.path().join("console.log"),
    );
    container.wait_booted();

    // A site that does not give inhibitor locks to every user (the action's default made
    // "no"): the package's polkit rule still gives the agent's system user its delay lock.
    let strict = container.exec(&[
        "sed",
        "-i",
        "/inhibit-delay-shutdown\"/,/<\\/action>/s|<allow_any>yes<|<allow_any>no<|",
        "/usr/share/polkit-1/actions/org.freedesktop.login1.policy",
    ]);
    assert!(strict.status.success(), "sed: {strict:?}");
    let policy = container.stdout(&[
        "grep",
        "-A12",
        "inhibit-delay-shutdown\"",
        "/usr/share/polkit-1/actions/org.freedesktop.login1.policy",
    ]);
    assert!(policy.contains("<allow_any>no</allow_any>"), "{policy}");

    // `apt install ./gpu-agent_*.deb`, as a user would: dpkg's postinst enables and starts it.
    let inside = format!(
        "/mnt/packages/{}",
        deb.file_name().and_then(|n| n.to_str()).expect("name")
    );
    let install = container.exec(&["dpkg", "-i", &inside]);
    assert!(
        install.status.success(),
        "dpkg -i: {}{}",
        String::from_utf8_lossy(&install.stdout),
        String::from_utf8_lossy(&install.stderr)
    );
    for unit in ["gpu-agent.service", "gpu-agent-kubelet-config.service"] {
        assert_eq!(
            container.stdout(&["systemctl", "is-enabled", unit]),
            "enabled",
            "{unit}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while container.stdout(&["systemctl", "is-active", "gpu-agent"]) != "active" {
        assert!(
            Instant::now() < deadline,
            "gpu-agent is not active: {}\n{}",
            container.stdout(&["systemctl", "status", "--no-pager", "gpu-agent"]),
            container.stdout(&["journalctl", "-b", "--no-pager", "-n", "60"])
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // It runs as the gpu-agent system user, not root (issue 21), with exactly its four
    // capabilities, ...
    let pid = container.stdout(&["systemctl", "show", "-P", "MainPID", "gpu-agent"]);
    let owner = container.stdout(&["stat", "-c", "%U", &format!("/proc/{pid}")]);
    assert_eq!(owner, "gpu-agent", "main PID {pid}");
    let caps = container.stdout(&["grep", "^CapEff", &format!("/proc/{pid}/status")]);
    // CAP_KILL (5), CAP_SYS_PTRACE (19), CAP_DAC_OVERRIDE (1), CAP_SYSLOG (34).
    let expected = (1u64 << 5) | (1 << 19) | (1 << 1) | (1 << 34);
    assert!(caps.ends_with(&format!("{expected:016x}")), "{caps}");

    // ... and that user may take logind's shutdown delay lock (polkit, the package's rule):
    // a host shutdown waits for the checkpoint (not only against the fake logind).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = container.stdout(&["systemd-inhibit", "--list", "--no-pager"]);
        if list
            .lines()
            .any(|l| l.contains("gpu-agent") && l.contains("shutdown") && l.contains("delay"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no gpu-agent delay lock: {list}\n{}\n{}",
            container.stdout(&["gpu-agent", "status"]),
            container.stdout(&["journalctl", "-b", "--no-pager", "-n", "40"])
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The Status: line says what the agent sees: no GPUs here.
    let status_text = || container.stdout(&["systemctl", "show", "-P", "StatusText", "gpu-agent"]);
    let before = wait(10, "a status line", || {
        let s = status_text();
        (!s.is_empty()).then_some(s)
    });
    assert!(before.starts_with("no GPUs"), "status line: {before}");
    let shown = container.stdout(&["systemctl", "status", "--no-pager", "gpu-agent"]);
    assert!(shown.contains(&format!("Status: \"{before}\"")), "{shown}");
    // The CLI reaches the daemon over its socket (exit 0 healthy, 1 faults seen).
    let cli = container.exec(&["gpu-agent", "status"]);
    assert!(
        matches!(cli.status.code(), Some(0 | 1))
            && String::from_utf8_lossy(&cli.stdout).contains("Health: "),
        "gpu-agent status: {cli:?}"
    );

    // A fire drill: `gpu-agent inject` inside the container writes a marked Xid on a GPU of
    // our own into the (shared) kernel log; the packaged config counts drills, and ignores
    // the other tests' unmarked userspace lines.
    let domain = gpu_agent_e2e::unique_domain();
    let pci = format!("{domain:04x}:3b:00.0");
    let drill = container.exec(&["gpu-agent", "inject", "xid", "79", "--pci", &pci]);
    assert!(drill.status.success(), "gpu-agent inject: {drill:?}");
    let changed = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let s = status_text();
        if s != before {
            break s;
        }
        assert!(
            Instant::now() < changed,
            "the status line did not change after the drill ({drill:?}):\n{}\n{}",
            container.stdout(&["journalctl", "-u", "gpu-agent", "--no-pager", "-n", "40"]),
            container.stdout(&["gpu-agent", "check"]),
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(after.contains("fatal"), "status line: {after}");

    // The journal carries the fault as structured fields.
    let journal = wait(10, "the fault in the journal", || {
        let out = container.stdout(&["journalctl", "-u", "gpu-agent", "-o", "json", "--no-pager"]);
        out.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| e["FAULT"].as_str().is_some_and(|f| f.contains(&pci)))
    });
    assert_eq!(journal["SYSLOG_IDENTIFIER"], "gpu-agent");
    assert_eq!(journal["MESSAGE"], "GPU fault detected.");
    assert_eq!(journal["PRIORITY"], "3", "{journal}");
    assert_eq!(journal["CODE"], "Xid 79", "{journal}");
    assert!(
        journal["ACTION"].is_string() && journal["SEVERITY"] == "fatal",
        "{journal}"
    );

    // The admin socket has a directory of its own, never shared with pods; root on the node
    // (here, the container's own init namespaces) may clear the drill through it.
    assert_eq!(
        container.stdout(&["stat", "-c", "%a %U", "/run/gpu-agent-admin"]),
        "750 gpu-agent"
    );
    let cleared = container.exec(&["gpu-agent", "clear", "--all"]);
    assert!(
        cleared.status.success() && String::from_utf8_lossy(&cleared.stdout).contains("cleared"),
        "gpu-agent clear: {cleared:?}\n{}",
        container.stdout(&["journalctl", "-u", "gpu-agent", "--no-pager", "-n", "20"])
    );

    // NVRx's health check for a launcher of group `nvrx`, under the shipped unit (no chown:
    // its system-call filter forbids it; an ACL grants the group), and no one else.
    for step in [
        &["groupadd", "nvrx"][..],
        &["useradd", "-G", "nvrx", "launcher"],
        &["useradd", "outsider"],
        &[
            "sed",
            "-i",
            "-e",
            "s|^socket = \"\"$|socket = \"/run/gpu-agent/nvhcd.sock\"|",
            "-e",
            "s|^group = \"\"$|group = \"nvrx\"|",
            "/etc/gpu-agent/config.toml",
        ],
        &["systemctl", "restart", "gpu-agent"],
    ] {
        let out = container.exec(step);
        assert!(out.status.success(), "{step:?}: {out:?}");
    }
    wait(10, "the NVRx sink on", || {
        let out = container.stdout(&["gpu-agent", "status", "--json"]);
        let s: serde_json::Value = serde_json::from_str(&out).ok()?;
        s["sinks"]
            .as_array()?
            .iter()
            .any(|x| x["sink"] == "nvrx-health" && x["state"] == "on")
            .then_some(())
    });
    let connect = |user: &str| {
        container.exec(&[
            "setpriv",
            &format!("--reuid={user}"),
            &format!("--regid={user}"),
            "--init-groups",
            "perl",
            "-MIO::Socket::UNIX",
            "-e",
            "IO::Socket::UNIX->new(Peer => '/run/gpu-agent/nvhcd.sock') or die qq($!\n)",
        ])
    };
    let member = connect("launcher");
    assert!(member.status.success(), "a member of nvrx: {member:?}");
    let other = connect("outsider");
    assert!(
        !other.status.success()
            && String::from_utf8_lossy(&other.stderr).contains("Permission denied"),
        "not a member: {other:?}"
    );

    // Without the package's polkit rule (on this strict site) logind refuses the lock, and
    // the agent runs on and says so.
    let unruled = container.exec(&["rm", "/usr/share/polkit-1/rules.d/50-gpu-agent.rules"]);
    assert!(unruled.status.success(), "rm: {unruled:?}");
    let restart = container.exec(&["systemctl", "restart", "polkit", "gpu-agent"]);
    assert!(restart.status.success(), "systemctl restart: {restart:?}");
    let refused = wait(10, "the refused lock in `gpu-agent status`", || {
        let out = container.stdout(&["gpu-agent", "status"]);
        out.contains("refused the shutdown delay lock")
            .then_some(out)
    });
    assert!(refused.contains("polkit"), "{refused}");
    let list = container.stdout(&["systemd-inhibit", "--list", "--no-pager"]);
    assert!(!list.contains("gpu-agent"), "{list}");

    // A clean stop: exit 0 on SIGTERM, nothing killed.
    let stop = container.exec(&["systemctl", "stop", "gpu-agent"]);
    assert!(stop.status.success(), "systemctl stop: {stop:?}");
    let result = container.stdout(&["systemctl", "show", "-P", "Result", "gpu-agent"]);
    assert_eq!(result, "success");
    let exit = container.stdout(&["systemctl", "show", "-P", "ExecMainStatus", "gpu-agent"]);
    assert_eq!(exit, "0");
    // The state it keeps across restarts was written.
    let state = container.exec(&["test", "-s", "/var/lib/gpu-agent/state.json"]);
    assert!(state.status.success(), "no state.json");

    let status = container.poweroff();
    assert!(status.success(), "nspawn: {status}");
}

/// The packaged binary runs on Amazon Linux 2023 (glibc 2.34), what EKS AMIs run, although it
/// is built on Debian 12 (glibc 2.36): it needs no newer glibc symbol version.
#[test]
fn the_binary_needs_no_glibc_newer_than_amazon_linux_2023s() {
    let symbols = run(Command::new("objdump")
        .arg("-T")
        .arg(gpu_agent_e2e::binary()));
    let newest = symbols
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
        .max()
        .expect("dynamically linked against glibc");
    assert!(newest <= (2, 34), "needs GLIBC_{}.{}", newest.0, newest.1);
}
