//! The image's root filesystem: the stripped agent and the shared libraries
//! it links, copied from the build host together with the symlinks that lead
//! to them, so that every path the dynamic loader uses on the host (the ELF
//! interpreter, the paths `ldd` resolved) resolves the same way in the image.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::util::output;

/// One entry of the layer. Modes are fixed by kind (not copied from the
/// host) so that a umask or a checkout's permissions cannot change the
/// digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir,
    File { data: Vec<u8>, executable: bool },
    Symlink(String),
}

impl Entry {
    pub fn mode(&self) -> u32 {
        match self {
            Entry::Dir => 0o755,
            Entry::File {
                executable: true, ..
            } => 0o755,
            Entry::File { .. } => 0o644,
            Entry::Symlink(_) => 0o777,
        }
    }
}

/// Paths relative to the image's root ("usr/lib"), in tar order: a
/// directory sorts before what it holds because a prefix sorts first.
#[derive(Debug, Default)]
pub struct Rootfs {
    entries: BTreeMap<String, Entry>,
}

/// Symlinks followed before giving up, as the kernel's ELOOP limit.
const MAX_SYMLINKS: usize = 40;

impl Rootfs {
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(p, e)| (p.as_str(), e))
    }

    /// Adds `entry` at `path` (relative) and every missing parent directory.
    /// The same entry twice is fine (two libraries in one directory); a
    /// different one at the same path is a contradiction of the host's
    /// layout and an error.
    pub fn add(&mut self, path: &str, entry: Entry) -> anyhow::Result<()> {
        let mut parent = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            self.insert(&parent, Entry::Dir)?;
        }
        self.insert(path, entry)
    }

    fn insert(&mut self, path: &str, entry: Entry) -> anyhow::Result<()> {
        if path.is_empty()
            || path.starts_with('/')
            || path
                .split('/')
                .any(|p| p == ".." || p == "." || p.is_empty())
        {
            bail!("not a plain relative path for the image: {path:?}");
        }
        match self.entries.get(path) {
            None => {
                self.entries.insert(path.to_string(), entry);
                Ok(())
            }
            Some(old) if *old == entry => Ok(()),
            Some(old) => bail!(
                "/{path} would be both {} and {} in the image",
                describe(old),
                describe(&entry)
            ),
        }
    }

    /// Copies the host file at the absolute `host` path to the same path in
    /// the image. Every symlink met on the way, in any component, becomes
    /// the same symlink in the image (with the same target text), and its
    /// target is followed and copied too.
    pub fn copy_host_path(&mut self, host: &Path) -> anyhow::Result<()> {
        self.copy_from(Path::new("/"), host)
    }

    /// [`Rootfs::copy_host_path`] from another root: `path` as it is under
    /// `root` (an unpacked foreign architecture's packages,
    /// [`super::foreign`]), symlinks resolved inside `root`.
    pub fn copy_from(&mut self, root: &Path, path: &Path) -> anyhow::Result<()> {
        self.copy_resolving(root, path, 0).with_context(|| {
            format!(
                "copying {} of {} into the image",
                path.display(),
                root.display()
            )
        })
    }

    /// `host`: the path in the image, found at the same path under `root`.
    fn copy_resolving(&mut self, root: &Path, host: &Path, followed: usize) -> anyhow::Result<()> {
        if !host.is_absolute() {
            bail!("{} is not an absolute path", host.display());
        }
        let parts: Vec<Component<'_>> = host.components().collect();
        let mut current = PathBuf::from("/");
        for (i, part) in parts.iter().enumerate() {
            let name = match part {
                Component::RootDir | Component::CurDir => continue,
                Component::ParentDir => {
                    current.pop();
                    continue;
                }
                Component::Normal(name) => name,
                Component::Prefix(_) => bail!("unexpected path prefix in {}", host.display()),
            };
            let next = current.join(name);
            let last = i == parts.len() - 1;
            let rel = relative(&next)?;
            let on_disk = root.join(&rel);
            let meta = std::fs::symlink_metadata(&on_disk)
                .with_context(|| format!("reading {}", on_disk.display()))?;
            if meta.file_type().is_symlink() {
                if followed >= MAX_SYMLINKS {
                    bail!("too many symlinks resolving {}", host.display());
                }
                let target = std::fs::read_link(&on_disk)
                    .with_context(|| format!("reading the link {}", on_disk.display()))?;
                let text = target
                    .to_str()
                    .with_context(|| format!("{} links to a non-UTF-8 path", on_disk.display()))?;
                self.add(&rel, Entry::Symlink(text.to_string()))?;
                let mut resolved = if target.is_absolute() {
                    target.clone()
                } else {
                    current.join(&target)
                };
                for rest in &parts[i + 1..] {
                    resolved.push(rest.as_os_str());
                }
                return self.copy_resolving(root, &resolved, followed + 1);
            }
            if last {
                if !meta.is_file() {
                    bail!("{} is not a regular file", on_disk.display());
                }
                let data = std::fs::read(&on_disk)
                    .with_context(|| format!("reading {}", on_disk.display()))?;
                let executable = meta.permissions().mode() & 0o111 != 0;
                return self.add(&rel, Entry::File { data, executable });
            }
            if !meta.is_dir() {
                bail!("{} is not a directory", on_disk.display());
            }
            self.add(&rel, Entry::Dir)?;
            current = next;
        }
        bail!("{} names no file", host.display())
    }
}

fn describe(entry: &Entry) -> String {
    match entry {
        Entry::Dir => "a directory".into(),
        Entry::File { .. } => "a file".into(),
        Entry::Symlink(t) => format!("a symlink to {t}"),
    }
}

fn relative(path: &Path) -> anyhow::Result<String> {
    let text = path
        .to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))?;
    Ok(text.trim_start_matches('/').to_string())
}

/// The shared objects `ldd` says `binary` loads (the ELF interpreter
/// included), as absolute host paths. A library `ldd` cannot find is an
/// error: the image would not start.
pub fn linked_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let text = output(Command::new("ldd").arg(binary))?;
    parse_ldd(&text).with_context(|| format!("reading `ldd {}`", binary.display()))
}

fn parse_ldd(text: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line == "statically linked" {
            continue;
        }
        // "name => /path (0x...)", "/interp (0x...)", or "linux-vdso.so.1
        // (0x...)": the vDSO is the kernel's, in no file.
        let path = match line.split_once(" => ") {
            Some((name, rest)) => {
                let path = rest.split(" (").next().unwrap_or_default().trim();
                if path == "not found" || !path.starts_with('/') {
                    bail!("{name} is not found on this host (`{line}`)");
                }
                path
            }
            None if line.starts_with('/') => line.split(" (").next().unwrap_or_default(),
            None if line.contains("(0x") => continue,
            None => bail!("unexpected line `{line}`"),
        };
        found.push(PathBuf::from(path));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_give_the_loaded_files_and_not_the_vdso() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f4c)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f4c)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f4c)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
        let err = parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "libfoo.so.1 is not found on this host (`libfoo.so.1 => not found`)"
        );
    }

    #[test]
    fn parents_are_added_and_contradictions_refused() {
        let mut fs = Rootfs::default();
        fs.add(
            "usr/lib/a.so",
            Entry::File {
                data: vec![1],
                executable: false,
            },
        )
        .unwrap();
        fs.add("lib", Entry::Symlink("usr/lib".into())).unwrap();
        fs.add("lib", Entry::Symlink("usr/lib".into())).unwrap();
        let names: Vec<&str> = fs.entries().map(|(p, _)| p).collect();
        assert_eq!(names, ["lib", "usr", "usr/lib", "usr/lib/a.so"]);
        let err = fs.add("usr/lib", Entry::Symlink("x".into())).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/usr/lib would be both a directory and a symlink to x in the image"
        );
        assert!(fs.add("usr/../etc", Entry::Dir).is_err());
    }

    #[test]
    fn host_symlinks_on_the_way_are_kept_and_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/lib/arch")).unwrap();
        std::fs::write(root.join("usr/lib/arch/ld.so"), b"ld").unwrap();
        std::fs::set_permissions(
            root.join("usr/lib/arch/ld.so"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
        std::fs::create_dir(root.join("lib64")).unwrap();
        std::os::unix::fs::symlink("../lib/arch/ld.so", root.join("lib64/ld.so")).unwrap();

        let mut fs = Rootfs::default();
        fs.copy_host_path(&root.join("lib64/ld.so")).unwrap();
        let base = relative(root).unwrap();
        let got: Vec<(String, Entry)> = fs
            .entries()
            .filter_map(|(p, e)| Some((p.strip_prefix(&base)?.to_string(), e.clone())))
            .filter(|(p, _)| !p.is_empty())
            .collect();
        assert_eq!(
            got,
            vec![
                ("/lib".to_string(), Entry::Symlink("usr/lib".into())),
                ("/lib64".to_string(), Entry::Dir),
                (
                    "/lib64/ld.so".to_string(),
                    Entry::Symlink("../lib/arch/ld.so".into())
                ),
                ("/usr".to_string(), Entry::Dir),
                ("/usr/lib".to_string(), Entry::Dir),
                ("/usr/lib/arch".to_string(), Entry::Dir),
                (
                    "/usr/lib/arch/ld.so".to_string(),
                    Entry::File {
                        data: b"ld".to_vec(),
                        executable: true
                    }
                ),
            ]
        );
    }
}
