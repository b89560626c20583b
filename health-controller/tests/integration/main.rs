//! The controller through its public API: the leader's worker, node-down, and
//! the binary's answers to wrong input.
//!
//! One test binary per crate: each links the crate and its dependencies
//! (kube, tokio, hyper) at the release profile's opt-level, and a binary
//! per file cost a link and the generics' instantiation each
//! (docs/benchmarks.md, "CI").

mod cli_input;
mod common;
mod node_down;
mod worker_cycle;
