//! How many GPUs this node should have.

use std::path::Path;

/// NVIDIA GPUs per EC2 instance type, every NVIDIA GPU family EC2 offers (AMD's g4ad and
/// the Trainium/Inferentia families have none NVML would see). Types not listed fall back
/// to the PCI bus, which cannot see a GPU that fell off it; `[nvml] expected_gpus`
/// overrides both.
///
/// Source: the EC2 accelerated-computing instance specifications (docs.aws.amazon.com,
/// ec2/latest/instancetypes/ac.html, "Accelerators" column) as DescribeInstanceTypes reports
/// them (`GpuInfo.Gpus[].Count`); the sizes in `shared/reference/instance-types.tsv`
/// (Karpenter's generated instance-type reference) agree. p6e-gb200 instances are the 4-GPU
/// slices of a GB200 NVL72 UltraServer.
const INSTANCE_GPUS: &[(&str, u32)] = &[
    // Blackwell
    ("p6-b300.48xlarge", 8),
    ("p6-b200.48xlarge", 8),
    ("p6e-gb200.36xlarge", 4),
    // Hopper
    ("p5en.48xlarge", 8),
    ("p5e.48xlarge", 8),
    ("p5.48xlarge", 8),
    ("p5.4xlarge", 1),
    // Ampere
    ("p4de.24xlarge", 8),
    ("p4d.24xlarge", 8),
    // Volta
    ("p3dn.24xlarge", 8),
    ("p3.16xlarge", 8),
    ("p3.8xlarge", 4),
    ("p3.2xlarge", 1),
    // L40S
    ("g6e.48xlarge", 8),
    ("g6e.24xlarge", 4),
    ("g6e.12xlarge", 4),
    ("g6e.16xlarge", 1),
    ("g6e.8xlarge", 1),
    ("g6e.4xlarge", 1),
    ("g6e.2xlarge", 1),
    ("g6e.xlarge", 1),
    // L4
    ("g6.48xlarge", 8),
    ("g6.24xlarge", 4),
    ("g6.12xlarge", 4),
    ("g6.16xlarge", 1),
    ("g6.8xlarge", 1),
    ("g6.4xlarge", 1),
    ("g6.2xlarge", 1),
    ("g6.xlarge", 1),
    ("gr6.8xlarge", 1),
    ("gr6.4xlarge", 1),
    // A10G
    ("g5.48xlarge", 8),
    ("g5.24xlarge", 4),
    ("g5.12xlarge", 4),
    ("g5.16xlarge", 1),
    ("g5.8xlarge", 1),
    ("g5.4xlarge", 1),
    ("g5.2xlarge", 1),
    ("g5.xlarge", 1),
    // T4 (g5g: T4G with Graviton)
    ("g4dn.metal", 8),
    ("g4dn.12xlarge", 4),
    ("g4dn.16xlarge", 1),
    ("g4dn.8xlarge", 1),
    ("g4dn.4xlarge", 1),
    ("g4dn.2xlarge", 1),
    ("g4dn.xlarge", 1),
    ("g5g.metal", 2),
    ("g5g.16xlarge", 2),
    ("g5g.8xlarge", 1),
    ("g5g.4xlarge", 1),
    ("g5g.2xlarge", 1),
    ("g5g.xlarge", 1),
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

    /// Issue 22: a GPU missing from the bus is seen only where the type is known: every
    /// NVIDIA family and size is, and the table agrees with the reference.
    #[test]
    fn every_nvidia_family_is_known_and_agrees_with_the_reference() {
        for family in [
            "g4dn.",
            "g5.",
            "g6.",
            "g6e.",
            "gr6.",
            "p4d.",
            "p4de.",
            "p5.",
            "p5e.",
            "p5en.",
            "p6-b200.",
            "p6-b300.",
            "p6e-gb200.",
        ] {
            assert!(
                INSTANCE_GPUS.iter().any(|(t, _)| t.starts_with(family)),
                "no {family} type"
            );
        }
        for family in ["g5.", "g6.", "g6e."] {
            let sizes = INSTANCE_GPUS
                .iter()
                .filter(|(t, _)| t.starts_with(family))
                .count();
            assert_eq!(sizes, 8, "every {family} size");
        }
        let reference = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/reference/instance-types.tsv");
        let Ok(text) = std::fs::read_to_string(&reference) else {
            return; // the reference sits beside the checkout, not in it
        };
        let mut compared = 0;
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("instance"))
        {
            let fields: Vec<&str> = line.split('\t').collect();
            let (Some(t), Some(gpus)) = (
                fields.first(),
                fields.get(3).and_then(|g| g.parse::<u32>().ok()),
            ) else {
                continue;
            };
            if let Some((_, n)) = INSTANCE_GPUS.iter().find(|(name, _)| name == t) {
                assert_eq!(*n, gpus, "{t}");
                compared += 1;
            }
        }
        assert!(compared >= 10, "only {compared} types compared");
    }
}
