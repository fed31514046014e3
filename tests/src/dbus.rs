//! A private `dbus-daemon` on a socket in a test's directory: the bus the fake logind and
//! the fake systemd manager serve on, and the agent connects to by address, with the runtime
//! the fakes' D-Bus objects run on.

use std::io::Read;
use std::process::{Child, Command, Stdio};

/// A running bus; killed when dropped.
pub struct PrivateBus {
    /// The bus address (`unix:path=...,guid=...`).
    pub address: String,
    /// Where the fakes' objects on this bus are served.
    pub runtime: tokio::runtime::Runtime,
    daemon: Child,
}

impl PrivateBus {
    /// Start `dbus-daemon` listening on `socket`, and wait for its address.
    pub fn start(socket: &std::path::Path) -> Self {
        let mut daemon = Command::new("dbus-daemon")
            .args(["--session", "--nofork", "--print-address=1"])
            .arg(format!("--address=unix:path={}", socket.display()))
            .stdout(Stdio::piped())
            .spawn()
            .expect("dbus-daemon (apt install dbus)");
        let mut address = String::new();
        let mut out = daemon.stdout.take().expect("stdout");
        let mut byte = [0u8; 1];
        while out.read(&mut byte).expect("read address") == 1 && byte[0] != b'\n' {
            address.push(byte[0] as char);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        Self {
            address,
            runtime,
            daemon,
        }
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}
