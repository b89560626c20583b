//! The volume-health node agent as a library: the last stages of the node
//! pipeline, and the loop that drives all of them.
//!
//! Where an error travels: a tracepoint fires in the kernel (`health-ebpf`),
//! is counted per device and sampled into a ring buffer;
//! - `health_kernel`: `probes` loads and attaches the programs, `collector`
//!   turns counters and samples into exact records;
//! - `health_topology`: names the device, its partitions, loop backing file
//!   and mounts;
//! - [`volumes`]: finds the pod volumes under kubelet's root, maps the device
//!   to them and keeps one condition state machine (`health_core::conditions`)
//!   per volume, fed by kernel errors, built-in checks and CSI;
//! - [`report`]: the [`report::Reporter`] interface, the JSON schema, the
//!   standalone `watch` view and the node's metrics;
//! - [`cluster`]: cluster mode, a reporter that resolves pods and PVCs and
//!   hands condition changes to `health_kube`'s Event recorder and
//!   `VolumeHealth` write plan;
//! - [`conditions_socket`]: in `run`, the agent's conditions per CSI volume
//!   on a unix socket, for `health-agent csi-proxy` (`health_csi::proxy`).
//!
//! [`agent`] is the one loop that drives the stages for `watch` and `run`.
//! Dependencies run downstream only: volumes → report → cluster, and the
//! loop over them; the binary (`health-agent`) is the only user.

pub mod volumes;

pub mod report;

pub mod agent;
pub mod cluster;
pub mod conditions_socket;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz_targets;
