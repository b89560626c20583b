//! Entry points of the coverage-guided fuzz targets.
//!
//! Convention (`cargo xtask fuzz` and the seed-corpus test rely on it): a
//! target `NAME` is a module `NAME` with `pub fn run(data: &[u8])`, in the
//! `fuzzing` module of the crate whose parser it feeds (`health_kernel`,
//! `health_topology`) or here, re-exported here either way; the afl binary
//! `fuzz/src/bin/NAME.rs` calls `health_node::fuzz_targets::NAME::run`; a
//! seed corpus in
//! `fuzz/corpus/NAME/`, and an entry in [`TARGETS`]. `run` feeds the bytes
//! to one parser of outside input the way the agent does and panics only
//! when a property the parser promises is broken; any panic is a finding.
//!
//! Behind the `fuzzing` feature (fuzz/ enables it, and so do this crate's
//! tests, which run the seed corpora through the same functions afl
//! drives): the agent's build does not carry them.

pub mod block_counters;
pub mod csi;
pub mod csi_proxy;
pub mod events_copy;
pub mod kubelet_dir;
pub mod ringbuf;
pub mod vol_data;

pub use health_kernel::fuzzing::{btf, trace_stats, tracefs};
pub use health_topology::fuzzing::{
    dm_status, mountinfo, mountstats, nvme_smart, smb_client, sysfs,
};

/// A target's entry point.
pub type Run = fn(&[u8]);

/// Every target by name, for the seed-corpus test.
pub const TARGETS: &[(&str, Run)] = &[
    ("block_counters", block_counters::run),
    ("btf", btf::run),
    ("csi", csi::run),
    ("csi_proxy", csi_proxy::run),
    ("dm_status", dm_status::run),
    ("events_copy", events_copy::run),
    ("kubelet_dir", kubelet_dir::run),
    ("mountinfo", mountinfo::run),
    ("mountstats", mountstats::run),
    ("nvme_smart", nvme_smart::run),
    ("ringbuf", ringbuf::run),
    ("smb_client", smb_client::run),
    ("sysfs", sysfs::run),
    ("trace_stats", trace_stats::run),
    ("tracefs", tracefs::run),
    ("vol_data", vol_data::run),
];
