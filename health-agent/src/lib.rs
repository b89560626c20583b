//! The volume-health node agent.
//!
//! Where an error travels: a tracepoint fires in the kernel
//! (`health-ebpf`), is counted per device and sampled into a ring buffer;
//! [`probes`] loads and attaches those programs, [`collector`] turns counters
//! and samples into exact records, [`topology`] names the device and its
//! mounts, [`event`] formats them and [`watch`] runs the loop and prints them.
//!
//! Pod volumes: [`kubelet`] finds them, [`volumes`] maps devices to them and
//! keeps one [`conditions`] state machine per volume, fed by kernel errors,
//! [`checks`] and CSI. In cluster mode ([`k8s`]) the same loop hands
//! condition changes to `k8s::report`, which resolves pod and PVC from the
//! reflectors (`k8s::cluster`) and records them in `k8s::events`, whose
//! writer task sends the Events; [`metrics`] and [`http`] serve Prometheus.

pub mod collector;
pub mod dev;
pub mod event;
pub mod probes;
pub mod topology;
pub mod tracefs;
pub mod watch;

pub mod checks;
pub mod conditions;
pub mod k8s;
pub mod kubelet;
pub mod volumes;

pub mod http;
pub mod metrics;
