//! Fuzz entry points of this crate's parsers of outside input (tracefs
//! formats, BTF, tracefs statistics); listed with every other target in
//! `health_node::fuzz_targets`, whose doc gives the convention.

pub mod btf;
pub mod trace_stats;
pub mod tracefs;
