//! The shipped systemd units: `systemd-analyze verify` is silent, and the daemon's exposure
//! score meets the target (2.5 or lower).

use std::path::{Path, PathBuf};
use std::process::Command;

fn unit_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd")
}

/// Copy a unit with ExecStart pointing at the built binary (verify checks it exists).
fn staged(dir: &Path, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(unit_dir().join(name)).expect("unit");
    let path = dir.join(name);
    std::fs::write(
        &path,
        text.replace(
            "/usr/bin/gpu-agent",
            &gpu_agent_e2e::binary().to_string_lossy(),
        ),
    )
    .expect("stage");
    path
}

#[test]
fn units_verify_without_warnings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let units = [
        staged(dir.path(), "gpu-agent.service"),
        staged(dir.path(), "gpu-agent-kubelet-config.service"),
    ];
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .output()
        .expect("systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {stderr}"
    );
}

fn exposure(unit: &Path) -> f64 {
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes"])
        .arg(unit)
        .output()
        .expect("systemd-analyze");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.split("Overall exposure level for ").nth(1))
        .and_then(|rest| rest.split(": ").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in: {text}"))
}

#[test]
fn exposure_scores_meet_the_target() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = exposure(&staged(dir.path(), "gpu-agent.service"));
    assert!(daemon <= 2.5, "gpu-agent.service exposure {daemon} > 2.5");
    let oneshot = exposure(&staged(dir.path(), "gpu-agent-kubelet-config.service"));
    assert!(
        oneshot <= 2.5,
        "gpu-agent-kubelet-config.service exposure {oneshot} > 2.5"
    );
}

#[test]
fn unit_contract() {
    let daemon = std::fs::read_to_string(unit_dir().join("gpu-agent.service")).expect("unit");
    for line in [
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "ExecStart=/usr/bin/gpu-agent run",
        "StateDirectory=gpu-agent",
    ] {
        assert!(daemon.contains(line), "gpu-agent.service lacks {line}");
    }
    let oneshot =
        std::fs::read_to_string(unit_dir().join("gpu-agent-kubelet-config.service")).expect("unit");
    for line in [
        "Type=oneshot",
        "Before=nodeadm-run.service kubelet.service",
        "ExecStart=/usr/bin/gpu-agent kubelet-config apply",
    ] {
        assert!(
            oneshot.contains(line),
            "gpu-agent-kubelet-config.service lacks {line}"
        );
    }
    let logind =
        std::fs::read_to_string(unit_dir().join("logind.conf.d/gpu-agent.conf")).expect("drop-in");
    assert!(logind.contains("[Login]") && logind.contains("InhibitDelayMaxSec="));
}
