//! Recognising NVIDIA GPU and NVSwitch fault lines in kernel-log messages.
//!
//! Shapes drivers have printed (the message part of a `/dev/kmsg` record):
//! - `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.`
//! - `NVRM: Xid (0000:3b:00): 13, Graphics Exception ...` (older drivers, no `PCI:`)
//! - `NVRM: Xid (PCI:0000:3b:00): 31, pid='<unknown>', name=<unknown>, Ch 00000008, ...`
//! - `NVRM: Xid (PCI:0000:3b:00): 43, pid=0, Ch 00000010`
//! - `NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 04 (0x... 0x... ...)`
//! - `NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.` (no Xid line)
//! - `nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 27 ...` and its
//!   follow-up lines (`12028, Severity 0 Engine instance 27 ...`, `12028, Data {0x...}`).
//!
//! Matching is anchored at the start of the message, so a line that merely quotes one (an
//! audit record, a shell echo of a log) is not a fault.

use crate::model::PciAddress;

/// A recognised fault line, borrowing from the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultLine<'a> {
    /// `NVRM: Xid (...)`.
    Xid {
        /// The GPU.
        pci: PciAddress,
        /// The Xid number.
        code: u32,
        /// Everything after `<code>,` (pid, process name, details).
        rest: &'a str,
    },
    /// `NVRM: GPU at PCI:...: GPU has fallen off the bus.`
    FallenOffBus {
        /// The GPU.
        pci: PciAddress,
    },
    /// `nvidia-nvswitchN: SXid (...)`.
    Sxid {
        /// The NVSwitch.
        pci: PciAddress,
        /// The SXid number.
        code: u32,
        /// The line's own `Fatal` / `Non-fatal` token, when it has one.
        fatal: Option<bool>,
        /// A follow-up line (`Severity ...`, `Data {...}`) detailing an event already reported.
        follow_up: bool,
    },
}

/// Recognise a fault line; `None` for anything else.
pub fn parse(message: &str) -> Option<FaultLine<'_>> {
    let message = message.trim_start();
    if let Some(rest) = message.strip_prefix("NVRM: ") {
        if let Some(rest) = rest.strip_prefix("Xid (") {
            return parse_xid(rest);
        }
        if let Some(rest) = rest.strip_prefix("GPU at ") {
            return parse_fallen_off_bus(rest);
        }
        return None;
    }
    if let Some(rest) = message.strip_prefix("nvidia-nvswitch") {
        let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit());
        return parse_sxid(rest.strip_prefix(": SXid (")?);
    }
    None
}

/// `<address>): <code>[, <rest>]` → address, code, rest.
fn address_and_code(text: &str) -> Option<(PciAddress, u32, &str)> {
    let (address, after) = text.split_once("):")?;
    let pci = address.parse().ok()?;
    let after = after.trim_start();
    let digits = after.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 9 {
        return None;
    }
    let code = after[..digits].parse().ok()?;
    let tail = &after[digits..];
    let rest = match tail.bytes().next() {
        None => "",
        Some(b',') => tail[1..].trim(),
        Some(b' ') | Some(b'\t') => tail.trim(),
        Some(_) => return None,
    };
    Some((pci, code, rest))
}

fn parse_xid(text: &str) -> Option<FaultLine<'_>> {
    let (pci, code, rest) = address_and_code(text)?;
    Some(FaultLine::Xid { pci, code, rest })
}

fn parse_fallen_off_bus(text: &str) -> Option<FaultLine<'_>> {
    let (address, what) = text.split_once(": ")?;
    if !what.contains("fallen off the bus") {
        return None;
    }
    Some(FaultLine::FallenOffBus {
        pci: address.parse().ok()?,
    })
}

fn parse_sxid(text: &str) -> Option<FaultLine<'_>> {
    let (pci, code, rest) = address_and_code(text)?;
    let first = rest.split([',', ' ']).next().unwrap_or("");
    let (fatal, follow_up) = match first.to_ascii_lowercase().as_str() {
        "fatal" => (Some(true), false),
        "non-fatal" | "nonfatal" => (Some(false), false),
        "severity" | "data" => (None, true),
        _ => (None, false),
    };
    Some(FaultLine::Sxid {
        pci,
        code,
        fatal,
        follow_up,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pci(text: &str) -> PciAddress {
        text.parse().expect("valid address")
    }

    #[test]
    fn xid_formats() {
        let cases = [
            ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.", 79, "pid=1234, name=python3, GPU has fallen off the bus."),
            ("NVRM: Xid (0000:3b:00): 13, Graphics Exception on (GPC 0, TPC 1)", 13, "Graphics Exception on (GPC 0, TPC 1)"),
            ("NVRM: Xid (PCI:0000:3b:00): 31, pid='<unknown>', name=<unknown>, Ch 00000008", 31, "pid='<unknown>', name=<unknown>, Ch 00000008"),
            ("NVRM: Xid (PCI:0000:3b:00): 43, pid=0, Ch 00000010", 43, "pid=0, Ch 00000010"),
            ("NVRM: Xid (PCI:0000:3b:00): 62, 0000d4b8 0000d298", 62, "0000d4b8 0000d298"),
            ("NVRM: Xid (PCI:0000:3b:00.0): 48", 48, ""),
            ("  NVRM: Xid (PCI:0000:3b:00): 94, pid=7, name=x, Contained: CE User Channel (0x9).", 94, "pid=7, name=x, Contained: CE User Channel (0x9)."),
        ];
        for (line, code, rest) in cases {
            assert_eq!(
                parse(line),
                Some(FaultLine::Xid {
                    pci: pci("0000:3b:00.0"),
                    code,
                    rest
                }),
                "{line}"
            );
        }
    }

    #[test]
    fn nvlink5_line_keeps_registers() {
        let line = "NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 04 (0x004505c6 0x00000000 0x00000000)";
        let Some(FaultLine::Xid { pci: p, code, rest }) = parse(line) else {
            panic!("not parsed")
        };
        assert_eq!((p, code), (pci("0008:01:00.0"), 149));
        assert!(rest.ends_with("(0x004505c6 0x00000000 0x00000000)"));
    }

    #[test]
    fn fallen_off_bus_without_xid() {
        assert_eq!(
            parse("NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus."),
            Some(FaultLine::FallenOffBus {
                pci: pci("0000:3b:00.0")
            })
        );
        assert_eq!(parse("NVRM: GPU at PCI:0000:3b:00: GPU-abc is fine"), None);
    }

    #[test]
    fn sxid_lines() {
        assert_eq!(
            parse("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 27 egress non-posted PRIV error"),
            Some(FaultLine::Sxid { pci: pci("0000:05:00.0"), code: 12028, fatal: Some(false), follow_up: false })
        );
        assert_eq!(
            parse(
                "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
            ),
            Some(FaultLine::Sxid {
                pci: pci("0000:06:00.0"),
                code: 20034,
                fatal: Some(true),
                follow_up: false
            })
        );
        assert_eq!(
            parse("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Severity 1 Engine instance 48 Sub-engine instance 00"),
            Some(FaultLine::Sxid { pci: pci("0000:06:00.0"), code: 20034, fatal: None, follow_up: true })
        );
    }

    #[test]
    fn look_alikes_are_ignored() {
        for line in [
            "audit: comm=\"grep\" args=\"NVRM: Xid (PCI:0000:3b:00): 79, pid=1\"",
            "NVRM: Xid (PCI:0000:3b:00): seventy-nine",
            "NVRM: Xid (PCI:0000:3b:00): 79x, pid=1",
            "NVRM: Xid (PCI:zzzz:3b:00): 79, pid=1",
            "NVRM: Xid PCI:0000:3b:00: 79",
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module 570.133.20",
            "xNVRM: Xid (PCI:0000:3b:00): 79",
            "nvidia-nvswitch0: probe of 0000:05:00.0 failed",
            "NVRM: Xid (PCI:0000:3b:00): 1234567890123, too long",
            "",
        ] {
            assert_eq!(parse(line), None, "{line}");
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse(&text);
        }

        #[test]
        fn near_misses_never_panic(
            prefix in proptest::sample::select(vec!["NVRM: Xid (", "NVRM: GPU at ", "nvidia-nvswitch0: SXid (", "NVRM: Xid (PCI:"]),
            tail in "[0-9a-fA-FPCI:.(), x-]{0,64}",
        ) {
            let line = format!("{prefix}{tail}");
            if let Some(FaultLine::Xid { rest, .. }) = parse(&line) {
                proptest::prop_assert!(line.ends_with(rest));
            }
        }

        #[test]
        fn every_well_formed_xid_parses(domain in 0u32..0xffff, bus in 0u8..=255, device in 0u8..32, code in 1u32..100_000) {
            let line = format!("NVRM: Xid (PCI:{domain:04x}:{bus:02x}:{device:02x}): {code}, pid=1, name=x, text");
            let want = PciAddress { domain, bus, device, function: 0 };
            proptest::prop_assert_eq!(parse(&line), Some(FaultLine::Xid { pci: want, code, rest: "pid=1, name=x, text" }));
        }
    }
}
