//! One architecture's part of the image: its two binaries, stripped, the
//! shared libraries they load (the build host's for the host's
//! architecture, Debian's packages of the other: [`super::foreign`]) and
//! the SBOM of what those files are made of.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use super::rootfs::{self, Entry, Rootfs};
use super::{foreign, sbom, AGENT_PATH, CONTROLLER_PATH};
use crate::cross::{self, Arch};
use crate::util::{output, workspace_root};

/// What the SBOM says of the image as a whole.
pub struct About<'a> {
    pub repository: &'a str,
    pub version: &'a str,
    /// RFC 3339, the commit's time.
    pub created: &'a str,
}

/// One architecture's files, its SBOM among them.
pub struct Assembled {
    pub rootfs: Rootfs,
    pub sbom: Vec<u8>,
}

/// The root filesystem of `arch` from its `agent` and `controller`.
pub fn assemble(
    arch: &Arch,
    agent: &Path,
    controller: &Path,
    about: &About<'_>,
) -> anyhow::Result<Assembled> {
    let sysroot = match arch.is_host() {
        true => None,
        false => Some(foreign::sysroot(arch)?),
    };
    let mut fs = Rootfs::default();
    let mut host_libraries: Vec<PathBuf> = Vec::new();
    for (binary, path) in [(agent, AGENT_PATH), (controller, CONTROLLER_PATH)] {
        let stripped = strip(arch, binary)?;
        let built_for = elf_architecture(&stripped)
            .with_context(|| format!("reading the ELF header of {}", binary.display()))?;
        if built_for != arch.name {
            bail!(
                "{} is built for {built_for}, not for {}",
                binary.display(),
                arch.name
            );
        }
        fs.add(
            path.trim_start_matches('/'),
            Entry::File {
                data: stripped,
                executable: true,
            },
        )?;
        match &sysroot {
            None => {
                for library in rootfs::linked_libraries(binary)? {
                    fs.copy_host_path(&library)?;
                    host_libraries.push(library);
                }
            }
            Some(sysroot) => {
                for library in foreign::needed(binary, &sysroot.root, arch)? {
                    fs.copy_from(&sysroot.root, &library)?;
                }
            }
        }
    }
    let debian = match sysroot {
        None => sbom::debian_packages(&host_libraries)?,
        Some(sysroot) => sysroot.packages,
    };
    let crates = sbom::crates(
        &workspace_root(),
        &["health-agent", "health-controller"],
        arch.rust_target,
    )?;
    let bom = sbom::document(
        about.repository,
        about.version,
        about.created,
        &crates,
        &debian,
    )?;
    fs.add(
        sbom::PATH,
        Entry::File {
            data: bom.clone(),
            executable: false,
        },
    )?;
    Ok(Assembled {
        rootfs: fs,
        sbom: bom,
    })
}

/// A binary without debug info, as `objcopy --strip-debug` (the one for
/// `arch`) leaves it (the same input gives the same output).
fn strip(arch: &Arch, binary: &Path) -> anyhow::Result<Vec<u8>> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("stripped");
    output(
        Command::new(arch.binutil("objcopy"))
            .arg("--strip-debug")
            .arg(binary)
            .arg(&out),
    )?;
    std::fs::read(&out).with_context(|| format!("reading {}", out.display()))
}

/// The OCI architecture of a 64-bit little-endian ELF executable.
pub fn elf_architecture(elf: &[u8]) -> anyhow::Result<&'static str> {
    if elf.len() < 20 || &elf[..4] != b"\x7fELF" {
        bail!("not an ELF file");
    }
    if elf[4] != 2 || elf[5] != 1 {
        bail!("not a 64-bit little-endian ELF file");
    }
    let machine = u16::from_le_bytes([elf[18], elf[19]]);
    cross::ALL
        .into_iter()
        .find(|a| a.elf_machine == machine)
        .map(|a| a.name)
        .with_context(|| format!("ELF machine {machine} has no OCI architecture here"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_architecture_comes_from_the_elf_header() {
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[18] = 62;
        assert_eq!(elf_architecture(&elf).unwrap(), "amd64");
        elf[18] = 183;
        assert_eq!(elf_architecture(&elf).unwrap(), "arm64");
        elf[18] = 3;
        assert_eq!(
            elf_architecture(&elf).unwrap_err().to_string(),
            "ELF machine 3 has no OCI architecture here"
        );
        assert!(elf_architecture(b"#!/bin/sh\n").is_err());
    }
}
