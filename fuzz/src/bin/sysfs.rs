//! afl target `sysfs`: see `health_node::fuzz_targets::sysfs`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::sysfs::run(data));
}
