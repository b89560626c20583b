//! afl target `block_counters`: see `health_node::fuzz_targets::block_counters`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::block_counters::run(data));
}
