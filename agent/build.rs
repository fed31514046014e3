//! Generates the kubelet pod-resources gRPC client and the NVRx node health-check server
//! from `proto/` at build time (only with the `clients` feature). protox compiles the .proto
//! in Rust, so the build machine needs no protoc; the generated code lands in OUT_DIR and is
//! never checked in.
//!
//! It also lays out the fault path's code: on x86_64 Linux release builds (linked by lld,
//! Rust's default there) the functions listed in `hot-path.order` (what the daemon runs at
//! steady state and on a fault, profiled by `scripts/hot-path-order.sh`) are placed together
//! between the `gpu_agent_hot_start` and `gpu_agent_hot_end` markers, and the crate is built
//! with `cfg(hot_layout)` so that `host::resident` can keep that region locked in memory and
//! hand the rest of the program back. `GPU_AGENT_HOT_LAYOUT=off` builds without it (for a
//! linker without `--symbol-ordering-file`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    hot_layout();
    #[cfg(feature = "clients")]
    {
        let files = protox::compile(["podresources/v1/api.proto"], ["proto"])?;
        tonic_prost_build::configure()
            .build_server(false)
            .build_transport(false)
            .compile_fds(files)?;
        let files = protox::compile(["nvhcd/nvhcd.proto"], ["proto"])?;
        tonic_prost_build::configure()
            .build_client(false)
            .build_transport(false)
            .compile_fds(files)?;
    }
    Ok(())
}

/// Link the binary with the fault path's functions first and together (see the module doc).
fn hot_layout() {
    println!("cargo:rerun-if-changed=hot-path.order");
    println!("cargo:rerun-if-env-changed=GPU_AGENT_HOT_LAYOUT");
    println!("cargo::rustc-check-cfg=cfg(hot_layout)");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    // The order names the x86_64 release build's symbols: another target or profile mangles
    // them differently, and only lld (and mold) read the file.
    if var("TARGET") != "x86_64-unknown-linux-gnu"
        || var("PROFILE") != "release"
        || var("GPU_AGENT_HOT_LAYOUT") == "off"
    {
        return;
    }
    let order = std::path::Path::new(&var("CARGO_MANIFEST_DIR")).join("hot-path.order");
    println!(
        "cargo:rustc-link-arg-bin=gpu-agent=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    // A symbol the order names but this build lacks (a dependency updated since the profile)
    // is skipped: the region shrinks, and `host::resident` checks what is left.
    println!("cargo:rustc-link-arg-bin=gpu-agent=-Wl,--no-warn-symbol-ordering");
    println!("cargo:rustc-cfg=hot_layout");
}
