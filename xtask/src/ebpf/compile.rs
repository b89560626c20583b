//! Building the kernel object with Debian's compiler, the same bytes from
//! any checkout.
//!
//! What could vary between two machines with the same toolchain, and what
//! keeps it out:
//! - absolute paths in the debug info and in BTF's line info: the checkout
//!   is remapped to `..` (relative to the kernel crate, where the linker
//!   runs, so LLVM still finds each source line it copies into `.BTF.ext`),
//!   the cargo registry to `/cargo-registry`; the library source of Debian's
//!   compiler is at the same path everywhere;
//! - the checkout's path in symbol names (cargo hashes a path dependency
//!   outside the kernel crate's workspace by its absolute path): none,
//!   health-common's source is a module of the kernel crate;
//! - the target directory: not in the object;
//! - timestamps: an ELF object has none.
//!
//! The DWARF sections are stripped afterwards (`llvm-objcopy
//! --strip-debug`): the loader reads BTF, which stays, and the object is a
//! fifth of the size in the repository. The flags below are also the
//! recipe the manifest records, so a change to them is a change of inputs.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use super::manifest::Versions;
use crate::bootstrap::{self, Toolchain, DEBIAN_CARGO, DEBIAN_RUSTC};
use crate::util::{output, run, say, without_cargo_run_env, workspace_root};

const TARGET: &str = "bpfel-unknown-none";
/// The kernel crate's build (build-std is unstable; Debian's stable
/// compiler allows it with RUSTC_BOOTSTRAP=1).
const CARGO_ARGS: &[&str] = &[
    "build",
    "--release",
    "--locked",
    "--target",
    TARGET,
    "-Z",
    "build-std=core",
];
/// BTF needs the debug info it is made from.
const RUSTFLAGS: &[&str] = &["-C", "debuginfo=2", "-C", "link-arg=--btf"];
/// Where the checkout and the registry appear in the object.
const CHECKOUT_AS: &str = "..";
const REGISTRY_AS: &str = "/cargo-registry";
const STRIP: &[&str] = &["--strip-debug"];
/// Bumped when the procedure changes in a way the flags above do not show.
const RECIPE_VERSION: u32 = 1;

/// The build as the manifest records it (no machine's paths in it).
pub fn recipe() -> String {
    format!(
        "v{RECIPE_VERSION}: cargo {}; rustflags {} --remap-path-prefix=<checkout>={CHECKOUT_AS} \
         --remap-path-prefix=<cargo home>/registry/src={REGISTRY_AS}; llvm-objcopy {}",
        CARGO_ARGS.join(" "),
        RUSTFLAGS.join(" "),
        STRIP.join(" ")
    )
}

/// A fresh build: the stripped object and the toolchain that made it.
pub struct Fresh {
    pub object: Vec<u8>,
    pub versions: Versions,
}

/// Builds `health-ebpf` in `target_dir` and returns the stripped object.
pub fn build(toolchain: &Toolchain, target_dir: &Path) -> anyhow::Result<Fresh> {
    // cargo runs in the canonical directory (getcwd resolves symlinks), so
    // that is the prefix the compiler sees.
    let root = workspace_root()
        .canonicalize()
        .context("resolving the checkout's path")?;
    say(format!(
        "building the kernel programs (Debian rustc, LLVM {})",
        toolchain.llvm_major
    ));
    let rustflags = format!(
        "{} --remap-path-prefix={}={CHECKOUT_AS} --remap-path-prefix={}={REGISTRY_AS}",
        RUSTFLAGS.join(" "),
        root.display(),
        cargo_home()?.join("registry/src").display()
    );
    let mut cmd = Command::new(DEBIAN_CARGO);
    without_cargo_run_env(&mut cmd)
        .current_dir(root.join("health-ebpf"))
        .args(CARGO_ARGS)
        .arg("--target-dir")
        .arg(target_dir)
        // rustup's proxies and the outer cargo's settings must not leak in:
        // this build uses a different compiler.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env("RUSTC", DEBIAN_RUSTC)
        .env("RUSTC_BOOTSTRAP", "1")
        .env(
            "CARGO_TARGET_BPFEL_UNKNOWN_NONE_LINKER",
            &toolchain.bpf_linker,
        )
        .env("CARGO_TARGET_BPFEL_UNKNOWN_NONE_RUSTFLAGS", rustflags);
    run(&mut cmd).context("building the kernel programs")?;
    let linked = target_dir.join(TARGET).join("release/health-ebpf");
    if !linked.is_file() {
        bail!(
            "the eBPF build succeeded but {} is missing",
            linked.display()
        );
    }
    let stripped = target_dir.join("health-ebpf.bpfel.o");
    run(Command::new(objcopy(toolchain))
        .args(STRIP)
        .arg(&linked)
        .arg(&stripped))
    .context("stripping the kernel object's DWARF")?;
    let object =
        std::fs::read(&stripped).with_context(|| format!("reading {}", stripped.display()))?;
    Ok(Fresh {
        object,
        versions: versions(toolchain)?,
    })
}

/// The llvm-objcopy of the LLVM bpf-linker uses (installed with it).
fn objcopy(toolchain: &Toolchain) -> PathBuf {
    PathBuf::from(format!(
        "/usr/lib/llvm-{}/bin/llvm-objcopy",
        toolchain.llvm_major
    ))
}

/// The cargo home Debian's cargo uses: `CARGO_HOME`, else `~/.cargo`.
fn cargo_home() -> anyhow::Result<PathBuf> {
    let home = match std::env::var_os("CARGO_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(std::env::var_os("HOME").context("neither CARGO_HOME nor HOME is set")?)
                .join(".cargo")
        }
    };
    // The registry's path as the compiler sees it, symlinks resolved, when
    // it exists already.
    Ok(home.canonicalize().unwrap_or(home))
}

fn versions(toolchain: &Toolchain) -> anyhow::Result<Versions> {
    let rustc = output(Command::new(DEBIAN_RUSTC).arg("--version"))?;
    let linker = output(Command::new(&toolchain.bpf_linker).arg("--version"))?;
    Ok(Versions {
        rustc: rustc.trim().to_string(),
        debian_rust: bootstrap::package_version(bootstrap::DEBIAN_RUST_PACKAGE)?,
        llvm: bootstrap::package_version(&format!("libllvm{}", toolchain.llvm_major))?,
        bpf_linker: linker.trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_recipe_names_every_flag_and_no_path_of_this_machine() {
        let recipe = super::recipe();
        assert_eq!(
            recipe,
            "v1: cargo build --release --locked --target bpfel-unknown-none -Z build-std=core; \
             rustflags -C debuginfo=2 -C link-arg=--btf --remap-path-prefix=<checkout>=.. \
             --remap-path-prefix=<cargo home>/registry/src=/cargo-registry; llvm-objcopy --strip-debug"
        );
        let root = crate::util::workspace_root();
        assert!(!recipe.contains(&*root.to_string_lossy()));
    }
}
