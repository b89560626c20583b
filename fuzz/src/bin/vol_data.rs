//! afl target `vol_data`: see `health_node::fuzz_targets::vol_data`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::vol_data::run(data));
}
