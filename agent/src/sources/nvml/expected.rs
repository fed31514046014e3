//! How many GPUs this node should have.

use std::path::Path;

/// GPUs per EC2 instance type (AWS's published shapes). Types not listed fall back to the
/// PCI bus; `[nvml] expected_gpus` overrides both.
const INSTANCE_GPUS: &[(&str, u32)] = &[
    ("p6-b200.48xlarge", 8),
    ("p5en.48xlarge", 8),
    ("p5e.48xlarge", 8),
    ("p5.48xlarge", 8),
    ("p5.4xlarge", 1),
    ("p4de.24xlarge", 8),
    ("p4d.24xlarge", 8),
    ("p3dn.24xlarge", 8),
    ("g6e.48xlarge", 8),
    ("g6e.xlarge", 1),
    ("g6.48xlarge", 8),
    ("g6.xlarge", 1),
    ("g5.48xlarge", 8),
    ("g5.xlarge", 1),
    ("g4dn.12xlarge", 4),
];

/// Expected GPU count and where it came from: config, instance type, or the PCI bus.
pub fn expected_gpus(configured: u32, sysfs_root: &Path, on_bus: usize) -> (u32, String) {
    if configured > 0 {
        return (configured, "[nvml] expected_gpus".into());
    }
    if let Some(t) = crate::host::instance_type(sysfs_root) {
        if let Some((_, n)) = INSTANCE_GPUS.iter().find(|(name, _)| *name == t) {
            return (*n, format!("instance type {t}"));
        }
    }
    (
        u32::try_from(on_bus).unwrap_or(u32::MAX),
        "NVIDIA GPUs on the PCI bus".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_then_instance_type_then_bus() {
        let root = tempfile::tempdir().expect("tempdir");
        assert_eq!(expected_gpus(4, root.path(), 2).0, 4);
        assert_eq!(expected_gpus(0, root.path(), 2).0, 2);
        std::fs::create_dir_all(root.path().join("class/dmi/id")).expect("mkdir");
        std::fs::write(
            root.path().join("class/dmi/id/product_name"),
            "p5.48xlarge\n",
        )
        .expect("write");
        assert_eq!(
            expected_gpus(0, root.path(), 7),
            (8, "instance type p5.48xlarge".to_string())
        );
    }
}
