//! afl target `events_copy`: see `health_node::fuzz_targets::events_copy`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::events_copy::run(data));
}
