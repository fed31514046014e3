//! Recognising NVIDIA GPU and NVSwitch fault lines in kernel-log messages.
//!
//! Shapes drivers have printed (the message part of a `/dev/kmsg` record), each with a
//! fixture and its provenance in the tests below:
//! - `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.`
//! - `NVRM: Xid (0000:3b:00): 13, Graphics Exception ...` (older drivers, no `PCI:`)
//! - `NVRM: Xid (PCI:0000:3b:00): 31, pid='<unknown>', name=<unknown>, Ch 00000008, ...`
//! - `NVRM: Xid (PCI:0000:3b:00): 43, pid=0, Ch 00000010`
//! - `NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, ...` and `(PCI:... GPU-I:01 GPU-CI:02)`: a
//!   MIG-enabled GPU names the GPU (and compute) instance inside the parentheses
//! - `NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 04 (0x... 0x... ...)`
//! - fallen off the bus without an Xid, in every wording: `NVRM: GPU at PCI:0000:3b:00: GPU
//!   has fallen off the bus.`, `NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.`, `NVRM: GPU at
//!   0000:01:00.0 has fallen off the bus.` (older drivers, no colon), 8-digit
//!   domains, and the long notice `NVRM: The NVIDIA GPU 0000:0e:00.0 (PCI ID: 10de:1b06)
//!   installed in this system has fallen off the bus and is not responding to commands.`,
//!   printed as one record (its newlines escaped as `\x0a`) or as several `NVRM:` records, the
//!   first naming the GPU ([`FaultLine::GpuNotice`]) and a later one saying "fallen off the
//!   bus" ([`FaultLine::FallenOffBusTail`]); the reader joins them.
//! - `nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 27 ...` and its
//!   follow-up records (`12028, Severity 0 Engine instance 27 ...`, `12028, Data {0x...}`).
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
    /// A GPU has fallen off the bus (no Xid), in any of the driver's wordings.
    FallenOffBus {
        /// The GPU.
        pci: PciAddress,
    },
    /// `NVRM: The NVIDIA GPU <address> ...` without "fallen off the bus": the first record
    /// of a notice that may say so in a later record.
    GpuNotice {
        /// The GPU named.
        pci: PciAddress,
    },
    /// An `NVRM:` record saying "fallen off the bus" without naming a GPU: the rest of a
    /// notice whose first record ([`FaultLine::GpuNotice`]) named it.
    FallenOffBusTail,
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
    /// `efa <address>[ <ibdev>]: ...`: the EFA driver reporting a device failure.
    EfaDriver {
        /// The EFA device's PCI function.
        pci: PciAddress,
        /// What failed (`EFA_ADMIN_CMD_TIMEOUT`, ...).
        what: &'static str,
    },
}

/// What the `efa` driver logs when its device fails (efa_com.c), and our name for each. A
/// command that completes in error is not here: userspace can cause that (the device's
/// `cmds_err` counter carries it, as a warning).
const EFA_FAILURES: &[(&str, &str)] = &[
    (
        "Wait for completion (polling) timeout",
        "EFA_ADMIN_CMD_TIMEOUT",
    ),
    (
        "didn't send any completion for admin cmd",
        "EFA_ADMIN_CMD_TIMEOUT",
    ),
    (
        "didn't receive any MSI-X interrupt for admin cmd",
        "EFA_ADMIN_CMD_TIMEOUT",
    ),
    ("Admin queue is closed", "EFA_ADMIN_QUEUE_CLOSED"),
    ("Reset indication didn't turn", "EFA_DEVICE_RESET_FAILED"),
    (
        "Device isn't ready, can't reset device",
        "EFA_DEVICE_RESET_FAILED",
    ),
    ("Device isn't ready, abort com init", "EFA_DEVICE_NOT_READY"),
];

/// `<address>[ <ibdev>]: <text>` after `efa `: a device failure the driver names.
fn parse_efa(rest: &str) -> Option<FaultLine<'_>> {
    let (head, text) = rest.split_once(": ")?;
    let pci = head.split_whitespace().next()?.parse::<PciAddress>().ok()?;
    EFA_FAILURES
        .iter()
        .find(|(pattern, _)| text.contains(pattern))
        .map(|(_, what)| FaultLine::EfaDriver { pci, what })
}

/// Recognise a fault line; `None` for anything else.
pub fn parse(message: &str) -> Option<FaultLine<'_>> {
    let message = message.trim_start();
    if let Some(rest) = message.strip_prefix("NVRM: ") {
        if let Some(rest) = rest.strip_prefix("Xid (") {
            return parse_xid(rest);
        }
        if let Some(rest) = rest.strip_prefix("The NVIDIA GPU ") {
            return parse_gpu_notice(rest);
        }
        if let Some(rest) = rest
            .strip_prefix("GPU at ")
            .or_else(|| rest.strip_prefix("GPU "))
        {
            if let Some(line) = parse_fallen_off_bus(rest) {
                return Some(line);
            }
        }
        return rest
            .contains(FALLEN_OFF)
            .then_some(FaultLine::FallenOffBusTail)
            .filter(|_| !names_an_address(rest));
    }
    if let Some(rest) = message.strip_prefix("efa ") {
        return parse_efa(rest);
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
    let (code, rest) = code_and_rest(after)?;
    Some((pci, code, rest))
}

/// ` <code>[, <rest>]` → code, rest (borrowed from the message).
fn code_and_rest(after: &str) -> Option<(u32, &str)> {
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
    Some((code, rest))
}

/// What every wording of the notice says.
const FALLEN_OFF: &str = "fallen off the bus";

fn parse_xid(text: &str) -> Option<FaultLine<'_>> {
    // A MIG-enabled GPU: `PCI:0000:01:00 GPU-I:05 GPU-CI:02): ...`: the address is the first
    // word, and the words after it must be the driver's instance ids.
    let (inside, after) = text.split_once("):")?;
    let mut words = inside.split(' ');
    let pci = words.next()?.parse().ok()?;
    let instance = |w: &str| {
        ["GPU-I:", "GPU-CI:"].iter().any(|p| {
            w.strip_prefix(p)
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
    };
    if !words.all(instance) {
        return None;
    }
    let (code, rest) = code_and_rest(after)?;
    Some(FaultLine::Xid { pci, code, rest })
}

/// `<address>: ... fallen off the bus ...` or, in older drivers' wording, `<address> has
/// fallen off the bus.` (after `GPU at ` or `GPU `): the address is the first word.
fn parse_fallen_off_bus(text: &str) -> Option<FaultLine<'_>> {
    let (address, what) = text.split_once(' ')?;
    if !what.contains(FALLEN_OFF) {
        return None;
    }
    Some(FaultLine::FallenOffBus {
        pci: address.strip_suffix(':').unwrap_or(address).parse().ok()?,
    })
}

/// `<address> (PCI ID: 10de:...) installed in this system has fallen off the bus ...`, maybe
/// with the rest in later records.
fn parse_gpu_notice(text: &str) -> Option<FaultLine<'_>> {
    let address = text.split([' ', '\\']).next()?;
    let pci = address.parse().ok()?;
    Some(if text.contains(FALLEN_OFF) {
        FaultLine::FallenOffBus { pci }
    } else {
        FaultLine::GpuNotice { pci }
    })
}

/// Does a record's text name a PCI address (`dddd:bb:dd`)? A tail that does is not a tail.
fn names_an_address(text: &str) -> bool {
    text.split([' ', '(', ')', ',']).any(|w| {
        w.trim_end_matches(':').matches(':').count() >= 2
            && w.trim_end_matches(':').parse::<PciAddress>().is_ok()
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
    fn efa_driver_failures_name_the_device_and_what_failed() {
        let pci: PciAddress = "0000:10:1c.0".parse().expect("pci");
        for (line, want) in [
            (
                "efa 0000:10:1c.0 rdmap16s28: The device didn't send any completion for admin cmd CREATE_QP(1) status 1 (id: 4, sq producer: 7, sq consumer: 6, cq consumer: 6)",
                "EFA_ADMIN_CMD_TIMEOUT",
            ),
            ("efa 0000:10:1c.0: Admin queue is closed", "EFA_ADMIN_QUEUE_CLOSED"),
            (
                "efa 0000:10:1c.0: Reset indication didn't turn on",
                "EFA_DEVICE_RESET_FAILED",
            ),
        ] {
            assert_eq!(
                parse(line),
                Some(FaultLine::EfaDriver { pci, what: want }),
                "{line}"
            );
        }
        // A command completing in error (userspace can cause it), and other efa lines: none.
        assert_eq!(
            parse("efa 0000:10:1c.0 rdmap16s28: Failed to process command CREATE_QP (opcode 1) comp_status 7 err -22"),
            None
        );
        assert_eq!(parse("efa 0000:10:1c.0: Setup irqs done"), None);
        assert_eq!(parse("efa: not an address: Admin queue is closed"), None);
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
    fn mig_enabled_xids_name_the_gpu_instance() {
        // NVIDIA open-gpu-kernel-modules (krcGetMigAttributionForError, XID_PRINT_WITH_ATTR:
        // "PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u") and the A100 GPU memory error
        // management guide ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, ...").
        for (line, code) in [
            ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No", 94),
            ("NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=python3, Graphics Exception", 13),
        ] {
            let Some(FaultLine::Xid { pci: p, code: c, .. }) = parse(line) else {
                panic!("not parsed: {line}")
            };
            assert_eq!((p, c), (pci("0000:01:00.0"), code), "{line}");
        }
        // Anything else in the parentheses is not the driver's.
        assert_eq!(parse("NVRM: Xid (PCI:0000:01:00 hello): 94, x"), None);
        assert_eq!(parse("NVRM: Xid (PCI:0000:01:00 GPU-I:): 94, x"), None);
    }

    #[test]
    fn fallen_off_bus_in_every_wording() {
        let gpu = |text| FaultLine::FallenOffBus { pci: pci(text) };
        for (line, want) in [
            // The long-standing form (existing fixture).
            ("NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.", gpu("0000:3b:00.0")),
            // Without `at` and `PCI:`, with a function (GPUd's SXid docs; NVIDIA forum quotes).
            ("NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.", gpu("0000:91:00.0")),
            // An 8-digit domain, as NVML prints it.
            ("NVRM: GPU at PCI:00000000:3b:00: GPU has fallen off the bus.", gpu("0000:3b:00.0")),
            ("NVRM: GPU 00000008:01:00.0: GPU has fallen off the bus.", gpu("0008:01:00.0")),
            // Older drivers: no colon after the address.
            ("NVRM: GPU at 0000:01:00.0 has fallen off the bus.", gpu("0000:01:00.0")),
            ("NVRM: GPU at PCI:0000:3b:00 has fallen off the bus.", gpu("0000:3b:00.0")),
            // The long notice in one record (PCI-passthrough and eGPU reports).
            ("NVRM: The NVIDIA GPU 0000:0e:00.0 (PCI ID: 10de:1b06) installed in this system has fallen off the bus and is not responding to commands.", gpu("0000:0e:00.0")),
            // ... with the newline the kernel escapes in /dev/kmsg.
            ("NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1e07) installed in this\\x0aNVRM: system has fallen off the bus and is not responding to commands.", gpu("0000:01:00.0")),
            // Its first record alone, and its tail alone (the reader joins them).
            ("NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1e07) installed in this", FaultLine::GpuNotice { pci: pci("0000:01:00.0") }),
            ("NVRM: system has fallen off the bus and is not responding to commands.", FaultLine::FallenOffBusTail),
            // Hosts with several PCI segments (issue 21): a domain other than 0000, in every
            // form, including VMD's 5-digit domains.
            ("NVRM: GPU at PCI:0001:3b:00: GPU has fallen off the bus.", gpu("0001:3b:00.0")),
            ("NVRM: GPU at PCI:0001:3b:00.0: GPU has fallen off the bus.", gpu("0001:3b:00.0")),
            ("NVRM: GPU 0007:91:00.0: GPU has fallen off the bus.", gpu("0007:91:00.0")),
            ("NVRM: GPU 10000:01:00.0: GPU has fallen off the bus.", gpu("10000:01:00.0")),
            ("NVRM: The NVIDIA GPU 0009:0e:00.0 (PCI ID: 10de:2330) installed in this system has fallen off the bus and is not responding to commands.", gpu("0009:0e:00.0")),
            ("NVRM: The NVIDIA GPU 0009:0e:00.0 (PCI ID: 10de:2330) installed in this\\x0aNVRM: system has fallen off the bus and is not responding to commands.", gpu("0009:0e:00.0")),
            ("NVRM: The NVIDIA GPU 0009:0e:00.0 (PCI ID: 10de:2330) installed in this", FaultLine::GpuNotice { pci: pci("0009:0e:00.0") }),
        ] {
            assert_eq!(parse(line), Some(want), "{line}");
        }
        for line in [
            "NVRM: GPU at PCI:0000:3b:00: GPU-abc is fine",
            "NVRM: GPU 0000:09:00.0: RmInitAdapter failed! (0x22:0x56:894)",
            "NVRM: GPU at PCI:0000:00:05: GPU-efbdfde9-5798-a6e7-4c46-12518fa15375",
            // Quoting the notice is not the notice.
            "audit: cmd=\"echo NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.\"",
            "kernel: probe: NVRM: The NVIDIA GPU 0000:0e:00.0 has fallen off the bus",
        ] {
            assert_eq!(parse(line), None, "{line}");
        }
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
