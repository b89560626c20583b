//! The suites that drive this host's kernel, as root: kernel errors counted
//! exactly, volumes and their checks, stalls, pinned state, cluster mode
//! against the fake and the real API server, the CSI driver and proxy, the
//! image. One binary for all of them (ripgrep's way): each integration test
//! binary links the workspace anew and instantiates kube's, tokio's and
//! hyper's generics again, which took most of a fresh `cargo xtask test`
//! (docs/benchmarks.md, "CI").
//!
//! A test that starts an agent or fails requests holds the kernel
//! (`health_tests::shared_kernel`, `kernel_alone`) while it does: in one
//! process that lock keeps such tests of every suite one at a time, as
//! separate binaries run one after another did; the others run beside
//! them. `cargo xtask vm --tests kernel_errors` runs one suite (a module
//! here) in a guest.

mod api_requests_audit;
mod checks;
mod cluster;
mod cluster_real_api;
mod csi_driver;
mod csi_proxy;
mod faultdisk_selftest;
mod image;
mod kernel_btf;
mod kernel_errors;
mod kubelet_discovery;
mod latency;
mod memlock;
mod pinning;
mod priority;
mod read_only_remount;
mod schedule;
mod stalls;
mod tenant;
mod topology;
mod tracefs;
mod volumes;
