//! afl target `tracefs`: see `health_agent::fuzz_targets::tracefs`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_agent::fuzz_targets::tracefs::run(data));
}
