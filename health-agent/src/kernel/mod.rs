//! The kernel stage: the eBPF programs of `health-ebpf` loaded and attached
//! ([`probes`], with tracepoint field layouts from [`tracefs`]), and their
//! counters and samples turned into exact records ([`collector`]).
//! [`witness`] keeps the kernel tracer's own count of failed requests, so
//! that failures the kernel ran no program for are reported, not hidden.
//! [`names`] and [`clock`] give the records' numbers and times their
//! meaning. Uses only `crate::dev`; every later stage reads its records.

pub mod clock;
pub mod collector;
pub mod names;
pub mod pinned;
pub mod probes;
pub mod tracefs;
pub mod witness;
