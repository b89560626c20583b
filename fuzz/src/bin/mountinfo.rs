//! afl target `mountinfo`: see `health_node::fuzz_targets::mountinfo`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::mountinfo::run(data));
}
