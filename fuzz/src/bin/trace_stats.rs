//! afl target `trace_stats`: see `health_node::fuzz_targets::trace_stats`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::trace_stats::run(data));
}
