//! The Kubernetes and CSI components the tests, the benchmarks and the
//! local cluster run against, built by the project from Go modules.
//!
//! No registry here serves Kubernetes or CSI binaries; the Go module proxy
//! serves their sources (../docs/development.md, "Kubernetes and CSI
//! components"). What is built, and why each:
//!
//! | set | programs | for |
//! |---|---|---|
//! | `k8s.io/kubernetes` [`KUBERNETES`] | kube-apiserver, kube-controller-manager, kube-scheduler, kubelet | the real-server suites, the local cluster, the 1.37 volume health scenarios |
//! | `k8s.io/kubernetes` [`KUBERNETES_OLDEST`] | kube-apiserver | the oldest server the README claims: the manifests' dry-run, flow-control v1beta3 |
//! | `go.etcd.io/etcd/server/v3` [`ETCD`] | etcd | the store of both servers |
//! | `github.com/kubernetes-csi/csi-test/v5` [`CSI_TEST`] | csi-sanity | CSI conformance of the project's test driver, directly and through `csi-proxy` |
//!
//! Each set is built once per version into the tools cache ([`gomod`]).
//! A user's own binaries win: [`K8S_ENV`], [`K8S_OLDEST_ENV`] and
//! [`CSI_ENV`] name directories that are used as they are, and nothing is
//! built for them.

pub mod gocaches;
pub mod gomod;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::bootstrap::cache_dir;
use crate::util::say;
use gocaches::GoCaches;
use gomod::GoSet;

/// The Kubernetes the project runs by default (the local cluster, the
/// real-server suites).
pub const KUBERNETES: &str = "v1.37.2";
/// The oldest Kubernetes the README claims, whose API server the
/// old-cluster suites run against.
pub const KUBERNETES_OLDEST: &str = "v1.26.15";
pub const ETCD: &str = "v3.6.16";
/// csi-sanity's module: v5.6.0 is built on CSI spec 1.13.0, with the
/// health RPCs' specs.
pub const CSI_TEST: &str = "v5.6.0";

/// A directory with kube-apiserver, kube-controller-manager,
/// kube-scheduler and the kubelet (and etcd, else etcd from PATH).
pub const K8S_ENV: &str = "HEALTH_K8S_ASSETS";
/// A directory with the oldest supported kube-apiserver (and etcd).
pub const K8S_OLDEST_ENV: &str = "HEALTH_K8S_OLDEST_ASSETS";
/// A directory with csi-sanity.
pub const CSI_ENV: &str = "HEALTH_CSI_ASSETS";

/// The control plane and node programs of [`KUBERNETES`].
pub const KUBERNETES_PROGRAMS: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
];

/// What a command needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// [`KUBERNETES`]: every program, with etcd beside them.
    Kubernetes,
    /// [`KUBERNETES_OLDEST`]'s API server, with etcd beside it.
    KubernetesOldest,
    /// csi-sanity.
    CsiSanity,
}

/// Every part, in the order they are built (the newest Kubernetes first:
/// most suites need it).
pub const ALL: &[Part] = &[Part::Kubernetes, Part::CsiSanity, Part::KubernetesOldest];

/// The directories of the parts asked for.
#[derive(Clone, Debug, Default)]
pub struct Assets {
    pub kubernetes: Option<PathBuf>,
    pub kubernetes_oldest: Option<PathBuf>,
    pub csi: Option<PathBuf>,
}

impl Assets {
    /// The environment the tests and the lab read them from.
    pub fn env(&self) -> Vec<(&'static str, &Path)> {
        [
            (K8S_ENV, &self.kubernetes),
            (K8S_OLDEST_ENV, &self.kubernetes_oldest),
            (CSI_ENV, &self.csi),
        ]
        .into_iter()
        .filter_map(|(name, dir)| dir.as_deref().map(|d| (name, d)))
        .collect()
    }

    /// [`Self::env`] set on `cmd`.
    pub fn apply(&self, cmd: &mut std::process::Command) {
        for (name, dir) in self.env() {
            cmd.env(name, dir);
        }
    }
}

/// The directories of `parts`: a user's own where the variable names one,
/// else the project's, built first where the cache has none.
pub fn ensure(parts: &[Part]) -> anyhow::Result<Assets> {
    let cache = cache_dir();
    let caches = GoCaches::new(&cache);
    let mut assets = Assets::default();
    for part in parts {
        let dir = match user_dir(*part)? {
            Some(dir) => {
                say(format!("{}: {} (yours)", env_name(*part), dir.display()));
                dir
            }
            None => build(*part, &cache, &caches)?,
        };
        match part {
            Part::Kubernetes => assets.kubernetes = Some(dir),
            Part::KubernetesOldest => assets.kubernetes_oldest = Some(dir),
            Part::CsiSanity => assets.csi = Some(dir),
        }
    }
    Ok(assets)
}

/// What the lab's `command` runs against: `cluster up` and the benchmarks
/// start Kubernetes; nothing else needs a component.
pub fn for_lab(
    command: &str,
    args: &[String],
    version: crate::lab_cli::bench::Kubernetes,
) -> anyhow::Result<Assets> {
    use crate::lab_cli::bench::Kubernetes;
    let starts_kubernetes = match command {
        "cluster" => args.iter().any(|a| a == "up"),
        "bench" => !args.iter().any(|a| a == "--help" || a == "-h"),
        _ => false,
    };
    match (starts_kubernetes, version) {
        (true, Kubernetes::Newest) => ensure(&[Part::Kubernetes]),
        // The lab starts whatever HEALTH_K8S_ASSETS names.
        (true, Kubernetes::Oldest) => ensure(&[Part::KubernetesOldest]).map(|a| Assets {
            kubernetes: a.kubernetes_oldest,
            ..Assets::default()
        }),
        (false, _) => Ok(Assets::default()),
    }
}

/// [`ensure`] on a thread of its own, beside other work (a cargo build).
pub struct Background {
    handle: Option<std::thread::JoinHandle<anyhow::Result<Assets>>>,
}

impl Background {
    pub fn start(parts: &'static [Part]) -> Background {
        say("building the Kubernetes and CSI components in the background (xtask: go: ...)");
        Background {
            handle: Some(std::thread::spawn(move || ensure(parts))),
        }
    }

    /// Waits for the build; its result.
    pub fn finish(mut self) -> anyhow::Result<Assets> {
        let handle = self.handle.take().context("finished twice")?;
        match handle.join() {
            Ok(result) => result,
            Err(_) => bail!("the components' build thread panicked"),
        }
    }
}

fn env_name(part: Part) -> &'static str {
    match part {
        Part::Kubernetes => K8S_ENV,
        Part::KubernetesOldest => K8S_OLDEST_ENV,
        Part::CsiSanity => CSI_ENV,
    }
}

/// The programs a directory of `part` must hold.
fn required(part: Part) -> &'static [&'static str] {
    match part {
        Part::Kubernetes => KUBERNETES_PROGRAMS,
        Part::KubernetesOldest => &["kube-apiserver"],
        Part::CsiSanity => &["csi-sanity"],
    }
}

/// The user's directory for `part`, checked, if the variable is set.
fn user_dir(part: Part) -> anyhow::Result<Option<PathBuf>> {
    let name = env_name(part);
    let Some(dir) = std::env::var_os(name).map(PathBuf::from) else {
        return Ok(None);
    };
    let missing: Vec<&str> = required(part)
        .iter()
        .copied()
        .filter(|p| !dir.join(p).is_file())
        .collect();
    if !missing.is_empty() {
        bail!(
            "{name}={} lacks {}; unset it to use the project's own build",
            dir.display(),
            missing.join(", ")
        );
    }
    Ok(Some(dir))
}

fn build(part: Part, cache: &Path, caches: &GoCaches) -> anyhow::Result<PathBuf> {
    match part {
        Part::Kubernetes => with_etcd(kubernetes(KUBERNETES, KUBERNETES_PROGRAMS)?, cache, caches),
        Part::KubernetesOldest => with_etcd(
            kubernetes(KUBERNETES_OLDEST, &["kube-apiserver"])?,
            cache,
            caches,
        ),
        Part::CsiSanity => gomod::ensure(&csi_sanity(), cache, caches),
    }
}

/// The Kubernetes set's programs with a link to etcd beside them, where
/// the real-server harness and the cluster look for it.
fn with_etcd(set: GoSet, cache: &Path, caches: &GoCaches) -> anyhow::Result<PathBuf> {
    let dir = gomod::ensure(&set, cache, caches)?;
    let etcd = gomod::ensure(&etcd(), cache, caches)?.join("etcd");
    let link = dir.join("etcd");
    if std::fs::read_link(&link).ok().as_deref() != Some(etcd.as_path()) {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&etcd, &link)
            .with_context(|| format!("linking {} to {}", link.display(), etcd.display()))?;
    }
    Ok(dir)
}

/// `k8s.io/kubernetes` at `version` (`v1.N.P`), its staging modules at
/// `v0.N.P`, the binaries telling their version (without it they say
/// `v0.0.0-master`).
fn kubernetes(version: &'static str, programs: &[&'static str]) -> anyhow::Result<GoSet> {
    let (major, minor, staging) = split_version(version)
        .with_context(|| format!("{version} is not a Kubernetes version vMAJOR.MINOR.PATCH"))?;
    let mut ldflags_x = Vec::new();
    for package in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        ldflags_x.push(format!("{package}.gitVersion={version}"));
        ldflags_x.push(format!("{package}.gitMajor={major}"));
        ldflags_x.push(format!("{package}.gitMinor={minor}"));
        ldflags_x.push(format!("{package}.gitTreeState=clean"));
    }
    Ok(GoSet {
        name: "kubernetes",
        module: "k8s.io/kubernetes",
        version,
        programs: programs
            .iter()
            .map(|p| (kubernetes_package(p), *p))
            .collect(),
        staging: Some(staging),
        ldflags_x,
    })
}

fn kubernetes_package(program: &str) -> &'static str {
    match program {
        "kube-apiserver" => "k8s.io/kubernetes/cmd/kube-apiserver",
        "kube-controller-manager" => "k8s.io/kubernetes/cmd/kube-controller-manager",
        "kube-scheduler" => "k8s.io/kubernetes/cmd/kube-scheduler",
        "kubelet" => "k8s.io/kubernetes/cmd/kubelet",
        other => unreachable!("no Kubernetes program {other}"),
    }
}

/// "v1.37.2" -> ("1", "37", "v0.37.2").
fn split_version(version: &str) -> Option<(String, String, String)> {
    let mut parts = version.strip_prefix('v')?.split('.');
    let (major, minor, patch) = (parts.next()?, parts.next()?, parts.next()?);
    let numeric = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    if parts.next().is_some() || ![major, minor, patch].into_iter().all(numeric) {
        return None;
    }
    Some((
        major.to_string(),
        minor.to_string(),
        format!("v0.{minor}.{patch}"),
    ))
}

fn etcd() -> GoSet {
    GoSet {
        name: "etcd",
        // The server module's root package is etcd's main.
        module: "go.etcd.io/etcd/server/v3",
        version: ETCD,
        programs: vec![("go.etcd.io/etcd/server/v3", "etcd")],
        staging: None,
        ldflags_x: Vec::new(),
    }
}

fn csi_sanity() -> GoSet {
    GoSet {
        name: "csi-test",
        module: "github.com/kubernetes-csi/csi-test/v5",
        version: CSI_TEST,
        programs: vec![(
            "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity",
            "csi-sanity",
        )],
        staging: None,
        ldflags_x: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_versions_give_their_staging_version() {
        assert_eq!(
            split_version("v1.37.2"),
            Some(("1".into(), "37".into(), "v0.37.2".into()))
        );
        assert_eq!(
            split_version("v1.26.15"),
            Some(("1".into(), "26".into(), "v0.26.15".into()))
        );
        for bad in ["1.37.2", "v1.37", "v1.37.2.1", "v1.37.x", "v1..2"] {
            assert_eq!(split_version(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_kubernetes_set_tells_its_version() {
        let set = kubernetes(KUBERNETES, KUBERNETES_PROGRAMS).unwrap();
        assert_eq!(set.staging.as_deref(), Some("v0.37.2"));
        assert_eq!(set.programs.len(), 4);
        assert_eq!(
            set.programs[3],
            ("k8s.io/kubernetes/cmd/kubelet", "kubelet")
        );
        assert!(set
            .ldflags_x
            .contains(&"k8s.io/component-base/version.gitVersion=v1.37.2".to_string()));
        assert!(set
            .ldflags_x
            .contains(&"k8s.io/component-base/version.gitMinor=37".to_string()));
    }

    #[test]
    fn a_users_directory_must_hold_the_programs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kube-apiserver"), "").unwrap();
        // The variable is this process's: no other test reads it.
        std::env::set_var(K8S_OLDEST_ENV, dir.path());
        assert_eq!(
            user_dir(Part::KubernetesOldest).unwrap().as_deref(),
            Some(dir.path())
        );
        std::env::set_var(CSI_ENV, dir.path());
        let err = user_dir(Part::CsiSanity).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{CSI_ENV}={} lacks csi-sanity; unset it to use the project's own build",
                dir.path().display()
            )
        );
        std::env::remove_var(K8S_OLDEST_ENV);
        std::env::remove_var(CSI_ENV);
    }
}
