//! Shared by the agent's integration tests: run the built binary.

use std::process::Command;

/// Run `gpu-agent ARGS`; (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-agent"))
        .args(args)
        .output()
        .expect("run gpu-agent");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
