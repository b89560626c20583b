//! afl target `mountinfo`: see `health_agent::fuzz_targets::mountinfo`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_agent::fuzz_targets::mountinfo::run(data));
}
