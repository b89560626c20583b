//! The Kubernetes binaries the cluster runs ([`Assets`]): found once by
//! `up` and handed to whatever starts a daemon from them (the control plane
//! and the kubelet).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};

/// Where the Kubernetes binaries are: the project's build of
/// `xtask::components::KUBERNETES` (xtask builds it before it runs the lab
/// and names it in `HEALTH_K8S_ASSETS`), or a user's own there.
pub(super) struct Assets {
    pub bin: PathBuf,
}

const BINARIES: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "etcd",
];

impl Assets {
    /// The directory `HEALTH_K8S_ASSETS` names, with every program.
    pub(super) fn find() -> anyhow::Result<Assets> {
        let env = xtask::components::K8S_ENV;
        let bin = std::env::var_os(env).map(PathBuf::from).with_context(|| {
            format!(
                "no Kubernetes binaries: {env} is not set (`cargo xtask cluster up` builds them \
                 and sets it; `cargo xtask components` prints it)"
            )
        })?;
        let missing: Vec<&str> = BINARIES
            .iter()
            .copied()
            .filter(|b| !bin.join(b).is_file())
            .collect();
        if !missing.is_empty() {
            bail!(
                "{} lacks {} ({env} points there)",
                bin.display(),
                missing.join(", ")
            );
        }
        Ok(Assets { bin })
    }

    pub(super) fn command(&self, name: &str) -> Command {
        Command::new(self.bin.join(name))
    }
}
