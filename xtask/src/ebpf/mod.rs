//! The kernel object, committed: `health-ebpf/object/`.
//!
//! Building the kernel programs needs Debian's Rust compiler and library
//! source, LLVM and bpf-linker built against it: minutes of apt and
//! compiling on a fresh machine, for an object that changes only with the
//! kernel sources. So the object (bpfel, DWARF stripped) is kept in the
//! repository with a manifest of what it was built from ([`manifest`]), as
//! Go's bpf2go keeps its generated objects:
//!
//! - `cargo xtask build`, `run`, `image` and `vm` use the committed object
//!   when its manifest matches the tree's kernel sources ([`check`]), with
//!   no toolchain at all; when the sources changed, they build it and write
//!   the new object and manifest in place ([`ensure`]), to be committed;
//! - `cargo xtask test` builds it again with the toolchain and fails when
//!   the committed bytes are not those of a fresh build ([`verify`]);
//! - `cargo xtask ebpf` builds and writes it ([`refresh`]); `--check` is
//!   [`verify`] alone (CI runs it beside the guests).
//!
//! The build is path-independent and reproducible ([`compile`] says how), so
//! the same sources and toolchain give the same bytes on every machine.
//! health-agent/build.rs embeds `health-ebpf/object/health-ebpf.bpfel.o`
//! (unless `HEALTH_EBPF_OBJECT` names another), so a plain `cargo build`
//! gets a working agent too.

pub mod compile;
pub mod manifest;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use manifest::{Difference, Manifest, Sources};

use crate::bootstrap;
use crate::util::{say, workspace_root};

/// The committed object and its manifest, relative to the workspace root.
pub const OBJECT: &str = "health-ebpf/object/health-ebpf.bpfel.o";
pub const MANIFEST: &str = "health-ebpf/object/manifest.txt";

/// The command that rebuilds and writes both.
const REFRESH: &str = "cargo xtask ebpf";

pub fn object_path() -> PathBuf {
    workspace_root().join(OBJECT)
}

fn manifest_path() -> PathBuf {
    workspace_root().join(MANIFEST)
}

/// Where the kernel object is built: a target directory of its own, so that
/// this build (another compiler) neither waits for the lock of the agent's
/// build running beside it nor shares its host artifacts.
pub fn target_dir() -> PathBuf {
    crate::util::target_dir().join("ebpf")
}

/// Whether the committed object fits this tree.
pub enum Committed {
    Fresh,
    /// Why not, in words.
    Stale(Vec<String>),
}

/// Compares the committed object and manifest with the tree's kernel
/// sources; needs no toolchain.
pub fn check() -> anyhow::Result<Committed> {
    let root = workspace_root();
    let sources = Sources::read(&root).context("reading the kernel sources")?;
    let text = match std::fs::read_to_string(manifest_path()) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Committed::Stale(vec![format!("{MANIFEST} is missing")]))
        }
        Err(e) => return Err(e).with_context(|| format!("reading {MANIFEST}")),
    };
    let committed = match Manifest::parse(&text) {
        Ok(m) => m,
        Err(e) => return Ok(Committed::Stale(vec![format!("{MANIFEST}: {e}")])),
    };
    let object = match std::fs::read(object_path()) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Committed::Stale(vec![format!("{OBJECT} is missing")]))
        }
        Err(e) => return Err(e).with_context(|| format!("reading {OBJECT}")),
    };
    let differences = committed.differences(&sources, &compile::recipe(), &object);
    Ok(if differences.is_empty() {
        Committed::Fresh
    } else {
        Committed::Stale(differences.iter().map(Difference::to_string).collect())
    })
}

/// The object to embed: the committed one when it fits the tree, else a
/// fresh build written in its place (the developer commits it).
pub fn ensure() -> anyhow::Result<PathBuf> {
    match check()? {
        Committed::Fresh => Ok(object_path()),
        Committed::Stale(reasons) => rebuild(&reasons),
    }
}

/// [`refresh`], for a committed object that [`check`] found stale.
pub fn rebuild(reasons: &[String]) -> anyhow::Result<PathBuf> {
    say(format!(
        "the committed kernel object does not fit the kernel sources ({}); building it",
        reasons.join("; ")
    ));
    refresh()
}

/// `cargo xtask ebpf`: installs the toolchain, builds the object and
/// writes it and its manifest in place (only what changed is rewritten, so
/// the agent is not rebuilt for nothing).
pub fn refresh() -> anyhow::Result<PathBuf> {
    let (fresh, manifest) = build_fresh()?;
    let changed = write(&fresh.object, &manifest)?;
    if changed {
        say(format!(
            "wrote {OBJECT} and {MANIFEST}: commit them with the kernel sources"
        ));
    } else {
        say(format!("{OBJECT} and {MANIFEST} are up to date"));
    }
    Ok(object_path())
}

/// `cargo xtask test`: the committed object must be, byte for byte, what
/// the toolchain builds from the tree's sources. When it is not, the fresh
/// build is written in place (ready to commit) and this fails.
pub fn verify() -> anyhow::Result<PathBuf> {
    let committed_text = std::fs::read_to_string(manifest_path()).ok();
    let committed_object = std::fs::read(object_path()).ok();
    let (fresh, manifest) = build_fresh()?;
    let committed = committed_text.as_deref().map(Manifest::parse);
    let problems = match (&committed, &committed_object) {
        (None, _) => vec![format!("{MANIFEST} is missing")],
        (_, None) => vec![format!("{OBJECT} is missing")],
        (Some(Err(e)), _) => vec![format!("{MANIFEST}: {e}")],
        (Some(Ok(committed)), Some(object)) => {
            let mut problems: Vec<String> = committed
                .differences(&manifest.sources, &manifest.recipe, object)
                .iter()
                .map(Difference::to_string)
                .collect();
            let toolchain = (committed.versions != manifest.versions).then(|| {
                Difference::Toolchain {
                    was: committed.versions.clone(),
                    now: manifest.versions.clone(),
                }
                .to_string()
            });
            if *object != fresh.object {
                problems.push(format!(
                    "the committed object is not what this toolchain builds from these sources \
                     (committed sha256 {}, fresh {})",
                    manifest::sha256(object),
                    manifest.object_sha256
                ));
                problems.extend(toolchain);
            } else if let Some(toolchain) = toolchain {
                // The same bytes from another toolchain: the object is right,
                // the manifest names the toolchain that first built it.
                say(format!(
                    "the kernel object is reproduced byte for byte, {toolchain}"
                ));
            }
            problems
        }
    };
    if problems.is_empty() {
        say(format!(
            "{OBJECT} is what this toolchain builds from the tree's sources (sha256 {})",
            manifest.object_sha256
        ));
        return Ok(object_path());
    }
    write(&fresh.object, &manifest)?;
    bail!(
        "{OBJECT} does not match a fresh build of the kernel sources:\n  - {}\n\
         This run wrote the fresh build there. Commit health-ebpf/object/ \
         (`{REFRESH}` rebuilds and writes it the same way).",
        problems.join("\n  - ")
    )
}

/// Installs the toolchain, builds, and describes the result.
fn build_fresh() -> anyhow::Result<(compile::Fresh, Manifest)> {
    let toolchain = bootstrap::ensure_toolchain()?;
    let sources = Sources::read(&workspace_root()).context("reading the kernel sources")?;
    let fresh = compile::build(&toolchain, &target_dir())?;
    // The sources as they were built: a change during the build would
    // otherwise be recorded as built.
    if Sources::read(&workspace_root())? != sources {
        bail!("the kernel sources changed during the build; run it again");
    }
    let manifest = Manifest {
        object_sha256: manifest::sha256(&fresh.object),
        recipe: compile::recipe(),
        versions: fresh.versions.clone(),
        sources,
    };
    Ok((fresh, manifest))
}

/// Writes the object and the manifest where they differ from what is
/// there; whether anything was written.
fn write(object: &[u8], manifest: &Manifest) -> anyhow::Result<bool> {
    let dir = workspace_root().join("health-ebpf/object");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let a = write_if_changed(&object_path(), object)?;
    let b = write_if_changed(&manifest_path(), manifest.render().as_bytes())?;
    Ok(a || b)
}

/// Replaces `path` with `data` (through a temporary file, so a reader never
/// sees half an object) unless it holds exactly that: an unchanged file
/// keeps its time, and health-agent/build.rs does not run again.
fn write_if_changed(path: &Path, data: &[u8]) -> anyhow::Result<bool> {
    if std::fs::read(path).is_ok_and(|old| old == data) {
        return Ok(false);
    }
    let staged = path.with_extension("tmp");
    std::fs::write(&staged, data).with_context(|| format!("writing {}", staged.display()))?;
    std::fs::rename(&staged, path)
        .with_context(|| format!("moving {} to {}", staged.display(), path.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchanged_file_is_not_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o");
        assert!(write_if_changed(&path, b"one").unwrap());
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!write_if_changed(&path, b"one").unwrap());
        assert_eq!(
            std::fs::metadata(&path).unwrap().modified().unwrap(),
            before
        );
        assert!(write_if_changed(&path, b"two").unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert!(!dir.path().join("o.tmp").exists());
    }

    /// The repository's own object fits its sources: otherwise every fresh
    /// machine would need the eBPF toolchain.
    #[test]
    fn the_committed_object_fits_the_kernel_sources() {
        match check().unwrap() {
            Committed::Fresh => {}
            Committed::Stale(reasons) => panic!(
                "{OBJECT} does not fit the tree: {}; run `{REFRESH}` and commit it",
                reasons.join("; ")
            ),
        }
    }
}
