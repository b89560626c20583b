//! afl target `csi`: see `health_agent::fuzz_targets::csi`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_agent::fuzz_targets::csi::run(data));
}
