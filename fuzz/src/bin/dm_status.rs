//! afl target `dm_status`: see `health_node::fuzz_targets::dm_status`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::dm_status::run(data));
}
