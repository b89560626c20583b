//! The volume-health node agent.
//!
//! Where an error travels: a tracepoint fires in the kernel
//! (`health-ebpf`), is counted per device and sampled into a ring buffer;
//! [`probes`] loads and attaches those programs, [`collector`] turns counters
//! and samples into exact records, [`topology`] names the device and its
//! mounts, [`event`] formats them and [`watch`] prints them.

pub mod collector;
pub mod dev;
pub mod event;
pub mod probes;
pub mod topology;
pub mod tracefs;
pub mod watch;

pub mod checks;
pub mod conditions;
pub mod kubelet;
pub mod volumes;
