//! afl target `smb_client`: see `health_node::fuzz_targets::smb_client`.
fn main() {
    afl::fuzz!(|data: &[u8]| health_node::fuzz_targets::smb_client::run(data));
}
