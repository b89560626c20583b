//! afl target `btf`: see `health_agent::fuzz_targets::btf`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_agent::fuzz_targets::btf::run(data));
}
