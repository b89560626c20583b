//! afl target `ringbuf`: see `health_node::fuzz_targets::ringbuf`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::ringbuf::run(data));
}
