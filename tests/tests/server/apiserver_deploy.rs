//! Every way `deploy/` gives an old cluster its objects passes `kubectl apply
//! --dry-run=server` (strict field validation) on a real v1.26 kube-apiserver
//! (`health_tests::envtest`), the oldest Kubernetes the README supports:
//! - every file of `deploy/`, at any depth (`deploy/controller/` included);
//! - every kustomization there, as `kubectl kustomize` renders it;
//! - the chart rendered for this server's version (`helm template
//!   --kube-version`, its API Priority and Fairness objects in v1beta3),
//!   with default values and with `controller.enabled`, and with
//!   `recursiveReadOnly=disabled` (APF off) at helm's own default version.
//!
//! Files and directories added later are covered without a change here.
//! What cannot apply to 1.26 as it is must be listed in [`NOT_ON_1_26`] with
//! its reason, which is checked: a Component is rendered with deploy/ and
//! must be refused with exactly the listed errors (the switch matters), a
//! patch must be no complete object. The chart's rendering for a new
//! cluster must be refused the same way.
//!
//! No root, no BPF; needs HEALTH_K8S_OLDEST_ASSETS (see the harness) and
//! kubectl and helm (`cargo xtask tools`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use health_tests::envtest::{apply_manifest, runtime, Options, RealApiServer};
use health_tests::k8s_tools;
use health_tests::manifests::{documents, repo_root};
use serde_json::json;

/// What 1.26 says of the agent's DaemonSet with recursiveReadOnly on the
/// mounts of deploy/components/recursive-read-only (`{file}`: what kubectl
/// was given).
const RECURSIVE_READ_ONLY_REFUSED: &str = "Error from server (BadRequest): error when creating \
\"{file}\": DaemonSet in version \"v1\" cannot be handled as a DaemonSet: strict decoding error: \
unknown field \"spec.template.spec.containers[0].volumeMounts[0].recursiveReadOnly\", \
unknown field \"spec.template.spec.containers[0].volumeMounts[1].recursiveReadOnly\", \
unknown field \"spec.template.spec.containers[0].volumeMounts[5].recursiveReadOnly\", \
unknown field \"spec.template.spec.containers[0].volumeMounts[6].recursiveReadOnly\"";

/// What 1.26 (admissionregistration.k8s.io/v1 not served) says of the
/// policies of deploy/components/admission-policy, one line each.
const ADMISSION_POLICY_REFUSED: &str = concat!(
    "resource mapping not found for name: \"volume-health-node-entries\" namespace: \"\" from \"{file}\": no matches for kind \"ValidatingAdmissionPolicy\" in version \"admissionregistration.k8s.io/v1\"\n",
    "ensure CRDs are installed first\n",
    "resource mapping not found for name: \"volume-health-pvc-label\" namespace: \"\" from \"{file}\": no matches for kind \"ValidatingAdmissionPolicy\" in version \"admissionregistration.k8s.io/v1\"\n",
    "ensure CRDs are installed first\n",
    "resource mapping not found for name: \"volume-health-node-entries\" namespace: \"\" from \"{file}\": no matches for kind \"ValidatingAdmissionPolicyBinding\" in version \"admissionregistration.k8s.io/v1\"\n",
    "ensure CRDs are installed first\n",
    "resource mapping not found for name: \"volume-health-pvc-label\" namespace: \"\" from \"{file}\": no matches for kind \"ValidatingAdmissionPolicyBinding\" in version \"admissionregistration.k8s.io/v1\"\n",
    "ensure CRDs are installed first"
);

/// What 1.26 (flowcontrol v1beta3 only) says of the API Priority and
/// Fairness objects of deploy/components/flow-control (v1, 1.29+; its
/// v1beta3 twin applies to 1.26 and is dry-run with the rest).
const FLOW_CONTROL_V1_REFUSED: &str = concat!(
    "resource mapping not found for name: \"volume-health-agent\" namespace: \"\" from \"{file}\": no matches for kind \"FlowSchema\" in version \"flowcontrol.apiserver.k8s.io/v1\"\n",
    "ensure CRDs are installed first\n",
    "resource mapping not found for name: \"volume-health-agent\" namespace: \"\" from \"{file}\": no matches for kind \"PriorityLevelConfiguration\" in version \"flowcontrol.apiserver.k8s.io/v1\"\n",
    "ensure CRDs are installed first"
);

/// Why a path of deploy/ is not applied to 1.26 as it is.
enum NotOn126 {
    /// A kustomize Component (nothing by itself): deploy/ with it, as a
    /// user's kustomization names both, is refused with exactly this error.
    Component { refused: &'static str },
    /// A strategic-merge patch for `kubectl patch`, not an object
    /// (apiserver_rbac.rs applies it to a driver's StatefulSet).
    Patch,
}

/// Every path of deploy/ (relative) that is not applied as it is, and why.
const NOT_ON_1_26: &[(&str, NotOn126)] = &[
    // recursiveReadOnly: unknown before 1.30, on by default from 1.31.
    (
        "components/recursive-read-only",
        NotOn126::Component {
            refused: RECURSIVE_READ_ONLY_REFUSED,
        },
    ),
    // ValidatingAdmissionPolicy v1: Kubernetes 1.30+ (and the node name in a
    // pod's token, which the policy reads). tests/tests/server/apiserver_status.rs
    // runs the same policies as 1.26's v1alpha1.
    (
        "components/admission-policy",
        NotOn126::Component {
            refused: ADMISSION_POLICY_REFUSED,
        },
    ),
    // flowcontrol.apiserver.k8s.io/v1: Kubernetes 1.29+.
    (
        "components/flow-control",
        NotOn126::Component {
            refused: FLOW_CONTROL_V1_REFUSED,
        },
    ),
    ("controller/sidecar.yaml", NotOn126::Patch),
    ("controller/example-hostpath/sidecar.yaml", NotOn126::Patch),
];

/// What deploy/ holds, found by walking it (the chart aside).
#[derive(Debug, Default)]
struct Found {
    /// Directories with a kustomization.yaml of kind Kustomization.
    kustomizations: Vec<PathBuf>,
    /// Directories with a kustomization.yaml of kind Component.
    components: Vec<PathBuf>,
    /// YAML files but kustomization.yaml, outside Components.
    files: Vec<PathBuf>,
}

fn walk(dir: &Path, found: &mut Found) -> Result<()> {
    let kustomization = dir.join("kustomization.yaml");
    if kustomization.is_file() {
        let text = std::fs::read_to_string(&kustomization)
            .with_context(|| format!("reading {}", kustomization.display()))?;
        let docs = documents(&text, &kustomization.display().to_string())?;
        match docs.first().and_then(|d| d["kind"].as_str()) {
            Some("Kustomization") => found.kustomizations.push(dir.to_path_buf()),
            // A Component's files are patches of it, not objects.
            Some("Component") => {
                found.components.push(dir.to_path_buf());
                return Ok(());
            }
            other => bail!("{}: kind {other:?}", kustomization.display()),
        }
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if path.is_dir() {
            // The chart is rendered with helm below, never read as files.
            if path != repo_root().join("deploy/helm") {
                walk(&path, found)?;
            }
        } else if (name.ends_with(".yaml") || name.ends_with(".yml"))
            && name != "kustomization.yaml"
        {
            found.files.push(path);
        }
    }
    Ok(())
}

/// One `kubectl apply --dry-run=server` and what it said.
struct DryRun {
    /// The file kubectl was given.
    file: PathBuf,
    /// Error lines of stderr (warnings aside); empty when it succeeded.
    errors: Vec<String>,
}

struct Tools {
    kubectl: PathBuf,
    helm: PathBuf,
    kubeconfig: PathBuf,
    /// Homes of both tools and the renderings.
    dir: tempfile::TempDir,
}

impl Tools {
    fn new(server: &RealApiServer) -> Result<Self> {
        Ok(Self {
            kubectl: k8s_tools::find("KUBECTL_BIN", "kubectl")?,
            helm: k8s_tools::find("HELM_BIN", "helm")?,
            kubeconfig: server.kubeconfig(server.admin()).to_path_buf(),
            dir: tempfile::tempdir().context("a directory for the renderings")?,
        })
    }

    /// `text` saved as `name` for kubectl.
    fn save(&self, name: &str, text: &str) -> Result<PathBuf> {
        let file = self.dir.path().join(name);
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
        Ok(file)
    }

    fn kubectl(&self, args: &[&str]) -> Result<String> {
        k8s_tools::run(&self.kubectl, args, self.dir.path())
    }

    fn helm_template(&self, values: &[&str]) -> Result<String> {
        let chart = repo_root().join("deploy/helm/volume-health");
        let mut args = vec![
            "template",
            "volume-health",
            chart.to_str().context("UTF-8")?,
        ];
        args.extend_from_slice(values);
        k8s_tools::run(&self.helm, &args, self.dir.path())
    }

    /// `kubectl apply --dry-run=server` of `file`: on success, every
    /// document must be reported as applied in the dry run.
    fn dry_run(&self, file: &Path) -> Result<DryRun> {
        let path = file.to_str().context("UTF-8 path")?;
        let kubeconfig = self.kubeconfig.to_str().context("UTF-8 path")?;
        let args = [
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "--kubeconfig",
            kubeconfig,
            "-f",
            path,
        ];
        let out = k8s_tools::output(&self.kubectl, &args, self.dir.path())?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<String> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("Warning:"))
            .map(str::to_string)
            .collect();
        if out.status.success() {
            ensure!(errors.is_empty(), "{path}: succeeded, but said {errors:?}");
            let text = std::fs::read_to_string(file)?;
            let docs = documents(&text, path)?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let applied = stdout.lines().filter(|l| l.ends_with(" (server dry run)"));
            ensure!(
                applied.count() == docs.len() && !docs.is_empty(),
                "{path}: {} documents, kubectl said:\n{stdout}",
                docs.len()
            );
        } else {
            ensure!(!errors.is_empty(), "{path}: failed without an error line");
        }
        Ok(DryRun {
            file: file.to_path_buf(),
            errors,
        })
    }
}

/// The namespaces every rendering names, created for real: a dry run creates
/// nothing, so objects in a namespace the same rendering makes would fail.
async fn create_namespaces(client: &kube::Client, renderings: &[&str]) -> Result<()> {
    let mut names = BTreeSet::new();
    for text in renderings {
        for doc in documents(text, "a rendering")? {
            if doc["kind"] == "Namespace" {
                names.extend(doc["metadata"]["name"].as_str().map(str::to_string));
            }
            names.extend(doc["metadata"]["namespace"].as_str().map(str::to_string));
        }
    }
    for name in names {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        apply_manifest(client, &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
    }
    Ok(())
}

fn relative(path: &Path) -> Result<String> {
    let deploy = repo_root().join("deploy");
    Ok(path.strip_prefix(&deploy)?.display().to_string())
}

fn expect_refused(run: &DryRun, refused: &str) -> Result<()> {
    let expected = refused.replace("{file}", &run.file.display().to_string());
    ensure!(
        run.errors.join("\n") == expected,
        "{}: expected exactly\n{expected}\ngot {:#?}",
        run.file.display(),
        run.errors
    );
    Ok(())
}

#[test]
fn every_file_and_old_cluster_rendering_of_deploy_passes_a_server_dry_run() -> Result<()> {
    let Some(server) = Options::new().oldest().require() else {
        return Ok(());
    };
    let tools = Tools::new(&server)?;
    let rt = runtime()?;
    let admin = rt.block_on(server.client(server.admin()))?;
    let version = rt.block_on(admin.apiserver_version())?;
    ensure!(
        version.major == "1" && version.minor.trim_end_matches('+').parse::<u32>()? < 30,
        "this test holds the manifests to a server without recursiveReadOnly (before 1.30), \
         not {}",
        version.git_version
    );
    let kube_version = version.git_version.clone();

    let mut found = Found::default();
    walk(&repo_root().join("deploy"), &mut found)?;
    let listed: BTreeSet<&str> = NOT_ON_1_26.iter().map(|(p, _)| *p).collect();

    // Everything that must apply as it is: (what, rendering file).
    let mut applicable: Vec<(String, PathBuf)> = Vec::new();
    let mut excluded = BTreeSet::new();
    for file in &found.files {
        let name = relative(file)?;
        if listed.contains(name.as_str()) {
            excluded.insert(name);
        } else {
            applicable.push((name, file.clone()));
        }
    }
    for dir in &found.kustomizations {
        let name = Path::new("deploy").join(relative(dir)?);
        let text = tools.kubectl(&["kustomize", dir.to_str().context("UTF-8")?])?;
        let file = tools.save(&format!("kustomize-{}.yaml", applicable.len()), &text)?;
        applicable.push((format!("kubectl kustomize {}", name.display()), file));
    }
    for values in [
        vec!["--kube-version", kube_version.as_str()],
        vec![
            "--kube-version",
            &kube_version,
            "--set",
            "controller.enabled=true",
        ],
        // helm's own version is 1.29 or newer: its APF objects are v1,
        // which 1.26 does not serve (the chart's version choice is
        // deploy_render.rs's).
        vec![
            "--set",
            "recursiveReadOnly=disabled",
            "--set",
            "priorityAndFairness.enabled=false",
        ],
    ] {
        let text = tools.helm_template(&values)?;
        let file = tools.save(&format!("helm-{}.yaml", applicable.len()), &text)?;
        applicable.push((format!("helm template {values:?}"), file));
    }
    for dir in &found.components {
        let name = relative(dir)?;
        if listed.contains(name.as_str()) {
            excluded.insert(name);
            continue;
        }
        // A Component that applies to 1.26 (device-mapper-status adds a
        // capability): rendered with deploy/ as docs/install.md tells users to.
        let user = tempfile::tempdir()?;
        health_tests::k8s_tools::write_kustomization(
            user.path(),
            &[&repo_root().join("deploy")],
            &[dir],
        )?;
        let text = tools.kubectl(&["kustomize", user.path().to_str().context("UTF-8")?])?;
        let file = tools.save(&format!("component-{}.yaml", applicable.len()), &text)?;
        applicable.push((format!("deploy/ with {name}"), file));
    }
    let listed: BTreeSet<String> = listed.into_iter().map(String::from).collect();
    ensure!(
        excluded == listed,
        "not applied as they are: {excluded:?}; NOT_ON_1_26 lists {listed:?} (a new \
         Component or patch needs an entry there with its reason)"
    );
    ensure!(
        found.kustomizations.len() >= 3 && found.files.len() >= 13,
        "too little found in deploy/: {found:#?}"
    );

    let renderings: Vec<String> = applicable
        .iter()
        .map(|(_, f)| std::fs::read_to_string(f))
        .collect::<std::io::Result<_>>()?;
    let texts: Vec<&str> = renderings.iter().map(String::as_str).collect();
    rt.block_on(create_namespaces(&admin, &texts))?;

    let mut refused = Vec::new();
    for (what, file) in &applicable {
        let run = tools.dry_run(file)?;
        if !run.errors.is_empty() {
            refused.push(format!("{what}: {:?}", run.errors));
        }
    }
    ensure!(
        refused.is_empty(),
        "refused by {kube_version}:\n{}",
        refused.join("\n")
    );

    // What is listed is so for the reason given.
    let deploy = repo_root().join("deploy");
    for (path, why) in NOT_ON_1_26 {
        match why {
            NotOn126::Component { refused } => {
                let user = tempfile::tempdir()?;
                k8s_tools::write_kustomization(user.path(), &[&deploy], &[&deploy.join(path)])?;
                let text = tools.kubectl(&["kustomize", user.path().to_str().context("UTF-8")?])?;
                let file = tools.save("with-component.yaml", &text)?;
                expect_refused(&tools.dry_run(&file)?, refused).context(*path)?;
            }
            NotOn126::Patch => {
                let file = deploy.join(path);
                let docs = documents(&std::fs::read_to_string(&file)?, path)?;
                ensure!(
                    docs.len() == 1 && docs[0]["spec"].get("selector").is_none(),
                    "{path}: not a patch of a workload's pod template"
                );
            }
        }
    }

    // The chart's rendering for a new cluster is what 1.26 refuses (its v1
    // APF objects aside: refused as the Component's above).
    let text = tools.helm_template(&[
        "--kube-version",
        "1.33.0",
        "--set",
        "priorityAndFairness.enabled=false",
    ])?;
    let file = tools.save("helm-1.33.yaml", &text)?;
    expect_refused(&tools.dry_run(&file)?, RECURSIVE_READ_ONLY_REFUSED)
        .context("helm template --kube-version 1.33.0")
}
