//! The architectures the image is built for, and building the agent and the
//! controller for the one the build host is not: Rust's own target for it
//! (`rustup target add`) and Debian's cross toolchain (gcc, binutils and
//! the C library to link against: ring compiles C), so the build runs at
//! the host's speed, with no emulation. The kernel object is the same for
//! every architecture: its programs read their arguments as the kernel's
//! 64-bit argument arrays (tracepoints, BTF tracepoints, fentry and fexit),
//! never through an architecture's registers.

use std::process::Command;

use anyhow::{bail, Context};

use crate::bootstrap;
use crate::build::Built;
use crate::ebpf::{self, Committed};
use crate::util::{cargo, output, run, say, target_dir, workspace_root};

/// One architecture of the image.
#[derive(Debug, PartialEq, Eq)]
pub struct Arch {
    /// The OCI and Kubernetes name (`kubernetes.io/arch`), Debian's too.
    pub name: &'static str,
    /// Rust's target triple.
    pub rust_target: &'static str,
    /// The GNU triple: Debian's multiarch directory and the cross tools'
    /// prefix (`aarch64-linux-gnu-gcc`).
    pub gnu: &'static str,
    /// The ELF header's `e_machine`.
    pub elf_machine: u16,
    /// `std::env::consts::ARCH` of a program built for it.
    rust_arch: &'static str,
    /// Debian's packages that build for it from another architecture.
    cross_packages: &'static [&'static str],
}

pub const AMD64: Arch = Arch {
    name: "amd64",
    rust_target: "x86_64-unknown-linux-gnu",
    gnu: "x86_64-linux-gnu",
    elf_machine: 62,
    rust_arch: "x86_64",
    cross_packages: &[
        "gcc-x86-64-linux-gnu",
        "binutils-x86-64-linux-gnu",
        "libc6-dev-amd64-cross",
    ],
};

pub const ARM64: Arch = Arch {
    name: "arm64",
    rust_target: "aarch64-unknown-linux-gnu",
    gnu: "aarch64-linux-gnu",
    elf_machine: 183,
    rust_arch: "aarch64",
    cross_packages: &[
        "gcc-aarch64-linux-gnu",
        "binutils-aarch64-linux-gnu",
        "libc6-dev-arm64-cross",
    ],
};

/// Every architecture the image holds, in the order the image lists them.
pub const ALL: [&Arch; 2] = [&AMD64, &ARM64];

/// The build host's architecture (xtask runs on it).
pub fn host() -> anyhow::Result<&'static Arch> {
    let arch = std::env::consts::ARCH;
    ALL.into_iter()
        .find(|a| a.rust_arch == arch)
        .with_context(|| {
            format!("the image is built for amd64 and arm64, not for this host's {arch}")
        })
}

/// The architecture called `name` (`amd64`, `arm64`).
pub fn by_name(name: &str) -> anyhow::Result<&'static Arch> {
    ALL.into_iter().find(|a| a.name == name).with_context(|| {
        let known: Vec<&str> = ALL.iter().map(|a| a.name).collect();
        format!(
            "no architecture {name:?}: the image is built for {}",
            known.join(", ")
        )
    })
}

impl Arch {
    /// Whether the build host is of this architecture.
    pub fn is_host(&self) -> bool {
        self.rust_arch == std::env::consts::ARCH
    }

    /// The binutils program `tool` (`objcopy`) that reads and writes this
    /// architecture's binaries: the host's own, or the cross one.
    pub fn binutil(&self, tool: &str) -> String {
        match self.is_host() {
            true => tool.to_string(),
            false => format!("{}-{tool}", self.gnu),
        }
    }
}

/// The release agent (kernel object embedded) and controller for `arch`,
/// which is not the host's: `cargo build --target`, linked by Debian's
/// cross gcc. Uses the committed kernel object, which the host's build
/// checked (or rebuilt) just before.
pub fn build(arch: &Arch) -> anyhow::Result<Built> {
    if arch.is_host() {
        bail!("{} is this host's architecture: no cross build", arch.name);
    }
    if let Committed::Stale(reasons) = ebpf::check()? {
        bail!(
            "the committed kernel object does not fit the sources ({}): `cargo xtask ebpf` first",
            reasons.join("; ")
        );
    }
    ensure_rust_target(arch.rust_target)?;
    bootstrap::ensure_packages(arch.cross_packages)?;
    say(format!(
        "building health-agent and health-controller for {} (release, {})",
        arch.name, arch.rust_target
    ));
    let key = arch.rust_target.replace('-', "_");
    let gcc = format!("{}-gcc", arch.gnu);
    run(cargo()
        .current_dir(workspace_root())
        .args(["build", "--release", "--target", arch.rust_target])
        .args([
            "--package",
            "health-agent",
            "--package",
            "health-controller",
        ])
        .env(format!("CARGO_TARGET_{}_LINKER", key.to_uppercase()), &gcc)
        .env(format!("CC_{key}"), &gcc)
        .env(format!("AR_{key}"), format!("{}-ar", arch.gnu)))?;
    let release = target_dir().join(arch.rust_target).join("release");
    Ok(Built {
        agent: release.join("health-agent"),
        controller: Some(release.join("health-controller")),
    })
}

/// Installs Rust's standard library for `target` unless rustup has it.
fn ensure_rust_target(target: &str) -> anyhow::Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))
        .context(
            "asking rustup which targets are installed (rustup is how the README installs Rust)",
        )?;
    if installed.lines().any(|l| l.trim() == target) {
        return Ok(());
    }
    say(format!("rustup target add {target}"));
    run(Command::new("rustup").args(["target", "add", target]))
}
