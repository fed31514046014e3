//! EFA devices for a [`Host`]'s fake sysfs, in the real layout (`class/infiniband/<dev>` ->
//! the Amazon PCI function bound to `efa`, `ports/1/hw_counters`, the device's own
//! `hw_counters`, `device/net/<ifname>`), and a real network interface whose carrier a test
//! takes down and up: one end of a veth pair, the other end in a network namespace.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::Host;

/// The counters every fake device starts with, at 0.
const COUNTERS: &[&str] = &[
    "rx_drops",
    "rdma_read_wr_err",
    "rdma_write_wr_err",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
    "retrans_timeout_events",
    "retrans_pkts",
    "tx_bytes",
    "rx_bytes",
];

impl Host {
    /// Add EFA device `index` (`rdmap<index>s0`, PCI `<domain>:<0x80 + index>:00.0`, NUMA node
    /// `index % 2`); with `netdev`, its network interface is that real interface. Returns the
    /// device's name.
    pub fn add_efa(&self, index: u8, netdev: Option<&str>) -> String {
        let name = format!("rdmap{index}s0");
        let pci = self.efa_pci(index);
        let function = self.sysfs().join("devices/pci0000:80").join(&pci);
        std::fs::create_dir_all(&function).expect("efa pci dir");
        std::fs::write(function.join("vendor"), "0x1d0f\n").expect("vendor");
        std::fs::write(function.join("numa_node"), format!("{}\n", index % 2)).expect("numa");
        let driver = self.sysfs().join("bus/pci/drivers/efa");
        std::fs::create_dir_all(&driver).expect("driver dir");
        std::os::unix::fs::symlink(&driver, function.join("driver")).expect("driver link");
        if let Some(netdev) = netdev {
            std::fs::create_dir_all(function.join("net")).expect("net dir");
            std::os::unix::fs::symlink(
                PathBuf::from("/sys/class/net").join(netdev),
                function.join("net").join(netdev),
            )
            .expect("netdev link");
        }
        let dev = self.efa_dir(&name);
        std::fs::create_dir_all(dev.join("ports/1/hw_counters")).expect("ports");
        std::fs::create_dir_all(dev.join("hw_counters")).expect("hw_counters");
        std::fs::write(dev.join("ports/1/state"), "4: ACTIVE\n").expect("state");
        std::fs::write(dev.join("ports/1/link_layer"), "Unknown\n").expect("link_layer");
        for counter in COUNTERS {
            self.set_efa_counter(&name, counter, 0);
        }
        for counter in ["no_completion_cmds", "cmds_err"] {
            std::fs::write(dev.join("hw_counters").join(counter), "0\n").expect("counter");
        }
        std::os::unix::fs::symlink(&function, dev.join("device")).expect("device link");
        name
    }

    /// Take device `name` away, as a device that fell off the bus leaves sysfs.
    pub fn remove_efa(&self, name: &str) {
        std::fs::remove_dir_all(self.efa_dir(name)).expect("remove efa device");
    }

    /// `<domain>:<0x80 + index>:00.0`, EFA device `index`'s PCI address.
    pub fn efa_pci(&self, index: u8) -> String {
        format!("{:04x}:{:02x}:00.0", self.domain, 0x80 + u32::from(index))
    }

    fn efa_dir(&self, name: &str) -> PathBuf {
        self.sysfs().join("class/infiniband").join(name)
    }

    /// Set a port counter of device `name` (written whole, as the kernel shows it).
    pub fn set_efa_counter(&self, name: &str, counter: &str, value: u64) {
        let path = self.efa_dir(name).join("ports/1/hw_counters").join(counter);
        std::fs::write(path, format!("{value}\n")).expect("counter");
    }

    /// Make DMI name the instance type (only the product name: no vendor, so the agent
    /// never takes the host for EC2 and sends nothing to IMDS).
    pub fn set_instance_type(&self, instance_type: &str) {
        let dmi = self.sysfs().join("class/dmi/id");
        std::fs::create_dir_all(&dmi).expect("dmi");
        std::fs::write(dmi.join("product_name"), format!("{instance_type}\n")).expect("type");
    }
}

/// A veth pair: `host` in this network namespace (the agent's: its `carrier` is what the
/// agent reads), `peer` in a namespace of its own. The link is up while the peer is up.
#[derive(Debug)]
pub struct Veth {
    /// The interface the agent reads.
    pub host: String,
    peer: String,
    netns: String,
}

fn ip(args: &[&str]) {
    let status = Command::new("ip")
        .args(args)
        .status()
        .expect("ip (iproute2)");
    assert!(status.success(), "ip {}", args.join(" "));
}

impl Veth {
    /// Create the pair, both ends up.
    pub fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = format!(
            "{:x}{}",
            std::process::id() % 0xffff,
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let veth = Self {
            host: format!("gae{id}"),
            peer: format!("gap{id}"),
            netns: format!("gpu-agent-efa-{id}"),
        };
        ip(&["netns", "add", &veth.netns]);
        ip(&[
            "link", "add", &veth.host, "type", "veth", "peer", "name", &veth.peer,
        ]);
        ip(&["link", "set", &veth.peer, "netns", &veth.netns]);
        ip(&["link", "set", &veth.host, "up"]);
        veth.set_peer(true);
        veth
    }

    /// Take the far end up or down: the near end's carrier follows.
    pub fn set_peer(&self, up: bool) {
        ip(&[
            "-n",
            &self.netns,
            "link",
            "set",
            &self.peer,
            if up { "up" } else { "down" },
        ]);
    }
}

impl Veth {
    /// Take the near end (the agent's) administratively up or down.
    pub fn set_admin(&self, up: bool) {
        ip(&["link", "set", &self.host, if up { "up" } else { "down" }]);
    }
}

impl Default for Veth {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}
