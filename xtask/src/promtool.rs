//! promtool for the alert rule tests (tests/tests/server/deploy_monitoring.rs:
//! `promtool check rules` and `promtool test rules` on the chart's rules).
//!
//! Debian ships it in the `prometheus` package, whose installation would
//! also create a user and a service and pull in the web UI's JavaScript.
//! Only the one static binary is needed, so the package is downloaded
//! (`apt-get download`, no installation, no root) and `usr/bin/promtool` is
//! taken out of it into the tools cache, next to helm and kubectl.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::bootstrap::{cache_dir, run_apt};
use crate::util::{output, replace_dir, run, say, single_file};

const PACKAGE: &str = "prometheus";
/// Cache folders are `promtool-<Debian version>`; any one of them will do.
const DIR_PREFIX: &str = "promtool-";

/// The cached promtool, fetched first if there is none.
pub fn ensure() -> anyhow::Result<PathBuf> {
    let bin = match cached()? {
        Some(bin) => bin,
        None => install()?,
    };
    let version = output(Command::new(&bin).arg("--version"))?;
    say(format!(
        "{} ({})",
        version.lines().next().unwrap_or("promtool").trim(),
        bin.display()
    ));
    Ok(bin)
}

fn cached() -> anyhow::Result<Option<PathBuf>> {
    let root = cache_dir();
    let Ok(entries) = fs::read_dir(&root) else {
        return Ok(None);
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("listing {}", root.display()))?
            .path();
        let is_ours = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(DIR_PREFIX));
        if is_ours && path.join("promtool").is_file() {
            found.push(path.join("promtool"));
        }
    }
    found.sort();
    Ok(found.pop())
}

fn install() -> anyhow::Result<PathBuf> {
    let root = cache_dir();
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let work = tempfile::Builder::new()
        .prefix(".promtool-")
        .tempdir_in(&root)
        .context("creating a work dir in the tools cache")?;
    // apt fetches as its own user (_apt) where it may write.
    make_readable(work.path())?;
    say(format!(
        "fetching Debian's {PACKAGE} package (~20 MB) for its promtool"
    ));
    if download(work.path()).is_err() {
        // A fresh machine has no package lists yet.
        say("apt-get update");
        run_apt(Command::new("apt-get").args(["update", "-qq"]))?;
        download(work.path())?;
    }
    let deb = single_file(work.path(), "deb", "apt-get download")?;
    let version = output(
        Command::new("dpkg-deb")
            .args(["-f"])
            .arg(&deb)
            .arg("Version"),
    )?;
    let unpacked = work.path().join("unpacked");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    let dir = root.join(format!("{DIR_PREFIX}{}", version.trim()));
    let staged = work.path().join("tool");
    fs::create_dir(&staged)?;
    fs::rename(unpacked.join("usr/bin/promtool"), staged.join("promtool"))
        .with_context(|| format!("no usr/bin/promtool in {}", deb.display()))?;
    replace_dir(&staged, &dir)?;
    Ok(dir.join("promtool"))
}

fn make_readable(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o777))
        .with_context(|| format!("chmod {}", dir.display()))
}

fn download(into: &Path) -> anyhow::Result<()> {
    run_apt(
        Command::new("apt-get")
            .args(["download", "-qq", PACKAGE])
            .current_dir(into),
    )
}
