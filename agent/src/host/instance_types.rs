//! How many GPUs and EFA devices this node should have, by EC2 instance type.

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
///
/// The third column is the most EFA devices (`EfaInfo.MaximumEfaInterfaces`, from the same
/// reference, and `shared/reference/efa.md` for p6-b300 and p6e-gb200); `None` where no
/// source read states it: the count is then not checked.
const INSTANCE_GPUS: &[(&str, u32, Option<u32>)] = &[
    // Blackwell
    ("p6-b300.48xlarge", 8, Some(16)),
    ("p6-b200.48xlarge", 8, Some(8)),
    ("p6e-gb200.36xlarge", 4, Some(4)),
    // The 4-GPU slice of a GB300 NVL72 UltraServer, like p6e-gb200 (shared/reference/
    // grace-gb200.md); its EFA count is stated by no source read.
    ("p6e-gb300.36xlarge", 4, None),
    // Hopper
    ("p5en.48xlarge", 8, Some(16)),
    ("p5e.48xlarge", 8, Some(32)),
    ("p5.48xlarge", 8, Some(32)),
    ("p5.4xlarge", 1, Some(1)),
    // Ampere
    ("p4de.24xlarge", 8, Some(4)),
    ("p4d.24xlarge", 8, Some(4)),
    // Volta
    ("p3dn.24xlarge", 8, Some(1)),
    ("p3.16xlarge", 8, None),
    ("p3.8xlarge", 4, None),
    ("p3.2xlarge", 1, None),
    // L40S
    ("g6e.48xlarge", 8, Some(4)),
    ("g6e.24xlarge", 4, None),
    ("g6e.12xlarge", 4, None),
    ("g6e.16xlarge", 1, None),
    ("g6e.8xlarge", 1, None),
    ("g6e.4xlarge", 1, None),
    ("g6e.2xlarge", 1, None),
    ("g6e.xlarge", 1, Some(0)),
    // L4
    ("g6.48xlarge", 8, Some(1)),
    ("g6.24xlarge", 4, None),
    ("g6.12xlarge", 4, None),
    ("g6.16xlarge", 1, None),
    ("g6.8xlarge", 1, None),
    ("g6.4xlarge", 1, None),
    ("g6.2xlarge", 1, None),
    ("g6.xlarge", 1, Some(0)),
    ("gr6.8xlarge", 1, None),
    ("gr6.4xlarge", 1, None),
    // Fractional L4 (g6f/gr6f): a share of one L4, which the guest's NVIDIA (vGPU) driver
    // presents as one GPU. The sizes are the ones AWS lists; a size not listed here falls
    // back to the bus, which sees the same one device.
    ("g6f.4xlarge", 1, None),
    ("g6f.2xlarge", 1, None),
    ("g6f.xlarge", 1, None),
    ("g6f.large", 1, None),
    ("gr6f.4xlarge", 1, None),
    // A10G
    ("g5.48xlarge", 8, Some(1)),
    ("g5.24xlarge", 4, None),
    ("g5.12xlarge", 4, None),
    ("g5.16xlarge", 1, None),
    ("g5.8xlarge", 1, None),
    ("g5.4xlarge", 1, None),
    ("g5.2xlarge", 1, None),
    ("g5.xlarge", 1, Some(0)),
    // T4 (g5g: T4G with Graviton)
    ("g4dn.metal", 8, None),
    ("g4dn.12xlarge", 4, Some(1)),
    ("g4dn.16xlarge", 1, None),
    ("g4dn.8xlarge", 1, None),
    ("g4dn.4xlarge", 1, None),
    ("g4dn.2xlarge", 1, None),
    ("g4dn.xlarge", 1, None),
    ("g5g.metal", 2, None),
    ("g5g.16xlarge", 2, None),
    ("g5g.8xlarge", 1, None),
    ("g5g.4xlarge", 1, None),
    ("g5g.2xlarge", 1, None),
    ("g5g.xlarge", 1, None),
];

/// Instance families whose GPUs are part of a multi-node NVLink domain (an NVL72
/// UltraServer: GB200/GB300), so multi-node NVLink goes through IMEX. Every other type in
/// [`INSTANCE_GPUS`] has none (p5 and p6-b200 have NVLink within the node only).
const NVLINK_DOMAIN_FAMILIES: &[&str] = &["p6e-gb200.", "p6e-gb300."];

/// Does this node's instance type have a multi-node NVLink domain? `None`: the type is not
/// known (not EC2, or not in the table).
pub fn nvlink_domain(sysfs_root: &Path) -> Option<(bool, String)> {
    let t = crate::host::instance_type(sysfs_root)?;
    let domain = NVLINK_DOMAIN_FAMILIES.iter().any(|f| t.starts_with(f));
    (domain || INSTANCE_GPUS.iter().any(|(name, _, _)| *name == t)).then_some((domain, t))
}

/// Expected GPU count and where it came from: config, instance type, or the PCI bus.
pub fn expected_gpus(configured: u32, sysfs_root: &Path, on_bus: usize) -> (u32, String) {
    if configured > 0 {
        return (configured, "[nvml] expected_gpus".into());
    }
    if let Some(t) = crate::host::instance_type(sysfs_root) {
        if let Some((_, n, _)) = INSTANCE_GPUS.iter().find(|(name, _, _)| *name == t) {
            return (*n, format!("instance type {t}"));
        }
    }
    (
        u32::try_from(on_bus).unwrap_or(u32::MAX),
        "NVIDIA GPUs on the PCI bus".into(),
    )
}

/// The most EFA devices this instance type can have, with the type's name; `None` where
/// the type is unknown or not in the table. A maximum, not what a launch attached: the EFA
/// source logs it beside the count it judges against, and condemns nothing by it.
pub fn efa_maximum(sysfs_root: &Path) -> Option<(u32, String)> {
    let t = crate::host::instance_type(sysfs_root)?;
    INSTANCE_GPUS
        .iter()
        .find(|(name, _, _)| *name == t)
        .and_then(|(_, _, efa)| *efa)
        .map(|n| (n, t.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_nvl72_types_have_an_nvlink_domain() {
        let root = tempfile::tempdir().expect("tempdir");
        assert_eq!(nvlink_domain(root.path()), None, "no instance type");
        let dmi = root.path().join("class/dmi/id");
        std::fs::create_dir_all(&dmi).expect("mkdir");
        for (t, want) in [
            ("p6e-gb200.36xlarge", Some(true)),
            ("p6e-gb300.36xlarge", Some(true)),
            ("p5.48xlarge", Some(false)),
            ("p6-b200.48xlarge", Some(false)),
            ("m7i.large", None),
        ] {
            std::fs::write(dmi.join("product_name"), format!("{t}\n")).expect("write");
            assert_eq!(nvlink_domain(root.path()).map(|d| d.0), want, "{t}");
        }
    }

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
        assert_eq!(
            efa_maximum(root.path()),
            Some((32, "p5.48xlarge".to_string()))
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
            "g6f.",
            "g5g.",
            "p4d.",
            "p4de.",
            "p5.",
            "p5e.",
            "p5en.",
            "p6-b200.",
            "p6-b300.",
            "p6e-gb200.",
            "p6e-gb300.",
        ] {
            assert!(
                INSTANCE_GPUS.iter().any(|(t, _, _)| t.starts_with(family)),
                "no {family} type"
            );
        }
        for family in ["g5.", "g6.", "g6e."] {
            let sizes = INSTANCE_GPUS
                .iter()
                .filter(|(t, _, _)| t.starts_with(family))
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
            let efa = fields.get(7).and_then(|e| e.parse::<u32>().ok());
            if let Some((_, n, e)) = INSTANCE_GPUS.iter().find(|(name, _, _)| name == t) {
                assert_eq!(*n, gpus, "{t}");
                if efa.is_some() {
                    assert_eq!(*e, efa, "{t} EFA devices");
                }
                compared += 1;
            }
        }
        assert!(compared >= 10, "only {compared} types compared");
    }
}
