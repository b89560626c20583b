//! The `health-agent` binary as users run it: wrong input and `csi-proxy`.
//!
//! One test binary per crate: each links the crate and its dependencies
//! (kube, tokio, hyper) at the release profile's opt-level, and a binary
//! per file cost a link and the generics' instantiation each
//! (docs/benchmarks.md, "CI").

mod cli_input;
mod csi_proxy_command;
