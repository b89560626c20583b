//! afl target `tracefs`: see `health_node::fuzz_targets::tracefs`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::tracefs::run(data));
}
