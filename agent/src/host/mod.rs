//! Facts about the host read from sysfs and procfs (roots injectable for tests), and the
//! host-side plumbing every local server and procfs reader shares: bounded reads of other
//! processes' files ([`proc_read`]), where a socket peer lives ([`peer`]), and the one
//! listener policy of the status, NVRx and metrics servers ([`listen`]).

mod boot;
mod dmi;
pub mod instance_types;
pub mod listen;
pub mod node_name;
mod pci;
pub mod peer;
pub mod proc_read;
pub mod resident;

pub use boot::{boot_id, boot_time, driver_branch};
pub use dmi::instance_type;
pub use pci::{nvidia_devices, NvidiaDevices, PciDevice};
