//! Generates the CSI gRPC client and server stubs from `proto/csi.proto`.
//!
//! `protox` parses the .proto in pure Rust, so building this crate needs no
//! `protoc` on the machine; its descriptor set goes straight to tonic's prost
//! code generator.

use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    println!("cargo:rerun-if-changed=build.rs");
    let descriptors = protox::compile(["proto/csi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        // The server stubs back the `testing` feature's fake driver; they
        // compile against tonic's always-present server traits, so the agent's
        // default build does not need tonic's transport server.
        .build_server(true)
        // A server implements only the RPCs it serves: the others answer
        // UNIMPLEMENTED, as a driver that lacks them does (the fake driver
        // serves no volume lifecycle, the test driver no expansion).
        .generate_default_stubs(true)
        // We connect over unix sockets with our own connector; the generated
        // `connect(dst)` helper would assume TCP URIs.
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
