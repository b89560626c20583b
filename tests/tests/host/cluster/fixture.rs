//! The cluster suite's fixture: one CSI volume on a fault disk, published
//! into two pods' volume directories, the API objects on the fake API
//! server, and the agent (`health-agent run`) against both.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use health_kube::events::LocalCopy;
use health_tests::agent::Agent;
use health_tests::apiserver::{FakeApiServer, Mode};
use health_tests::kubelet::{free_port, wait_ready, CsiVolume};
use health_tests::node_cluster::poll;
use health_tests::{require_env, shared_kernel, KernelUse};
use serde_json::{json, Value};
use tempfile::TempDir;

pub const POD_A: &str = "1a1a1a1a-0000-4000-8000-00000000001a";
pub const POD_B: &str = "1b1b1b1b-0000-4000-8000-00000000001b";
pub const PVC_UID: &str = "2c2c2c2c-0000-4000-8000-00000000002c";
pub const PV: &str = "pv-e2e";
pub const DRIVER: &str = "disk.csi.volume-health.test";

/// Everything one test runs on; torn down in reverse order.
pub struct Fixture {
    pub agent: Option<Agent>,
    pub volume: Option<CsiVolume>,
    pub api: FakeApiServer,
    pub metrics: SocketAddr,
    /// The agent's command line after `run`, for a restart.
    pub args: Vec<String>,
    pub root: TempDir,
    /// Dropped last: the storm runs alone (see `health_tests::KernelUse`).
    _kernel: KernelUse,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        drop(self.agent.take());
        drop(self.volume.take());
    }
}

pub fn pod(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "uid": uid},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
        }
    })
}

impl Fixture {
    /// The disk, the two published pod volumes, the API objects and the
    /// agent, ready (its `/readyz` says the first lists are done).
    /// The running agent's process id.
    pub fn agent_pid(&self) -> u32 {
        self.agent.as_ref().map_or(0, Agent::pid)
    }

    pub fn start(extra_args: &[&str]) -> Result<Fixture> {
        Self::start_with(extra_args, Mode::Up, shared_kernel())
    }

    /// Like [`Fixture::start`], with the API server in `mode` when the agent
    /// starts; waits for readiness only when it is up.
    pub fn start_with(extra_args: &[&str], api_mode: Mode, kernel: KernelUse) -> Result<Fixture> {
        require_env(&[])?;
        let root = tempfile::Builder::new().prefix("kubelet-").tempdir()?;
        let api = FakeApiServer::start()?;
        let mut fx = Fixture {
            agent: None,
            volume: None,
            metrics: free_port()?,
            args: Vec::new(),
            api,
            root,
            _kernel: kernel,
        };
        fx.volume = Some(CsiVolume::publish(
            fx.root.path(),
            PV,
            DRIVER,
            "node-1",
            &[POD_A, POD_B],
        )?);

        fx.api.put(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": PV},
            "spec": {
                "capacity": {"storage": "64Mi"},
                "accessModes": ["ReadWriteOnce"],
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "shop", "name": "data", "uid": PVC_UID},
                "storageClassName": "fast",
                "csi": {"driver": DRIVER, "volumeHandle": "handle-e2e"}
            }
        }));
        // The PVC itself, for its `volume-health.io/health` label.
        fx.api.put(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "shop", "uid": PVC_UID, "labels": {"app": "shop"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": PV}
        }));
        fx.api.put(pod("web-0", POD_A));
        fx.api.put(pod("web-1", POD_B));
        // Nor a PV no pod here uses.
        fx.api.put(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-elsewhere"},
            "spec": {
                "capacity": {"storage": "64Mi"},
                "accessModes": ["ReadWriteOnce"],
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "shop", "name": "other", "uid": "uid-other"},
                "csi": {"driver": DRIVER, "volumeHandle": "handle-elsewhere"}
            }
        }));
        // A pod of another node must not be asked about or reported on.
        let mut elsewhere = pod("far-away", "3d3d3d3d-0000-4000-8000-00000000003d");
        elsewhere["spec"]["nodeName"] = json!("node-2");
        fx.api.put(elsewhere);

        let kubeconfig = fx.api.write_kubeconfig(fx.root.path())?;
        let metrics = fx.metrics.to_string();
        let mut args: Vec<String> = vec![
            "--node-name".into(),
            "node-1".into(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--kubelet-root".into(),
            fx.root().display().to_string(),
            // Kept across kill_and_restart, as the DaemonSet's hostPath.
            "--state-dir".into(),
            fx.root()
                .join(health_tests::real_cluster::STATE_DIR_NAME)
                .display()
                .to_string(),
            "--metrics-addr".into(),
            metrics,
            "--check-interval".into(),
            "1".into(),
        ];
        args.extend(extra_args.iter().map(|s| s.to_string()));
        fx.args = args;
        fx.api.set_mode(api_mode);
        fx.start_agent()?;
        if api_mode == Mode::Up {
            fx.wait_ready()?;
        }
        Ok(fx)
    }

    pub fn start_agent(&mut self) -> Result<()> {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.agent = Some(Agent::start_cluster(&args)?);
        Ok(())
    }

    /// SIGKILL (as an OOM kill or a node's runtime does: no final flush, no
    /// clean detach), then the same command line again, ready. Once the
    /// node's copy of its Events holds what the API server accepted: the
    /// agent saves it in the background after each accepted write, and a
    /// kill inside that moment continues from the write before
    /// (docs/how-it-works.md), which is not what a restart test is about.
    pub fn kill_and_restart(&mut self) -> Result<()> {
        self.wait_events_kept(Duration::from_secs(10))?;
        // Dropping a running `Agent` kills it with SIGKILL and reaps it.
        drop(self.agent.take().context("the agent runs")?);
        self.start_agent()?;
        self.wait_ready()
    }

    /// Waits until the copy under `--state-dir` holds the API server's
    /// Events with their counts; a copy the agent could not load back ends
    /// the wait at once.
    fn wait_events_kept(&self, within: Duration) -> Result<()> {
        let file = self
            .root()
            .join(health_tests::real_cluster::STATE_DIR_NAME)
            .join("events.json");
        let accepted = || -> Vec<(String, Value)> {
            let mut counts: Vec<(String, Value)> = self
                .api
                .events()
                .iter()
                .map(|e| {
                    (
                        e["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        e["count"].clone(),
                    )
                })
                .collect();
            counts.sort_by(|a, b| a.0.cmp(&b.0));
            counts
        };
        poll(
            "the node's copy of its Events to hold what the API server accepted",
            within,
            || {
                let copy = LocalCopy::load(&file)?;
                let mut kept: Vec<(String, Value)> = copy
                    .events()
                    .into_iter()
                    .map(|e| (e.metadata.name.unwrap_or_default(), json!(e.count)))
                    .collect();
                kept.sort_by(|a, b| a.0.cmp(&b.0));
                let accepted = accepted();
                Ok(match kept == accepted {
                    true => Ok(()),
                    false => Err(format!("kept {kept:?}, accepted {accepted:?}")),
                })
            },
        )
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    pub fn device_name(&self) -> String {
        self.volume().device_name()
    }

    pub fn wait_ready(&self) -> Result<()> {
        wait_ready(self.metrics)
    }

    pub fn fail_writes(&self, n: u64) -> Result<()> {
        self.volume().fail_writes(n)
    }

    pub fn volume(&self) -> &CsiVolume {
        self.volume.as_ref().expect("the fixture's volume")
    }

    pub fn stop(&mut self) -> Result<String> {
        let agent = self.agent.take().context("the agent runs")?;
        let run = agent.stop_cleanly()?;
        Ok(run.stderr)
    }
}

/// Events on `kind/name` with `reason`.
pub fn events_on(api: &FakeApiServer, kind: &str, name: &str, reason: &str) -> Vec<Value> {
    api.events()
        .into_iter()
        .filter(|e| {
            e["involvedObject"]["kind"] == kind
                && e["involvedObject"]["name"] == name
                && e["reason"] == reason
        })
        .collect()
}

pub const OBJECTS: [(&str, &str); 3] = [
    ("Pod", "web-0"),
    ("Pod", "web-1"),
    ("PersistentVolumeClaim", "data"),
];
