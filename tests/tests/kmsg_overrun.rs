//! The kernel overwrites records the agent has not read yet (ring-buffer overrun): the agent
//! counts the loss, keeps following, and still finds the fault written after the flood.
//!
//! Its own test binary on purpose: the flood overwrites the shared kernel log, so it must not
//! run beside other tests (cargo runs test binaries one after another).

use std::time::Duration;

use gpu_agent_e2e::{fault, inject, Agent, Host};

#[test]
fn an_overrun_is_counted_and_the_fault_after_it_is_still_found() {
    let host = Host::new();
    let agent = Agent::start(&host.config(""), &host.socket());
    let before = agent.snapshot().expect("snapshot")["kmsg"]["records_lost"]
        .as_u64()
        .unwrap_or(0);

    // Stop the reader, then write more than the ring buffer holds (the default log buffer
    // is 128 KiB-1 MiB; 6,000 records of ~200 bytes overrun either).
    let stop = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &agent.pid().to_string()])
            .status()
            .expect("kill")
    };
    assert!(stop("-STOP").success());
    // A fault early in the flood: overwritten before the agent can read it.
    inject(&format!(
        "NVRM: Xid (PCI:{}): 48, pid=1, name=x, DBE lost in the overrun",
        host.gpu_bdf(1)
    ));
    let noise = format!(
        "gpu-agent-test {}: flood record {}",
        host.gpu_bdf(7),
        "x".repeat(160)
    );
    let flood = std::thread::spawn(move || {
        for _ in 0..6_000 {
            inject(&noise);
        }
    });
    flood.join().expect("flood");
    inject(&format!(
        "NVRM: Xid (PCI:{}): 79, pid=1, name=x, GPU has fallen off the bus.",
        host.gpu_bdf(0)
    ));
    assert!(stop("-CONT").success());

    let s = agent.wait_for(Duration::from_secs(10), |s| {
        fault(s, &host, "xid", Some(79)).is_some()
    });
    let lost = s["kmsg"]["records_lost"].as_u64().unwrap_or(0);
    assert!(lost > before, "the overrun is counted: {before} -> {lost}");
    assert!(
        agent.log().contains("Kernel log overran"),
        "the loss is logged"
    );
    assert_eq!(s["health"], "fatal");
    assert!(agent.stop().success());
}
