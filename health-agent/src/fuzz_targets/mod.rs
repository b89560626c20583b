//! Entry points of the coverage-guided fuzz targets.
//!
//! Convention (`cargo xtask fuzz` and the seed-corpus test rely on it): a
//! target `NAME` is this module's file `NAME.rs` with
//! `pub fn run(data: &[u8])`, the afl binary `fuzz/src/bin/NAME.rs` that
//! calls `health_agent::fuzz_targets::NAME::run`, a seed corpus in
//! `fuzz/corpus/NAME/`, and an entry in [`TARGETS`]. `run` feeds the bytes
//! to one parser of outside input the way the agent does and panics only
//! when a property the parser promises is broken; any panic is a finding.
//!
//! Compiled in every build (not behind a feature) so that the tests run the
//! seed corpora through the same functions afl drives; hidden from the docs.

pub mod btf;
pub mod csi;
pub mod kubelet_dir;
pub mod mountinfo;
pub mod ringbuf;
pub mod sysfs;
pub mod trace_stats;
pub mod tracefs;
pub mod vol_data;

/// A target's entry point.
pub type Run = fn(&[u8]);

/// Every target by name, for the seed-corpus test.
pub const TARGETS: &[(&str, Run)] = &[
    ("btf", btf::run),
    ("csi", csi::run),
    ("kubelet_dir", kubelet_dir::run),
    ("mountinfo", mountinfo::run),
    ("ringbuf", ringbuf::run),
    ("sysfs", sysfs::run),
    ("trace_stats", trace_stats::run),
    ("tracefs", tracefs::run),
    ("vol_data", vol_data::run),
];
