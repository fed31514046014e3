//! The EC2 instance type, from DMI (no network).

use std::path::Path;

/// The instance type: `<sysfs>/class/dmi/id/product_name` is the instance type on Nitro
/// instances (`p5.48xlarge`).
pub fn instance_type(sysfs_root: &Path) -> Option<String> {
    let name = std::fs::read_to_string(sysfs_root.join("class/dmi/id/product_name")).ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_string())
}
