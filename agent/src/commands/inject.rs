//! `gpu-agent inject`: write a realistic fault line into the kernel log, for fire drills.

use std::io::Write;
use std::path::Path;

use anyhow::Context;

use crate::catalog::{self, DriverBranch, SxidFatality};
use crate::cli::Inject;
use crate::config::Loaded;
use crate::host;
use crate::model::PciAddress;

/// An Xid line the way the driver prints it (without the drill mark).
pub fn xid_line(pci: PciAddress, code: u32) -> String {
    let class = catalog::classify_xid(code, "", DriverBranch::Unknown);
    format!(
        "NVRM: Xid (PCI:{:04x}:{:02x}:{:02x}): {code}, pid={}, name=gpu-agent-inject, {}",
        pci.domain,
        pci.bus,
        pci.device,
        std::process::id(),
        class.description
    )
}

/// An SXid line the way the NVSwitch driver prints it (without the drill mark).
pub fn sxid_line(pci: PciAddress, code: u32) -> String {
    let entry = catalog::sxid_entry(code);
    let fatal = entry.is_some_and(|e| e.fatality != SxidFatality::NonFatal);
    format!(
        "nvidia-nvswitch0: SXid (PCI:{pci}): {code}, {}, Link 0 {}",
        if fatal { "Fatal" } else { "Non-fatal" },
        entry.map_or("unknown", |e| e.name)
    )
}

/// Write the line to the configured kernel log (one open per line: the kernel rate-limits
/// writes per open file).
pub fn inject(loaded: &Loaded, what: &Inject) -> anyhow::Result<u8> {
    let config = &loaded.config;
    let devices = host::nvidia_devices(&config.sysfs.root);
    let line = match *what {
        Inject::Xid { code, pci } => {
            let pci = pci
                .or_else(|| devices.gpus.first().map(|d| d.pci))
                .unwrap_or(PciAddress {
                    domain: 0,
                    bus: 0x3b,
                    device: 0,
                    function: 0,
                });
            xid_line(pci, code)
        }
        Inject::Sxid { code, pci } => {
            let pci = pci
                .or_else(|| devices.nvswitches.first().map(|d| d.pci))
                .unwrap_or(PciAddress {
                    domain: 0,
                    bus: 5,
                    device: 0,
                    function: 0,
                });
            sxid_line(pci, code)
        }
    };
    // The drill mark: only a holder of this boot's key (root) can make a line count.
    let boot = host::boot_id(&config.procfs.root).unwrap_or_else(|| "unknown".into());
    let key = crate::drill::key(&config.state_dir, &boot, crate::drill::Holder::Drill)
        .context("cannot read or make the drill key (injecting needs root)")?;
    let line = crate::drill::mark(&key, &line);
    write_line(&config.kmsg.path, &format!("<3>{line}"))?;
    println!("{line}");
    Ok(0)
}

fn write_line(path: &Path, line: &str) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| {
            format!(
                "cannot open {} for writing (injecting needs root)",
                path.display()
            )
        })?;
    file.write_all(format!("{line}\n").as_bytes())
        .with_context(|| format!("cannot write to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::kmsg::parse::{parse, FaultLine};

    #[test]
    fn injected_lines_parse_back() {
        let pci: PciAddress = "0000:3b:00.0".parse().expect("addr");
        // As written: with the drill mark.
        let line = crate::drill::mark(b"key", &xid_line(pci, 79));
        assert!(matches!(parse(&line), Some(FaultLine::Xid { code: 79, pci: p, .. }) if p == pci));
        let line = crate::drill::mark(
            b"key",
            &sxid_line("0000:05:00.0".parse().expect("addr"), 20034),
        );
        assert!(line.contains(", Fatal, "));
        assert!(matches!(
            parse(&line),
            Some(FaultLine::Sxid {
                code: 20034,
                fatal: Some(true),
                ..
            })
        ));
    }
}
