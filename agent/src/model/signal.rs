//! Signal names a handler can catch (never KILL or STOP), the `SigCgt` mask, and which
//! signals may carry the checkpoint request: SIGINT never (every Python process "catches"
//! it as KeyboardInterrupt, so `SigCgt` says nothing about a checkpoint handler), and
//! SIGTERM, SIGHUP and SIGQUIT only with a warning (launchers tear the job down on them).

use rustix::process::Signal;

/// Catchable signals by name.
const SIGNALS: &[(&str, Signal)] = &[
    ("USR1", Signal::USR1),
    ("USR2", Signal::USR2),
    ("TERM", Signal::TERM),
    ("INT", Signal::INT),
    ("HUP", Signal::HUP),
    ("QUIT", Signal::QUIT),
    ("ALRM", Signal::ALARM),
    ("CONT", Signal::CONT),
    ("WINCH", Signal::WINCH),
    ("PWR", Signal::POWER),
    ("URG", Signal::URG),
];

/// Parse `SIGUSR1`, `USR1` or `usr1`. `None` for unknown or uncatchable signals.
pub fn parse(name: &str) -> Option<Signal> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    SIGNALS.iter().find(|(n, _)| *n == bare).map(|(_, s)| *s)
}

/// `SIGUSR1`.
pub fn name(signal: Signal) -> String {
    SIGNALS.iter().find(|(_, s)| *s == signal).map_or_else(
        || format!("signal {}", signal.as_raw()),
        |(n, _)| format!("SIG{n}"),
    )
}

/// Why `signal` may not carry a checkpoint request, if it may not.
pub fn refused(signal: Signal) -> Option<&'static str> {
    (signal == Signal::INT).then_some(
        "SIGINT is refused: every Python process catches it (KeyboardInterrupt), so a handler \
         check cannot tell a checkpoint handler from none",
    )
}

/// A warning for a signal that many jobs treat as "stop now", if `signal` is one.
pub fn risky(signal: Signal) -> Option<&'static str> {
    matches!(signal, Signal::TERM | Signal::HUP | Signal::QUIT).then_some(
        "torchrun and DeepSpeed's launcher catch it to tear the whole job down; use it only \
         for processes whose handler checkpoints (SIGUSR1 is the default)",
    )
}

/// Does a `SigCgt` mask catch (nearly) every standard signal? Go's runtime installs a
/// handler for all of them and ignores most (SIGUSR1 included): such a mask says nothing
/// about a checkpoint handler.
pub fn catches_everything(sigcgt_hex: &str) -> bool {
    u64::from_str_radix(sigcgt_hex.trim(), 16).is_ok_and(|mask| {
        // Of signals 1-31 (29 catchable), Go catches all but the job-control ones: 25.
        (mask & 0x7fff_ffff).count_ones() >= 24
    })
}

/// Does a `SigCgt` hex mask (from `/proc/PID/status`) include `signal`?
pub fn caught(sigcgt_hex: &str, signal: Signal) -> bool {
    let bit = signal.as_raw() - 1;
    u64::from_str_radix(sigcgt_hex.trim(), 16)
        .is_ok_and(|mask| (0..64).contains(&bit) && mask & (1u64 << bit) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_masks() {
        assert_eq!(parse("SIGUSR1"), Some(Signal::USR1));
        assert_eq!(parse("usr2"), Some(Signal::USR2));
        assert_eq!(parse("SIGKILL"), None, "uncatchable signals are never used");
        assert!(refused(Signal::INT).is_some() && refused(Signal::USR1).is_none());
        assert!(risky(Signal::TERM).is_some() && risky(Signal::USR2).is_none());
        assert_eq!(name(Signal::USR1), "SIGUSR1");
        // SIGUSR1 is 10: bit 9.
        assert!(caught("0000000000000200", Signal::USR1));
        assert!(!caught("0000000000000000", Signal::USR1));
        assert!(!caught("zz", Signal::USR1));
        // A Go program's runtime (as /proc shows it) and a Python trainer's handlers.
        assert!(catches_everything("fffffffe7fc1feff"));
        assert!(!catches_everything("0000000180004202"));
    }
}
