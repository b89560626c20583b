//! Debian kernels for the VM: find the newest package of a series, download
//! it once, keep its image and make its modules loadable.
//!
//! Packages come through a private apt (see apt.rs): the machine's own apt
//! configuration and state are never touched.
//!
//! The generic `-amd64-unsigned` flavour is used: it has BTF and ships loop,
//! fuse, xfs, btrfs, scsi_debug, dm-flakey and null_blk as modules (the
//! `cloud` flavour lacks some of them). The same flavour of arm64
//! (`-arm64-unsigned`) serves the image test's aarch64 guests
//! (`arm64_guests`): its modules stay in the cache, under a root of
//! their own, where the guests' initramfs takes them from.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use super::apt::{Archive, PrivateApt};
use crate::cross::Arch;
use crate::util::{output, run, say};

/// A kernel series the VM can boot, and the Debian suites that carry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Series {
    #[value(name = "5.10")]
    V5_10,
    #[value(name = "6.1")]
    V6_1,
    #[value(name = "6.12")]
    V6_12,
}

impl Series {
    /// Every series, oldest first.
    pub const ALL: [Series; 3] = [Series::V5_10, Series::V6_1, Series::V6_12];

    pub fn name(self) -> &'static str {
        match self {
            Series::V5_10 => "5.10",
            Series::V6_1 => "6.1",
            Series::V6_12 => "6.12",
        }
    }

    /// (archive, suite): kernel updates of a stable release land in its
    /// security suite, so that one is searched too; 6.12 is trixie's kernel
    /// and also in bookworm-backports.
    fn suites(self) -> &'static [(Archive, &'static str)] {
        use Archive::{Main, Security};
        match self {
            Series::V5_10 => &[(Main, "bullseye"), (Security, "bullseye-security")],
            Series::V6_1 => &[(Main, "bookworm"), (Security, "bookworm-security")],
            Series::V6_12 => &[
                (Main, "trixie"),
                (Security, "trixie-security"),
                (Main, "bookworm-backports"),
            ],
        }
    }
}

/// A kernel ready to boot: its image here, its modules in /lib/modules
/// (the host's architecture) or in `modules_root` (another's).
pub struct Kernel {
    /// `uname -r` inside the guest, e.g. `6.1.0-50-amd64`.
    pub release: String,
    /// e.g. `linux-image-6.1.0-50-amd64-unsigned`.
    pub package: String,
    /// The Debian version of that package, e.g. `6.1.176-1`.
    pub version: String,
    pub vmlinuz: PathBuf,
    /// The directory the image and the package record are in.
    pub dir: PathBuf,
}

/// Makes `series` of `arch` bootable, downloading only what is not cached
/// yet. Without `refresh`, the package chosen the first time is reused, so
/// a second run does no network access at all.
pub fn ensure(
    cache: &Path,
    series: Series,
    arch: &'static Arch,
    refresh: bool,
) -> anyhow::Result<Kernel> {
    let chosen = cache.join(format!("kernels/current-{}{}", series.name(), suffix(arch)));
    let remembered = fs::read_to_string(&chosen)
        .ok()
        .map(|p| p.trim().to_string())
        .filter(|p| !refresh && !p.is_empty());
    // apt is only run when something has to be looked up or fetched.
    let mut apt = None;
    let package = match remembered {
        Some(package) => package,
        None => {
            let a = private_apt(cache, series, arch)?;
            let package = newest_served(&a, cache, series, arch)?;
            apt = Some(a);
            fs::create_dir_all(cache.join("kernels")).context("creating the kernel cache")?;
            fs::write(&chosen, &package)
                .with_context(|| format!("recording the chosen package in {}", chosen.display()))?;
            package
        }
    };
    if let Ok(kernel) = load(cache, &package) {
        if modules_installed(&kernel, arch) {
            return Ok(kernel);
        }
    }
    // First use, or the modules went missing (a cleaned /lib/modules):
    // (re)install from the cached .deb, fetching it only when it is not there.
    let deb = match cached_deb(cache, &package) {
        Some(deb) => deb,
        None => {
            let apt = match apt {
                Some(apt) => apt,
                None => private_apt(cache, series, arch)?,
            };
            download(&apt, cache, &package)?
        }
    };
    install(cache, &package, &deb, arch)?;
    load(cache, &package)
}

/// What names another architecture's cache entries: `-arm64`; nothing
/// for the host's.
fn suffix(arch: &Arch) -> String {
    match arch.is_host() {
        true => String::new(),
        false => format!("-{}", arch.name),
    }
}

fn private_apt(cache: &Path, series: Series, arch: &'static Arch) -> anyhow::Result<PrivateApt> {
    let dir = cache
        .join("apt")
        .join(format!("{}{}", series.name(), suffix(arch)));
    let foreign = (!arch.is_host()).then_some(arch.name);
    PrivateApt::update(&dir, series.suites(), foreign).with_context(|| {
        format!(
            "looking up Debian's {} {} kernels",
            series.name(),
            arch.name
        )
    })
}

/// The newest generic image of `series` for `arch` in the suites that the
/// archive serves, downloaded. An older one is taken, saying so, where the
/// newer ones' files are refused: the package registry of the development
/// machines lists bullseye's arm64 security updates (Debian's LTS) but
/// answers 404 for each (2026-12-02), and serves bullseye's last point
/// release.
fn newest_served(
    apt: &PrivateApt,
    cache: &Path,
    series: Series,
    arch: &Arch,
) -> anyhow::Result<String> {
    let suites: Vec<&str> = series.suites().iter().map(|(_, s)| *s).collect();
    let mut images: Vec<String> = apt
        .package_names("linux-image-")?
        .into_iter()
        .filter(|n| is_generic_image(n, series, arch.name))
        .collect();
    images.sort_by_key(|n| std::cmp::Reverse(release_key(n)));
    let mut refused = Vec::new();
    for package in images {
        if cached_deb(cache, &package).is_some() {
            return Ok(package);
        }
        match download(apt, cache, &package) {
            Ok(_) => {
                if !refused.is_empty() {
                    say(format!(
                        "{package} instead of the newer {}: the archive refused their files",
                        refused.join(", ")
                    ));
                }
                return Ok(package);
            }
            Err(e) => {
                say(format!("{package} is listed but not served: {e:#}"));
                refused.push(package);
            }
        }
    }
    bail!(
        "no linux-image-{}.*-{}-unsigned package in {} could be downloaded{}",
        series.name(),
        arch.name,
        suites.join(", "),
        match refused.is_empty() {
            true => String::new(),
            false => format!(" (refused: {})", refused.join(", ")),
        }
    )
}

/// `linux-image-6.1.0-50-amd64-unsigned` -> `6.1.0-50-amd64`.
fn release_of(package: &str) -> anyhow::Result<&str> {
    package
        .strip_prefix("linux-image-")
        .and_then(|p| p.strip_suffix("-unsigned"))
        .with_context(|| format!("{package} is not a linux-image-*-unsigned package name"))
}

/// Whether `name` is the generic image of `series` for `arch` (`amd64`,
/// `arm64`): the release is digits, dots, dashes and a `+debNN` tag only,
/// which leaves out the `cloud`, `rt`, `16k` and `dbg` flavours.
fn is_generic_image(name: &str, series: Series, arch: &str) -> bool {
    let Some(release) = name
        .strip_prefix("linux-image-")
        .and_then(|r| r.strip_suffix(&format!("-{arch}-unsigned")))
    else {
        return false;
    };
    let Some(rest) = release.strip_prefix(series.name()) else {
        return false;
    };
    // "6.1" must not match "6.12.x": the series is followed by ".<patch>".
    let Some(rest) = rest.strip_prefix('.') else {
        return false;
    };
    let rest = rest.replacen("+deb", "-", 1);
    !rest.is_empty()
        && rest
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == '-')
}

/// Orders kernel releases by their numbers: `5.10.0-46` > `5.10.0-9`,
/// `6.12.117+deb13` > `6.12.95+deb12`.
fn release_key(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

fn cached_deb(cache: &Path, package: &str) -> Option<PathBuf> {
    let prefix = format!("{package}_");
    fs::read_dir(cache.join("debs"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
        })
}

fn download(apt: &PrivateApt, cache: &Path, package: &str) -> anyhow::Result<PathBuf> {
    let debs = cache.join("debs");
    say(format!("downloading {package} (once, ~70 MB)"));
    apt.download(package, &debs)?;
    cached_deb(cache, package).with_context(|| {
        format!(
            "apt-get download {package} left no .deb in {}",
            debs.display()
        )
    })
}

/// Unpacks the .deb: the image and config go to the cache, the module tree
/// to /lib/modules/<release> (where virtme-ng and modprobe in the guest
/// look, since the guest's root is the host's), then depmod. Another
/// architecture's modules go to the cache ([`modules_root`]): nothing on
/// the host could load them.
fn install(cache: &Path, package: &str, deb: &Path, arch: &Arch) -> anyhow::Result<()> {
    let release = release_of(package)?;
    let dir = cache.join("kernels").join(release);
    let staging = cache.join("kernels").join(format!(".{release}.unpack"));
    let _ = fs::remove_dir_all(&staging);
    say(format!("unpacking {}", deb.display()));
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&staging))
        .with_context(|| format!("unpacking {}", deb.display()))?;
    let version = output(
        Command::new("dpkg-deb")
            .args(["-f"])
            .arg(deb)
            .arg("Version"),
    )
    .with_context(|| format!("reading the version of {}", deb.display()))?;

    // trixie ships modules under /usr/lib, older releases under /lib.
    let modules = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|d| staging.join(d).join(release))
        .find(|p| p.is_dir())
        .with_context(|| format!("{} has no modules for {release}", deb.display()))?;
    let root = match arch.is_host() {
        true => PathBuf::from("/"),
        false => modules_root(&dir),
    };
    let target = root.join("lib/modules").join(release);
    if target.exists() {
        fs::remove_dir_all(&target)
            .with_context(|| format!("removing the incomplete {}", target.display()))?;
    }
    let parent = root.join("lib/modules");
    fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    // Same filesystem in the usual layout (cache under /root); copy otherwise.
    if fs::rename(&modules, &target).is_err() {
        run(Command::new("cp").arg("-a").arg(&modules).arg(&target))
            .with_context(|| format!("copying the modules of {release} to {}", target.display()))?;
    }
    run(Command::new("depmod").arg("-b").arg(&root).arg(release))
        .with_context(|| format!("depmod {release} (package kmod)"))?;

    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (from, to) in [("vmlinuz", "vmlinuz"), ("config", "config")] {
        let src = staging.join("boot").join(format!("{from}-{release}"));
        fs::rename(&src, dir.join(to))
            .with_context(|| format!("{} has no {}", deb.display(), src.display()))?;
    }
    // Written last: its presence means the image and modules are complete.
    fs::write(
        dir.join("package"),
        format!("{package} {}\n", version.trim()),
    )
    .with_context(|| format!("writing {}", dir.join("package").display()))?;
    let _ = fs::remove_dir_all(&staging);
    Ok(())
}

fn load(cache: &Path, package: &str) -> anyhow::Result<Kernel> {
    let release = release_of(package)?.to_string();
    let dir = cache.join("kernels").join(&release);
    let record = fs::read_to_string(dir.join("package"))
        .with_context(|| format!("{} is not installed in {}", package, dir.display()))?;
    let version = record.split_whitespace().nth(1).unwrap_or("?").to_string();
    let vmlinuz = dir.join("vmlinuz");
    if !vmlinuz.is_file() {
        bail!("{} is missing", vmlinuz.display());
    }
    Ok(Kernel {
        release,
        package: package.to_string(),
        version,
        vmlinuz,
        dir,
    })
}

/// Where another architecture's kernel in `dir` keeps its modules:
/// `lib/modules/<release>` under it, as on that kernel's root.
pub fn modules_root(dir: &Path) -> PathBuf {
    dir.join("root")
}

fn modules_installed(kernel: &Kernel, arch: &Arch) -> bool {
    let root = match arch.is_host() {
        true => PathBuf::from("/"),
        false => modules_root(&kernel.dir),
    };
    let dir = root.join("lib/modules").join(&kernel.release);
    dir.join("modules.dep").is_file() && dir.join("kernel").is_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generic_images_only() {
        use Series::{V5_10, V6_1, V6_12};
        let generic = |name, series, arch| is_generic_image(name, series, arch);
        assert!(generic(
            "linux-image-5.10.0-46-amd64-unsigned",
            V5_10,
            "amd64"
        ));
        assert!(generic(
            "linux-image-6.1.0-50-amd64-unsigned",
            V6_1,
            "amd64"
        ));
        assert!(generic(
            "linux-image-6.12.117+deb13-amd64-unsigned",
            V6_12,
            "amd64"
        ));
        assert!(!generic(
            "linux-image-6.12.117+deb13-amd64-unsigned",
            V6_1,
            "amd64"
        ));
        assert!(!generic(
            "linux-image-6.12.117+deb13-cloud-amd64-unsigned",
            V6_12,
            "amd64"
        ));
        assert!(!generic(
            "linux-image-6.12.117+deb13-rt-amd64-unsigned",
            V6_12,
            "amd64"
        ));
        assert!(!generic("linux-image-6.1.0-50-amd64", V6_1, "amd64"));
        // arm64's names, as bookworm and trixie list them.
        assert!(generic(
            "linux-image-6.12.118+deb13-arm64-unsigned",
            V6_12,
            "arm64"
        ));
        assert!(generic(
            "linux-image-6.12.115+deb13.1-arm64-unsigned",
            V6_12,
            "arm64"
        ));
        assert!(!generic(
            "linux-image-6.12.118+deb13-arm64-unsigned",
            V6_12,
            "amd64"
        ));
        assert!(!generic(
            "linux-image-6.12.118+deb13-amd64-unsigned",
            V6_12,
            "arm64"
        ));
        assert!(!generic(
            "linux-image-6.12.118+deb13-arm64-16k-unsigned",
            V6_12,
            "arm64"
        ));
        assert!(!generic(
            "linux-image-6.12.118+deb13-cloud-arm64-unsigned",
            V6_12,
            "arm64"
        ));
        assert!(!generic("linux-image-6.12.96+deb13-arm64", V6_12, "arm64"));
    }

    #[test]
    fn newest_release_wins() {
        assert!(
            release_key("linux-image-5.10.0-46-amd64") > release_key("linux-image-5.10.0-9-amd64")
        );
        assert!(
            release_key("linux-image-6.12.117+deb13-amd64")
                > release_key("linux-image-6.12.95+deb12-amd64")
        );
    }

    #[test]
    fn release_from_package_name() {
        assert_eq!(
            release_of("linux-image-6.1.0-50-amd64-unsigned").unwrap(),
            "6.1.0-50-amd64"
        );
        assert!(release_of("linux-image-amd64").is_err());
    }
}
