//! Installing the eBPF toolchain and the test tools on a fresh machine.
//!
//! Only a build of the kernel object needs the toolchain (everyone else uses
//! the committed object, xtask::ebpf). The object is built with Debian's
//! Rust (its library source ships as a Debian package that matches the
//! compiler exactly, which `-Z build-std` needs) and linked by bpf-linker
//! built against the same LLVM major as that compiler. The major is read
//! from the compiler rather than assumed, so a Debian update that moves
//! rustc to another LLVM still produces a working linker. Everything
//! installed is cached: apt packages system-wide, bpf-linker under
//! `~/.cache/volume-health/tools`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};

use crate::util::{is_root, lock_exclusive, on_path, output, run, say};

/// The tools the image tests drive (`health_tests::cmd::IMAGE_TEST_TOOLS`),
/// each with its Debian package: `cargo xtask test` installs them.
pub const IMAGE_TEST_TOOLS: &[(&str, &str)] = &[
    ("skopeo", "skopeo"),
    ("umoci", "umoci"),
    ("unshare", "util-linux"),
    ("chroot", "coreutils"),
    ("timeout", "coreutils"),
    ("readelf", "binutils"),
    ("qemu-aarch64", "qemu-user"),
    ("qemu-system-aarch64", "qemu-system-arm"),
    ("cpio", "cpio"),
    ("xz", "xz-utils"),
    ("debugfs", "e2fsprogs"),
];

pub const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
pub const DEBIAN_CARGO: &str = "/usr/bin/cargo";
const BPF_LINKER_VERSION: &str = "0.13.0";

/// The Debian package of the compiler; its cargo and library source come
/// from the same source package, at the same version.
pub const DEBIAN_RUST_PACKAGE: &str = "rustc-web";
/// Debian's compiler, its cargo and its library source (for build-std).
const COMPILER_PACKAGES: &[&str] = &[DEBIAN_RUST_PACKAGE, "cargo-web", "rust-web-src"];
/// Tools the real-kernel tests, the demo and the benchmarks drive, and etcd
/// and openssl for the real kube-apiserver of the RBAC tests
/// (health_tests::envtest). Building or running the agent needs none.
pub const TEST_PACKAGES: &[&str] = &[
    "util-linux",
    "e2fsprogs",
    "xfsprogs",
    "btrfs-progs",
    "fdisk",
    "fuse3",
    "kmod",
    "etcd-server",
    "openssl",
];

pub struct Toolchain {
    pub bpf_linker: PathBuf,
    pub llvm_major: u32,
}

/// Makes sure the eBPF toolchain is installed: only a build of the kernel
/// object needs it (xtask::ebpf), not one of the agent.
pub fn ensure_toolchain() -> anyhow::Result<Toolchain> {
    let mut apt = Apt::default();
    apt.ensure(COMPILER_PACKAGES)?;
    let llvm_major = rustc_llvm_major()?;
    let llvm_packages = [
        format!("llvm-{llvm_major}-dev"),
        format!("libllvm{llvm_major}"),
    ];
    let llvm_refs: Vec<&str> = llvm_packages.iter().map(String::as_str).collect();
    apt.ensure(&llvm_refs)?;
    let bpf_linker = ensure_bpf_linker(llvm_major)?;
    Ok(Toolchain {
        bpf_linker,
        llvm_major,
    })
}

/// "LLVM version: 22.1.8" in `rustc --version --verbose`.
fn rustc_llvm_major() -> anyhow::Result<u32> {
    let text = output(Command::new(DEBIAN_RUSTC).args(["--version", "--verbose"]))?;
    parse_llvm_major(&text).with_context(|| {
        format!("no LLVM version in `{DEBIAN_RUSTC} --version --verbose`:\n{text}")
    })
}

fn parse_llvm_major(text: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.strip_prefix("LLVM version:"))
        .and_then(|v| v.trim().split('.').next())
        .and_then(|m| m.parse().ok())
}

#[derive(Default)]
struct Apt {
    updated: bool,
}

impl Apt {
    fn ensure(&mut self, packages: &[&str]) -> anyhow::Result<()> {
        let missing = missing_packages(packages);
        if missing.is_empty() {
            return Ok(());
        }
        if !is_root() {
            bail!(
                "missing Debian packages {}; run `cargo xtask build` as root, or `apt-get install {}` first",
                missing.join(" "),
                missing.join(" ")
            );
        }
        if !self.updated {
            say("apt-get update");
            run_apt(Command::new("apt-get").args(["update", "-qq"]))?;
            self.updated = true;
        }
        say(format!("installing Debian packages: {}", missing.join(" ")));
        run_apt(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    }
}

/// Runs `apt` (an `apt-get` command) while no other apt-get of this
/// project's runs: two at once fail on apt's own locks (the package lists',
/// dpkg's), and CI installs the eBPF toolchain beside the guests' stage,
/// which fetches their tools. Another program's apt holding dpkg's lock
/// (unattended-upgrades) is waited for too, up to 5 minutes.
pub fn run_apt(apt: &mut Command) -> anyhow::Result<()> {
    let _lock = lock_exclusive(&cache_dir().join(".apt.lock"), || {
        "waiting for another apt-get of this project's to end".into()
    })?;
    run(apt.args(["-o", "DPkg::Lock::Timeout=300"]))
}

/// Makes sure the tools the root tests, the demo and the benchmarks drive
/// are installed.
pub fn ensure_test_packages() -> anyhow::Result<()> {
    ensure_packages(TEST_PACKAGES)
}

/// Which of `packages` are not installed.
pub fn missing_packages<'a>(packages: &[&'a str]) -> Vec<&'a str> {
    packages.iter().copied().filter(|p| !installed(p)).collect()
}

/// The installed version of a Debian package (`dpkg-query`).
pub fn package_version(package: &str) -> anyhow::Result<String> {
    let version = output(Command::new("dpkg-query").args(["-W", "-f=${Version}", package]))?;
    let version = version.trim();
    if version.is_empty() {
        bail!("dpkg-query knows no installed version of {package}");
    }
    Ok(version.to_string())
}

/// Makes sure each (command, Debian package) is there: a command found on
/// PATH is used as it is (it may come from elsewhere than Debian, like npm
/// from a nodejs package), otherwise its package is installed.
pub fn ensure_commands(commands: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = commands
        .iter()
        .filter(|(command, _)| on_path(command).is_none())
        .map(|(_, package)| *package)
        .collect();
    Apt::default().ensure(&missing)
}

/// Makes sure the Debian `packages` are installed (`cargo xtask cluster`
/// needs packages, not commands: the CNI plugins and a static busybox).
pub fn ensure_packages(packages: &[&str]) -> anyhow::Result<()> {
    Apt::default().ensure(packages)
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Where built and fetched tools are kept (`~/.cache/volume-health/tools`).
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    base.join("volume-health/tools")
}

fn ensure_bpf_linker(llvm_major: u32) -> anyhow::Result<PathBuf> {
    let root = cache_dir().join(format!("bpf-linker-{BPF_LINKER_VERSION}-llvm{llvm_major}"));
    let bin = root.join("bin/bpf-linker");
    if bin.is_file() {
        return Ok(bin);
    }
    say(format!(
        "building bpf-linker {BPF_LINKER_VERSION} against LLVM {llvm_major} into {} (once; takes a few minutes)",
        root.display()
    ));
    // /usr/bin/llvm-config may be another LLVM; point the build at ours.
    run(crate::util::cargo()
        .args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
            "--no-default-features",
        ])
        .args(["--features", &format!("llvm-{llvm_major}"), "--root"])
        .arg(&root)
        .env("LLVM_PREFIX", format!("/usr/lib/llvm-{llvm_major}")))
    .context("building bpf-linker")?;
    if !bin.is_file() {
        bail!("bpf-linker installed, but {} is missing", bin.display());
    }
    Ok(bin)
}

#[cfg(test)]
mod tests {
    #[test]
    fn llvm_major_comes_from_rustc_verbose_output() {
        let text = "rustc 1.96.0\nbinary: rustc\nhost: x86_64-unknown-linux-gnu\nrelease: 1.96.0\nLLVM version: 22.1.8\n";
        assert_eq!(super::parse_llvm_major(text), Some(22));
        assert_eq!(super::parse_llvm_major("rustc 1.96.0\n"), None);
    }
}
