//! afl target `sysfs`: see `health_agent::fuzz_targets::sysfs`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_agent::fuzz_targets::sysfs::run(data));
}
