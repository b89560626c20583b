//! afl target `mountstats`: see `health_node::fuzz_targets::mountstats`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::mountstats::run(data));
}
