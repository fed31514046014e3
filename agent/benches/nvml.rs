//! NVML poll cost: one full poll of 8 GPUs (identity, ECC, remapping, 18 NVLinks with three
//! counters each, PCIe and its replay counter, clock events, utilisation, SM clocks, power
//! limits, a GPM sample each and the activity since the last, and the checks and the slow
//! verdict) through the real nvml-wrapper against the fake library, as the daemon polls.
//!
//! ```sh
//! cargo build --release -p fake-nvml
//! FAKE_NVML_LIB=target/release/libfake_nvml.so cargo bench -p gpu-agent --bench nvml
//! ```

use std::time::Instant;

use gpu_agent::sources::nvml::gpm::Gpm;
use gpu_agent::sources::nvml::{load, Poller, Settings};

fn main() {
    let Some(lib) = std::env::var_os("FAKE_NVML_LIB") else {
        eprintln!("set FAKE_NVML_LIB to the fake library (see the file's doc comment)");
        std::process::exit(2);
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = dir.path().join("nvml.toml");
    let mut text = String::new();
    for i in 0..8 {
        text.push_str(&format!(
            "[[gpu]]\npci = \"0000:{:02x}:00.0\"\nuuid = \"GPU-{i}\"\nname = \"NVIDIA H100 80GB HBM3\"\nnvlink.up = [{}]\nutilization = {{ gpu = 95, memory = 40 }}\ngpm = {{ sm = 90.0, occupancy = 40.0, tensor = 55.0, dram_bw = 30.0 }}\n",
            0x18 + i * 0x10,
            vec!["true"; 18].join(", ")
        ));
    }
    std::fs::write(&scenario, text).expect("scenario");
    std::env::set_var("FAKE_NVML_SCENARIO", &scenario);
    let nvml = load(std::path::Path::new(&lib)).expect("load fake NVML");
    let mut poller = Poller::new(Settings {
        library: lib.into(),
        poll_interval: std::time::Duration::from_secs(10),
        expected_gpus: 8,
        sysfs_root: dir.path().to_path_buf(),
        procfs_root: dir.path().to_path_buf(),
        nvlink_boot_grace: std::time::Duration::ZERO,
        baseline: None,
        slow: gpu_agent::sources::nvml::slow::Limits::default(),
    });
    let mut gpm = Gpm::new(&nvml);
    for _ in 0..10 {
        poller.poll_with(&nvml, Some(&mut gpm));
    }
    let rounds = 1_000;
    let started = Instant::now();
    for _ in 0..rounds {
        poller.poll_with(&nvml, Some(&mut gpm));
    }
    let per_poll = started.elapsed() / rounds;
    println!(
        "NVML poll, 8 GPUs x 18 NVLinks, fake library: {:.1} µs per poll",
        per_poll.as_secs_f64() * 1e6
    );
}
