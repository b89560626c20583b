//! Generates the kubelet's plugin registration service (client and server)
//! from `proto/pluginregistration.proto`, for the test CSI driver's
//! registration socket. `protox` parses the .proto in pure Rust, as
//! health-csi's build does: no `protoc` on the build machine.

use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto/pluginregistration.proto");
    println!("cargo:rerun-if-changed=build.rs");
    let descriptors = protox::compile(["proto/pluginregistration.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Unix sockets only, with our own connector.
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
