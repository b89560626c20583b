//! afl target `nvme_smart`: see `health_node::fuzz_targets::nvme_smart`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::nvme_smart::run(data));
}
