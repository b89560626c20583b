//! The image's software bill of materials: CycloneDX 1.5 JSON, built and
//! checked with the `cyclonedx-bom` crate (the CycloneDX project's own Rust
//! library). It lists what the image's files are made of:
//!
//! - every crate compiled into the two binaries: `cargo tree` over their
//!   normal dependencies for the image's architecture, proc-macros left out (they run in
//!   the compiler, nothing of them is in a binary), with the version
//!   Cargo.lock pins, the license each manifest declares and a
//!   `pkg:cargo` purl for those from crates.io (the workspace's own crates
//!   have none: they are not published);
//! - the Debian package of every library copied into the image, as dpkg
//!   knows it (`pkg:deb/debian/NAME@VERSION?arch=ARCH`): the build host's
//!   for its architecture, the downloaded packages for the other.
//!
//! Reproducible like the rest of the image: no serial number, the commit's
//! time as the timestamp, components sorted.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use cyclonedx_bom::external_models::normalized_string::NormalizedString;
use cyclonedx_bom::external_models::uri::Purl;
use cyclonedx_bom::models::component::{Classification, Component, Components};
use cyclonedx_bom::models::license::{LicenseChoice, Licenses};
use cyclonedx_bom::models::metadata::Metadata;
use cyclonedx_bom::prelude::{Bom, DateTime, SpecVersion, Validate};

use crate::util::output;

/// Where the image holds it.
pub const PATH: &str = "usr/share/doc/volume-health/sbom.cdx.json";

/// One crate as `cargo tree` prints it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Crate {
    pub name: String,
    pub version: String,
    /// The SPDX expression of its manifest, when it has one.
    pub license: Option<String>,
    /// Its directory, for the workspace's own (path) crates.
    pub path: Option<String>,
}

/// One Debian package a copied library belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DebianPackage {
    pub name: String,
    pub version: String,
    pub architecture: String,
}

/// The crates compiled into `packages` (workspace members) for the Rust
/// `target`, each once.
pub fn crates(workspace: &Path, packages: &[&str], target: &str) -> anyhow::Result<Vec<Crate>> {
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo
        .current_dir(workspace)
        .args(["tree", "--locked", "--edges", "normal,no-proc-macro"])
        .args(["--target", target])
        .args(["--prefix", "none", "--format", "{p}\t{l}"]);
    for package in packages {
        cargo.args(["--package", package]);
    }
    parse_tree(&output(&mut cargo)?)
}

/// `cargo tree --prefix none --format "{p}\t{l}"`: `name vVERSION[
/// (path)]\tLICENSE[ (*)]` per line, repeats marked `(*)`.
fn parse_tree(text: &str) -> anyhow::Result<Vec<Crate>> {
    let mut found = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let line = line.trim_end_matches(['\r', '\n']).trim_end_matches(" (*)");
        let (package, license) = line
            .split_once('\t')
            .with_context(|| format!("cargo tree printed {line:?}"))?;
        let mut words = package.splitn(3, ' ');
        let (Some(name), Some(version)) = (words.next(), words.next()) else {
            bail!("cargo tree printed {line:?}");
        };
        let Some(version) = version.strip_prefix('v') else {
            bail!("cargo tree printed {line:?}: no version");
        };
        let path = words.next().map(|rest| {
            rest.trim_start_matches('(')
                .trim_end_matches(')')
                .to_string()
        });
        found.insert(Crate {
            name: name.to_string(),
            version: version.to_string(),
            license: Some(license.trim().to_string()).filter(|l| !l.is_empty()),
            path,
        });
    }
    if found.is_empty() {
        bail!("cargo tree listed no crate");
    }
    Ok(found.into_iter().collect())
}

/// The Debian packages `libraries` (host paths) belong to.
pub fn debian_packages(libraries: &[PathBuf]) -> anyhow::Result<Vec<DebianPackage>> {
    let mut names = BTreeSet::new();
    for library in libraries {
        names.insert(owner(library)?);
    }
    let mut packages = Vec::new();
    for name in names {
        let shown = output(Command::new("dpkg-query").args([
            "--show",
            "--showformat",
            "${Version}\t${Architecture}",
            &name,
        ]))?;
        let (version, architecture) = shown
            .trim()
            .split_once('\t')
            .with_context(|| format!("dpkg-query printed {shown:?} for {name}"))?;
        packages.push(DebianPackage {
            name: name.split(':').next().unwrap_or(&name).to_string(),
            version: version.to_string(),
            architecture: architecture.to_string(),
        });
    }
    Ok(packages)
}

/// The package owning `path`: asked for the path, then for the file it
/// resolves to (with merged /usr, dpkg knows one of the two).
fn owner(path: &Path) -> anyhow::Result<String> {
    let real = std::fs::canonicalize(path).with_context(|| format!("{}", path.display()))?;
    for candidate in [path, real.as_path()] {
        let out = Command::new("dpkg")
            .arg("--search")
            .arg(candidate)
            .output()
            .context("running dpkg --search")?;
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            if let Some((package, _)) = text.lines().next().and_then(|l| l.split_once(": ")) {
                return Ok(package.to_string());
            }
        }
    }
    bail!("no Debian package owns {}", path.display())
}

/// The document, as JSON.
pub fn document(
    image: &str,
    version: &str,
    created: &str,
    crates: &[Crate],
    debian: &[DebianPackage],
) -> anyhow::Result<Vec<u8>> {
    let mut components = Vec::new();
    for c in crates {
        let mut component = Component::new(
            Classification::Library,
            &c.name,
            &c.version,
            Some(format!("crate:{}@{}", c.name, c.version)),
        );
        // Old manifests write "MIT/Apache-2.0", which SPDX spells with OR.
        component.licenses = c
            .license
            .as_deref()
            .map(|l| l.split('/').map(str::trim).collect::<Vec<_>>().join(" OR "))
            .map(|l| Licenses(vec![LicenseChoice::expression(&l)]));
        if c.path.is_none() {
            component.purl = Some(Purl::new("cargo", &c.name, &c.version)?);
        } else {
            component.group = Some(NormalizedString::new("volume-health"));
        }
        components.push(component);
    }
    for d in debian {
        let mut component = Component::new(
            Classification::Library,
            &d.name,
            &d.version,
            Some(format!("deb:{}@{}", d.name, d.version)),
        );
        component.purl = Some(
            format!(
                "pkg:deb/debian/{}@{}?arch={}",
                d.name,
                percent_version(&d.version),
                d.architecture
            )
            .parse()
            .map_err(|()| anyhow::anyhow!("a purl for {}", d.name))?,
        );
        components.push(component);
    }
    let bom = Bom {
        // A random serial number would make two builds differ.
        serial_number: None,
        metadata: Some(Metadata {
            timestamp: Some(DateTime::try_from(created.to_string())?),
            component: Some(Component::new(
                Classification::Container,
                image,
                version,
                Some(format!("image:{image}@{version}")),
            )),
            tools: None,
            authors: None,
            manufacture: None,
            supplier: None,
            licenses: None,
            properties: None,
            lifecycles: None,
        }),
        components: Some(Components(components)),
        spec_version: SpecVersion::V1_5,
        ..Bom::default()
    };
    let checked = bom.validate_version(SpecVersion::V1_5);
    if !checked.passed() {
        bail!("the SBOM does not validate as CycloneDX 1.5: {checked:?}");
    }
    let mut json = Vec::new();
    bom.output_as_json_v1_5(&mut json)
        .context("writing the SBOM")?;
    Ok(json)
}

/// A purl's version with the characters purl reserves escaped (a Debian
/// version may hold `+` and `:`).
fn percent_version(version: &str) -> String {
    version
        .replace('%', "%25")
        .replace('+', "%2B")
        .replace(':', "%3A")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_tree_lines_become_crates_once_each() {
        let text = "health-agent v0.1.0 (/w/health-agent)\tApache-2.0\n\
                    aya v0.13.1\tMIT OR Apache-2.0\n\
                    libc v0.2.177\tMIT OR Apache-2.0\n\
                    aya v0.13.1\tMIT OR Apache-2.0 (*)\n\
                    nolicense v1.0.0\t\n";
        let crates = parse_tree(text).unwrap();
        let seen: Vec<(&str, &str, Option<&str>, Option<&str>)> = crates
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.version.as_str(),
                    c.license.as_deref(),
                    c.path.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("aya", "0.13.1", Some("MIT OR Apache-2.0"), None),
                (
                    "health-agent",
                    "0.1.0",
                    Some("Apache-2.0"),
                    Some("/w/health-agent")
                ),
                ("libc", "0.2.177", Some("MIT OR Apache-2.0"), None),
                ("nolicense", "1.0.0", None, None),
            ]
        );
        assert!(parse_tree("").is_err());
        assert!(parse_tree("no tab here").is_err());
    }

    #[test]
    fn the_document_lists_crates_and_packages_with_purls_and_no_serial() {
        let crates = [
            Crate {
                name: "aya".into(),
                version: "0.13.1".into(),
                license: Some("MIT OR Apache-2.0".into()),
                path: None,
            },
            Crate {
                name: "health-agent".into(),
                version: "0.1.0".into(),
                license: Some("Apache-2.0".into()),
                path: Some("/w/health-agent".into()),
            },
        ];
        let debian = [DebianPackage {
            name: "libc6".into(),
            version: "2.36-9+deb12u10".into(),
            architecture: "amd64".into(),
        }];
        let json = document(
            "volume-health-agent",
            "0.1.0",
            "2026-11-24T00:00:00Z",
            &crates,
            &debian,
        )
        .unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(doc["bomFormat"], "CycloneDX");
        assert_eq!(doc["specVersion"], "1.5");
        assert_eq!(doc.get("serialNumber"), None);
        assert_eq!(doc["metadata"]["timestamp"], "2026-11-24T00:00:00Z");
        assert_eq!(doc["metadata"]["component"]["type"], "container");
        assert_eq!(doc["metadata"]["component"]["name"], "volume-health-agent");
        let listed: Vec<(&str, &str, Option<&str>)> = doc["components"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap(),
                    c["version"].as_str().unwrap(),
                    c["purl"].as_str(),
                )
            })
            .collect();
        assert_eq!(
            listed,
            [
                ("aya", "0.13.1", Some("pkg:cargo/aya@0.13.1")),
                ("health-agent", "0.1.0", None),
                (
                    "libc6",
                    "2.36-9+deb12u10",
                    Some("pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=amd64")
                ),
            ]
        );
        assert_eq!(
            doc["components"][0]["licenses"],
            serde_json::json!([{"expression": "MIT OR Apache-2.0"}])
        );
        let again = document(
            "volume-health-agent",
            "0.1.0",
            "2026-11-24T00:00:00Z",
            &crates,
            &debian,
        )
        .unwrap();
        assert_eq!(again, json, "the same input, the same bytes");
    }
}
