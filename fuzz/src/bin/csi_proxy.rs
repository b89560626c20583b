//! afl target `csi_proxy`: see `health_node::fuzz_targets::csi_proxy`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::csi_proxy::run(data));
}
