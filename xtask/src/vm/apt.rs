//! apt confined to a directory of ours, for fetching packages of other
//! Debian releases.
//!
//! The sources list, package lists and download cache all live under our
//! cache directory and the installed-package state is empty, so the
//! machine's own apt configuration and state are never read for resolution
//! nor written (bullseye or trixie never become install candidates on the
//! host). The archive mirror is the one the host already uses, because that
//! is the one known to be reachable from here.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::util::{output, run, say};

/// Which Debian archive a suite lives in.
#[derive(Clone, Copy)]
pub enum Archive {
    Main,
    Security,
}

pub struct PrivateApt {
    dir: PathBuf,
    /// Another architecture than the host's, whose packages the lists
    /// then hold instead (Debian's name: `arm64`).
    arch: Option<&'static str>,
}

impl PrivateApt {
    /// Writes a sources list for `suites` into `dir` and runs
    /// `apt-get update` on it, for the host's architecture or `arch`.
    pub fn update(
        dir: &Path,
        suites: &[(Archive, &str)],
        arch: Option<&'static str>,
    ) -> anyhow::Result<PrivateApt> {
        for sub in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let (main, security) = host_mirrors();
        let mut sources = String::new();
        for (archive, suite) in suites {
            let uri = match archive {
                Archive::Main => &main,
                Archive::Security => &security,
            };
            sources.push_str(&format!(
                "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {uri} {suite} main\n"
            ));
        }
        let list = dir.join("sources.list");
        fs::write(&list, sources).with_context(|| format!("writing {}", list.display()))?;
        let apt = PrivateApt {
            dir: dir.to_path_buf(),
            arch,
        };
        let names: Vec<&str> = suites.iter().map(|(_, s)| *s).collect();
        say(format!(
            "apt-get update for {} (private state in {})",
            names.join(", "),
            dir.display()
        ));
        run(apt.command("apt-get").args(["update", "-qq"])).with_context(|| {
            format!(
                "apt-get update for {} failed: is the Debian archive reachable, and does \
                 debian-archive-keyring know these releases' keys?",
                names.join(", ")
            )
        })?;
        Ok(apt)
    }

    /// apt-get or apt-cache confined to our directory.
    fn command(&self, program: &str) -> Command {
        let d = &self.dir;
        let mut cmd = Command::new(program);
        for (key, value) in [
            ("Dir::Etc::SourceList", d.join("sources.list")),
            ("Dir::Etc::SourceParts", PathBuf::from("/dev/null")),
            ("Dir::State::Lists", d.join("lists")),
            ("Dir::Cache", d.join("cache")),
            // Nothing is installed from here: the host's status must not
            // take part in the resolution.
            ("Dir::State::Status", PathBuf::from("/dev/null")),
            // The host enables AppStream metadata; we only need Packages.
            (
                "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled",
                PathBuf::from("false"),
            ),
            // Downloads go to a root-owned directory the _apt user cannot write.
            ("APT::Sandbox::User", PathBuf::from("root")),
        ] {
            cmd.arg("-o").arg(format!("{key}={}", value.display()));
        }
        if let Some(arch) = self.arch {
            cmd.arg("-o").arg(format!("APT::Architecture={arch}"));
            cmd.arg("-o").arg(format!("APT::Architectures::={arch}"));
        }
        cmd
    }

    /// Names of the packages that start with `prefix`.
    pub fn package_names(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let names = output(self.command("apt-cache").args(["pkgnames", prefix]))
            .with_context(|| format!("listing the {prefix}* packages"))?;
        Ok(names.lines().map(|l| l.trim().to_string()).collect())
    }

    /// Downloads `package` (its candidate version) into `into`.
    pub fn download(&self, package: &str, into: &Path) -> anyhow::Result<()> {
        fs::create_dir_all(into).with_context(|| format!("creating {}", into.display()))?;
        run(self
            .command("apt-get")
            .current_dir(into)
            .args(["download", "-qq", package]))
        .with_context(|| format!("downloading {package} from the Debian archive"))
    }
}

/// The Debian archive and security URIs the host's apt uses (deb822 or
/// one-line format), defaulting to deb.debian.org.
fn host_mirrors() -> (String, String) {
    let mut texts = Vec::new();
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        for entry in dir.flatten() {
            texts.extend(fs::read_to_string(entry.path()).ok());
        }
    }
    texts.extend(fs::read_to_string("/etc/apt/sources.list").ok());
    let (mut main, mut security) = (None, None);
    for (uri, suites) in texts.iter().flat_map(|t| sources_entries(t)) {
        if !uri.contains("debian") {
            continue;
        }
        if suites.iter().any(|s| s.ends_with("-security")) {
            security.get_or_insert(uri);
        } else {
            main.get_or_insert(uri);
        }
    }
    (
        main.unwrap_or_else(|| "http://deb.debian.org/debian".into()),
        security.unwrap_or_else(|| "http://deb.debian.org/debian-security".into()),
    )
}

/// (URI, suites) of each source in a deb822 `.sources` or one-line file.
fn sources_entries(text: &str) -> Vec<(String, Vec<String>)> {
    let mut entries = Vec::new();
    // One-line format: deb [options] URI suite components...
    for line in text.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("deb ") else {
            continue;
        };
        let rest = rest.trim_start();
        let rest = match rest.strip_prefix('[') {
            Some(opts) => opts.split_once(']').map_or("", |(_, r)| r),
            None => rest,
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        if words.len() >= 2 {
            entries.push((words[0].to_string(), vec![words[1].to_string()]));
        }
    }
    // deb822: stanzas separated by blank lines.
    for stanza in text.split("\n\n") {
        let field = |name: &str| {
            stanza.lines().find_map(|l| {
                l.strip_prefix(name)
                    .map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            })
        };
        if let (Some(uris), Some(suites)) = (field("URIs:"), field("Suites:")) {
            entries.extend(uris.into_iter().next().map(|uri| (uri, suites)));
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::sources_entries;

    #[test]
    fn mirrors_from_both_formats() {
        let deb822 = "Types: deb\nURIs: http://m/debian\nSuites: bookworm bookworm-updates\n\n\
                      Types: deb\nURIs: http://m/debian-security\nSuites: bookworm-security\n";
        let e = sources_entries(deb822);
        assert_eq!(e[0].0, "http://m/debian");
        assert_eq!(e[1].1, vec!["bookworm-security".to_string()]);
        let one = "deb [arch=amd64 signed-by=/k.gpg] http://x/debian bookworm main\n";
        assert_eq!(sources_entries(one)[0].0, "http://x/debian");
    }
}
