//! The manifest beside the committed kernel object: what it was built from.
//!
//! It records the SHA-256 of the object, of every input file (the kernel
//! crate's manifest, lock and sources, and health-common's sources), the
//! build recipe (xtask's flags) and the toolchain's versions, and one digest
//! over all inputs. Plain `key = value` lines, so that a change reads well in
//! a diff and the bytes never depend on a serializer's key order.
//!
//! What decides whether the committed object still fits a tree
//! ([`Manifest::differences`]): the input files and the recipe. The
//! toolchain is recorded (and in the inputs digest) but cannot be compared
//! where no toolchain is installed, which is the point of committing the
//! object; `cargo xtask test` compares it when it rebuilds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The first line of the digested text, and the `format` line: a new
/// layout of either changes it.
pub const FORMAT: &str = "volume-health kernel object manifest v1";

/// Input files, relative to the workspace root.
pub const INPUT_FILES: &[&str] = &["health-ebpf/Cargo.toml", "health-ebpf/Cargo.lock"];
/// Input directories, every file under them (health-common's source is a
/// module of the kernel crate, see health-ebpf/src/main.rs; its Cargo.toml
/// is not read by that build).
pub const INPUT_DIRS: &[&str] = &["health-ebpf/src", "health-common/src"];

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a UTF-8 path")]
    Path { path: PathBuf },
    #[error("line {line} is not `key = value`: {text:?}")]
    Line { line: usize, text: String },
    #[error("unknown key {0:?}")]
    Unknown(String),
    #[error("no {0:?} line")]
    Missing(&'static str),
    #[error("it is of another format ({0:?}, expected {FORMAT:?})")]
    Format(String),
    #[error("its inputs-sha256 {recorded} is not the digest of its own lines ({computed}): edited by hand?")]
    Digest { recorded: String, computed: String },
}

/// SHA-256 of each input file as this tree has it, by path relative to the
/// workspace root with `/` separators (sorted).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sources(pub BTreeMap<String, String>);

impl Sources {
    /// Reads [`INPUT_FILES`] and every file under [`INPUT_DIRS`] of `root`.
    pub fn read(root: &Path) -> Result<Sources, ManifestError> {
        let mut files = BTreeMap::new();
        let mut add = |path: &Path| -> Result<(), ManifestError> {
            let data = std::fs::read(path).map_err(|source| ManifestError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            files.insert(relative(root, path)?, sha256(&data));
            Ok(())
        };
        for file in INPUT_FILES {
            add(&root.join(file))?;
        }
        for dir in INPUT_DIRS {
            for path in files_under(&root.join(dir))? {
                add(&path)?;
            }
        }
        Ok(Sources(files))
    }
}

/// Every file under `dir`, depth first in name order.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let read = |source| ManifestError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(read)?;
    entries.sort();
    let mut files = Vec::new();
    for path in entries {
        if path.is_dir() {
            files.extend(files_under(&path)?);
        } else {
            files.push(path);
        }
    }
    Ok(files)
}

fn relative(root: &Path, path: &Path) -> Result<String, ManifestError> {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let parts: Option<Vec<&str>> = rel.components().map(|c| c.as_os_str().to_str()).collect();
    parts
        .map(|p| p.join("/"))
        .ok_or_else(|| ManifestError::Path {
            path: path.to_path_buf(),
        })
}

pub fn sha256(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

/// The toolchain that built the object, as its packages and binaries name
/// themselves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versions {
    /// The first line of `rustc --version --verbose`.
    pub rustc: String,
    /// Debian's version of rustc-web (its cargo and library source are the
    /// same source package).
    pub debian_rust: String,
    /// Debian's version of the LLVM library bpf-linker and llvm-objcopy use.
    pub llvm: String,
    /// `bpf-linker --version`.
    pub bpf_linker: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub object_sha256: String,
    pub recipe: String,
    pub versions: Versions,
    pub sources: Sources,
}

/// Why a committed object does not fit a tree (or a fresh build).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Difference {
    Changed(String),
    Added(String),
    Removed(String),
    /// xtask builds it another way now.
    Recipe {
        was: String,
        now: String,
    },
    /// The object's bytes are not those the manifest names.
    Object,
    /// Built by another toolchain (only a rebuild can tell).
    Toolchain {
        was: Versions,
        now: Versions,
    },
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Difference::Changed(path) => write!(f, "{path} changed"),
            Difference::Added(path) => write!(f, "{path} is new"),
            Difference::Removed(path) => write!(f, "{path} was removed"),
            Difference::Recipe { was, now } => {
                write!(f, "the build recipe changed (was `{was}`, now `{now}`)")
            }
            Difference::Object => write!(f, "the object's bytes are not those of the manifest"),
            Difference::Toolchain { was, now } => write!(
                f,
                "the toolchain differs (committed: {}; here: {})",
                was.summary(),
                now.summary()
            ),
        }
    }
}

impl Versions {
    fn summary(&self) -> String {
        format!(
            "{}, rustc-web {}, LLVM {}, {}",
            self.rustc, self.debian_rust, self.llvm, self.bpf_linker
        )
    }
}

impl Manifest {
    /// SHA-256 over the format, the recipe, the toolchain and every input
    /// file's digest: what the object was built from, in one value.
    pub fn inputs_digest(&self) -> String {
        let mut text = format!("{FORMAT}\n");
        for (key, value) in self.input_lines() {
            let _ = writeln!(text, "{key} {value}");
        }
        sha256(text.as_bytes())
    }

    fn input_lines(&self) -> Vec<(String, &str)> {
        let v = &self.versions;
        let mut lines = vec![
            ("recipe".to_string(), self.recipe.as_str()),
            ("rustc".to_string(), v.rustc.as_str()),
            ("debian-rust".to_string(), v.debian_rust.as_str()),
            ("llvm".to_string(), v.llvm.as_str()),
            ("bpf-linker".to_string(), v.bpf_linker.as_str()),
        ];
        for (path, digest) in &self.sources.0 {
            lines.push((format!("source {path}"), digest.as_str()));
        }
        lines
    }

    pub fn render(&self) -> String {
        let mut text = String::from(
            "# The kernel object beside this file and what it was built from (xtask/src/ebpf/).\n\
             # Written by `cargo xtask ebpf`, and by `cargo xtask build`, `run` and `image` when\n\
             # the kernel sources changed; `cargo xtask test` rebuilds the object and compares.\n",
        );
        let _ = writeln!(text, "format = {FORMAT}");
        let _ = writeln!(text, "object-sha256 = {}", self.object_sha256);
        let _ = writeln!(text, "inputs-sha256 = {}", self.inputs_digest());
        for (key, value) in self.input_lines() {
            let _ = writeln!(text, "{key} = {value}");
        }
        text
    }

    /// Reads what [`Manifest::render`] wrote; refuses a manifest whose
    /// inputs digest does not match its own lines.
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        let mut keys: BTreeMap<&str, &str> = BTreeMap::new();
        let mut sources = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line.split_once(" = ").ok_or_else(|| ManifestError::Line {
                line: i + 1,
                text: line.to_string(),
            })?;
            match key.strip_prefix("source ") {
                Some(path) => {
                    sources.insert(path.to_string(), value.to_string());
                }
                None => {
                    keys.insert(key, value);
                }
            }
        }
        let mut take = |key: &'static str| {
            keys.remove(key)
                .map(str::to_string)
                .ok_or(ManifestError::Missing(key))
        };
        let format = take("format")?;
        if format != FORMAT {
            return Err(ManifestError::Format(format));
        }
        let recorded = take("inputs-sha256")?;
        let manifest = Manifest {
            object_sha256: take("object-sha256")?,
            recipe: take("recipe")?,
            versions: Versions {
                rustc: take("rustc")?,
                debian_rust: take("debian-rust")?,
                llvm: take("llvm")?,
                bpf_linker: take("bpf-linker")?,
            },
            sources: Sources(sources),
        };
        if let Some(key) = keys.keys().next() {
            return Err(ManifestError::Unknown(key.to_string()));
        }
        let computed = manifest.inputs_digest();
        if computed != recorded {
            return Err(ManifestError::Digest { recorded, computed });
        }
        Ok(manifest)
    }

    /// What keeps this committed manifest and `object` from fitting a tree
    /// with `sources` built by `recipe` (the toolchain is not compared:
    /// there may be none).
    pub fn differences(&self, sources: &Sources, recipe: &str, object: &[u8]) -> Vec<Difference> {
        let mut out = Vec::new();
        for (path, digest) in &sources.0 {
            match self.sources.0.get(path) {
                None => out.push(Difference::Added(path.clone())),
                Some(was) if was != digest => out.push(Difference::Changed(path.clone())),
                Some(_) => {}
            }
        }
        for path in self.sources.0.keys() {
            if !sources.0.contains_key(path) {
                out.push(Difference::Removed(path.clone()));
            }
        }
        if self.recipe != recipe {
            out.push(Difference::Recipe {
                was: self.recipe.clone(),
                now: recipe.to_string(),
            });
        }
        if self.object_sha256 != sha256(object) {
            out.push(Difference::Object);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions() -> Versions {
        Versions {
            rustc: "rustc 1.96.0 (ac68faa20 2026-05-25)".into(),
            debian_rust: "1.96.0+dfsg1-1~deb12u2".into(),
            llvm: "1:22.1.8-1~deb12u1".into(),
            bpf_linker: "bpf-linker 0.13.0".into(),
        }
    }

    fn manifest(object: &[u8]) -> Manifest {
        let mut files = BTreeMap::new();
        files.insert(
            "health-ebpf/src/main.rs".to_string(),
            sha256(b"fn main() {}"),
        );
        files.insert(
            "health-common/src/lib.rs".to_string(),
            sha256(b"pub struct K;"),
        );
        Manifest {
            object_sha256: sha256(object),
            recipe: "cargo build".into(),
            versions: versions(),
            sources: Sources(files),
        }
    }

    #[test]
    fn sha256_is_lowercase_hex() {
        assert_eq!(
            sha256(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_rendered_manifest_parses_back() {
        let m = manifest(b"\x7fELF");
        let text = m.render();
        assert_eq!(Manifest::parse(&text).unwrap(), m);
        assert!(text.contains(&format!("inputs-sha256 = {}\n", m.inputs_digest())));
        assert!(text.contains("source health-common/src/lib.rs = "));
        // Sources in path order, whatever order they were found in.
        let common = text.find("source health-common").unwrap();
        let ebpf = text.find("source health-ebpf").unwrap();
        assert!(common < ebpf);
    }

    #[test]
    fn every_input_changes_the_digest_and_the_object_does_not() {
        let base = manifest(b"object");
        let digest = base.inputs_digest();
        let mut other = base.clone();
        other.object_sha256 = sha256(b"another object");
        assert_eq!(other.inputs_digest(), digest, "the object is an output");
        type Change = Box<dyn Fn(&mut Manifest)>;
        let changes: Vec<Change> = vec![
            Box::new(|m| m.recipe.push_str(" --offline")),
            Box::new(|m| m.versions.rustc = "rustc 1.97.0".into()),
            Box::new(|m| m.versions.debian_rust = "1.96.0+dfsg1-1~deb12u3".into()),
            Box::new(|m| m.versions.llvm = "1:22.1.9-1~deb12u1".into()),
            Box::new(|m| m.versions.bpf_linker = "bpf-linker 0.13.1".into()),
            Box::new(|m| {
                m.sources
                    .0
                    .insert("health-ebpf/src/main.rs".into(), sha256(b"fn main() { }"));
            }),
            Box::new(|m| {
                m.sources
                    .0
                    .insert("health-ebpf/src/new.rs".into(), sha256(b""));
            }),
            Box::new(|m| {
                m.sources.0.remove("health-common/src/lib.rs");
            }),
            // The same content under another name is another input.
            Box::new(|m| {
                let digest = m.sources.0.remove("health-ebpf/src/main.rs").unwrap();
                m.sources.0.insert("health-ebpf/src/lib.rs".into(), digest);
            }),
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut m = base.clone();
            change(&mut m);
            assert_ne!(m.inputs_digest(), digest, "change {i}");
        }
    }

    #[test]
    fn a_hand_edited_or_foreign_manifest_is_refused() {
        let m = manifest(b"object");
        let text = m.render();
        let edited = text.replace("bpf-linker 0.13.0", "bpf-linker 0.13.1");
        assert!(matches!(
            Manifest::parse(&edited),
            Err(ManifestError::Digest { .. })
        ));
        let foreign = text.replace(FORMAT, "another format");
        assert_eq!(
            Manifest::parse(&foreign).unwrap_err().to_string(),
            format!("it is of another format (\"another format\", expected {FORMAT:?})")
        );
        let missing: String = text
            .lines()
            .filter(|l| !l.starts_with("llvm = "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            Manifest::parse(&missing).unwrap_err().to_string(),
            "no \"llvm\" line"
        );
        assert_eq!(
            Manifest::parse(&format!("{text}color = blue\n"))
                .unwrap_err()
                .to_string(),
            "unknown key \"color\""
        );
        assert_eq!(
            Manifest::parse("format\n").unwrap_err().to_string(),
            "line 1 is not `key = value`: \"format\""
        );
    }

    #[test]
    fn differences_name_each_changed_input_and_a_foreign_object() {
        let m = manifest(b"object");
        let mut tree = m.sources.clone();
        assert_eq!(m.differences(&tree, "cargo build", b"object"), vec![]);
        tree.0
            .insert("health-ebpf/src/main.rs".into(), sha256(b"changed"));
        tree.0.insert("health-ebpf/src/new.rs".into(), sha256(b""));
        tree.0.remove("health-common/src/lib.rs");
        let found = m.differences(&tree, "cargo build --other", b"tampered");
        assert_eq!(
            found,
            vec![
                Difference::Changed("health-ebpf/src/main.rs".into()),
                Difference::Added("health-ebpf/src/new.rs".into()),
                Difference::Removed("health-common/src/lib.rs".into()),
                Difference::Recipe {
                    was: "cargo build".into(),
                    now: "cargo build --other".into()
                },
                Difference::Object,
            ]
        );
        assert_eq!(found[0].to_string(), "health-ebpf/src/main.rs changed");
    }

    #[test]
    fn sources_are_read_from_the_input_files_and_directories_only() {
        let root = tempfile::tempdir().unwrap();
        let write = |path: &str, text: &str| {
            let path = root.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("health-ebpf/Cargo.toml", "[package]");
        write("health-ebpf/Cargo.lock", "version = 4");
        write("health-ebpf/src/main.rs", "fn main() {}");
        write("health-ebpf/src/nested/deep.rs", "");
        write("health-common/src/lib.rs", "pub struct K;");
        // Not inputs: the committed object itself, build output, the
        // userspace crate's manifest.
        write("health-ebpf/object/health-ebpf.bpfel.o", "\x7fELF");
        write("health-ebpf/target/x", "");
        write("health-common/Cargo.toml", "[package]");
        let sources = Sources::read(root.path()).unwrap();
        let paths: Vec<&str> = sources.0.keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            [
                "health-common/src/lib.rs",
                "health-ebpf/Cargo.lock",
                "health-ebpf/Cargo.toml",
                "health-ebpf/src/main.rs",
                "health-ebpf/src/nested/deep.rs",
            ]
        );
        assert_eq!(
            sources.0["health-ebpf/src/main.rs"],
            sha256(b"fn main() {}")
        );
        // A checkout elsewhere reads the same.
        let copy = tempfile::tempdir().unwrap();
        for path in sources.0.keys() {
            let to = copy.path().join(path);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(root.path().join(path), to).unwrap();
        }
        assert_eq!(Sources::read(copy.path()).unwrap(), sources);
        std::fs::remove_file(root.path().join("health-ebpf/Cargo.lock")).unwrap();
        assert!(matches!(
            Sources::read(root.path()),
            Err(ManifestError::Read { .. })
        ));
    }
}
