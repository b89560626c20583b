//! The developer tool behind `cargo xtask <command>`.
//!
//! xtask owns everything plain cargo cannot do alone: installing the eBPF
//! toolchain on a fresh machine ([`bootstrap`]), building the kernel object
//! with Debian's compiler and embedding it into the agent ([`build`]),
//! running the tests, writing the agent's image without an engine
//! ([`image`]), VMs with other kernels ([`vm`]), fuzzing ([`fuzz`]) and the
//! manifest tools ([`k8s_tools`], [`promtool`]).
//!
//! What it may depend on: small, general crates only (clap, anyhow, nix,
//! tar/flate2/sha2 for the image), never a crate of the workspace, so that
//! `cargo xtask run` on a fresh machine compiles this in seconds and goes
//! on to the release build. What drives the built agent end to end (the
//! benchmarks, the demo, the kind cluster) is the `lab` crate, which xtask
//! builds and runs, and which uses this library.

pub mod bootstrap;
pub mod build;
pub mod cluster_test;
pub mod fuzz;
pub mod image;
pub mod k8s_tools;
pub mod lab;
pub mod promtool;
pub mod util;
pub mod vm;
