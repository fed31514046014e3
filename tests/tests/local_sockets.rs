//! The agent's local servers face tenants: the real daemon, real sockets, real namespaces.
//! A container's root cannot clear a fault, and a thousand idle clients on each server
//! (status, NVRx, metrics) cannot take the descriptors the next notice's scan needs, with
//! the agent held to the default 1,024 of them.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use gpu_agent_e2e::imds::FakeImds;
use gpu_agent_e2e::trainer::{gpu_device, Trainer};
use gpu_agent_e2e::{binary, inject, wait_until as wait, Agent, Host};

/// `gpu-agent clear` from root in another mount namespace (`unshare -m`, as in a container
/// that mounted the agent's directory) is refused and the fault stays; from the agent's own
/// namespaces it clears.
#[test]
fn clear_from_another_mount_namespace_is_refused() {
    let host = Host::new();
    let config = host.config("");
    let agent = Agent::start(&config, &host.socket());
    inject(&format!(
        "NVRM: Xid (PCI:{}): 79, pid=1, name=x, GPU has fallen off the bus.",
        host.gpu_bdf(2)
    ));
    agent.wait_for(Duration::from_secs(5), |s| {
        gpu_agent_e2e::fault(s, &host, "xid", Some(79)).is_some()
    });
    let config_arg = config.to_string_lossy().into_owned();
    let out = std::process::Command::new("unshare")
        .arg("-m")
        .arg(binary())
        .args(["--config", &config_arg, "clear", "--all"])
        .output()
        .expect("unshare");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("another mount namespace"), "{said}");
    let s = agent.snapshot().expect("snapshot");
    assert!(
        gpu_agent_e2e::fault(&s, &host, "xid", Some(79)).is_some(),
        "still there"
    );
    assert!(agent.log().contains("Refused to clear faults."));

    let (code, out, err) = gpu_agent_e2e::cli(&["--config", &config_arg, "clear", "--all"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Xid 79"), "{out}");
    assert!(agent.stop().success());
}

#[test]
fn a_thousand_idle_clients_on_each_socket_leave_every_target_signalled() {
    const IDLE: usize = 1000;
    // This test holds 3,000 sockets itself.
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .unwrap_or(65_536);
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(hard.min(65_536)),
            maximum: Some(hard),
        },
    )
    .expect("raise RLIMIT_NOFILE");

    let host = Host::new();
    let imds = FakeImds::start();
    let gpu = gpu_device(host.dir.path(), "nvidia0");
    let trainers: Vec<Trainer> = (0..4)
        .map(|i| Trainer::start(host.dir.path(), &format!("t{i}"), "usr1", Some(&gpu), &[]))
        .collect();
    let nvrx = host.dir.path().join("run/nvhcd.sock");
    let port = gpu_agent_e2e::free_port();
    let config = host.checkpoint_config(
        &imds,
        false,
        &format!(
            "[nvrx]\nsocket = {nvrx:?}\n[metrics]\nenabled = true\nlisten = \"127.0.0.1:{port}\"\n"
        ),
    );
    // The default soft limit a service gets without LimitNOFILE=.
    let agent = Agent::start_under(
        &config,
        &host.socket(),
        &["prlimit", "--nofile=1024:1024", "--"].map(String::from),
    );
    agent.wait_for(Duration::from_secs(5), |s| {
        s["sinks"].as_array().is_some_and(|a| {
            a.iter()
                .any(|x| x["sink"] == "nvrx-health" && x["state"] == "on")
        })
    });
    agent.wait_for_source_on(Duration::from_secs(5), "imds");

    let mut idle_unix = Vec::new();
    for _ in 0..IDLE {
        idle_unix.push(UnixStream::connect(host.socket()).expect("status client"));
        idle_unix.push(UnixStream::connect(&nvrx).expect("NVRx client"));
    }
    // Metrics clients beyond its cap and the accept queue wait in SYN retries, as a flood
    // from the network would: connect them all at once and hold them (from another thread)
    // until the end of the test.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let flood = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let mut clients = Vec::new();
            for _ in 0..IDLE {
                let mut stopped = stopped.clone();
                clients.push(tokio::spawn(async move {
                    let held = async {
                        let _client = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
                        std::future::pending::<()>().await;
                    };
                    tokio::select! {
                        () = held => {}
                        _ = stopped.wait_for(|s| *s) => {}
                    }
                }));
            }
            for c in clients {
                let _ = c.await;
            }
        });
    });
    std::thread::sleep(Duration::from_secs(1));
    // The agent is well under its 1,024 descriptors: every server takes only its cap.
    let fds = std::fs::read_dir(format!("/proc/{}/fd", agent.pid()))
        .expect("agent fds")
        .count();
    assert!(fds < 300, "the agent holds {fds} descriptors");

    imds.spot_terminate_in(Duration::from_secs(120));
    wait(Duration::from_secs(10), "SIGUSR1 at every trainer", || {
        trainers.iter().all(|t| t.signals() == ["SIGUSR1"])
    });

    // The idle clients it served were dropped when their time was up (status 2 s, NVRx's
    // preface deadline 2 s, metrics' header deadline 2 s), not held for ever: the first
    // status client has been closed by the agent.
    let mut first = idle_unix.swap_remove(0);
    first
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut rest = Vec::new();
    assert_eq!(
        first.read_to_end(&mut rest).expect("closed, not timed out"),
        0
    );
    drop(idle_unix);
    let _ = stop.send(true);
    flood.join().expect("flood");
    // Served again once they are gone.
    wait(Duration::from_secs(10), "the status socket answers", || {
        agent.snapshot().is_some()
    });
    assert!(agent.stop().success());
}
