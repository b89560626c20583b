//! afl target `ringbuf`: see `health_agent::fuzz_targets::ringbuf`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_agent::fuzz_targets::ringbuf::run(data));
}
