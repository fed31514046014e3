//! Why a process is, or is not, signalled: one value that renders itself as the status text
//! (`not_signalled`), the journal line and the metric label, so none of them is parsed back
//! out of another.

use std::fmt;

use super::declared::SIGNAL_ANNOTATION;
use super::targets::OPT_IN_VAR;

/// The verdict on one process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Verdict {
    /// Not decided yet.
    #[default]
    Undecided,
    /// Signalled: `what` qualifies it (`holds /dev/nvidia3`, a pod's declaration, an
    /// opt-in), and it handles `signal`.
    Target {
        /// What qualifies it.
        what: String,
        /// The signal's name.
        signal: String,
    },
    /// PID 1 or the agent itself.
    InitOrAgent,
    /// A kernel thread.
    KernelThread,
    /// A system daemon (built in or `[checkpoint] exclude`), by this name.
    Excluded(String),
    /// A launcher (torchrun, DeepSpeed, Accelerate, NVRx): its workers are signalled.
    Launcher(&'static str),
    /// Its pod declares `gpu-agent.io/checkpoint-signal: none`.
    DeclaredNone {
        /// `namespace/name`.
        pod: String,
    },
    /// It opted in with a value that is not a catchable signal.
    NotCatchable {
        /// What it asked for.
        requested: String,
    },
    /// It opted in with a signal that is refused (SIGINT).
    Refused(String),
    /// It catches every signal (a Go runtime) and was not asked for by its pod or opt-in.
    CatchesEverything {
        /// What qualifies it.
        what: String,
        /// The signal's name.
        signal: String,
    },
    /// It does not handle the signal: signalling it would kill it.
    NoHandler {
        /// What qualifies it.
        what: String,
        /// The signal's name.
        signal: String,
    },
    /// It only supervises targets below it (a `timeout`, a shell, an init).
    Supervisor,
    /// A forked copy of target `pid` (`name`), which checkpoints for it.
    ForkedCopy {
        /// The target's PID.
        pid: i32,
        /// The target's name.
        name: String,
    },
    /// Its verdict waits on process `pid`, whose files did not answer.
    Waits(i32),
    /// A file that decides did not answer: stuck in the kernel.
    Stuck(String),
}

impl Verdict {
    /// The metric label of a process not signalled (`gpu_agent_checkpoint_targets_skipped`).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Undecided | Self::Target { .. } => "other",
            Self::InitOrAgent => "init",
            Self::KernelThread => "kernel-thread",
            Self::Excluded(_) => "excluded",
            Self::Launcher(_) => "launcher",
            Self::DeclaredNone { .. } => "declared-none",
            Self::NotCatchable { .. } => "not-catchable",
            Self::Refused(_) => "refused",
            Self::CatchesEverything { .. } => "catches-everything",
            Self::NoHandler { .. } => "no-handler",
            Self::Supervisor => "supervisor",
            Self::ForkedCopy { .. } => "forked-copy",
            Self::Waits(_) => "waiting",
            Self::Stuck(_) => "stuck",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Undecided => Ok(()),
            Self::Target { what, signal } => write!(f, "target: {what} and handles {signal}"),
            Self::InitOrAgent => f.write_str("skipped: init or the agent itself"),
            Self::KernelThread => f.write_str("skipped: kernel thread"),
            Self::Excluded(name) => write!(f, "skipped: {name} is a system daemon (excluded)"),
            Self::Launcher(name) => write!(
                f,
                "skipped: {name} is a launcher: its workers are signalled (a launcher treats a \
                 handled signal as the job's death and kills them)"
            ),
            Self::DeclaredNone { pod } => write!(
                f,
                "skipped: pod {pod} declares {SIGNAL_ANNOTATION} none (it reads the notice file)"
            ),
            Self::NotCatchable { requested } => write!(
                f,
                "skipped: opted in with {OPT_IN_VAR}={requested}, which is not a catchable signal"
            ),
            Self::Refused(why) => write!(f, "skipped: opted in with {OPT_IN_VAR}: {why}"),
            Self::CatchesEverything { what, signal } => write!(
                f,
                "skipped: {what} but catches every signal (a Go program's runtime does, and \
                 ignores {signal}): declare the signal on its pod or opt in to signal it"
            ),
            Self::NoHandler { what, signal } => write!(
                f,
                "skipped: {what} but does not handle {signal} (it would be killed)"
            ),
            Self::Supervisor => f.write_str(
                "skipped: supervises other targets and holds no GPU itself (a `timeout`, shell \
                 or init forwards a signal or dies of it): the processes below it are signalled",
            ),
            Self::ForkedCopy { pid, name } => write!(
                f,
                "skipped: a forked copy of target {pid} ({name}), which checkpoints for it \
                 (forked workers inherit the GPU files and the handler)"
            ),
            Self::Waits(pid) => write!(
                f,
                "waits for process {pid}, whose files did not answer: whether this one is \
                 signalled depends on it"
            ),
            Self::Stuck(stuck) => write!(
                f,
                "skipped: stuck in the kernel: {stuck}; a process that cannot run cannot \
                 checkpoint"
            ),
        }
    }
}

impl serde::Serialize for Verdict {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_value_gives_the_text_and_the_label() {
        let v = Verdict::NoHandler {
            what: "holds /dev/nvidia3".into(),
            signal: "SIGUSR1".into(),
        };
        assert_eq!(
            v.to_string(),
            "skipped: holds /dev/nvidia3 but does not handle SIGUSR1 (it would be killed)"
        );
        assert_eq!(v.label(), "no-handler");
        assert_eq!(
            serde_json::to_value(&v).expect("json"),
            serde_json::json!(v.to_string())
        );
        assert_eq!(Verdict::Excluded("dcgm".into()).label(), "excluded");
    }
}
