//! The binary's command line: exit codes and the one-shot commands that need no daemon.

use gpu_agent_e2e::cli as run;

#[test]
fn xid_explains_a_code() {
    let (code, out, _) = run(&["xid", "79"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"),
        "{out}"
    );
    assert!(
        out.contains("RESTART_BM") && out.contains("action reboot"),
        "{out}"
    );
    let (code, out, _) = run(&["xid", "--sxid", "20034"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("LTSSM Fault Up") && out.contains("severity fatal"),
        "{out}"
    );
    let (code, out, _) = run(&["xid", "63"]);
    assert_eq!(code, 0);
    assert!(out.contains("why:"), "overrides are explained: {out}");
    assert_eq!(run(&["xid", "4242"]).0, 1);
}

#[test]
fn usage_errors_exit_64_and_help_exits_0() {
    assert_eq!(run(&["frobnicate"]).0, 64);
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    for sub in ["run", "status", "check", "xid", "inject"] {
        assert!(out.contains(sub), "{out}");
    }
}

#[test]
fn default_config_is_the_documented_file() {
    let (code, out, _) = run(&["default-config"]);
    assert_eq!(code, 0);
    assert!(out.contains("[kmsg]") && out.contains("listen = \"127.0.0.1:9467\""));
}
