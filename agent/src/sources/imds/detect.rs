//! Is this an EC2 instance? Decided from DMI and the hypervisor UUID, without any network.

use std::path::Path;

/// `Ok(())` on EC2, else why not.
pub fn ec2(sysfs_root: &Path) -> Result<(), String> {
    let read = |p: &str| {
        std::fs::read_to_string(sysfs_root.join(p))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    for file in ["class/dmi/id/sys_vendor", "class/dmi/id/board_vendor"] {
        if read(file) == "Amazon EC2" {
            return Ok(());
        }
    }
    for file in ["class/dmi/id/product_uuid", "hypervisor/uuid"] {
        if read(file).to_ascii_lowercase().starts_with("ec2") {
            return Ok(());
        }
    }
    Err(format!(
        "not an EC2 instance (no \"Amazon EC2\" vendor or ec2 UUID under {}); IMDS is not contacted",
        sysfs_root.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendor_or_uuid() {
        let root = tempfile::tempdir().expect("tempdir");
        assert!(ec2(root.path()).is_err());
        std::fs::create_dir_all(root.path().join("hypervisor")).expect("mkdir");
        std::fs::write(
            root.path().join("hypervisor/uuid"),
            "ec2e1916-9099-7caf-fd21-012345abcdef\n",
        )
        .expect("write");
        assert!(ec2(root.path()).is_ok());
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("class/dmi/id")).expect("mkdir");
        std::fs::write(root.path().join("class/dmi/id/sys_vendor"), "Amazon EC2\n").expect("write");
        assert!(ec2(root.path()).is_ok());
    }
}
