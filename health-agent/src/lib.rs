//! The volume-health node agent, one folder per pipeline stage.
//!
//! Where an error travels: a tracepoint fires in the kernel (`health-ebpf`),
//! is counted per device and sampled into a ring buffer;
//! - [`kernel`]: `probes` loads and attaches the programs, `collector` turns
//!   counters and samples into exact records;
//! - [`topology`]: names the device, its partitions, loop backing file and
//!   mounts;
//! - [`volumes`]: finds the pod volumes under kubelet's root, maps the device
//!   to them and keeps one condition state machine per volume, fed by kernel
//!   errors, built-in checks and CSI;
//! - [`report`]: the [`report::Reporter`] interface, the JSON schema, the
//!   standalone `watch` view, metrics and the HTTP endpoints;
//! - [`k8s`]: cluster mode, a reporter that resolves pods and PVCs from
//!   reflectors and writes Events.
//!
//! - [`controller`]: `health-agent controller`, the cluster-side half: a
//!   leader-elected sidecar of a CSI controller plugin that asks the driver
//!   about every PV and watches for nodes going down, writing Events on the
//!   PVCs (and pods) through the same recorder.
//!
//! [`agent`] is the one loop that drives the stages for `watch` and `run`.
//! Dependencies run downstream only: kernel → topology → volumes → report →
//! k8s; [`dev`] (device numbers) and [`bounded`] (syscalls that may hang,
//! bounded by a timeout) are shared by all.

pub mod bounded;
pub mod dev;

pub mod kernel;
pub mod topology;
pub mod volumes;

pub mod report;

pub mod agent;
pub mod controller;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod k8s;
