//! Facts about the host read from sysfs and procfs (roots injectable for tests).

mod boot;
mod dmi;
pub mod instance_types;
pub mod node_name;
mod pci;
pub mod peer;
pub mod proc_read;
pub mod resident;

pub use boot::{boot_id, boot_time, driver_branch};
pub use dmi::instance_type;
pub use pci::{nvidia_devices, NvidiaDevices, PciDevice};
