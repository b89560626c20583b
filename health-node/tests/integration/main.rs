//! The node agent's library through its public API: pod volumes, storage
//! backend health, and the fuzz targets' corpora.
//!
//! One test binary per crate: each links the crate and its dependencies
//! (kube, tokio, hyper) at the release profile's opt-level, and a binary
//! per file cost a link and the generics' instantiation each
//! (docs/benchmarks.md, "CI").

mod fuzz_corpus;
mod storage_health;
mod volume_monitor;
