//! afl target `csi`: see `health_node::fuzz_targets::csi`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::csi::run(data));
}
