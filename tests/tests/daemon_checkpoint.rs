//! The real daemon, the test IMDS and real child processes: a notice becomes a checkpoint
//! signal to the processes that handle it, once per notice, and never to one that does not.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use gpu_agent_e2e::imds::{scheduled_reboot, FakeImds};
use gpu_agent_e2e::trainer::{gpu_device, rfc3339, PodCgroup, Trainer};
use gpu_agent_e2e::{cli, wait_until as wait, Agent, Host};

/// The daemon under test scans the real /proc. Only the test that exercises the opt-in
/// variable honours it, so daemons of tests running in parallel leave its processes alone.
fn config(host: &Host, imds: &FakeImds, extra: &str) -> PathBuf {
    host.checkpoint_config(imds, false, extra)
}

#[test]
fn a_spot_notice_signals_handlers_once_and_never_a_process_without_one() {
    let host = Host::new();
    let imds = FakeImds::start();
    let gpu = gpu_device(host.dir.path(), "nvidia0");
    let handler = Trainer::start(host.dir.path(), "handler", "usr1", Some(&gpu), &[]);
    let mut bystander = Trainer::start(host.dir.path(), "bystander", "none", Some(&gpu), &[]);
    let opted_in = Trainer::start(
        host.dir.path(),
        "opted-in",
        "usr2",
        None,
        &[("GPU_AGENT_CHECKPOINT_SIGNAL", "SIGUSR2")],
    );
    let config = host.checkpoint_config(&imds, true, "");

    // The drill shows who is in and who is out, and why.
    let (code, out, _) = cli(&[
        "--config",
        &config.to_string_lossy(),
        "drill",
        "checkpoint",
        "--dry-run",
    ]);
    assert_eq!(code, 0);
    let line = |pid: u32| {
        out.lines()
            .find(|l| l.starts_with(&format!("{pid} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line(handler.child.id()).contains("target: holds")
            && line(handler.child.id()).contains("SIGUSR1"),
        "{out}"
    );
    assert!(
        line(bystander.child.id()).contains("does not handle SIGUSR1"),
        "{out}"
    );
    assert!(
        line(opted_in.child.id()).contains("opted in with GPU_AGENT_CHECKPOINT_SIGNAL=SIGUSR2"),
        "{out}"
    );
    assert!(handler.signals().is_empty(), "a dry run signals nobody");

    let agent = Agent::start(&config, &host.socket());
    agent.wait_for_source_on(Duration::from_secs(5), "imds");
    let deadline = imds.spot_terminate_in(Duration::from_secs(120));
    let took = wait(Duration::from_secs(5), "SIGUSR1 at the handler", || {
        handler.signals() == ["SIGUSR1"]
    });
    assert!(
        took < Duration::from_millis(1200),
        "signalled {took:?} after the notice (poll 200 ms + 1 s)"
    );
    wait(
        Duration::from_secs(2),
        "SIGUSR2 at the opted-in process",
        || opted_in.signals() == ["SIGUSR2"],
    );
    assert!(
        bystander.alive(),
        "a process without a handler is never signalled"
    );
    assert!(bystander.signals().is_empty());
    let s = agent.wait_for(Duration::from_secs(2), |s| {
        s["pending_end"]["signalled"] == 2
    });
    assert_eq!(s["pending_end"]["kind"], "spot");
    assert!(
        s["summary"]
            .as_str()
            .is_some_and(|l| l.contains(&format!("spot end at {deadline} (2 signalled)"))),
        "{}",
        s["summary"]
    );
    assert!(agent.stop().success());

    // A restarted agent does not signal the same notice again.
    let agent = Agent::start(&config, &host.socket());
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        handler.signals(),
        ["SIGUSR1"],
        "same notice, no second signal"
    );
    // A changed notice for the same ending (new action and time) is acted on, covered by the
    // first signal (also across the restart): one ending, one signal.
    let later = rfc3339(SystemTime::now() + Duration::from_secs(100));
    imds.set_spot(Some(&format!(r#"{{"action": "stop", "time": "{later}"}}"#)));
    let s = agent.wait_for(Duration::from_secs(5), |s| {
        s["checkpoints"]
            .as_array()
            .is_some_and(|c| c.iter().any(|r| !r["covered_by"].is_null()))
    });
    assert_eq!(s["pending_end"]["deadline"], later.as_str());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(handler.signals(), ["SIGUSR1"], "one ending, one signal");
    assert!(bystander.alive());
    assert!(agent.stop().success());
}

#[test]
fn scheduled_maintenance_fires_at_deadline_minus_lead() {
    let host = Host::new();
    let imds = FakeImds::start();
    let gpu = gpu_device(host.dir.path(), "nvidia1");
    let handler = Trainer::start(host.dir.path(), "handler", "usr1", Some(&gpu), &[]);
    let agent = Agent::start(
        &config(
            &host,
            &imds,
            "[checkpoint.lead]\nscheduled-maintenance = \"3s\"\n",
        ),
        &host.socket(),
    );
    // NotBefore 5 s from now (whole seconds, as IMDS prints them): due 2 s from now.
    let set_at = Instant::now();
    imds.set_scheduled(&scheduled_reboot(
        SystemTime::now() + Duration::from_secs(5),
    ));
    let s = agent.wait_for(Duration::from_secs(3), |s| {
        s["pending_end"]["kind"] == "scheduled-maintenance"
    });
    assert!(s["summary"]
        .as_str()
        .is_some_and(|l| l.contains("scheduled-maintenance end at")));
    std::thread::sleep(Duration::from_millis(800));
    assert!(handler.signals().is_empty(), "not before deadline - lead");
    wait(Duration::from_secs(6), "signal at deadline - lead", || {
        handler.signals() == ["SIGUSR1"]
    });
    let at = set_at.elapsed();
    assert!(
        at >= Duration::from_millis(900) && at <= Duration::from_secs(4),
        "fired {at:?} after the event was set (due about 2 s)"
    );
    assert!(agent.stop().success());
}

/// A Spot notice can only come to a Spot instance: on an On-Demand one (IMDS
/// `instance-life-cycle`) the Spot path is read at the rebalance recommendation's pace, not
/// every `poll_interval`; a notice that comes anyway is still acted on.
#[test]
fn only_a_spot_instance_polls_the_spot_notice_at_its_pace() {
    let started = |life_cycle: &str| {
        let host = Host::new();
        let imds = FakeImds::start();
        imds.set_life_cycle(life_cycle);
        let config = config(&host, &imds, "");
        let text = std::fs::read_to_string(&config)
            .expect("config")
            .replace(
                "rebalance_interval = \"200ms\"",
                "rebalance_interval = \"2s\"",
            )
            .replace(
                "scheduled_interval = \"200ms\"",
                "scheduled_interval = \"2s\"",
            );
        std::fs::write(&config, text).expect("config");
        let agent = Agent::start(&config, &host.socket());
        agent.wait_for_source_on(Duration::from_secs(5), "imds");
        (host, imds, agent)
    };
    let (_spot_host, spot, spot_agent) = started("spot");
    let (host, on_demand, agent) = started("on-demand");
    let gpu = gpu_device(host.dir.path(), "nvidia1");
    let handler = Trainer::start(host.dir.path(), "handler", "usr1", Some(&gpu), &[]);
    let path = "spot/instance-action";
    let before = (spot.gets_of(path), on_demand.gets_of(path));
    std::thread::sleep(Duration::from_secs(3));
    let fast = spot.gets_of(path) - before.0;
    let slow = on_demand.gets_of(path) - before.1;
    assert!(
        fast >= 10,
        "a Spot instance, every 200 ms: {fast} GETs in 3 s"
    );
    assert!(slow <= 2, "an On-Demand one, every 2 s: {slow} GETs in 3 s");
    // A notice that comes anyway is still seen, at the slower pace.
    on_demand.spot_terminate_in(Duration::from_secs(120));
    wait(Duration::from_secs(5), "SIGUSR1 at the trainer", || {
        handler.signals() == ["SIGUSR1"]
    });
    assert!(spot_agent.stop().success());
    assert!(agent.stop().success());
}

#[test]
fn off_ec2_the_imds_source_is_off_without_touching_the_network() {
    let host = Host::new();
    let agent = Agent::start(&host.config(""), &host.socket());
    let s = agent.snapshot().expect("snapshot");
    let imds = s["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .find(|x| x["source"] == "imds")
        .expect("imds")
        .clone();
    assert_eq!(imds["state"], "off");
    assert!(
        imds["reason"]
            .as_str()
            .is_some_and(|r| r.contains("not an EC2 instance")),
        "{imds}"
    );
    assert!(agent.stop().success());
}

/// A daemon on the fake logind's bus (`checkpoint` lines join `[checkpoint]`), once it holds
/// logind's shutdown delay lock.
fn with_logind(
    host: &Host,
    imds: &FakeImds,
    logind: &gpu_agent_e2e::logind::FakeLogind,
    checkpoint: &str,
) -> Agent {
    let extra = format!("{checkpoint}[logind]\nbus_address = {:?}\n", logind.address);
    let agent = Agent::start(&config(host, imds, &extra), &host.socket());
    agent.wait_for(Duration::from_secs(5), |s| {
        s["sources"].as_array().is_some_and(|a| {
            a.iter()
                .any(|x| x["source"] == "logind" && x["state"] == "on")
        })
    });
    assert_eq!(
        logind.held(),
        [("shutdown".to_string(), "delay".to_string())],
        "a shutdown delay lock is held"
    );
    agent
}

#[test]
fn host_shutdown_is_held_until_the_trainer_has_checkpointed_and_exited() {
    use gpu_agent_e2e::logind::FakeLogind;
    let host = Host::new();
    let imds = FakeImds::start();
    let logind = FakeLogind::start(host.dir.path());
    let gpu = gpu_device(host.dir.path(), "nvidia2");
    // Takes 3 s to write its checkpoint after SIGUSR1, then exits.
    let mut trainer = Trainer::start(host.dir.path(), "handler", "usr1-exit", Some(&gpu), &[]);
    let agent = with_logind(&host, &imds, &logind, "");

    logind.prepare_for_shutdown(true);
    wait(Duration::from_secs(5), "the signal", || {
        trainer.signals() == ["SIGUSR1"]
    });
    // Checkpointing: the shutdown waits, and status says for whom.
    let s = agent.wait_for(Duration::from_secs(2), |s| {
        s["pending_end"]["waiting_for"]
            .as_array()
            .is_some_and(|w| w.len() == 1)
    });
    assert_eq!(s["pending_end"]["waiting_for"][0], trainer.child.id());
    let (_, text) = agent.status(false);
    assert!(text.contains("Waiting for 1 signalled processes"), "{text}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !logind.held().is_empty(),
        "released before the trainer finished"
    );
    // The trainer exits: the lock goes at once, long before the 30 s cap.
    wait(Duration::from_secs(10), "the trainer to exit", || {
        !trainer.alive()
    });
    let released = wait(Duration::from_secs(3), "the lock released", || {
        logind.held().is_empty()
    });
    assert!(
        released < Duration::from_secs(3),
        "not held to the 60 s cap"
    );
    assert!(agent.stop().success());
}

#[test]
fn a_spot_notice_then_the_shutdown_signal_once_and_the_notice_file_comes_and_goes() {
    use gpu_agent_e2e::logind::FakeLogind;
    let host = Host::new();
    let imds = FakeImds::start();
    let logind = FakeLogind::start(host.dir.path());
    let gpu = gpu_device(host.dir.path(), "nvidia3");
    let trainer = Trainer::start(host.dir.path(), "handler", "usr1", Some(&gpu), &[]);
    let notice_file = host.dir.path().join("run/notice.json");
    let agent = with_logind(
        &host,
        &imds,
        &logind,
        &format!("notice_file = {notice_file:?}\nhold = \"1s\"\n"),
    );
    assert!(!notice_file.exists(), "nothing pending, no file");
    let deadline = imds.spot_terminate_in(Duration::from_secs(120));
    wait(Duration::from_secs(5), "the Spot signal", || {
        trainer.signals() == ["SIGUSR1"]
    });
    wait(Duration::from_secs(5), "the notice file", || {
        notice_file.exists()
    });
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&notice_file).expect("read")).expect("json");
    assert_eq!(
        (written["kind"].as_str(), written["signal"].as_str()),
        (Some("spot"), Some("SIGUSR1")),
        "{written}"
    );
    assert_eq!(written["deadline"], deadline.as_str());
    assert!(written["seconds_left"]
        .as_u64()
        .is_some_and(|s| s > 100 && s <= 120));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&notice_file)
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644, "world-readable");

    // Two minutes later the host shuts down: the same ending, no second signal.
    logind.prepare_for_shutdown(true);
    wait(Duration::from_secs(5), "the shutdown handled", || {
        logind.held().is_empty()
    });
    let s = agent.snapshot().expect("snapshot");
    let covered = s["checkpoints"]
        .as_array()
        .and_then(|c| {
            c.iter().find(|r| {
                r["notice_id"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("shutdown"))
            })
        })
        .cloned()
        .unwrap_or_default();
    assert!(
        covered["covered_by"]
            .as_str()
            .is_some_and(|c| c.starts_with("spot")),
        "{covered}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(trainer.signals(), ["SIGUSR1"], "one ending, one signal");

    // The notice goes (a cancelled shutdown, no Spot notice): the file goes too.
    logind.prepare_for_shutdown(false);
    imds.set_spot(None);
    wait(Duration::from_secs(5), "the notice file removed", || {
        !notice_file.exists()
    });
    assert!(
        !notice_file.with_extension("json.bak").exists(),
        "no stale copy of the ending left beside it"
    );
    assert!(agent.stop().success());
}

#[test]
fn only_the_topmost_process_of_a_forked_trainer_is_signalled() {
    let host = Host::new();
    let imds = FakeImds::start();
    let gpu = gpu_device(host.dir.path(), "nvidia4");
    let trainer = Trainer::start(host.dir.path(), "forked", "usr1-fork", Some(&gpu), &[]);
    let config = config(&host, &imds, "");
    let (code, out, _) = cli(&[
        "--config",
        &config.to_string_lossy(),
        "drill",
        "checkpoint",
        "--dry-run",
    ]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.contains(&format!("forked copy of target {}", trainer.child.id()))),
        "the forked worker is explained as a forked copy of its target: {out}"
    );
    let agent = Agent::start(&config, &host.socket());
    imds.set_spot(Some(
        r#"{"action": "terminate", "time": "2099-01-01T00:00:00Z"}"#,
    ));
    wait(Duration::from_secs(5), "the Spot signal", || {
        trainer.signals() == ["SIGUSR1"]
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        trainer.child_signals().is_empty(),
        "the forked worker was signalled: {:?}",
        trainer.child_signals()
    );
    assert!(agent.stop().success());
}

/// EC2 starts terminating an UltraServer Capacity Block's instances 60 minutes before its
/// end (an instance block's 30): the block's kind comes from DescribeCapacityBlocks
/// (`UltraserverType`), and the signal fires at end - 60 min - lead, with the notice saying
/// which rule applied. Without the DescribeCapacityBlocks permission the earlier rule is
/// taken, and the notice says why.
#[test]
fn an_ultraserver_capacity_block_is_signalled_before_end_minus_60_minutes() {
    use gpu_agent_e2e::ec2::FakeEc2;
    let host = Host::new();
    let imds = FakeImds::start();
    let ec2 = FakeEc2::start();
    let gpu = gpu_device(host.dir.path(), "nvidia3");
    let handler = Trainer::start(host.dir.path(), "handler", "usr1", Some(&gpu), &[]);
    // An hour and 8 s to the end: with a 2 s lead, due 6 s from now (an instance block's
    // rule would wait another half hour).
    let end = SystemTime::now() + Duration::from_secs(60 * 60 + 8);
    {
        let mut s = ec2.state.lock().expect("state");
        s.reservation_id = Some("cr-0a1b2c3d4e5f67890".into());
        s.reservation = Some(("capacity-block".into(), rfc3339(end)));
        s.capacity_block = Some(("cb-0123456789abcdef0".into(), Some("u-p6e-gb200x72".into())));
    }
    let extra = format!(
        "[checkpoint.lead]\ncapacity-block = \"2s\"\n[ec2]\nendpoint = {:?}\npoll_interval = \"1s\"\n",
        ec2.endpoint(),
    );
    let config = config(&host, &imds, &extra);
    let env = [
        ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
        ("AWS_SECRET_ACCESS_KEY", "secret"),
        ("AWS_EC2_METADATA_DISABLED", "false"),
    ];
    let agent = Agent::start_with_env(&config, &host.socket(), &env);
    let s = agent.wait_for(Duration::from_secs(10), |s| {
        s["pending_end"]["kind"] == "capacity-block"
    });
    let detail = s["pending_end"]["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        detail.contains("UltraServer Capacity Block cb-0123456789abcdef0 (u-p6e-gb200x72)")
            && detail.contains("60 minutes before"),
        "{detail}"
    );
    wait(
        Duration::from_secs(12),
        "signal at end - 60 min - lead",
        || handler.signals() == ["SIGUSR1"],
    );
    let actions = ec2.state.lock().expect("state").actions.clone();
    assert!(
        actions.contains(&"DescribeCapacityBlocks".to_string()),
        "{actions:?}"
    );
    // Looked up every second, connected once: the instance id and region were read from
    // IMDS for the first lookup only, the later ones are the EC2 calls alone.
    let lookups = actions.iter().filter(|a| *a == "DescribeInstances").count();
    assert!(lookups >= 3, "{actions:?}");
    assert_eq!(imds.gets_of("instance-id"), 1);
    assert_eq!(imds.gets_of("placement/region"), 1);
    assert!(agent.stop().success());

    // An instance block: 30 minutes. Without the permission: 60, saying why.
    ec2.state.lock().expect("state").capacity_block = Some(("cb-1".into(), None));
    let agent = Agent::start_with_env(&config, &host.socket(), &env);
    let s = agent.wait_for(Duration::from_secs(10), |s| {
        s["pending_end"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("instance Capacity Block cb-1"))
    });
    assert!(
        s["pending_end"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("30 minutes before")),
        "{}",
        s["pending_end"]
    );
    assert!(agent.stop().success());
    ec2.state
        .lock()
        .expect("state")
        .denied
        .push("DescribeCapacityBlocks".into());
    let agent = Agent::start_with_env(&config, &host.socket(), &env);
    let s = agent.wait_for(Duration::from_secs(10), |s| {
        s["pending_end"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no ec2:DescribeCapacityBlocks permission"))
    });
    assert!(
        s["pending_end"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("60 minutes before")),
        "{}",
        s["pending_end"]
    );
    assert!(agent.stop().success());
}

#[test]
fn a_capacity_block_end_fires_at_end_minus_30_minutes_minus_lead_and_iam_errors_name_the_action() {
    use gpu_agent_e2e::ec2::FakeEc2;
    let host = Host::new();
    let imds = FakeImds::start();
    let ec2 = FakeEc2::start();
    let gpu = gpu_device(host.dir.path(), "nvidia3");
    let handler = Trainer::start(host.dir.path(), "handler", "usr1", Some(&gpu), &[]);
    let api = gpu_agent_e2e::kube_api::KubeApi::start(&["cb-node"]);
    // Termination starts at EndDate - 30 min; with a 2 s lead the signal is due 6 s from now.
    let end = SystemTime::now() + Duration::from_secs(30 * 60 + 8);
    {
        let mut s = ec2.state.lock().expect("state");
        s.reservation_id = Some("cr-0a1b2c3d4e5f67890".into());
        s.reservation = Some(("capacity-block".into(), rfc3339(end)));
    }
    let extra = format!(
        "[checkpoint.lead]\ncapacity-block = \"2s\"\n[ec2]\nendpoint = {:?}\npoll_interval = \"1s\"\n\
         [kubernetes]\nkubeconfig = {:?}\n",
        ec2.endpoint(),
        api.kubeconfig(host.dir.path())
    );
    let config = config(&host, &imds, &format!("node_name = \"cb-node\"\n{extra}"));
    let agent = Agent::start_with_env(
        &config,
        &host.socket(),
        &[
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("AWS_EC2_METADATA_DISABLED", "false"),
        ],
    );
    let s = agent.wait_for(Duration::from_secs(10), |s| {
        s["pending_end"]["kind"] == "capacity-block"
    });
    assert!(
        s["pending_end"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("cr-0a1b2c3d4e5f67890")),
        "{}",
        s["pending_end"]
    );
    // Known but not yet acted on: InterruptionPending stays False, naming the end.
    wait(
        Duration::from_secs(5),
        "InterruptionPending False with the known end",
        || {
            api.condition("cb-node", "InterruptionPending")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "CapacityBlockScheduled")
        },
    );
    assert!(handler.signals().is_empty());
    wait(
        Duration::from_secs(12),
        "signal at end - 30 min - lead",
        || handler.signals() == ["SIGUSR1"],
    );
    // From deadline - lead, when the signal fires: True.
    wait(Duration::from_secs(3), "InterruptionPending True", || {
        api.condition("cb-node", "InterruptionPending")
            .is_some_and(|c| c["status"] == "True" && c["reason"] == "CapacityBlockPending")
    });
    let actions = ec2.state.lock().expect("state").actions.clone();
    assert!(
        actions.starts_with(&[
            "DescribeInstances".to_string(),
            "DescribeCapacityReservations".to_string()
        ]),
        "{actions:?}"
    );
    assert!(agent.stop().success());

    // Without ec2:DescribeCapacityReservations, the source says so, naming the action.
    ec2.state
        .lock()
        .expect("state")
        .denied
        .push("DescribeCapacityReservations".into());
    let agent = Agent::start_with_env(
        &config,
        &host.socket(),
        &[
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
        ],
    );
    let s = agent.wait_for(Duration::from_secs(10), |s| {
        s["sources"].as_array().is_some_and(|a| {
            a.iter()
                .any(|x| x["source"] == "capacity-block" && x["state"] == "failed")
        })
    });
    let reason = s["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .find(|x| x["source"] == "capacity-block")
        .expect("source")["reason"]
        .clone();
    assert!(
        reason.as_str().is_some_and(|r| r.contains(
            "missing IAM permission ec2:DescribeCapacityReservations (UnauthorizedOperation)"
        )),
        "{reason}"
    );
    assert!(agent.stop().success());

    // An EC2 endpoint that never answers (review 2026-12-03b L12): the lookup is cut off
    // within the poll interval and the source says so.
    {
        let mut s = ec2.state.lock().expect("state");
        s.denied.clear();
        s.stalled.push("DescribeInstances".into());
    }
    let agent = Agent::start_with_env(
        &config,
        &host.socket(),
        &[
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
        ],
    );
    agent.wait_for(Duration::from_secs(10), |s| {
        s["sources"].as_array().is_some_and(|a| {
            a.iter().any(|x| {
                x["source"] == "capacity-block"
                    && x["state"] == "failed"
                    && x["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("no answer within"))
            })
        })
    });
    assert!(agent.stop().success());
}

#[test]
fn a_target_in_a_pod_gets_an_event_and_cordon_is_opt_in() {
    use gpu_agent_e2e::kube_api::KubeApi;
    let host = Host::new();
    let imds = FakeImds::start();
    let api = KubeApi::start(&["gpu-node-7"]);
    let gpu = gpu_device(host.dir.path(), "nvidia4");
    let handler = Trainer::start(host.dir.path(), "handler", "usr1", Some(&gpu), &[]);
    let uid = "1b4c7e9a-2f6d-4c1e-9a0b-3d5e7f9a1c2b";
    let container = "5f0c".repeat(16);
    let Some(_cgroup) = PodCgroup::enter(uid, &container, handler.child.id()) else {
        eprintln!("skipping: cannot create a kubepods cgroup here");
        return;
    };
    api.add_pod_with_containers(
        "ml",
        "trainer-0",
        uid,
        "gpu-node-7",
        &[("sidecar", &"0".repeat(64)), ("trainer", &container)],
    );
    // The device plugin gave the container GPU 4 (index IDs: no NVML needed to resolve).
    let kubelet = gpu_agent_e2e::kubelet::Kubelet::start(&host.kubelet_socket());
    kubelet.assign("ml", "trainer-0", "trainer", "nvidia.com/gpu", &["4"]);
    // The helper's [checkpoint] table gets cordon; node name and kubeconfig go on top.
    let config = config(&host, &imds, "");
    let text = std::fs::read_to_string(&config).expect("config").replace(
        "opt_in_env = false\n",
        "opt_in_env = false\ncordon = true\n",
    );
    let text = format!(
        "node_name = \"gpu-node-7\"\n{text}\n[kubernetes]\nkubeconfig = {:?}\n",
        api.kubeconfig(host.dir.path())
    );
    std::fs::write(&config, text).expect("config");
    let agent = Agent::start(&config, &host.socket());
    imds.spot_terminate_in(Duration::from_secs(120));
    wait(Duration::from_secs(5), "the signal", || {
        handler.signals() == ["SIGUSR1"]
    });
    wait(Duration::from_secs(5), "the pod Event", || {
        api.events().iter().any(|e| {
            e["reason"] == "CheckpointSignal" && e["involvedObject"]["name"] == "trainer-0"
        })
    });
    let event = api
        .events()
        .into_iter()
        .find(|e| e["reason"] == "CheckpointSignal")
        .expect("event");
    assert_eq!(
        (
            event["metadata"]["namespace"].as_str(),
            event["involvedObject"]["kind"].as_str(),
            event["involvedObject"]["uid"].as_str()
        ),
        (Some("ml"), Some("Pod"), Some(uid))
    );
    assert!(
        event["message"]
            .as_str()
            .is_some_and(|m| m.contains("SIGUSR1") && m.contains("spot notice")),
        "{event}"
    );
    // It names the container and the GPUs that container holds.
    let holding = format!(
        "in container trainer, holding GPU 4 ({}.0)",
        host.gpu_bdf(4)
    );
    assert!(
        event["message"]
            .as_str()
            .is_some_and(|m| m.contains(&holding)),
        "{event}"
    );
    wait(Duration::from_secs(3), "cordon", || {
        api.node("gpu-node-7")
            .is_some_and(|n| n["spec"]["unschedulable"] == true)
    });
    assert!(agent.stop().success());
}

/// Issue 22: the notice file must survive an agent restart during an ending (trainers that
/// poll it would see the ending vanish), and go once the ending does.
#[test]
fn the_notice_file_survives_an_agent_restart_during_an_ending() {
    let host = Host::new();
    let imds = FakeImds::start();
    let gpu = gpu_device(host.dir.path(), "nvidia5");
    let trainer = Trainer::start(host.dir.path(), "handler", "usr1", Some(&gpu), &[]);
    let notice_file = host.dir.path().join("run/notice.json");
    let config = config(&host, &imds, &format!("notice_file = {notice_file:?}\n"));
    let agent = Agent::start(&config, &host.socket());
    imds.spot_terminate_in(Duration::from_secs(120));
    wait(Duration::from_secs(5), "the notice file", || {
        notice_file.exists()
    });
    let before = std::fs::read_to_string(&notice_file).expect("read");
    assert!(agent.stop().success());
    assert!(notice_file.exists(), "a stopped agent leaves the ending");

    let agent = Agent::start(&config, &host.socket());
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        assert!(
            notice_file.exists(),
            "the notice file vanished during the restart"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let after = std::fs::read_to_string(&notice_file).expect("read");
    let id =
        |text: &str| serde_json::from_str::<serde_json::Value>(text).expect("json")["id"].clone();
    assert_eq!(id(&after), id(&before), "the same ending");
    assert_eq!(trainer.signals(), ["SIGUSR1"], "not signalled again");

    imds.set_spot(None);
    wait(Duration::from_secs(15), "the notice file removed", || {
        !notice_file.exists()
    });
    assert!(agent.stop().success());
}

/// Issue 26 (H1): an ack file is a tenant's input, read with the agent's powers. A link to
/// /dev/zero, a FIFO, a sparse terabyte and a relative link out of the process's root are
/// each refused unread: the agent's memory stays flat, nothing of any target file reaches
/// its log, those processes stay unconfirmed, and an honest ack beside them still confirms.
#[test]
fn hostile_ack_files_are_refused_unread_and_the_agent_stays_small() {
    use gpu_agent_e2e::status_kib;
    let host = Host::new();
    let imds = FakeImds::start();
    let gpu = gpu_device(host.dir.path(), "nvidia6");
    let ack = host.dir.path().join("ack");
    std::fs::create_dir_all(&ack).expect("ack dir");
    let names = ["zero", "fifo", "sparse", "escape", "honest"];
    let trainers: Vec<Trainer> = names
        .iter()
        .map(|n| Trainer::start(host.dir.path(), n, "usr1", Some(&gpu), &[]))
        .collect();
    let at = |i: usize| ack.join(trainers[i].child.id().to_string());
    std::os::unix::fs::symlink("/dev/zero", at(0)).expect("link to /dev/zero");
    let fifo = std::process::Command::new("mkfifo")
        .arg(at(1))
        .status()
        .expect("mkfifo");
    assert!(fifo.success());
    std::fs::File::create(at(2))
        .and_then(|f| f.set_len(1 << 40))
        .expect("a sparse terabyte");
    std::os::unix::fs::symlink("../../../../../../../../../../etc/passwd", at(3))
        .expect("a relative link out");

    let config = config(&host, &imds, &format!("ack_dir = {ack:?}\nhold = \"2s\"\n"));
    let agent = Agent::start(&config, &host.socket());
    agent.wait_for_source_on(Duration::from_secs(5), "imds");
    let before = status_kib(agent.pid(), "VmRSS:");
    imds.spot_terminate_in(Duration::from_secs(6));
    wait(Duration::from_secs(5), "every trainer signalled", || {
        trainers.iter().all(|t| t.signals() == ["SIGUSR1"])
    });
    std::fs::write(at(4), "done\n").expect("the honest ack");
    let peak = std::cell::Cell::new(before);
    let s = agent.wait_for(Duration::from_secs(15), |s| {
        peak.set(peak.get().max(status_kib(agent.pid(), "VmRSS:")));
        s["checkpoints"][0]["unconfirmed"]
            .as_array()
            .is_some_and(|u| !u.is_empty())
    });
    let report = &s["checkpoints"][0];
    assert_eq!(report["confirmed"], 1, "{report}");
    let unconfirmed: Vec<u64> = report["unconfirmed"]
        .as_array()
        .map(|u| u.iter().filter_map(serde_json::Value::as_u64).collect())
        .unwrap_or_default();
    let hostile: Vec<u64> = trainers[..4]
        .iter()
        .map(|t| u64::from(t.child.id()))
        .collect();
    assert_eq!(unconfirmed, hostile, "{report}");
    let peak = peak.get();
    assert!(
        peak < before + 16 * 1024,
        "RSS went from {before} KiB to {peak} KiB"
    );
    let log = agent.log();
    assert!(!log.contains("root:"), "a host file reached the log: {log}");
    for (i, why) in [
        "a symbolic link",
        "not a regular file",
        "larger than 4096 bytes",
        "a symbolic link",
    ]
    .iter()
    .enumerate()
    {
        let pid = trainers[i].child.id();
        assert!(
            log.lines().any(|l| l.contains("ack file not read")
                && l.contains(&pid.to_string())
                && l.contains(why)),
            "no refusal ({why}) for {pid}: {log}"
        );
    }
    assert!(agent.stop().success());
}

/// Review M6: the state disk hangs (every save of the checkpoint record stops for a minute
/// before its rename, as on a saturated or failing EBS volume): the Spot notice still
/// signals at once, and the notice file, the only channel of pods that take no signal,
/// appears right after, not when the disk comes back.
#[test]
fn a_hung_state_disk_delays_neither_the_signal_nor_the_notice_file() {
    let host = Host::new();
    let imds = FakeImds::start();
    let gpu = gpu_device(host.dir.path(), "nvidia0");
    let trainer = Trainer::start(host.dir.path(), "handler", "usr1", Some(&gpu), &[]);
    let notice_file = host.dir.path().join("run/notice.json");
    let config = config(&host, &imds, "");
    let agent = Agent::start_with_env(
        &config,
        &host.socket(),
        &[("GPU_AGENT_FAILPOINT", "pause-before-rename:checkpoint.json")],
    );
    agent.wait_for_source_on(Duration::from_secs(5), "imds");
    imds.spot_terminate_in(Duration::from_secs(120));
    wait(Duration::from_secs(5), "the Spot signal", || {
        trainer.signals() == ["SIGUSR1"]
    });
    wait(Duration::from_secs(5), "the notice file", || {
        notice_file.exists()
    });
    // The save runs in the background: it may reach its hang just after the notice file.
    wait(Duration::from_secs(5), "the record's save hanging", || {
        agent.log().contains("failpoint: paused before renaming")
    });
    // The checkpoint report reached the core too.
    agent.wait_for(Duration::from_secs(5), |s| {
        s["checkpoints"]
            .as_array()
            .is_some_and(|c| c.iter().any(|r| r["signalled"] == 1))
    });
    assert!(agent.stop().success());
}
