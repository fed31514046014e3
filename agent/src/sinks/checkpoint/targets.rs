//! Which processes get the checkpoint signal, and why each is in or out.
//!
//! In: a process that opted in with `GPU_AGENT_CHECKPOINT_SIGNAL=<SIGNAME>` in its environment
//! (that signal), or one that has a file matching `device_glob` open; in both cases only if
//! its `SigCgt` shows it catches the signal. Out, always: PID 1, the agent itself, kernel
//! threads, system daemons (kubelet, container runtimes, NVIDIA device plugin, DCGM,
//! persistenced, fabric manager, MPS, gpu-agent) plus `[checkpoint] exclude`, matched by
//! executable name as well as by the kernel's 15-character `comm`; launchers (torchrun,
//! DeepSpeed, Accelerate: they treat a handled signal as the job's death and kill the
//! workers); and the descendants of a target (forked DataLoader workers inherit the GPU files
//! and the Python handler, but the process that owns the job is the one to checkpoint). A
//! process that holds a GPU but does not catch the signal is listed as skipped, never
//! signalled; an opt-in asking for SIGINT is refused.

use std::path::Path;

use rustix::process::Signal;
use serde::Serialize;

use crate::model::signal as signals;

/// The opt-in variable.
pub const OPT_IN_VAR: &str = "GPU_AGENT_CHECKPOINT_SIGNAL";

/// Process names never signalled: executable names and the kernel's 15-character `comm`.
const BUILT_IN_EXCLUDES: &[&str] = &[
    "kubelet",
    "containerd",
    "containerd-shim",
    "containerd-shim-runc-v2",
    "dockerd",
    "crio",
    "conmon",
    "runc",
    "nvidia-device-p",
    "nvidia-device-plugin",
    "k8s-device-plug",
    "dcgm",
    "nv-hostengine",
    "dcgm-exporter",
    "dcgmi",
    "nvidia-persistenced",
    "nvidia-persiste",
    "nv-fabricmanager",
    "nv-fabricmanage",
    "nvidia-cuda-mps-server",
    "nvidia-cuda-mps-control",
    "gpu-agent",
    "systemd",
    "systemd-logind",
    "sshd",
    "init",
];

/// Launchers, by a word of their command line: they supervise workers and treat a handled
/// signal as the job's end (torchrun forwards it, waits 30 s and SIGKILLs the workers).
const LAUNCHERS: &[&str] = &[
    "torchrun",
    "torch.distributed.run",
    "torch.distributed.launch",
    "deepspeed",
    "deepspeed.launcher.launch",
    "accelerate",
];

/// One process considered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// PID.
    pub pid: i32,
    /// Parent PID.
    pub ppid: i32,
    /// Start time in clock ticks since boot (with the PID, the process's identity).
    pub start_time: u64,
    /// Process name.
    pub name: String,
    /// The signal it gets, if it is a target.
    pub signal: Option<String>,
    /// Why it is in or out.
    pub why: String,
    /// Kubernetes pod UID, from its cgroup, where it runs in a pod.
    pub pod_uid: Option<String>,
    /// Its container's ID (the runtime's, from its cgroup), where it runs in a pod.
    pub container_id: Option<String>,
}

/// What a scan needs.
#[derive(Debug, Clone)]
pub struct Selection {
    /// procfs root.
    pub procfs: std::path::PathBuf,
    /// The default signal.
    pub signal: Signal,
    /// Device files that mark a GPU process.
    pub device_glob: glob::Pattern,
    /// Extra names never signalled.
    pub exclude: Vec<String>,
    /// Honour the opt-in variable.
    pub opt_in_env: bool,
}

fn read(path: &Path) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// What `/proc/PID/stat` says of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The kernel's 15-character command name.
    pub comm: String,
    /// Parent PID.
    pub ppid: i32,
    /// Start time in clock ticks since boot.
    pub start_time: u64,
    /// Exited, waiting for its parent to reap it (state `Z` or `X`).
    pub zombie: bool,
}

/// `/proc/PID/stat`, parsed (comm may hold spaces and parentheses).
pub fn stat(procfs: &Path, pid: i32) -> Option<Stat> {
    let text = read(&procfs.join(pid.to_string()).join("stat"))?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // After the comm: state(0) ppid(1) ... starttime is field 22 overall, index 19 here.
    Some(Stat {
        comm: text[open + 1..close].to_string(),
        ppid: fields.get(1)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
        zombie: matches!(fields.first(), Some(&"Z" | &"X")),
    })
}

/// The `SigCgt` mask from `/proc/PID/status`.
pub fn sigcgt(procfs: &Path, pid: i32) -> Option<String> {
    read(&procfs.join(pid.to_string()).join("status"))?
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:").map(|v| v.trim().to_string()))
}

fn pod_uid(cgroup: &str) -> Option<String> {
    // cgroupfs: .../kubepods/burstable/pod<uid>/...; systemd: ...kubepods-burstable-pod<uid_with_underscores>.slice
    if !cgroup.contains("kubepods") {
        return None;
    }
    cgroup.split(['/', '\n']).find_map(|part| {
        let at = part.rfind("pod")?;
        let uid = part[at + 3..].trim_end_matches(".slice").replace('_', "-");
        (uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')).then_some(uid)
    })
}

/// The container ID in a pod's cgroup path (the first hierarchy that names the pod): its
/// last part, as the runtime names it (`cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `docker-<id>.scope` with the systemd driver; `<id>` with cgroupfs).
fn container_id(cgroup: &str) -> Option<String> {
    let line = cgroup.lines().find(|l| l.contains("kubepods"))?;
    let last = line.rsplit('/').next()?;
    let last = last.strip_suffix(".scope").unwrap_or(last);
    let id = ["cri-containerd-", "crio-", "docker-", "containerd-"]
        .iter()
        .find_map(|p| last.strip_prefix(p))
        .unwrap_or(last);
    (id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_string())
}

/// The executable's file name (`/proc/PID/exe`, else the command line's first word).
fn executable(dir: &Path, cmdline: &[String]) -> Option<String> {
    std::fs::read_link(dir.join("exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| {
            cmdline
                .first()
                .and_then(|a| Path::new(a).file_name())
                .map(|n| n.to_string_lossy().into_owned())
        })
}

/// The launcher this command line runs, if any (`torchrun ...`, `python -m torch.distributed.run ...`).
fn launcher(cmdline: &[String]) -> Option<&'static str> {
    cmdline.iter().take(3).find_map(|arg| {
        let word = Path::new(arg)
            .file_name()
            .map_or(arg.as_str(), |n| n.to_str().unwrap_or_default());
        LAUNCHERS.iter().copied().find(|l| *l == word)
    })
}

/// Consider every process; returns those holding a GPU or opted in (others are not listed).
pub fn scan(sel: &Selection) -> Vec<Candidate> {
    let mut out = consider(sel);
    only_topmost(sel, &mut out);
    out
}

/// A target whose ancestor is also a target is its child (a forked worker): skipped.
fn only_topmost(sel: &Selection, candidates: &mut [Candidate]) {
    let targets: Vec<(i32, String)> = candidates
        .iter()
        .filter(|c| c.signal.is_some())
        .map(|c| (c.pid, c.name.clone()))
        .collect();
    for c in candidates.iter_mut().filter(|c| c.signal.is_some()) {
        let mut parent = c.ppid;
        // Bounded walk up the tree (a PID cycle in a fake procfs must not hang).
        for _ in 0..64 {
            if parent <= 1 {
                break;
            }
            if let Some((pid, name)) = targets.iter().find(|(pid, _)| *pid == parent) {
                c.why = format!(
                    "skipped: child of target {pid} ({name}), which checkpoints for it (forked \
                     workers inherit the GPU files and the handler)"
                );
                c.signal = None;
                break;
            }
            match stat(&sel.procfs, parent) {
                Some(up) => parent = up.ppid,
                None => break,
            }
        }
    }
}

fn consider(sel: &Selection) -> Vec<Candidate> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir(&sel.procfs) else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect();
    pids.sort_unstable();
    let mut out = Vec::new();
    for pid in pids {
        let dir = sel.procfs.join(pid.to_string());
        let Some(Stat {
            comm: name,
            ppid,
            start_time,
            ..
        }) = stat(&sel.procfs, pid)
        else {
            continue;
        };
        let environ = if sel.opt_in_env {
            std::fs::read(dir.join("environ")).unwrap_or_default()
        } else {
            Vec::new()
        };
        let opt_in = environ.split(|b| *b == 0).find_map(|kv| {
            std::str::from_utf8(kv)
                .ok()?
                .strip_prefix(OPT_IN_VAR)?
                .strip_prefix('=')
                .map(str::to_string)
        });
        let device = std::fs::read_dir(dir.join("fd")).ok().and_then(|fds| {
            fds.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .find(|target| sel.device_glob.matches_path(target))
        });
        if opt_in.is_none() && device.is_none() {
            continue;
        }
        let cmdline: Vec<String> = std::fs::read(dir.join("cmdline"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let exe = executable(&dir, &cmdline);
        let mut candidate = Candidate {
            pid,
            ppid,
            start_time,
            name: name.clone(),
            signal: None,
            why: String::new(),
            pod_uid: None,
            container_id: None,
        };
        if let Some(cgroup) = read(&dir.join("cgroup")) {
            candidate.pod_uid = pod_uid(&cgroup);
            candidate.container_id = candidate.pod_uid.as_ref().and(container_id(&cgroup));
        }
        let names = [Some(name.as_str()), exe.as_deref()];
        let excluded = names
            .iter()
            .flatten()
            .find(|n| BUILT_IN_EXCLUDES.contains(n) || sel.exclude.iter().any(|e| e == *n));
        let signal = match &opt_in {
            Some(requested) => signals::parse(requested),
            None => Some(sel.signal),
        };
        candidate.why = if pid == 1 || u32::try_from(pid).is_ok_and(|p| p == me) {
            "skipped: init or the agent itself".into()
        } else if ppid == 2 || ppid == 0 {
            "skipped: kernel thread".into()
        } else if let Some(n) = excluded {
            format!("skipped: {n} is a system daemon (excluded)")
        } else if let Some(l) = launcher(&cmdline) {
            format!(
                "skipped: {l} is a launcher: its workers are signalled (a launcher treats a \
                 handled signal as the job's death and kills them)"
            )
        } else if let (Some(requested), None) = (&opt_in, signal) {
            format!(
                "skipped: opted in with {OPT_IN_VAR}={requested}, which is not a catchable signal"
            )
        } else if let Some(why) = signal.and_then(signals::refused) {
            format!("skipped: opted in with {OPT_IN_VAR}: {why}")
        } else {
            let signal = signal.unwrap_or(sel.signal);
            let what = match (&opt_in, &device) {
                (Some(requested), _) => format!("opted in with {OPT_IN_VAR}={requested}"),
                (None, Some(dev)) => format!("holds {}", dev.display()),
                (None, None) => String::new(),
            };
            if sigcgt(&sel.procfs, pid).is_some_and(|mask| signals::caught(&mask, signal)) {
                candidate.signal = Some(signals::name(signal));
                format!("target: {what} and handles {}", signals::name(signal))
            } else {
                format!(
                    "skipped: {what} but does not handle {} (it would be killed)",
                    signals::name(signal)
                )
            }
        };
        out.push(candidate);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake procfs process: comm, parent, command line, executable, and whether it holds
    /// the GPU and catches SIGUSR1 (bit 10) / SIGINT (bit 2).
    struct Proc<'a> {
        pid: i32,
        ppid: i32,
        comm: &'a str,
        cmdline: &'a [&'a str],
        exe: &'a str,
        gpu: bool,
        env: &'a str,
    }

    fn fake(dir: &Path, p: &Proc<'_>) {
        let d = dir.join(p.pid.to_string());
        std::fs::create_dir_all(d.join("fd")).expect("dirs");
        std::fs::write(
            d.join("stat"),
            format!(
                "{} ({}) S {} 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 4242 0 0",
                p.pid, p.comm, p.ppid
            ),
        )
        .expect("stat");
        std::fs::write(d.join("status"), "SigCgt:\t0000000000000202\n").expect("status");
        std::fs::write(d.join("cmdline"), p.cmdline.join("\0")).expect("cmdline");
        std::fs::write(d.join("environ"), p.env).expect("environ");
        std::os::unix::fs::symlink(p.exe, d.join("exe")).expect("exe");
        if p.gpu {
            std::os::unix::fs::symlink("/dev/nvidia0", d.join("fd/3")).expect("fd");
        }
    }

    #[test]
    fn only_the_owner_of_the_job_is_a_target() {
        let dir = tempfile::tempdir().expect("tempdir");
        let procs = [
            // torchrun (holds the GPU here, to prove the launcher rule) and its worker, whose
            // DataLoader worker was forked with the GPU files and the handler.
            Proc {
                pid: 100,
                ppid: 1,
                comm: "torchrun",
                cmdline: &["/usr/bin/python3", "/usr/local/bin/torchrun", "train.py"],
                exe: "/usr/bin/python3.11",
                gpu: true,
                env: "",
            },
            Proc {
                pid: 101,
                ppid: 100,
                comm: "python3",
                cmdline: &["/usr/bin/python3", "train.py"],
                exe: "/usr/bin/python3.11",
                gpu: true,
                env: "",
            },
            Proc {
                pid: 102,
                ppid: 101,
                comm: "pt_data_worker",
                cmdline: &["/usr/bin/python3", "train.py"],
                exe: "/usr/bin/python3.11",
                gpu: true,
                env: "",
            },
            // MPS: comm is cut to 15 characters; the executable name matches.
            Proc {
                pid: 200,
                ppid: 1,
                comm: "nvidia-cuda-mps",
                cmdline: &["nvidia-cuda-mps-server"],
                exe: "/usr/bin/nvidia-cuda-mps-server",
                gpu: true,
                env: "",
            },
            // A long executable name excluded by config, with a short comm.
            Proc {
                pid: 300,
                ppid: 1,
                comm: "long-named-serv",
                cmdline: &["/opt/long-named-server-bin"],
                exe: "/opt/long-named-server-bin",
                gpu: true,
                env: "",
            },
            // Opted in for SIGINT: refused.
            Proc {
                pid: 400,
                ppid: 1,
                comm: "python3",
                cmdline: &["python3", "job.py"],
                exe: "/usr/bin/python3.11",
                gpu: false,
                env: "GPU_AGENT_CHECKPOINT_SIGNAL=SIGINT",
            },
        ];
        for p in &procs {
            fake(dir.path(), p);
        }
        let sel = Selection {
            procfs: dir.path().to_path_buf(),
            signal: Signal::USR1,
            device_glob: glob::Pattern::new("/dev/nvidia[0-9]*").expect("glob"),
            exclude: vec!["long-named-server-bin".into()],
            opt_in_env: true,
        };
        let found = scan(&sel);
        let why = |pid: i32| {
            let c = found.iter().find(|c| c.pid == pid).expect("listed");
            (c.signal.clone(), c.why.clone())
        };
        assert!(
            why(100).0.is_none() && why(100).1.contains("launcher"),
            "{:?}",
            why(100)
        );
        assert_eq!(why(101).0.as_deref(), Some("SIGUSR1"), "{:?}", why(101));
        assert!(
            why(102).0.is_none() && why(102).1.contains("child of target 101"),
            "{:?}",
            why(102)
        );
        assert!(
            why(200).0.is_none() && why(200).1.contains("nvidia-cuda-mps-server"),
            "{:?}",
            why(200)
        );
        assert!(
            why(300).0.is_none() && why(300).1.contains("excluded"),
            "{:?}",
            why(300)
        );
        assert!(
            why(400).0.is_none() && why(400).1.contains("SIGINT is refused"),
            "{:?}",
            why(400)
        );
    }

    #[test]
    fn pod_uid_from_either_cgroup_driver() {
        assert_eq!(
            pod_uid("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b4c7e9a_2f6d_4c1e_9a0b_3d5e7f9a1c2b.slice/cri-containerd-abc.scope"),
            Some("1b4c7e9a-2f6d-4c1e-9a0b-3d5e7f9a1c2b".into())
        );
        assert_eq!(
            pod_uid("0::/kubepods/burstable/pod1b4c7e9a-2f6d-4c1e-9a0b-3d5e7f9a1c2b/abcdef"),
            Some("1b4c7e9a-2f6d-4c1e-9a0b-3d5e7f9a1c2b".into())
        );
        assert_eq!(pod_uid("0::/user.slice/user-0.slice/session-1.scope"), None);
        let id = "a".repeat(64);
        assert_eq!(
            container_id(&format!("0::/kubepods.slice/kubepods-pod1b4c7e9a_2f6d_4c1e_9a0b_3d5e7f9a1c2b.slice/cri-containerd-{id}.scope\n")).as_deref(),
            Some(id.as_str())
        );
        assert_eq!(
            container_id(&format!(
                "0::/kubepods/besteffort/pod1b4c7e9a-2f6d-4c1e-9a0b-3d5e7f9a1c2b/{id}"
            ))
            .as_deref(),
            Some(id.as_str())
        );
        assert_eq!(
            container_id("0::/kubepods/burstable/pod1b4c7e9a-2f6d-4c1e-9a0b-3d5e7f9a1c2b"),
            None
        );
        // cgroup v1: one line per hierarchy, the unified one last and empty.
        assert_eq!(
            container_id(&format!(
                "8:pids:/kubepods/burstable/pod1b4c7e9a-2f6d-4c1e-9a0b-3d5e7f9a1c2b/{id}\n0::/\n"
            ))
            .as_deref(),
            Some(id.as_str())
        );
    }
}
