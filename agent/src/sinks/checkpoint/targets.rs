//! Which processes get the checkpoint signal, and why each is in or out.
//!
//! In: a process that has a file matching `device_glob` open, or one that opted in with
//! `GPU_AGENT_CHECKPOINT_SIGNAL=<SIGNAME>` in its environment; in both cases only if its
//! `SigCgt` shows it catches the signal. The signal: its pod's
//! `gpu-agent.io/checkpoint-signal` annotation ([`declared`](super::declared); `none`: not
//! signalled), else its opt-in, else `[checkpoint] signal`. Out, always: PID 1, the agent
//! itself, kernel threads, system daemons (kubelet, container runtimes, NVIDIA device plugin,
//! DCGM, persistenced, fabric manager, MPS, gpu-agent) plus `[checkpoint] exclude`, matched
//! by executable name as well as by the kernel's 15-character `comm`; launchers (torchrun,
//! DeepSpeed's runner and launcher, Accelerate, NVRx's ft_launcher: they treat a handled
//! signal as the job's death and kill the workers), recognised by the program they run, not
//! by a word anywhere in their arguments; supervisors (a process that only opted in, holds no
//! GPU itself and has a candidate below it: `timeout`, a shell, an init); and forked copies
//! of a target (DataLoader workers inherit the GPU files and the Python handler; the process
//! that owns the job is the one to checkpoint). A child that exec'd a program of its own (a
//! rank that Lightning's launcher or `mp.spawn` started under rank 0) is a target of its own.
//! A process that holds a GPU but does not catch the signal is listed as skipped, never
//! signalled; SIGINT is refused.
//!
//! Every read of a process's files is bounded ([`ProcReader`]): a process stuck in the kernel
//! (D state) is listed as skipped with the file that did not answer, and the scan goes on.

use std::path::Path;

use rustix::process::Signal;
use serde::Serialize;

use super::declared::{self, Ask};
use super::proc_facts::{container_id, executable, ns_pid_in, parse_stat, pod_uid, sigcgt_in};
pub use super::proc_facts::{sigcgt, stat, Stat};
pub use super::verdict::Verdict;
use crate::host::proc_read::{ProcReader, Stuck};
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

/// Launchers, by the program (or Python script or module) they run: they supervise workers
/// and treat a handled signal as the job's end (torchrun forwards it, waits 30 s and SIGKILLs
/// the workers; DeepSpeed's launcher kills the tree).
const LAUNCHERS: &[&str] = &[
    "torchrun",
    "torch.distributed.run",
    "torch.distributed.launch",
    "deepspeed",
    "deepspeed.launcher.runner",
    "deepspeed.launcher.launch",
    "accelerate",
    "accelerate.commands.launch",
    "ft_launcher",
    "nvidia_resiliency_ext.fault_tolerance.launcher",
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
    pub why: Verdict,
    /// Kubernetes pod UID, from its cgroup, where it runs in a pod.
    pub pod_uid: Option<String>,
    /// Its container's ID (the runtime's, from its cgroup), where it runs in a pod.
    pub container_id: Option<String>,
    /// Its PID in its own PID namespace (`NSpid`'s last field): the name of its ack file.
    pub ns_pid: i32,
    /// It holds a GPU device file itself (not only opted in).
    #[serde(skip)]
    pub holds_gpu: bool,
    /// Its memory layout's digest ([`Stat::image`]; else of its command line and
    /// environment): a forked copy has its parent's. 0: not known.
    #[serde(skip)]
    pub image: u64,
    /// A file that decides its verdict did not answer: it is looked at again (its `why` is
    /// the verdict should it never answer).
    #[serde(skip)]
    pub waiting: bool,
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
    /// How long one read of a process's files may take before it is skipped as stuck.
    pub read_deadline: std::time::Duration,
    /// What the pods on this node declare, by pod UID.
    pub declared: declared::ByPod,
    /// Only these pods' processes are signalled (UIDs; their declared leads are due before
    /// the node's); `None`: every pod's.
    pub only_pods: Option<Vec<String>>,
}

/// A path's last part.
fn base(arg: &str) -> &str {
    Path::new(arg)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(arg)
}

/// `python`, `python3`, `python3.11`.
fn is_python(program: &str) -> bool {
    program
        .strip_prefix("python")
        .is_some_and(|v| v.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
}

/// The launcher this command line runs, if any: the program itself (`torchrun ...`,
/// `deepspeed ...`), or the script or module Python runs (`python3 /usr/local/bin/torchrun`,
/// `python -m torch.distributed.run`). A program that merely has a launcher among its
/// arguments (`timeout 3600 torchrun ...`, `bash -c "torchrun ..."`) is none.
fn launcher(cmdline: &[String]) -> Option<&'static str> {
    let find = |word: &str| LAUNCHERS.iter().copied().find(|l| *l == word);
    let program = base(cmdline.first()?);
    if let Some(l) = find(program) {
        return Some(l);
    }
    if !is_python(program) {
        return None;
    }
    let mut args = cmdline.iter().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-m" => return args.next().and_then(|m| find(m)),
            "-c" => return None,
            // Options that take a value.
            "-W" | "-X" | "-Q" => {
                args.next();
            }
            a if a.starts_with("-m") => return find(&a[2..]),
            a if a.starts_with('-') => {}
            script => return find(base(script)),
        }
    }
    None
}

/// Consider every process once; returns those holding a GPU or opted in, and those whose
/// files did not answer in time, listed as skipped (others are not listed). A notice's
/// signalling uses [`Scan`], which looks at those again before it gives up on them.
pub fn scan(sel: &Selection) -> Vec<Candidate> {
    Scan::new(sel).decide(true)
}

/// One scan of the processes, kept so that those whose files did not answer can be looked
/// at again: a trainer whose `cmdline` waits on its memory-map lock (a thread in direct
/// reclaim) answers a second later and is signalled then, not skipped for the notice.
#[derive(Debug)]
pub struct Scan {
    sel: Selection,
    reader: ProcReader,
    /// Every process listed, in PID order, its own verdict (before the rules that relate
    /// processes to each other).
    found: Vec<Candidate>,
}

impl Scan {
    /// Look at every process once.
    pub fn new(sel: &Selection) -> Self {
        let mut reader = ProcReader::new(sel.read_deadline);
        let pids = std::fs::read_dir(&sel.procfs)
            .map(|entries| {
                let mut pids: Vec<i32> = entries
                    .flatten()
                    .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
                    .collect();
                pids.sort_unstable();
                pids
            })
            .unwrap_or_default();
        let found = pids
            .into_iter()
            .filter_map(|pid| consider(sel, &mut reader, pid))
            .collect();
        Self {
            sel: sel.clone(),
            reader,
            found,
        }
    }

    /// What it scans for.
    pub fn selection(&self) -> &Selection {
        &self.sel
    }

    /// Whether a process's files did not answer (it is looked at again by [`Self::again`]).
    pub fn waiting(&self) -> bool {
        self.found.iter().any(|c| c.waiting)
    }

    /// Look again at the processes whose files did not answer.
    pub fn again(&mut self) {
        let (sel, reader) = (&self.sel, &mut self.reader);
        let mut kept = Vec::with_capacity(self.found.len());
        for c in std::mem::take(&mut self.found) {
            if c.waiting {
                kept.extend(consider(sel, reader, c.pid));
            } else {
                kept.push(c);
            }
        }
        self.found = kept;
    }

    /// Every process listed, the rules that relate them applied: a process whose verdict
    /// depends on one still waiting (a supervisor of it, a forked copy's parent) waits too.
    /// `last`: nothing waits any more; a process whose files did not answer is skipped.
    pub fn decide(&mut self, last: bool) -> Vec<Candidate> {
        let mut out = self.found.clone();
        if last {
            for c in &mut out {
                c.waiting = false;
            }
        }
        only_topmost(&self.sel, &mut self.reader, &mut out);
        out
    }
}

/// Supervisors and forked copies are not targets. A target that only opted in (holds no GPU
/// itself) with a target below it is a supervisor (`timeout`, a shell, an init that
/// inherited the opt-in): it would forward or die, so what runs below it is signalled. A
/// target below another target with the same memory layout of its arguments and
/// environment is a forked copy of it (a DataLoader worker, one that renamed itself
/// included): the one above checkpoints for it. A child that exec'd its own program (a rank
/// started by its rank 0) stays a target. A process whose answer depends on one still
/// waiting waits with it.
fn only_topmost(sel: &Selection, reader: &mut ProcReader, candidates: &mut [Candidate]) {
    let ancestors = |reader: &mut ProcReader, c: &Candidate| {
        let mut chain = Vec::new();
        let mut parent = c.ppid;
        // Bounded walk up the tree (a PID cycle in a fake procfs must not hang).
        for _ in 0..64 {
            if parent <= 1 {
                break;
            }
            chain.push(parent);
            let path = sel.procfs.join(parent.to_string()).join("stat");
            match reader
                .read_text(&path)
                .ok()
                .flatten()
                .as_deref()
                .and_then(parse_stat)
            {
                Some(up) => parent = up.ppid,
                None => break,
            }
        }
        chain
    };
    let chains: Vec<Vec<i32>> = candidates.iter().map(|c| ancestors(reader, c)).collect();
    // Who is below `pid`: a would-be target, or one still waiting.
    let below = |pid: i32, what: &dyn Fn(&Candidate) -> bool| {
        candidates
            .iter()
            .zip(&chains)
            .any(|(c, chain)| chain.contains(&pid) && what(c))
    };
    let mut supervisors = Vec::new();
    let mut waits_below = Vec::new();
    for c in candidates
        .iter()
        .filter(|c| c.signal.is_some() && !c.holds_gpu)
    {
        if below(c.pid, &|d| d.signal.is_some() && !d.waiting) {
            supervisors.push(c.pid);
        } else if below(c.pid, &|d| d.waiting) {
            waits_below.push(c.pid);
        }
    }
    let targets: Vec<(i32, String, u64)> = candidates
        .iter()
        .filter(|c| c.signal.is_some() && !c.waiting && !supervisors.contains(&c.pid))
        .map(|c| (c.pid, c.name.clone(), c.image))
        .collect();
    // Still waiting, with their layout (0: not known).
    let waiting: Vec<(i32, u64)> = candidates
        .iter()
        .filter(|c| c.waiting)
        .map(|c| (c.pid, c.image))
        .collect();
    for (c, chain) in candidates.iter_mut().zip(&chains) {
        if c.signal.is_none() || c.waiting {
            continue;
        }
        if supervisors.contains(&c.pid) {
            c.why = Verdict::Supervisor;
            c.signal = None;
            continue;
        }
        let copy_of = chain.iter().find_map(|up| {
            targets
                .iter()
                .find(|(pid, _, image)| pid == up && *image == c.image)
        });
        if let Some((pid, name, _)) = copy_of {
            c.why = Verdict::ForkedCopy {
                pid: *pid,
                name: name.clone(),
            };
            c.signal = None;
            continue;
        }
        let waits_on = chain.iter().find(|up| {
            waiting
                .iter()
                .any(|(pid, image)| pid == *up && (*image == 0 || *image == c.image))
        });
        if let Some(pid) = waits_on.or(waits_below.iter().find(|p| **p == c.pid)) {
            c.waiting = true;
            c.why = Verdict::Waits(*pid);
        }
    }
}

/// One process: `None` when it neither holds a GPU nor opted in; listed as waiting (its
/// verdict "stuck in the kernel") when a file that decides did not answer.
fn consider(sel: &Selection, reader: &mut ProcReader, pid: i32) -> Option<Candidate> {
    let mut known = None;
    match consider_one(sel, reader, pid, &mut known) {
        Ok(candidate) => candidate,
        Err(stuck) => {
            let stat = known.unwrap_or(Stat {
                comm: "?".into(),
                ppid: 0,
                start_time: 0,
                zombie: false,
                image: None,
            });
            tracing::info!(pid, name = %stat.comm, error = %stuck, "A process's procfs files do not answer; it is looked at again.");
            Some(Candidate {
                pid,
                ppid: stat.ppid,
                start_time: stat.start_time,
                name: stat.comm,
                signal: None,
                why: Verdict::Stuck(stuck.to_string()),
                pod_uid: None,
                container_id: None,
                ns_pid: pid,
                holds_gpu: false,
                image: stat.image.unwrap_or(0),
                waiting: true,
            })
        }
    }
}

/// One process: `None` when it neither holds a GPU nor opted in. `known` gets its stat as
/// soon as that is read, so a process stuck later is still named. What qualifies a process
/// is read first, without its memory-map lock (`stat`, `fd`, `status`, `exe`); `environ`
/// only where it can matter (a GPU holder, or one that catches a signal, while opt-in is
/// honoured); `cmdline` and `cgroup` only for a candidate. A `cgroup` read that does not
/// answer (6.1 kernels take the global cgroup mutex, which a node drain's container
/// teardown holds) costs only the pod's name, unless a pod's declaration could change the
/// verdict.
fn consider_one(
    sel: &Selection,
    reader: &mut ProcReader,
    pid: i32,
    known: &mut Option<Stat>,
) -> Result<Option<Candidate>, Stuck> {
    let me = std::process::id();
    let dir = sel.procfs.join(pid.to_string());
    let Some(stat) = reader
        .read_text(&dir.join("stat"))?
        .as_deref()
        .and_then(parse_stat)
    else {
        return Ok(None);
    };
    *known = Some(stat.clone());
    let Stat {
        comm: name,
        ppid,
        start_time,
        image: layout,
        ..
    } = stat;
    let device = reader
        .links_in(&dir.join("fd"))?
        .unwrap_or_default()
        .into_iter()
        .find(|target| sel.device_glob.matches_path(target));
    let status = reader.read_text(&dir.join("status"))?.unwrap_or_default();
    let mask = sigcgt_in(&status);
    let catches_some = mask
        .as_deref()
        .is_some_and(|m| m.chars().any(|c| c.is_ascii_hexdigit() && c != '0'));
    if device.is_none() && !(sel.opt_in_env && catches_some) {
        return Ok(None);
    }
    let environ = if sel.opt_in_env {
        reader.read(&dir.join("environ"))?.unwrap_or_default()
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
    if opt_in.is_none() && device.is_none() {
        return Ok(None);
    }
    let raw_cmdline = reader.read(&dir.join("cmdline"))?.unwrap_or_default();
    let image = match layout {
        Some(layout) => layout,
        None => {
            // No layout shown: the command line and environment, digested, stand in.
            let environ = if environ.is_empty() {
                reader.read(&dir.join("environ"))?.unwrap_or_default()
            } else {
                environ
            };
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            raw_cmdline.hash(&mut h);
            environ.hash(&mut h);
            h.finish()
        }
    };
    let cmdline: Vec<String> = raw_cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let exe = executable(reader, &dir, &cmdline)?;
    let mut candidate = Candidate {
        pid,
        ppid,
        start_time,
        name: name.clone(),
        signal: None,
        why: Verdict::Undecided,
        pod_uid: None,
        container_id: None,
        ns_pid: ns_pid_in(&status).unwrap_or(pid),
        holds_gpu: device.is_some(),
        image,
        waiting: false,
    };
    let pods_matter = !sel.declared.is_empty() || sel.only_pods.is_some();
    match reader.read_text(&dir.join("cgroup")) {
        Ok(Some(cgroup)) => {
            candidate.pod_uid = pod_uid(&cgroup);
            candidate.container_id = candidate.pod_uid.as_ref().and(container_id(&cgroup));
        }
        Ok(None) => {}
        Err(stuck) if pods_matter => return Err(stuck),
        Err(stuck) => {
            tracing::info!(pid, %name, error = %stuck, "A process's cgroup does not answer; its pod is not named.");
        }
    }
    let names = [Some(name.as_str()), exe.as_deref()];
    let excluded = names
        .iter()
        .flatten()
        .find(|n| BUILT_IN_EXCLUDES.contains(n) || sel.exclude.iter().any(|e| e == *n));
    let declared = candidate
        .pod_uid
        .as_ref()
        .and_then(|uid| sel.declared.get(uid))
        .filter(|d| d.ask.is_some());
    let signal = match (declared.and_then(|d| d.ask), &opt_in) {
        (Some(Ask::Signal(s)), _) => Some(s),
        (Some(Ask::Nothing), _) => None,
        (None, Some(requested)) => signals::parse(requested),
        (None, None) => Some(sel.signal),
    };
    candidate.why = if pid == 1 || u32::try_from(pid).is_ok_and(|p| p == me) {
        Verdict::InitOrAgent
    } else if ppid == 2 || ppid == 0 {
        Verdict::KernelThread
    } else if let Some(n) = excluded {
        Verdict::Excluded((*n).to_string())
    } else if let Some(l) = launcher(&cmdline) {
        Verdict::Launcher(l)
    } else if let (Some(d), None) = (declared, signal) {
        Verdict::DeclaredNone { pod: d.pod.clone() }
    } else if let (Some(requested), None) = (&opt_in, signal) {
        Verdict::NotCatchable {
            requested: requested.clone(),
        }
    } else if let Some(why) = signal.and_then(signals::refused) {
        Verdict::Refused(why.to_string())
    } else {
        let signal = signal.unwrap_or(sel.signal);
        let held = device
            .as_ref()
            .map(|dev| format!("holds {}", dev.display()));
        let what = match (declared, &opt_in, held) {
            (Some(d), _, held) => format!(
                "{}pod {} declares {}",
                held.map_or_else(String::new, |h| h + ", "),
                d.pod,
                signals::name(signal)
            ),
            (None, Some(requested), _) => format!("opted in with {OPT_IN_VAR}={requested}"),
            (None, None, Some(held)) => held,
            (None, None, None) => String::new(),
        };
        let asked = declared.is_some() || opt_in.is_some();
        let name = signals::name(signal);
        if !asked && mask.as_deref().is_some_and(signals::catches_everything) {
            Verdict::CatchesEverything { what, signal: name }
        } else if mask.is_some_and(|mask| signals::caught(&mask, signal)) {
            candidate.signal = Some(name.clone());
            Verdict::Target { what, signal: name }
        } else {
            Verdict::NoHandler { what, signal: name }
        }
    };
    Ok(Some(candidate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::checkpoint::Declared;

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
            read_deadline: std::time::Duration::from_millis(100),
            declared: declared::ByPod::new(),
            only_pods: None,
        };
        let found = scan(&sel);
        let why = |pid: i32| {
            let c = found.iter().find(|c| c.pid == pid).expect("listed");
            (c.signal.clone(), c.why.to_string())
        };
        assert!(
            why(100).0.is_none() && why(100).1.contains("launcher"),
            "{:?}",
            why(100)
        );
        assert_eq!(why(101).0.as_deref(), Some("SIGUSR1"), "{:?}", why(101));
        assert!(
            why(102).0.is_none() && why(102).1.contains("forked copy of target 101"),
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

    /// Writes `pid`'s stat with a memory layout (fields 48-51) of `layout`.
    fn with_layout(dir: &Path, pid: i32, ppid: i32, comm: &str, layout: u64) {
        let mut fields = vec!["0".to_string(); 49];
        fields[0] = "S".into();
        fields[1] = ppid.to_string();
        fields[19] = "4242".into();
        for f in &mut fields[45..49] {
            *f = layout.to_string();
        }
        std::fs::write(
            dir.join(pid.to_string()).join("stat"),
            format!("{pid} ({comm}) {}", fields.join(" ")),
        )
        .expect("stat");
    }

    /// Issue 26 (L4): a DataLoader worker that renamed itself (setproctitle rewrites argv
    /// in place) is still a forked copy: it shares its parent's memory layout. A rank that
    /// exec'd the same command line has its own layout and stays a target.
    #[test]
    fn a_forked_copy_is_known_by_its_memory_layout_not_its_words() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc_ = |pid, ppid, cmdline: &'static [&'static str]| Proc {
            pid,
            ppid,
            comm: "python3",
            cmdline,
            exe: "/usr/bin/python3.11",
            gpu: true,
            env: "",
        };
        fake(dir.path(), &proc_(600, 1, &["python3", "train.py"]));
        fake(dir.path(), &proc_(601, 600, &["pt_data_worker"]));
        fake(dir.path(), &proc_(602, 600, &["python3", "train.py"]));
        with_layout(dir.path(), 600, 1, "python3", 1000);
        with_layout(dir.path(), 601, 600, "pt_data_worker", 1000);
        with_layout(dir.path(), 602, 600, "python3", 2000);
        let found = scan(&sel(dir.path(), declared::ByPod::new()));
        assert_eq!(outcome(&found, 600).0.as_deref(), Some("SIGUSR1"));
        let (signal, why) = outcome(&found, 601);
        assert!(
            signal.is_none() && why.contains("forked copy of target 600"),
            "{why}"
        );
        assert_eq!(outcome(&found, 602).0.as_deref(), Some("SIGUSR1"));
    }

    /// Issue 26 (M1): a trainer whose `cmdline` does not answer in time (its memory-map lock
    /// held in direct reclaim) waits, and so does its forked copy; once the read answers, a
    /// second look makes it a target and its copy is skipped. Only after the last look is a
    /// process that never answers skipped as stuck.
    #[test]
    fn a_slow_read_waits_for_the_next_look_not_the_next_notice() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc_ = |pid, ppid| Proc {
            pid,
            ppid,
            comm: "python3",
            cmdline: &["python3", "train.py"],
            exe: "/usr/bin/python3.11",
            gpu: true,
            env: "",
        };
        fake(dir.path(), &proc_(700, 1));
        fake(dir.path(), &proc_(701, 700));
        with_layout(dir.path(), 700, 1, "python3", 7);
        with_layout(dir.path(), 701, 700, "python3", 7);
        let cmdline = dir.path().join("700/cmdline");
        std::fs::remove_file(&cmdline).expect("rm");
        crate::host::proc_read::fifo(&cmdline);
        let mut scan = Scan::new(&sel(dir.path(), declared::ByPod::new()));
        assert!(scan.waiting());
        let first = scan.decide(false);
        let c = |found: &[Candidate], pid: i32| {
            found
                .iter()
                .find(|c| c.pid == pid)
                .cloned()
                .expect("listed")
        };
        assert!(c(&first, 700).waiting && c(&first, 700).signal.is_none());
        let copy = c(&first, 701);
        assert!(
            copy.waiting && copy.why.to_string().contains("waits for process 700"),
            "{}",
            copy.why
        );
        // The read answers (a writer comes: the stuck reader may close the pipe before the
        // write ends, so its result is not asked); the next look sees a plain file.
        let fifo = cmdline.clone();
        let _ = std::thread::spawn(move || std::fs::write(fifo, b"python3\0train.py")).join();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            std::fs::remove_file(&cmdline).ok();
            std::fs::write(&cmdline, "python3\0train.py").expect("cmdline");
            scan.again();
            if !scan.waiting() || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let second = scan.decide(false);
        assert_eq!(c(&second, 700).signal.as_deref(), Some("SIGUSR1"));
        let copy = c(&second, 701);
        assert!(
            copy.signal.is_none() && copy.why.to_string().contains("forked copy of target 700")
        );
    }

    /// Issue 22: a process in D state blocked the scan (its `environ` read never returned),
    /// nobody was signalled and the sink was stuck until restart.
    #[test]
    fn a_process_whose_files_never_answer_is_skipped_and_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let trainer = |pid| Proc {
            pid,
            ppid: 1,
            comm: "python3",
            cmdline: &["python3", "train.py"],
            exe: "/usr/bin/python3.11",
            gpu: true,
            env: "",
        };
        fake(dir.path(), &trainer(500));
        fake(dir.path(), &trainer(501));
        fake(dir.path(), &trainer(502));
        // 501 is stuck in the kernel: reading its environment never returns.
        let environ = dir.path().join("501/environ");
        std::fs::remove_file(&environ).expect("rm");
        crate::host::proc_read::fifo(&environ);
        let sel = Selection {
            procfs: dir.path().to_path_buf(),
            signal: Signal::USR1,
            device_glob: glob::Pattern::new("/dev/nvidia[0-9]*").expect("glob"),
            exclude: Vec::new(),
            opt_in_env: true,
            read_deadline: std::time::Duration::from_millis(100),
            declared: declared::ByPod::new(),
            only_pods: None,
        };
        let started = std::time::Instant::now();
        let found = scan(&sel);
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        let signal = |pid: i32| found.iter().find(|c| c.pid == pid).expect("listed");
        assert_eq!(signal(500).signal.as_deref(), Some("SIGUSR1"));
        assert_eq!(signal(502).signal.as_deref(), Some("SIGUSR1"));
        let stuck = signal(501);
        assert_eq!(
            (stuck.signal.as_deref(), stuck.name.as_str()),
            (None, "python3")
        );
        assert!(
            stuck.why.to_string().contains("stuck in the kernel")
                && stuck.why.to_string().contains("501/environ"),
            "{}",
            stuck.why
        );
        // A second scan does not wait for it again.
        let again = std::time::Instant::now();
        let found = scan(&sel);
        assert!(again.elapsed() < std::time::Duration::from_millis(90));
        assert_eq!(found.len(), 3);
        // Unblock the stuck reader thread.
        let _ = std::fs::write(&environ, b"");
    }

    #[test]
    fn launchers_by_the_program_they_run() {
        let l =
            |args: &[&str]| launcher(&args.iter().map(|a| (*a).to_string()).collect::<Vec<_>>());
        assert_eq!(
            l(&["/usr/local/bin/torchrun", "train.py"]),
            Some("torchrun")
        );
        assert_eq!(
            l(&[
                "/usr/bin/python3.11",
                "/usr/local/bin/torchrun",
                "--nproc-per-node",
                "8"
            ]),
            Some("torchrun")
        );
        assert_eq!(
            l(&["python", "-u", "-m", "torch.distributed.run", "train.py"]),
            Some("torch.distributed.run")
        );
        assert_eq!(
            l(&[
                "python3",
                "-u",
                "-m",
                "deepspeed.launcher.launch",
                "--world_info=x"
            ]),
            Some("deepspeed.launcher.launch")
        );
        assert_eq!(
            l(&["python3", "/usr/local/bin/deepspeed", "train.py"]),
            Some("deepspeed")
        );
        assert_eq!(
            l(&["python3", "/usr/local/bin/ft_launcher", "t.py"]),
            Some("ft_launcher")
        );
        assert_eq!(l(&["accelerate", "launch", "t.py"]), Some("accelerate"));
        // Arguments that merely mention a launcher.
        assert_eq!(l(&["timeout", "3600", "torchrun", "train.py"]), None);
        assert_eq!(l(&["bash", "-c", "torchrun train.py"]), None);
        assert_eq!(l(&["python3", "train.py", "torchrun"]), None);
        assert_eq!(l(&["python3", "-c", "import torchrun"]), None);
        // A worker torchrun started.
        assert_eq!(
            l(&["/usr/bin/python3", "-u", "train.py", "--local-rank=0"]),
            None
        );
    }

    fn sel(dir: &Path, declared: declared::ByPod) -> Selection {
        Selection {
            procfs: dir.to_path_buf(),
            signal: Signal::USR1,
            device_glob: glob::Pattern::new("/dev/nvidia[0-9]*").expect("glob"),
            exclude: Vec::new(),
            opt_in_env: true,
            read_deadline: std::time::Duration::from_millis(100),
            declared,
            only_pods: None,
        }
    }

    fn outcome(found: &[Candidate], pid: i32) -> (Option<String>, String) {
        let c = found.iter().find(|c| c.pid == pid).expect("listed");
        (c.signal.clone(), c.why.to_string())
    }

    /// Issue 22: Lightning's DDP launcher and `mp.spawn` start ranks as children of rank 0;
    /// each is a target. A `timeout` parent that inherited the opt-in is a supervisor.
    #[test]
    fn ranks_started_by_rank_0_are_targets_and_supervisors_are_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let opt_in = "GPU_AGENT_CHECKPOINT_SIGNAL=SIGUSR1\0";
        for p in [
            // timeout -> rank 0 -> rank 1 (Lightning re-runs the script with LOCAL_RANK=1)
            Proc {
                pid: 10,
                ppid: 1,
                comm: "timeout",
                cmdline: &["timeout", "3600", "python3", "fit.py"],
                exe: "/usr/bin/timeout",
                gpu: false,
                env: opt_in,
            },
            Proc {
                pid: 11,
                ppid: 10,
                comm: "python3",
                cmdline: &["python3", "fit.py"],
                exe: "/usr/bin/python3.11",
                gpu: true,
                env: opt_in,
            },
            Proc {
                pid: 12,
                ppid: 11,
                comm: "python3",
                cmdline: &["python3", "fit.py"],
                exe: "/usr/bin/python3.11",
                gpu: true,
                env: "GPU_AGENT_CHECKPOINT_SIGNAL=SIGUSR1\0LOCAL_RANK=1\0",
            },
            // mp.spawn: a fresh interpreter with its own command line.
            Proc {
                pid: 13,
                ppid: 11,
                comm: "python3",
                cmdline: &[
                    "python3",
                    "-c",
                    "from multiprocessing.spawn import spawn_main; spawn_main()",
                    "--multiprocessing-fork",
                ],
                exe: "/usr/bin/python3.11",
                gpu: true,
                env: opt_in,
            },
            // A forked DataLoader worker of rank 1.
            Proc {
                pid: 14,
                ppid: 12,
                comm: "pt_data_worker",
                cmdline: &["python3", "fit.py"],
                exe: "/usr/bin/python3.11",
                gpu: true,
                env: "GPU_AGENT_CHECKPOINT_SIGNAL=SIGUSR1\0LOCAL_RANK=1\0",
            },
        ] {
            fake(dir.path(), &p);
        }
        let found = scan(&sel(dir.path(), declared::ByPod::new()));
        let (signal, why) = outcome(&found, 10);
        assert!(signal.is_none() && why.contains("supervises"), "{why}");
        for rank in [11, 12, 13] {
            assert_eq!(
                outcome(&found, rank).0.as_deref(),
                Some("SIGUSR1"),
                "{:?}",
                outcome(&found, rank)
            );
        }
        let (signal, why) = outcome(&found, 14);
        assert!(
            signal.is_none() && why.contains("forked copy of target 12"),
            "{why}"
        );
    }

    #[test]
    fn the_pods_declaration_chooses_the_signal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let uid = "1b4c7e9a-2f6d-4c1e-9a0b-3d5e7f9a1c2b";
        for (pid, env) in [(20, ""), (21, "GPU_AGENT_CHECKPOINT_SIGNAL=SIGUSR2\0")] {
            fake(
                dir.path(),
                &Proc {
                    pid,
                    ppid: 1,
                    comm: "python3",
                    cmdline: &["python3", "train.py"],
                    exe: "/usr/bin/python3",
                    gpu: true,
                    env,
                },
            );
            std::fs::write(
                dir.path().join(format!("{pid}/cgroup")),
                format!("0::/kubepods/burstable/pod{uid}/{}\n", "a".repeat(64)),
            )
            .expect("cgroup");
            // SIGTERM (bit 15) and SIGUSR1 caught; in a PID namespace as 7.
            std::fs::write(
                dir.path().join(format!("{pid}/status")),
                "NSpid:\t20\t7\nSigCgt:\t0000000000004200\n",
            )
            .expect("status");
        }
        let annotations = |signal: &str| {
            [(declared::SIGNAL_ANNOTATION.to_string(), signal.to_string())]
                .into_iter()
                .collect()
        };
        let by_pod = |signal: &str| {
            let mut m = declared::ByPod::new();
            m.insert(
                uid.into(),
                Declared::from_annotations("ml/train", &annotations(signal)).expect("declared"),
            );
            m
        };
        let found = scan(&sel(dir.path(), by_pod("SIGTERM")));
        for pid in [20, 21] {
            let (signal, why) = outcome(&found, pid);
            assert_eq!(signal.as_deref(), Some("SIGTERM"), "{why}");
            assert!(why.contains("pod ml/train declares SIGTERM"), "{why}");
        }
        assert_eq!(found[0].ns_pid, 7);
        let found = scan(&sel(dir.path(), by_pod("none")));
        let (signal, why) = outcome(&found, 20);
        assert!(
            signal.is_none() && why.contains("declares gpu-agent.io/checkpoint-signal none"),
            "{why}"
        );
        // Undeclared: the opt-in, else the default.
        let found = scan(&sel(dir.path(), declared::ByPod::new()));
        assert_eq!(outcome(&found, 20).0.as_deref(), Some("SIGUSR1"));
        let (signal, why) = outcome(&found, 21);
        assert!(
            signal.is_none() && why.contains("does not handle SIGUSR2"),
            "{why}"
        );
    }

    /// Issue 22 (Low): a Go program's SigCgt shows every signal caught, so it was always a
    /// target, and a shutdown waited the whole hold for a process that ignores the signal.
    #[test]
    fn a_go_program_is_signalled_only_when_asked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = "GPU_AGENT_CHECKPOINT_SIGNAL=SIGUSR1\0";
        for (pid, env) in [(30, ""), (31, env)] {
            fake(
                dir.path(),
                &Proc {
                    pid,
                    ppid: 1,
                    comm: "inference",
                    cmdline: &["/app/inference"],
                    exe: "/app/inference",
                    gpu: true,
                    env,
                },
            );
            std::fs::write(
                dir.path().join(format!("{pid}/status")),
                "SigCgt:\tfffffffe7fc1feff\n",
            )
            .expect("status");
        }
        let found = scan(&sel(dir.path(), declared::ByPod::new()));
        let (signal, why) = outcome(&found, 30);
        assert!(
            signal.is_none() && why.contains("catches every signal"),
            "{why}"
        );
        assert_eq!(
            outcome(&found, 31).0.as_deref(),
            Some("SIGUSR1"),
            "opted in"
        );
    }
}
