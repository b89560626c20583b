//! The kernel side, in userspace: the eBPF programs of `health-ebpf` loaded
//! and attached ([`probes`], with tracepoint field layouts from
//! [`tracefs`]), and their counters and samples turned into exact records
//! ([`collector`]); [`device_maps`] gives the programs the device topology. [`tracer_count`] keeps the kernel tracer's own count of
//! failed requests, so that failures the kernel ran no program for are
//! reported, not hidden. [`pinned`] reads what a pinned agent counted, and [`uninstall`] removes
//! it;
//! [`names`] and [`clock`] give the records' numbers and times their
//! meaning. [`waiting`] reads the bios waiting now, per device, for stalls.
//!
//! The only crate of the workspace that talks to BPF. It uses
//! `health-common` (the records) and `health-core` (device numbers); every
//! later stage reads its records. The kernel object is not embedded here:
//! the binary embeds it ([`include_bytes_aligned`]) and hands it in through
//! [`probes::ProbeOptions::object`], so this crate builds without it.

pub mod clock;
pub mod collector;
pub mod device_maps;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod latency;
pub mod names;
pub mod pinned;
pub mod probes;
pub mod tracefs;
pub mod tracer_count;
pub mod uninstall;
pub mod waiting;

/// Embeds a file 8-byte aligned, as the ELF parser of the loader needs.
pub use aya::include_bytes_aligned;
