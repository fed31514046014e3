//! The test kubelet's pod-resources server, generated from the agent's own proto (so the two
//! sides cannot drift), with protox: no protoc needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../agent/proto");
    let files = protox::compile(["podresources/v1/api.proto"], ["../agent/proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_transport(false)
        .compile_fds(files)?;
    Ok(())
}
