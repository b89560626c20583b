//! The Event recorder, the Event writer and the `VolumeHealth` board through
//! their public API, pure or against kube's mock API service (tower-test).
//!
//! One test binary per crate: each links the crate and its dependencies
//! (kube, tokio, hyper) at the release profile's opt-level, and a binary
//! per file cost a link and the generics' instantiation each
//! (docs/benchmarks.md, "CI").

mod common;
mod events_recorder;
mod events_restart;
mod events_takeover;
mod status_takeover;
mod status_write_plan;
mod writer_requests;
