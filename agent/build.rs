//! Generates the kubelet pod-resources gRPC client and the NVRx node health-check server
//! from `proto/` at build time (only with the `clients` feature). protox compiles the .proto
//! in Rust, so the build machine needs no protoc; the generated code lands in OUT_DIR and is
//! never checked in.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
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
