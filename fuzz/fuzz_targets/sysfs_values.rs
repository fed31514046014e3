//! sysfs and procfs values: the input is split on NUL into the files the agent reads (CPU
//! lists, per-node meminfo, PCI vendor/class/NUMA node, driver version, boot id, uptime, DMI),
//! written into a scratch tree, then topology, PCI enumeration and the boot facts are read.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gpu_agent::{host, kubelet_config};
use libfuzzer_sys::fuzz_target;

const FILES: [&str; 13] = [
    "sys/devices/system/cpu/online",
    "sys/devices/system/cpu/cpu0/topology/thread_siblings_list",
    "sys/devices/system/node/node0/cpulist",
    "sys/devices/system/node/node0/meminfo",
    "sys/bus/pci/devices/0000:3b:00.0/vendor",
    "sys/bus/pci/devices/0000:3b:00.0/class",
    "sys/bus/pci/devices/0000:3b:00.0/numa_node",
    "sys/bus/pci/devices/0000:3b:00.0/device",
    "sys/module/nvidia/version",
    "sys/class/dmi/id/product_name",
    "proc/sys/kernel/random/boot_id",
    "proc/uptime",
    "proc/meminfo",
];

fn root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("gpu-agent-fuzz-{}", std::process::id()));
        for f in FILES {
            let path = root.join(f);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("scratch tree");
        }
        root
    })
}

fuzz_target!(|data: &[u8]| {
    let root = root();
    let mut values = data.split(|b| *b == 0);
    for f in FILES {
        std::fs::write(root.join(f), values.next().unwrap_or_default()).expect("write");
    }
    let (sys, proc) = (root.join("sys"), root.join("proc"));
    let _ = kubelet_config::read_topology(&sys);
    let _ = host::nvidia_devices(&sys);
    let _ = host::driver_branch(&sys);
    let _ = host::instance_type(&sys);
    let _ = host::boot_id(&proc);
    let _ = host::boot_time(&proc);
    let _ = kubelet_config::CpuSet::parse(&String::from_utf8_lossy(data));
});
