//! The EFA devices in sysfs: `<sysfs>/class/infiniband/<dev>` whose PCI function is Amazon's
//! (`device/vendor` `0x1d0f`) bound to the `efa` driver. Everything read here is a small
//! kernel attribute file; a file that cannot be read is left out, never fatal.
//!
//! The IB port's `state` of an EFA reads ACTIVE whatever the link does, so it is not read:
//! the link is the `carrier` (else `operstate`) of the device's network interface
//! (`device/net/*`), where it has one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::model::PciAddress;

/// Amazon's PCI vendor id.
const AMAZON_VENDOR: &str = "0x1d0f";

/// One EFA device as sysfs shows it now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    /// RDMA device name (`rdmap79s0`).
    pub name: String,
    /// PCI address (the `device` link's target).
    pub pci: Option<PciAddress>,
    /// The resolved PCI device directory (its ancestors are the PCIe switch ports).
    pub pci_path: Option<PathBuf>,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// Network interfaces (`device/net/*`).
    pub netdevs: Vec<String>,
    /// Link up: `carrier` of the first interface that answers (else its `operstate` is
    /// `up`); `None` without an interface.
    pub link_up: Option<bool>,
    /// Counters: each port's `hw_counters/*` (summed over ports) and the device's own
    /// `hw_counters/*` (admin queue), by file name.
    pub counters: BTreeMap<String, u64>,
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn counters_in(dir: &Path, into: &mut BTreeMap<String, u64>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(value) = read(&entry.path()).and_then(|v| v.parse::<u64>().ok()) {
            *into.entry(name).or_default() += value;
        }
    }
}

/// The link of the first interface that says: `carrier` 1/0, else `operstate`.
fn link(netdev: &Path) -> Option<bool> {
    match read(&netdev.join("carrier")).as_deref() {
        Some("1") => Some(true),
        Some("0") => Some(false),
        // Reading `carrier` of an interface that is administratively down fails (EINVAL).
        _ => read(&netdev.join("operstate")).map(|s| s == "up"),
    }
}

/// Every EFA device under `<sysfs_root>/class/infiniband`, sorted by name.
pub fn scan(sysfs_root: &Path) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(sysfs_root.join("class/infiniband")) else {
        return Vec::new();
    };
    let mut found: Vec<Found> = entries
        .flatten()
        .filter_map(|entry| device(&entry.path()))
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

fn device(dir: &Path) -> Option<Found> {
    let pci_dir = dir.join("device");
    if read(&pci_dir.join("vendor")).as_deref() != Some(AMAZON_VENDOR) {
        return None;
    }
    let driver = std::fs::read_link(pci_dir.join("driver")).ok()?;
    if driver.file_name()? != "efa" {
        return None;
    }
    let pci_path = std::fs::canonicalize(&pci_dir).ok();
    let pci = pci_path
        .as_ref()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse::<PciAddress>().ok());
    let numa_node = read(&pci_dir.join("numa_node")).and_then(|n| n.parse::<u32>().ok());
    let mut netdevs: Vec<(String, PathBuf)> = std::fs::read_dir(pci_dir.join("net"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        })
        .unwrap_or_default();
    netdevs.sort();
    let link_up = netdevs.iter().find_map(|(_, path)| link(path));
    let mut counters = BTreeMap::new();
    if let Ok(ports) = std::fs::read_dir(dir.join("ports")) {
        for port in ports.flatten() {
            counters_in(&port.path().join("hw_counters"), &mut counters);
        }
    }
    counters_in(&dir.join("hw_counters"), &mut counters);
    Some(Found {
        name: dir.file_name()?.to_string_lossy().into_owned(),
        pci,
        pci_path,
        numa_node,
        netdevs: netdevs.into_iter().map(|(name, _)| name).collect(),
        link_up,
        counters,
    })
}

/// The GPUs a device serves: those behind the same PCIe switch (the same upstream port two
/// levels above both functions), else those on its NUMA node.
pub fn nearby_gpus(
    device: &Found,
    sysfs_root: &Path,
    gpus: &[crate::host::PciDevice],
) -> Vec<PciAddress> {
    let switch = |path: &Path| {
        let upstream = path.parent()?.parent()?;
        upstream
            .file_name()?
            .to_str()?
            .parse::<PciAddress>()
            .ok()
            .map(|_| upstream.to_path_buf())
    };
    if let Some(ours) = device.pci_path.as_deref().and_then(switch) {
        let same: Vec<PciAddress> = gpus
            .iter()
            .filter(|g| {
                std::fs::canonicalize(sysfs_root.join("bus/pci/devices").join(g.pci.to_string()))
                    .ok()
                    .and_then(|p| switch(&p))
                    .is_some_and(|theirs| theirs == ours)
            })
            .map(|g| g.pci)
            .collect();
        if !same.is_empty() {
            return same;
        }
    }
    gpus.iter()
        .filter(|g| g.numa_node.is_some() && g.numa_node == device.numa_node)
        .map(|g| g.pci)
        .collect()
}

/// A fake sysfs EFA device in the real layout, for tests and benchmarks.
pub mod fake {
    use std::path::Path;

    /// Make `<root>/class/infiniband/<name>` for the Amazon function at `pci`
    /// (`<root>/devices/pci0000:00/<pci>`, bound to `efa`), on NUMA node `numa`, with AWS's
    /// port counters and the admin-queue counters at 0.
    pub fn device(root: &Path, name: &str, pci: &str, numa: u32) -> std::io::Result<()> {
        use std::fs::{create_dir_all, write};
        let function = root.join("devices/pci0000:00").join(pci);
        create_dir_all(&function)?;
        write(function.join("vendor"), "0x1d0f\n")?;
        write(function.join("numa_node"), format!("{numa}\n"))?;
        create_dir_all(root.join("bus/pci/drivers/efa"))?;
        std::os::unix::fs::symlink(root.join("bus/pci/drivers/efa"), function.join("driver"))?;
        let dev = root.join("class/infiniband").join(name);
        create_dir_all(dev.join("ports/1/hw_counters"))?;
        create_dir_all(dev.join("hw_counters"))?;
        std::os::unix::fs::symlink(&function, dev.join("device"))?;
        write(dev.join("ports/1/state"), "4: ACTIVE\n")?;
        for counter in super::super::checks::ERROR_COUNTERS
            .iter()
            .chain(&[super::super::checks::RETRANS])
        {
            write(dev.join("ports/1/hw_counters").join(counter), "0\n")?;
        }
        for counter in [
            super::super::checks::NO_COMPLETION,
            super::super::checks::CMDS_ERR,
        ] {
            write(dev.join("hw_counters").join(counter), "0\n")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_efa_devices_their_counters_and_link_and_skips_others() {
        let root = tempfile::tempdir().expect("tempdir");
        fake::device(root.path(), "rdmap79s0", "0000:4f:00.0", 0).expect("device");
        fake::device(root.path(), "rdmap80s0", "0000:50:00.0", 1).expect("device");
        // An mlx5 device: not Amazon's.
        let mlx = root.path().join("class/infiniband/mlx5_0/device");
        std::fs::create_dir_all(&mlx).expect("mlx");
        std::fs::write(mlx.join("vendor"), "0x15b3\n").expect("vendor");
        std::fs::write(
            root.path()
                .join("class/infiniband/rdmap79s0/ports/1/hw_counters/rx_drops"),
            "7\n",
        )
        .expect("counter");
        let net = root.path().join("devices/pci0000:00/0000:4f:00.0/net/eth1");
        std::fs::create_dir_all(&net).expect("net");
        std::fs::write(net.join("carrier"), "0\n").expect("carrier");
        let found = scan(root.path());
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].name, "rdmap79s0");
        assert_eq!(found[0].pci, "0000:4f:00.0".parse().ok());
        assert_eq!(found[0].numa_node, Some(0));
        assert_eq!(found[0].netdevs, ["eth1"]);
        assert_eq!(found[0].link_up, Some(false));
        assert_eq!(found[0].counters.get("rx_drops"), Some(&7));
        assert_eq!(found[0].counters.get("no_completion_cmds"), Some(&0));
        assert_eq!(found[1].link_up, None, "EFA-only: no interface");
    }
}
