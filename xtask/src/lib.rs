//! The developer tasks' library: the steps behind `cargo xtask <command>`.
//!
//! It owns everything plain cargo cannot do alone: the kernel object,
//! committed and checked against its sources, built with Debian's compiler
//! when they change ([`ebpf`]), installing that toolchain and the test tools
//! ([`bootstrap`]), building the agent with the object embedded ([`build`]),
//! running the tests ([`suite`]; as a user without root, too:
//! [`as_user`]), writing the agent's image without an engine, for amd64 and
//! arm64 ([`image`], [`cross`]), VMs with other kernels
//! ([`vm`]), fuzzing ([`fuzz`]), the manifest tools ([`k8s_tools`],
//! [`promtool`]) and the Kubernetes and CSI components built from Go
//! modules ([`components`]).
//!
//! Who uses it, one way only: the command line (`xtask/cli`, the `cargo
//! xtask` binary) and the lab (`lab/`, which drives the built agent end to
//! end and builds what it needs through this library). Neither is known
//! here. The lab's command lines are defined here ([`lab_cli`]) so that the
//! command line answers `--help` without building the lab.
//!
//! What it may depend on: small, general crates only (clap, anyhow, nix,
//! tar/flate2/sha2 for the image), never a crate of the workspace, so that
//! `cargo xtask run` on a fresh machine compiles this in seconds and goes
//! on to the release build.

pub mod as_user;
pub mod bootstrap;
pub mod build;
pub mod components;
pub mod cross;
pub mod ebpf;
pub mod fuzz;
pub mod image;
pub mod k8s_tools;
pub mod lab_cli;
pub mod promtool;
pub mod suite;
pub mod util;
pub mod vm;
