//! afl target `kubelet_dir`: see `health_node::fuzz_targets::kubelet_dir`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::kubelet_dir::run(data));
}
