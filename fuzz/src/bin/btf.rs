//! afl target `btf`: see `health_node::fuzz_targets::btf`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::btf::run(data));
}
