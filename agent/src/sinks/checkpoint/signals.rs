//! Signal names a handler can catch (never KILL or STOP), and the `SigCgt` mask.

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
        assert_eq!(name(Signal::USR1), "SIGUSR1");
        // SIGUSR1 is 10: bit 9.
        assert!(caught("0000000000000200", Signal::USR1));
        assert!(!caught("0000000000000000", Signal::USR1));
        assert!(!caught("zz", Signal::USR1));
    }
}
