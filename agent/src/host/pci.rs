//! NVIDIA GPUs and NVSwitches on the PCI bus, from `<sysfs>/bus/pci/devices`.

use std::path::Path;

use crate::model::PciAddress;

const NVIDIA_VENDOR: &str = "0x10de";

/// One NVIDIA PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    /// Its address.
    pub pci: PciAddress,
    /// NUMA node the device is attached to; `None` where sysfs says -1 or nothing.
    pub numa_node: Option<u32>,
}

/// The NVIDIA devices found, in bus order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvidiaDevices {
    /// GPUs (display or 3D controllers); index in this list is the GPU index.
    pub gpus: Vec<PciDevice>,
    /// NVSwitches (bridge class).
    pub nvswitches: Vec<PciDevice>,
    /// Why the list may be incomplete (sysfs missing or unreadable); `None` when it was read.
    pub problem: Option<String>,
}

/// Enumerate NVIDIA GPUs and NVSwitches. Missing or unreadable entries are skipped, never
/// fatal: the reason is returned in [`NvidiaDevices::problem`].
pub fn nvidia_devices(sysfs_root: &Path) -> NvidiaDevices {
    let dir = sysfs_root.join("bus/pci/devices");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) => {
            return NvidiaDevices {
                problem: Some(format!("cannot list {}: {e}", dir.display())),
                ..NvidiaDevices::default()
            }
        }
    };
    let mut found = NvidiaDevices::default();
    for entry in entries.flatten() {
        let Ok(pci) = entry.file_name().to_string_lossy().parse::<PciAddress>() else {
            continue;
        };
        let path = entry.path();
        let read =
            |name: &str| std::fs::read_to_string(path.join(name)).map(|s| s.trim().to_string());
        if read("vendor").ok().as_deref() != Some(NVIDIA_VENDOR) {
            continue;
        }
        let Ok(class) = read("class") else { continue };
        let numa_node = read("numa_node").ok().and_then(|n| n.parse::<u32>().ok());
        let device = PciDevice { pci, numa_node };
        // 0x0300xx VGA, 0x0302xx 3D controller (data-center GPUs); 0x0680xx NVSwitch bridge.
        if class.starts_with("0x0300") || class.starts_with("0x0302") {
            found.gpus.push(device);
        } else if class.starts_with("0x0680") {
            found.nvswitches.push(device);
        }
    }
    found.gpus.sort_by_key(|d| d.pci);
    found.nvswitches.sort_by_key(|d| d.pci);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(root: &Path, addr: &str, vendor: &str, class: &str, numa: &str) {
        let dir = root.join("bus/pci/devices").join(addr);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("vendor"), format!("{vendor}\n")).expect("write");
        std::fs::write(dir.join("class"), format!("{class}\n")).expect("write");
        std::fs::write(dir.join("numa_node"), format!("{numa}\n")).expect("write");
    }

    #[test]
    fn enumerates_in_bus_order() {
        let root = tempfile::tempdir().expect("tempdir");
        device(root.path(), "0000:b8:00.0", "0x10de", "0x030200", "1");
        device(root.path(), "0000:18:00.0", "0x10de", "0x030200", "0");
        device(root.path(), "0000:05:00.0", "0x10de", "0x068000", "-1");
        device(root.path(), "0000:00:1f.0", "0x8086", "0x060100", "0");
        device(root.path(), "0000:3b:00.1", "0x10de", "0x040300", "0");
        let found = nvidia_devices(root.path());
        assert_eq!(found.problem, None);
        let gpus: Vec<String> = found.gpus.iter().map(|g| g.pci.to_string()).collect();
        assert_eq!(gpus, ["0000:18:00.0", "0000:b8:00.0"]);
        assert_eq!(found.gpus[1].numa_node, Some(1));
        assert_eq!(found.nvswitches.len(), 1);
        assert_eq!(found.nvswitches[0].numa_node, None);
    }

    #[test]
    fn missing_sysfs_is_a_problem_not_a_crash() {
        let found = nvidia_devices(Path::new("/nonexistent-sysfs"));
        assert!(found.gpus.is_empty());
        assert!(found
            .problem
            .expect("problem")
            .contains("/nonexistent-sysfs"));
    }
}
