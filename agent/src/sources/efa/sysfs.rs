//! The EFA devices in sysfs: `<sysfs>/class/infiniband/<dev>` whose PCI function is Amazon's
//! (`device/vendor` `0x1d0f`) bound to the `efa` driver. Everything read here is a small
//! kernel attribute file; a file that cannot be read is left out, never fatal.
//!
//! The IB port's `state` of an EFA reads ACTIVE whatever the link does, so it is not read:
//! the link is the `carrier` (else `operstate`) of the device's network interface
//! (`device/net/*`), where it has one, and only while that interface is administratively up
//! (`flags` has `IFF_UP`): one left down on purpose is not watched.
//!
//! On EC2 the `efa` driver binds the EFA PCI function (device ids `0xefa0`-`0xefa3`) as an
//! RDMA device alone: it registers no network interface, so a real EFA function has no
//! `device/net` child and its link is not judged here (the ENA interface of the same ENI is
//! another PCI function, the `ena` driver's). The link check covers adapters that do have an
//! interface under the same function; on EC2 the evidence is the device count, the admin
//! queue, the error counters and the driver's own kernel-log lines.

use std::collections::BTreeMap;
use std::fs::File;
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
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// Network interfaces (`device/net/*`).
    pub netdevs: Vec<String>,
    /// The GPUs it serves: behind the same PCIe switch, else on its NUMA node.
    pub gpus: Vec<PciAddress>,
    /// Link up: `carrier` of its first interface (else that interface's `operstate` is
    /// `up`); `None` without an interface.
    pub link_up: Option<bool>,
    /// The counters judged: each port's (summed over ports) and the device's own (admin
    /// queue), by file name; a counter this device does not have is absent.
    pub counters: BTreeMap<&'static str, u64>,
}

/// The port counters read (`ports/*/hw_counters/<name>`): the ones judged, and the bytes
/// moved (for the funnel).
fn port_counters() -> impl Iterator<Item = &'static str> {
    super::checks::ERROR_COUNTERS
        .iter()
        .chain(super::checks::REMOTE_COUNTERS)
        .chain(&crate::model::EFA_TRAFFIC_COUNTERS)
        .copied()
        .chain([super::checks::RETRANS])
}

/// The device's own counters read (`hw_counters/<name>`: its admin queue).
const DEVICE_COUNTERS: [&str; 2] = [super::checks::NO_COMPLETION, super::checks::CMDS_ERR];

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Read an open sysfs attribute again from its start (sysfs renders it afresh at offset 0)
/// into `buf`: the text, trimmed.
fn reread<'b>(file: &File, buf: &'b mut [u8; 64]) -> std::io::Result<&'b str> {
    use std::os::unix::fs::FileExt;
    let n = file.read_at(buf, 0)?;
    std::str::from_utf8(&buf[..n])
        .map(str::trim)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// A device with its changing files open.
#[derive(Debug)]
struct Open {
    found: Found,
    /// Counter name and its file (one per port for port counters).
    counters: Vec<(&'static str, File)>,
    /// The first interface's `carrier`, `operstate` and `flags`.
    link: Option<(File, File, Option<File>)>,
}

/// The EFA devices, opened once: their fixed attributes are read when the set of devices
/// changes, their counter and link files kept open and re-read in place each poll (a poll
/// of 32 devices is then about 300 reads and no path walks).
#[derive(Debug)]
pub struct Devices {
    root: PathBuf,
    names: Vec<String>,
    open: Vec<Open>,
    /// A read failed (a device reset or driver reload replaced the files): open again.
    stale: bool,
}

impl Devices {
    /// The EFA devices under `<sysfs_root>/class/infiniband`.
    pub fn new(sysfs_root: &Path) -> Self {
        Self {
            root: sysfs_root.to_path_buf(),
            names: Vec::new(),
            open: Vec::new(),
            stale: false,
        }
    }

    /// Every EFA device as it is now, sorted by name.
    pub fn read(&mut self) -> Vec<Found> {
        let class = self.root.join("class/infiniband");
        let mut names: Vec<String> = std::fs::read_dir(&class)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        if names != self.names || self.stale {
            let gpus = crate::host::nvidia_devices(&self.root).gpus;
            self.open = names
                .iter()
                .filter_map(|name| open(&class.join(name), &self.root, &gpus))
                .collect();
            self.names = names;
            self.stale = false;
        }
        let mut out = Vec::with_capacity(self.open.len());
        let mut buf = [0u8; 64];
        for device in &self.open {
            let mut found = device.found.clone();
            for (name, file) in &device.counters {
                match reread(file, &mut buf).map(str::parse::<u64>) {
                    Ok(Ok(value)) => *found.counters.entry(name).or_default() += value,
                    _ => self.stale = true,
                }
            }
            found.link_up = device
                .link
                .as_ref()
                .and_then(|(carrier, operstate, flags)| {
                    let flags = flags.as_ref().and_then(|f| reread(f, &mut buf).ok());
                    if !admin_up(flags) {
                        return None;
                    }
                    match reread(carrier, &mut buf) {
                        Ok("1") => Some(true),
                        Ok("0") => Some(false),
                        _ => reread(operstate, &mut buf).ok().map(|s| s == "up"),
                    }
                });
            out.push(found);
        }
        out
    }
}

/// `IFF_UP` in an interface's `flags` (`0x1003`): administratively up. Unreadable: taken as
/// up (the carrier then says).
fn admin_up(flags: Option<&str>) -> bool {
    const IFF_UP: u32 = 0x1;
    flags
        .and_then(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).ok())
        .is_none_or(|f| f & IFF_UP != 0)
}

fn open(dir: &Path, sysfs_root: &Path, gpus: &[crate::host::PciDevice]) -> Option<Open> {
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
    let link = netdevs.first().and_then(|(_, path)| {
        Some((
            File::open(path.join("carrier")).ok()?,
            File::open(path.join("operstate")).ok()?,
            File::open(path.join("flags")).ok(),
        ))
    });
    let mut counters = Vec::new();
    if let Ok(ports) = std::fs::read_dir(dir.join("ports")) {
        for port in ports.flatten() {
            for name in port_counters() {
                if let Ok(file) = File::open(port.path().join("hw_counters").join(name)) {
                    counters.push((name, file));
                }
            }
        }
    }
    for name in DEVICE_COUNTERS {
        if let Ok(file) = File::open(dir.join("hw_counters").join(name)) {
            counters.push((name, file));
        }
    }
    let gpus = nearby_gpus(pci_path.as_deref(), numa_node, sysfs_root, gpus);
    Some(Open {
        found: Found {
            name: dir.file_name()?.to_string_lossy().into_owned(),
            pci,
            numa_node,
            netdevs: netdevs.into_iter().map(|(name, _)| name).collect(),
            gpus,
            link_up: None,
            counters: BTreeMap::new(),
        },
        counters,
        link,
    })
}

/// The GPUs a device serves: those behind the same PCIe switch (the same upstream port two
/// levels above both functions), else those on its NUMA node.
fn nearby_gpus(
    pci_path: Option<&Path>,
    numa_node: Option<u32>,
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
    if let Some(ours) = pci_path.and_then(switch) {
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
        .filter(|g| g.numa_node.is_some() && g.numa_node == numa_node)
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
        for counter in super::port_counters() {
            write(dev.join("ports/1/hw_counters").join(counter), "0\n")?;
        }
        for counter in super::DEVICE_COUNTERS {
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
        std::fs::write(net.join("operstate"), "down\n").expect("operstate");
        let found = Devices::new(root.path()).read();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].name, "rdmap79s0");
        assert_eq!(found[0].pci, "0000:4f:00.0".parse().ok());
        assert_eq!(found[0].numa_node, Some(0));
        assert_eq!(found[0].netdevs, ["eth1"]);
        assert_eq!(found[0].link_up, Some(false));
        assert_eq!(found[0].counters.get("rx_drops"), Some(&7));
        assert_eq!(found[0].counters.get("no_completion_cmds"), Some(&0));
        assert_eq!(found[1].link_up, None, "EFA-only: no interface");

        // Administratively down (no IFF_UP): not watched, whatever the carrier says.
        std::fs::write(net.join("flags"), "0x1002\n").expect("flags");
        let found = Devices::new(root.path()).read();
        assert_eq!(found[0].link_up, None, "admin down");
        std::fs::write(net.join("flags"), "0x1003\n").expect("flags");
        let found = Devices::new(root.path()).read();
        assert_eq!(found[0].link_up, Some(false), "up without carrier");
    }
}
