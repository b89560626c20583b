//! The shared libraries of an image for another architecture than the build
//! host's: Debian's own packages of that architecture, at the versions a
//! node of that architecture running the same release gets (security
//! updates included), not the cross toolchain's copies (`libc6-arm64-cross`
//! lags behind them). They are fetched with `apt-get download` under
//! package lists of their own in the tools cache (the machine's apt
//! configuration and dpkg database are not touched, and no foreign
//! architecture is added to it), unpacked into a root of their own
//! ([`Sysroot`]), and what the binaries load is found there the way the
//! dynamic loader finds it: the ELF interpreter and each `DT_NEEDED` entry,
//! in the architecture's multiarch directories, recursively ([`needed`]).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};

use super::sbom::DebianPackage;
use crate::bootstrap::{cache_dir, run_apt};
use crate::cross::Arch;
use crate::util::{output, run, say};

/// The packages holding what the binaries load: glibc (its loader, libc and
/// libm) and libgcc_s (unwinding), as on the host.
pub const PACKAGES: &[&str] = &["libc6", "libgcc-s1"];
/// The package lists are fetched again when older than this, so that an
/// image built today carries today's security updates.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// The unpacked packages of one architecture.
pub struct Sysroot {
    pub root: PathBuf,
    /// What was unpacked, as dpkg-deb reads each package.
    pub packages: Vec<DebianPackage>,
}

/// Fetches and unpacks [`PACKAGES`] for `arch` into
/// `<tools cache>/debian-<arch>/root` (replaced whole each time).
pub fn sysroot(arch: &Arch) -> anyhow::Result<Sysroot> {
    let base = cache_dir().join(format!("debian-{}", arch.name));
    let apt = AptFor::current(arch.name, &base)?;
    let work = tempfile::Builder::new()
        .prefix(".debs-")
        .tempdir_in(&base)
        .context("creating a work dir in the tools cache")?;
    let wanted: Vec<String> = PACKAGES
        .iter()
        .map(|p| format!("{p}:{}", arch.name))
        .collect();
    run_apt(
        apt.command()
            .arg("download")
            .arg("-qq")
            .args(&wanted)
            .current_dir(work.path()),
    )?;
    let root = base.join("root");
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    }
    let mut packages = Vec::new();
    for entry in fs::read_dir(work.path())? {
        let deb = entry?.path();
        if deb.extension().is_none_or(|e| e != "deb") {
            continue;
        }
        let fields = output(Command::new("dpkg-deb").args(["-f"]).arg(&deb).args([
            "Package",
            "Version",
            "Architecture",
        ]))?;
        packages.push(package_of(&fields).with_context(|| format!("reading {}", deb.display()))?);
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    }
    packages.sort();
    let names: BTreeSet<&str> = packages.iter().map(|p| p.name.as_str()).collect();
    if names != PACKAGES.iter().copied().collect() {
        bail!(
            "apt-get download fetched {names:?} for {}, not {PACKAGES:?}",
            arch.name
        );
    }
    Ok(Sysroot { root, packages })
}

/// One package of `arch` unpacked into a root of its own,
/// `<tools cache>/debian-<arch>/packages/<package>`: fetched the first
/// time, reused after (the image test's aarch64 guests take their busybox
/// from here).
pub fn unpacked(arch: &Arch, package: &str) -> anyhow::Result<PathBuf> {
    let base = cache_dir().join(format!("debian-{}", arch.name));
    let root = base.join("packages").join(package);
    // Written last: the unpacked tree is complete.
    let done = root.join(".unpacked");
    if done.exists() {
        return Ok(root);
    }
    let apt = AptFor::current(arch.name, &base)?;
    let work = tempfile::Builder::new()
        .prefix(".debs-")
        .tempdir_in(&base)
        .context("creating a work dir in the tools cache")?;
    run_apt(
        apt.command()
            .args(["download", "-qq", &format!("{package}:{}", arch.name)])
            .current_dir(work.path()),
    )?;
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    }
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    for entry in fs::read_dir(work.path())? {
        let deb = entry?.path();
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    }
    fs::write(&done, b"").with_context(|| format!("writing {}", done.display()))?;
    Ok(root)
}

/// `dpkg-deb -f DEB Package Version Architecture`.
fn package_of(fields: &str) -> anyhow::Result<DebianPackage> {
    let field = |name: &str| {
        fields
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
            .map(|v| v.trim().to_string())
            .with_context(|| format!("no {name} field in {fields:?}"))
    };
    Ok(DebianPackage {
        name: field("Package")?,
        version: field("Version")?,
        architecture: field("Architecture")?,
    })
}

/// apt-get with package lists and a download cache of one architecture's
/// own, beside which nothing of the machine's apt state is read or written
/// (the status file is empty: nothing counts as installed).
struct AptFor {
    arch: String,
    lists: PathBuf,
    cache: PathBuf,
    /// Touched after each update: apt dates its lists by the server's
    /// files, not by when they were fetched.
    updated: PathBuf,
}

impl AptFor {
    fn new(arch: &str, base: &Path) -> anyhow::Result<AptFor> {
        let lists = base.join("apt/lists");
        let cache = base.join("apt/cache");
        for dir in [lists.join("partial"), cache.join("archives/partial")] {
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        Ok(AptFor {
            arch: arch.to_string(),
            lists,
            cache,
            updated: base.join("apt/updated"),
        })
    }

    /// [`AptFor::new`], with its package lists fetched again when old.
    fn current(arch: &str, base: &Path) -> anyhow::Result<AptFor> {
        let apt = AptFor::new(arch, base)?;
        if apt.lists_are_old() {
            say(format!("apt-get update (the {arch} package lists)"));
            run_apt(apt.command().args(["update", "-qq"]))?;
            fs::write(&apt.updated, b"")
                .with_context(|| format!("writing {}", apt.updated.display()))?;
        }
        Ok(apt)
    }

    fn command(&self) -> Command {
        let mut apt = Command::new("apt-get");
        for option in [
            format!("APT::Architecture={}", self.arch),
            format!("APT::Architectures::={}", self.arch),
            format!("Dir::State::Lists={}", self.lists.display()),
            format!("Dir::Cache={}", self.cache.display()),
            "Dir::State::status=/dev/null".to_string(),
            // The cache is under the invoking user's home, where apt's own
            // user may not reach: fetch as the invoking user.
            "APT::Sandbox::User=root".to_string(),
        ] {
            apt.arg("-o").arg(option);
        }
        apt
    }

    /// Never updated, or last longer ago than [`LISTS_MAX_AGE`].
    fn lists_are_old(&self) -> bool {
        let updated = fs::metadata(&self.updated).and_then(|m| m.modified());
        updated.map_or(true, |t| {
            SystemTime::now()
                .duration_since(t)
                .is_ok_and(|age| age > LISTS_MAX_AGE)
        })
    }
}

/// What `binary` makes the loader open, as paths in the image (absolute):
/// its ELF interpreter and, recursively, every `DT_NEEDED` library, each
/// looked up in `arch`'s multiarch directories of `root`. One that is not
/// there is an error: the image would not start.
pub fn needed(binary: &Path, root: &Path, arch: &Arch) -> anyhow::Result<Vec<PathBuf>> {
    let headers = output(
        Command::new("readelf")
            .arg("--program-headers")
            .arg("--wide")
            .arg(binary),
    )?;
    let interpreter = interpreter(&headers)
        .with_context(|| format!("{} names no ELF interpreter", binary.display()))?;
    let dirs = [
        format!("lib/{}", arch.gnu),
        format!("usr/lib/{}", arch.gnu),
        "lib".to_string(),
        "usr/lib".to_string(),
    ];
    let mut found = vec![PathBuf::from(interpreter)];
    let mut seen = BTreeSet::new();
    let mut todo = vec![binary.to_path_buf()];
    while let Some(file) = todo.pop() {
        let dynamic = output(
            Command::new("readelf")
                .arg("--dynamic")
                .arg("--wide")
                .arg(&file),
        )?;
        for name in needed_names(&dynamic) {
            if !seen.insert(name.clone()) {
                continue;
            }
            let Some(dir) = dirs.iter().find(|d| root.join(d).join(&name).exists()) else {
                bail!(
                    "{} needs {name}, which no {} package unpacked in {} holds",
                    file.display(),
                    arch.name,
                    root.display()
                );
            };
            let in_image = Path::new("/").join(dir).join(&name);
            todo.push(root.join(dir).join(&name));
            found.push(in_image);
        }
    }
    Ok(found)
}

/// `[Requesting program interpreter: /lib/ld-linux-aarch64.so.1]` of
/// `readelf --program-headers --wide`.
fn interpreter(headers: &str) -> Option<String> {
    headers.lines().find_map(|l| {
        let rest = l.split_once("[Requesting program interpreter: ")?.1;
        Some(rest.strip_suffix(']')?.trim().to_string())
    })
}

/// `(NEEDED) Shared library: [libc.so.6]` lines of `readelf --dynamic --wide`.
fn needed_names(dynamic: &str) -> Vec<String> {
    dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| {
            let rest = l.split_once("Shared library: [")?.1;
            Some(rest.strip_suffix(']')?.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readelf_gives_the_interpreter_and_the_needed_libraries() {
        let headers = "  INTERP         0x0002a8 0x00000000000002a8 0x00000000000002a8 0x00001b 0x00001b R   0x1\n      [Requesting program interpreter: /lib/ld-linux-aarch64.so.1]\n  LOAD ...\n";
        assert_eq!(
            interpreter(headers).as_deref(),
            Some("/lib/ld-linux-aarch64.so.1")
        );
        assert_eq!(interpreter("  LOAD ...\n"), None);
        let dynamic = "Dynamic section at offset 0x1 contains 30 entries:\n  Tag        Type                         Name/Value\n 0x0000000000000001 (NEEDED)             Shared library: [libgcc_s.so.1]\n 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]\n 0x000000000000000e (SONAME)             Library soname: [libc.so.6]\n";
        assert_eq!(needed_names(dynamic), ["libgcc_s.so.1", "libc.so.6"]);
    }

    #[test]
    fn dpkg_deb_fields_make_the_package() {
        let fields = "Package: libc6\nVersion: 2.36-9+deb12u14\nArchitecture: arm64\n";
        assert_eq!(
            package_of(fields).unwrap(),
            DebianPackage {
                name: "libc6".into(),
                version: "2.36-9+deb12u14".into(),
                architecture: "arm64".into(),
            }
        );
        assert!(package_of("Package: libc6\n").is_err());
    }
}
