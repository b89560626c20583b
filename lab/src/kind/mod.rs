//! `cargo xtask kind`: the agent end to end in a kind cluster.
//!
//! Needs docker with a running engine, kind and kubectl. It cannot run on the
//! project's development VMs: they have no Docker engine. It runs where
//! Docker and kind exist (a Linux host: the kernel programs run in the host's
//! kernel, which needs BTF, and FUSE and loop devices must be available).
//!
//! What it does:
//! 1. builds the agent image as an OCI archive (`cargo xtask image`, no
//!    engine needed) and the `faultdisk` server (Dockerfile target
//!    `faultdisk`, a test tool: built on Debian bookworm, whose glibc is no
//!    newer than the kind node image's, so the binary runs there);
//! 2. creates the cluster (one node) with `target/kind-e2e/shared` of this
//!    host mounted into the node: the fault disk's control socket is created
//!    there by the server on the node and used from here;
//! 3. mounts tracefs and bpffs on the node (a kind node is a container whose
//!    /sys is a fresh sysfs without them), loads the image archive (`kind
//!    load image-archive`: containerd on the node imports it under the name
//!    in its index), applies deploy/
//!    with the image replaced and waits for the DaemonSet;
//! 4. on the node: the fault disk (FUSE), a loop device with direct I/O over
//!    its image, ext4 on it mounted at /mnt/volume-health-e2e and a probe
//!    file whose blocks are read with filefrag;
//! 5. a local PV at that mount, a PVC bound to it, and a pod pinned to the
//!    node that overwrites and fsyncs the probe file every 2 s;
//! 6. fails every write to the probe file's blocks with EIO and waits for a
//!    Warning event `BlockIOErrors` on the pod and on the PVC;
//! 7. clears the fault and waits for a Normal event on the pod (the agent
//!    clears kernel conditions after 5 quiet minutes);
//! 8. removes the workload and the fault disk (loop devices belong to the
//!    host's kernel and would outlive the node container), then the cluster
//!    unless `--keep`.
//!
//! The flow is here; what it sets up and takes down lives in one submodule
//! each: [`images`] (tools and images on this host), [`cluster`] (the kind
//! cluster and its node), [`kubectl`], [`deploy`] (the agent in the
//! cluster), [`disk`] (the fault disk on the node), [`workload`] (the PV,
//! PVC and pod on it) and [`events`] (waiting for the agent's Events).
//! Of the rest of xtask they use only `xtask::util`; of health-tests, the
//! fault disk's control protocol and `LoopDevice`.

mod cluster;
mod deploy;
mod disk;
mod events;
mod images;
mod kubectl;
mod workload;

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use cluster::{prepare_node, Cluster};
use deploy::{deploy_agent, diagnose};
use disk::NodeDisk;
use events::{describe_event, is_clear_event, is_warning, wait_event};
use health_tests::protocol::{Op, Rule};
use images::{build_images, require_tools, Built};
use kubectl::Kube;
use workload::Workload;
pub use xtask::lab_cli::kind::KindArgs;
use xtask::util::{say, workspace_root};

const E2E_IMAGE: &str = "volume-health-agent:e2e";
/// The tag of [`E2E_IMAGE`], given to `cargo xtask image`.
const E2E_TAG: &str = "e2e";
/// Where the host's `target/kind-e2e/shared` appears on the node.
const NODE_SHARED: &str = "/var/lib/volume-health-e2e";
const NODE_MOUNT: &str = "/mnt/volume-health-e2e";
const TEST_NAMESPACE: &str = "volume-health-e2e";
const PVC: &str = "faulty";
const POD: &str = "writer";
/// The condition the agent raises for failed block requests.
const REASON: &str = "BlockIOErrors";

pub fn run(args: &KindArgs) -> anyhow::Result<()> {
    require_tools()?;
    let work = workspace_root().join("target/kind-e2e");
    let shared = work.join("shared");
    std::fs::create_dir_all(&shared)?;
    let built = build_images(&work)?;
    let cluster = Cluster::up(args, &work, &shared)?;
    let result = e2e(args, &cluster, &shared, &built);
    if let Err(e) = &result {
        say(format!("failed: {e:#}"));
    }
    drop(cluster);
    result
}

/// The test proper, between a ready cluster and its teardown. What a
/// failure needs to be understood is printed before anything is removed.
fn e2e(args: &KindArgs, cluster: &Cluster, shared: &Path, built: &Built) -> anyhow::Result<()> {
    let kube = cluster.kube();
    let diagnosed = |r: anyhow::Result<()>| {
        if r.is_err() {
            diagnose(&kube);
        }
        r
    };
    prepare_node(&cluster.node)?;
    diagnosed(deploy_agent(cluster, &kube, &built.agent_image))?;
    let disk = NodeDisk::start(&cluster.node, shared, &built.faultdisk)?;
    let workload = Workload::create(&kube, &cluster.node);
    let workload = match workload {
        Ok(w) => w,
        Err(e) => return diagnosed(Err(e)),
    };
    let result = diagnosed(check_events(args, &kube, &disk));
    drop(workload);
    drop(disk);
    if result.is_ok() {
        say("end to end: passed");
    }
    result
}

/// Writes fail: Warning events on the pod and its PVC; the fault cleared: a
/// Normal event on the pod.
fn check_events(args: &KindArgs, kube: &Kube, disk: &NodeDisk) -> anyhow::Result<()> {
    say("giving the agent two rescans to find the pod's volume");
    std::thread::sleep(Duration::from_secs(20));
    let extents = disk.probe_file_extents()?;
    for (start, len) in &extents {
        disk.add_rule(Rule::new(Op::Write, libc::EIO).range(*start, *len))?;
    }
    say(format!(
        "writes to the probe file now fail with EIO ({} extents)",
        extents.len()
    ));
    let timeout = Duration::from_secs(args.warning_timeout);
    let on_pod = wait_event(kube, "Pod", POD, timeout, is_warning)?;
    say(format!("pod event: {}", describe_event(&on_pod)));
    let on_pvc = wait_event(kube, "PersistentVolumeClaim", PVC, timeout, is_warning)?;
    say(format!("PVC event: {}", describe_event(&on_pvc)));

    disk.clear_rules()?;
    let injected = disk.injected_writes()?;
    if injected == 0 {
        bail!("the fault disk failed no write, yet events came: they are not from this test");
    }
    say(format!(
        "fault cleared after {injected} failed writes; waiting for the agent to clear {REASON}"
    ));
    let timeout = Duration::from_secs(args.clear_timeout);
    let cleared = wait_event(kube, "Pod", POD, timeout, is_clear_event)?;
    say(format!("pod event: {}", describe_event(&cleared)));
    Ok(())
}
