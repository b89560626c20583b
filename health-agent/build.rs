//! Embeds the kernel object: the one committed in health-ebpf/object/, or
//! the file `HEALTH_EBPF_OBJECT` names.
//!
//! The object is built separately (another target, another compiler) and
//! kept in the repository with a manifest of its inputs; `cargo xtask`
//! rebuilds it when the kernel sources change (xtask/src/ebpf/). When it is
//! missing, an empty placeholder is embedded so that `cargo check`/`clippy`
//! still work; such a binary refuses to start with a message naming
//! `cargo xtask build`.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=HEALTH_EBPF_OBJECT");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let object = std::env::var_os("HEALTH_EBPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../health-ebpf/object/health-ebpf.bpfel.o"));
    println!("cargo:rerun-if-changed={}", object.display());
    let out =
        PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo")).join("health-ebpf.o");
    let bytes = match std::fs::read(&object) {
        Ok(b) => b,
        Err(_) => {
            println!(
                "cargo:warning=kernel object {} not found: this build cannot attach (run `cargo xtask build`)",
                object.display()
            );
            Vec::new()
        }
    };
    std::fs::write(&out, bytes).expect("writing the embedded kernel object");
}
