//! `cargo xtask kind`: the agent end to end in a kind cluster.
//!
//! Needs docker with a running engine, kind and kubectl. It cannot run on the
//! project's development VMs: they have no Docker engine. It runs where
//! Docker and kind exist (a Linux host: the kernel programs run in the host's
//! kernel, which needs BTF, and FUSE and loop devices must be available).
//!
//! What it does:
//! 1. builds the agent image (Dockerfile) and the `faultdisk` server
//!    (Dockerfile target `faultdisk`: built on Debian bookworm, whose glibc
//!    is no newer than the kind node image's, so the binary runs there);
//! 2. creates the cluster (one node) with `target/kind-e2e/shared` of this
//!    host mounted into the node: the fault disk's control socket is created
//!    there by the server on the node and used from here;
//! 3. mounts tracefs and bpffs on the node (a kind node is a container whose
//!    /sys is a fresh sysfs without them), loads the image, applies deploy/
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

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use health_tests::protocol::{Op, Request, Response, Rule, ServerInfo};
use health_tests::LoopDevice;
use serde_json::Value;

use crate::util::{on_path, output, run as run_cmd, say, workspace_root};

const CLUSTER: &str = "volume-health-e2e";
/// The image deploy/daemonset.yaml names; replaced by the one built here.
const DEPLOY_IMAGE: &str = "volume-health-agent:0.1.0";
const E2E_IMAGE: &str = "volume-health-agent:e2e";
const AGENT_NAMESPACE: &str = "volume-health";
const AGENT_DAEMON_SET: &str = "volume-health-agent";
/// Where the host's `target/kind-e2e/shared` appears on the node.
const NODE_SHARED: &str = "/var/lib/volume-health-e2e";
const NODE_MOUNT: &str = "/mnt/volume-health-e2e";
const NODE_FAULTDISK: &str = "/usr/local/bin/faultdisk";
const DISK_BYTES: u64 = 256 << 20;
const TEST_NAMESPACE: &str = "volume-health-e2e";
const PV: &str = "volume-health-e2e";
const PVC: &str = "faulty";
const POD: &str = "writer";
/// The condition the agent raises for failed block requests.
const REASON: &str = "BlockIOErrors";

#[derive(clap::Args)]
pub struct KindArgs {
    /// Leave the cluster (with the agent) running afterwards; the test's pod,
    /// volume and fault disk are removed in any case.
    #[arg(long)]
    keep: bool,
    /// Use the cluster if it exists (made by an earlier run with --keep)
    /// instead of refusing to touch it.
    #[arg(long)]
    reuse: bool,
    /// kind node image (default: kind's own).
    #[arg(long, value_name = "IMAGE")]
    node_image: Option<String>,
    /// Seconds to wait for the Warning events once writes fail.
    #[arg(long, default_value_t = 180)]
    warning_timeout: u64,
    /// Seconds to wait for the Normal event once the fault is cleared (the
    /// agent's quiet window for kernel conditions is 5 minutes).
    #[arg(long, default_value_t = 480)]
    clear_timeout: u64,
}

pub fn run(args: &KindArgs) -> anyhow::Result<()> {
    require_tools()?;
    let work = workspace_root().join("target/kind-e2e");
    let shared = work.join("shared");
    std::fs::create_dir_all(&shared)?;
    let faultdisk = build_images(&work)?;
    let cluster = Cluster::up(args, &work, &shared)?;
    let result = e2e(args, &cluster, &shared, &faultdisk);
    if let Err(e) = &result {
        say(format!("failed: {e:#}"));
    }
    drop(cluster);
    result
}

/// The test proper, between a ready cluster and its teardown. What a
/// failure needs to be understood is printed before anything is removed.
fn e2e(args: &KindArgs, cluster: &Cluster, shared: &Path, faultdisk: &Path) -> anyhow::Result<()> {
    let kube = cluster.kube();
    let diagnosed = |r: anyhow::Result<()>| {
        if r.is_err() {
            diagnose(&kube);
        }
        r
    };
    prepare_node(&cluster.node)?;
    diagnosed(deploy_agent(cluster, &kube))?;
    let disk = NodeDisk::start(&cluster.node, shared, faultdisk)?;
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

// ---------------------------------------------------------------------------
// Tools and images

fn require_tools() -> anyhow::Result<()> {
    let missing: Vec<&str> = ["docker", "kind", "kubectl"]
        .into_iter()
        .filter(|t| on_path(t).is_none())
        .collect();
    if !missing.is_empty() {
        bail!("{}", missing_tools_message(&missing));
    }
    output(Command::new("docker").args(["info", "--format", "{{.ServerVersion}}"])).context(
        "docker is installed but its engine does not answer (`docker info`); \
         cargo xtask kind needs a running Docker engine",
    )?;
    Ok(())
}

fn missing_tools_message(missing: &[&str]) -> String {
    format!(
        "cargo xtask kind needs docker, kind and kubectl on PATH; missing: {}. \
         It cannot run on the project's development VMs (no Docker engine); \
         run it where Docker and kind exist.",
        missing.join(", ")
    )
}

/// The agent image, and the faultdisk binary built the same way; returns
/// the binary's path on this host.
fn build_images(work: &Path) -> anyhow::Result<PathBuf> {
    let root = workspace_root();
    say(format!("building the agent image {E2E_IMAGE} (Dockerfile)"));
    run_cmd(
        Command::new("docker")
            .args(["build", "--tag", E2E_IMAGE])
            .arg(&root),
    )?;
    let out = work.join("faultdisk-out");
    say("building the faultdisk server (Dockerfile target `faultdisk`)");
    run_cmd(
        Command::new("docker")
            .args(["build", "--target", "faultdisk", "--output"])
            .arg(format!("type=local,dest={}", out.display()))
            .arg(&root),
    )?;
    let bin = out.join("faultdisk");
    if !bin.is_file() {
        bail!("the faultdisk build left no {}", bin.display());
    }
    Ok(bin)
}

// ---------------------------------------------------------------------------
// The cluster

struct Cluster {
    name: String,
    node: String,
    kubeconfig: PathBuf,
    /// An existing cluster was used (the agent may run an older image).
    reused: bool,
    /// Deleted when dropped: not with --keep, and never a cluster that
    /// turned out not to be this command's.
    delete: bool,
}

impl Cluster {
    fn up(args: &KindArgs, work: &Path, shared: &Path) -> anyhow::Result<Cluster> {
        let exists = output(Command::new("kind").args(["get", "clusters"]))?
            .lines()
            .any(|l| l.trim() == CLUSTER);
        if exists && !args.reuse {
            bail!(
                "a kind cluster named {CLUSTER} exists already; pass --reuse to use it, \
                 or delete it with `kind delete cluster --name {CLUSTER}`"
            );
        }
        if !exists {
            create_cluster(work, shared, args.node_image.as_deref())?;
        }
        let mut cluster = Cluster {
            name: CLUSTER.to_string(),
            node: String::new(),
            kubeconfig: work.join("kubeconfig"),
            reused: exists,
            // From here on a cluster made here goes away if anything fails.
            delete: !exists && !args.keep,
        };
        let config = output(Command::new("kind").args(["get", "kubeconfig", "--name", CLUSTER]))?;
        std::fs::write(&cluster.kubeconfig, config)?;
        cluster.node = control_plane_node()?;
        check_shared_mount(&cluster.node, shared)?;
        cluster.delete = !args.keep;
        Ok(cluster)
    }

    fn kube(&self) -> Kube {
        Kube {
            kubeconfig: self.kubeconfig.clone(),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.delete {
            say(format!(
                "leaving the cluster {} (kubectl --kubeconfig {})",
                self.name,
                self.kubeconfig.display()
            ));
            return;
        }
        say(format!("deleting the cluster {}", self.name));
        if let Err(e) =
            run_cmd(Command::new("kind").args(["delete", "cluster", "--name", &self.name]))
        {
            say(format!("deleting the cluster: {e:#}"));
        }
    }
}

fn create_cluster(work: &Path, shared: &Path, node_image: Option<&str>) -> anyhow::Result<()> {
    let config = work.join("kind-config.yaml");
    std::fs::write(&config, kind_config(shared))?;
    say(format!("creating the kind cluster {CLUSTER}"));
    let mut cmd = Command::new("kind");
    cmd.args([
        "create", "cluster", "--name", CLUSTER, "--wait", "180s", "--config",
    ])
    .arg(&config);
    if let Some(image) = node_image {
        cmd.args(["--image", image]);
    }
    run_cmd(&mut cmd)
}

fn kind_config(shared: &Path) -> String {
    format!(
        "kind: Cluster\n\
         apiVersion: kind.x-k8s.io/v1alpha4\n\
         nodes:\n\
         \x20 - role: control-plane\n\
         \x20   extraMounts:\n\
         \x20     - hostPath: {}\n\
         \x20       containerPath: {NODE_SHARED}\n",
        shared.display()
    )
}

fn control_plane_node() -> anyhow::Result<String> {
    let nodes = output(Command::new("kind").args(["get", "nodes", "--name", CLUSTER]))?;
    nodes
        .lines()
        .map(str::trim)
        .find(|n| n.ends_with("-control-plane"))
        .map(String::from)
        .with_context(|| format!("no control-plane node in {nodes:?}"))
}

/// A reused cluster must have been made by this command: the shared
/// directory of this host must be what the node sees.
fn check_shared_mount(node: &str, shared: &Path) -> anyhow::Result<()> {
    let marker = format!(".marker-{}", std::process::id());
    std::fs::write(shared.join(&marker), b"")?;
    let seen = node_sh(node, &format!("test -f {NODE_SHARED}/{marker}"));
    let _ = std::fs::remove_file(shared.join(&marker));
    seen.with_context(|| {
        format!(
            "the node {node} does not see {} at {NODE_SHARED}: the cluster was not made by \
             `cargo xtask kind`; delete it with `kind delete cluster --name {CLUSTER}`",
            shared.display()
        )
    })?;
    Ok(())
}

/// Runs a shell script on the node; its stdout.
fn node_sh(node: &str, script: &str) -> anyhow::Result<String> {
    output(Command::new("docker").args(["exec", node, "sh", "-c", script]))
}

/// tracefs and bpffs where the DaemonSet mounts them from, and what the
/// fault disk needs on the node.
fn prepare_node(node: &str) -> anyhow::Result<()> {
    say(format!("preparing the node {node}"));
    node_sh(
        node,
        "set -e
         mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
         mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf",
    )
    .context("mounting tracefs and bpffs on the node")?;
    let checks = [
        ("test -e /sys/kernel/btf/vmlinux", "the host kernel has no BTF (/sys/kernel/btf/vmlinux)"),
        ("test -c /dev/fuse", "no /dev/fuse on the node: load the fuse module on the host (modprobe fuse) and recreate the cluster"),
        ("test -e /dev/loop-control", "no /dev/loop-control on the node: load the loop module on the host (modprobe loop) and recreate the cluster"),
        ("command -v losetup && command -v mkfs.ext4 && command -v filefrag && command -v mknod", "the node image lacks losetup, mkfs.ext4, filefrag or mknod"),
    ];
    for (script, problem) in checks {
        node_sh(node, script).with_context(|| problem.to_string())?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// kubectl

struct Kube {
    kubeconfig: PathBuf,
}

impl Kube {
    fn cmd(&self) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        run_cmd(self.cmd().args(args))
    }

    fn output(&self, args: &[&str]) -> anyhow::Result<String> {
        output(self.cmd().args(args))
    }

    /// `kubectl apply -f -` with `yaml` on its stdin.
    fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        let mut child = self
            .cmd()
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .context("starting kubectl apply")?;
        let mut stdin = child.stdin.take().context("kubectl's stdin")?;
        stdin.write_all(yaml.as_bytes())?;
        drop(stdin);
        let status = child.wait()?;
        if !status.success() {
            bail!("kubectl apply failed with {status}");
        }
        Ok(())
    }
}

fn deploy_agent(cluster: &Cluster, kube: &Kube) -> anyhow::Result<()> {
    say(format!("loading {E2E_IMAGE} into the cluster"));
    run_cmd(Command::new("kind").args([
        "load",
        "docker-image",
        E2E_IMAGE,
        "--name",
        &cluster.name,
    ]))?;
    let deploy = workspace_root().join("deploy");
    let rendered = kube.output(&["kustomize", &deploy.to_string_lossy()])?;
    let manifests = replace_image(&rendered, DEPLOY_IMAGE, E2E_IMAGE)?;
    say("applying deploy/");
    kube.apply(&manifests)?;
    if cluster.reused {
        // Same spec as before, but the image under the tag may be new.
        kube.run(&[
            "--namespace",
            AGENT_NAMESPACE,
            "rollout",
            "restart",
            &format!("daemonset/{AGENT_DAEMON_SET}"),
        ])?;
    }
    kube.run(&[
        "--namespace",
        AGENT_NAMESPACE,
        "rollout",
        "status",
        &format!("daemonset/{AGENT_DAEMON_SET}"),
        "--timeout=180s",
    ])
    .context("the agent's DaemonSet did not become ready")
}

/// `image: FROM` replaced by `image: TO`, which must occur exactly once.
fn replace_image(manifests: &str, from: &str, to: &str) -> anyhow::Result<String> {
    let needle = format!("image: {from}\n");
    let count = manifests.matches(&needle).count();
    if count != 1 {
        bail!(
            "expected `{}` once in deploy/, found it {count} times",
            needle.trim()
        );
    }
    Ok(manifests.replace(&needle, &format!("image: {to}\n")))
}

/// What a failure needs to be understood: the agent's state and log.
fn diagnose(kube: &Kube) {
    let ns = AGENT_NAMESPACE;
    let ds = format!("daemonset/{AGENT_DAEMON_SET}");
    for args in [
        vec!["--namespace", ns, "get", "pods", "-o", "wide"],
        vec!["--namespace", ns, "describe", "pods"],
        vec!["--namespace", ns, "logs", ds.as_str(), "--tail=100"],
        vec!["--namespace", TEST_NAMESPACE, "get", "events"],
    ] {
        let _ = kube.run(&args);
    }
}

// ---------------------------------------------------------------------------
// The fault disk on the node

/// The faultdisk server on the node (through `docker exec`, whose stdin we
/// hold: the server cleans up by itself when it reaches EOF), a loop device
/// over its image and ext4 on it, mounted at NODE_MOUNT.
struct NodeDisk {
    node: String,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    /// The control socket, as this host sees it.
    socket: PathBuf,
    info: ServerInfo,
    loop_dev: Option<String>,
}

impl NodeDisk {
    fn start(node: &str, shared: &Path, faultdisk: &Path) -> anyhow::Result<NodeDisk> {
        let host_dir = shared.join("fd");
        if host_dir.exists() {
            std::fs::remove_dir_all(&host_dir)
                .with_context(|| format!("removing a previous run's {}", host_dir.display()))?;
        }
        std::fs::create_dir_all(&host_dir)?;
        run_cmd(
            Command::new("docker")
                .arg("cp")
                .arg(faultdisk)
                .arg(format!("{node}:{NODE_FAULTDISK}")),
        )?;
        let (child, stdin, info) = spawn_server(node, &host_dir)?;
        let mut disk = NodeDisk {
            node: node.to_string(),
            child: Some(child),
            stdin: Some(stdin),
            socket: host_dir.join("ctl.sock"),
            info,
            loop_dev: None,
        };
        disk.call(&Request::Ping)?;
        disk.attach_loop()?;
        disk.make_filesystem()?;
        Ok(disk)
    }

    fn attach_loop(&mut self) -> anyhow::Result<()> {
        // The node's /dev is a tmpfs filled when the container started: a
        // loop device the kernel adds later has no node there until made.
        let script = format!(
            "set -e
             dev=$(losetup -f)
             [ -b \"$dev\" ] || mknod \"$dev\" b 7 \"${{dev#/dev/loop}}\"
             losetup --direct-io=on \"$dev\" {image}
             echo \"$dev\"",
            image = self.info.image_path
        );
        let dev = node_sh(&self.node, &script)?.trim().to_string();
        let name = dev.strip_prefix("/dev/").unwrap_or(&dev).to_string();
        self.loop_dev = Some(dev.clone());
        let dio = node_sh(&self.node, &format!("cat /sys/block/{name}/loop/dio"))?;
        if dio.trim() != "1" {
            bail!(
                "{dev}: no direct I/O (dio={}); errors would hide in a page cache",
                dio.trim()
            );
        }
        // One loop request per FUSE request, as the test harness does.
        let fit = LoopDevice::fuse_fit_kb(self.info.max_request_bytes);
        node_sh(
            &self.node,
            &format!("echo {fit} > /sys/block/{name}/queue/max_sectors_kb"),
        )?;
        say(format!(
            "fault disk on the node: {dev} over {}",
            self.info.image_path
        ));
        Ok(())
    }

    fn make_filesystem(&self) -> anyhow::Result<()> {
        let dev = self.loop_dev.as_deref().context("no loop device")?;
        node_sh(
            &self.node,
            &format!(
                "set -e
                 mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,nodiscard {dev}
                 mkdir -p {NODE_MOUNT}
                 mount -t ext4 {dev} {NODE_MOUNT}
                 dd if=/dev/zero of={NODE_MOUNT}/probe bs=1M count=1 conv=fsync 2>/dev/null
                 chmod 0666 {NODE_MOUNT}/probe"
            ),
        )?;
        Ok(())
    }

    /// Byte ranges of the probe file on the disk image.
    fn probe_file_extents(&self) -> anyhow::Result<Vec<(u64, u64)>> {
        let text = node_sh(&self.node, &format!("filefrag -v {NODE_MOUNT}/probe"))?;
        let extents = parse_filefrag(&text)?;
        if extents.is_empty() {
            bail!("filefrag found no extent of the probe file:\n{text}");
        }
        Ok(extents)
    }

    fn add_rule(&self, rule: Rule) -> anyhow::Result<()> {
        self.call(&Request::AddRule { rule }).map(|_| ())
    }

    fn clear_rules(&self) -> anyhow::Result<()> {
        self.call(&Request::ClearRules).map(|_| ())
    }

    fn injected_writes(&self) -> anyhow::Result<u64> {
        let stats = self.call(&Request::Stats)?.stats.context("no stats")?;
        Ok(stats.injected(Op::Write, libc::EIO))
    }

    /// One request on a fresh connection to the control socket.
    fn call(&self, req: &Request) -> anyhow::Result<Response> {
        let stream = UnixStream::connect(&self.socket)
            .with_context(|| format!("connecting to {}", self.socket.display()))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut line = serde_json::to_string(req)?;
        line.push('\n');
        (&stream).write_all(line.as_bytes())?;
        let mut answer = String::new();
        BufReader::new(&stream).read_line(&mut answer)?;
        let resp: Response = serde_json::from_str(&answer)
            .with_context(|| format!("bad answer from the fault disk: {answer:?}"))?;
        if !resp.ok {
            bail!(
                "fault disk refused {req:?}: {}",
                resp.error.unwrap_or_default()
            );
        }
        Ok(resp)
    }

    /// Filesystem, loop device, FUSE mount, server: in that order.
    fn stop(&mut self) -> anyhow::Result<()> {
        let _ = self.clear_rules();
        let mut script =
            format!("umount {NODE_MOUNT} 2>/dev/null || umount -l {NODE_MOUNT} || true\n");
        if let Some(dev) = self.loop_dev.take() {
            script.push_str(&format!("losetup -d {dev}\n"));
        }
        script.push_str(&format!(
            "umount {} || umount -l {}\n",
            self.info.mount_dir, self.info.mount_dir
        ));
        let result = node_sh(&self.node, &script).map(|_| ());
        if let Some(mut child) = self.child.take() {
            if !wait_exit(&mut child, Duration::from_secs(10)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Closed last: EOF starts the server's own cleanup, which must not
        // race with ours.
        drop(self.stdin.take());
        result
    }
}

impl Drop for NodeDisk {
    fn drop(&mut self) {
        say("removing the fault disk from the node");
        if let Err(e) = self.stop() {
            say(format!("fault disk cleanup: {e:#}"));
        }
    }
}

/// `docker exec -i NODE faultdisk ...`, up to its ready line.
fn spawn_server(node: &str, host_dir: &Path) -> anyhow::Result<(Child, ChildStdin, ServerInfo)> {
    let log = std::fs::File::create(host_dir.with_extension("log"))?;
    let mut child = Command::new("docker")
        .args(["exec", "-i", node, NODE_FAULTDISK, "--dir"])
        .arg(format!("{NODE_SHARED}/fd"))
        .args(["--size", &DISK_BYTES.to_string()])
        // Its own process group: a Ctrl-C here must not kill it before the
        // cleanup; it notices that we are gone by its stdin.
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("starting faultdisk on the node")?;
    let stdin = child.stdin.take().context("faultdisk's stdin")?;
    let stdout = child.stdout.take().context("faultdisk's stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = tx.send(BufReader::new(stdout).read_line(&mut line).map(|_| line));
    });
    let line = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(line)) => line,
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "faultdisk on the node did not become ready; its log: {}",
                host_dir.with_extension("log").display()
            );
        }
    };
    let json = line
        .trim_end()
        .strip_prefix("ready ")
        .with_context(|| format!("faultdisk said {line:?} instead of its ready line"))?;
    Ok((child, stdin, serde_json::from_str(json)?))
}

fn wait_exit(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Byte ranges `(offset, length)` of the extents in `filefrag -v` output,
/// whose extents are counted in blocks of the size its header names:
///
/// ```text
/// File size of /mnt/x/probe is 1048576 (1024 blocks of 1024 bytes)
///  ext:     logical_offset:        physical_offset: length:   expected: flags:
///    0:        0..    1023:      33024..     34047:   1024:             last,eof
/// ```
fn parse_filefrag(text: &str) -> anyhow::Result<Vec<(u64, u64)>> {
    let block: u64 = text
        .split_once("blocks of ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no block size in filefrag's output:\n{text}"))?;
    let mut extents = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(':').map(str::trim).collect();
        let is_extent = fields.len() >= 4 && fields[0].parse::<u64>().is_ok();
        if !is_extent {
            continue;
        }
        let (first, last) = fields[2]
            .split_once("..")
            .with_context(|| format!("filefrag extent line {line:?}"))?;
        let first: u64 = first.trim().parse()?;
        let last: u64 = last.trim().parse()?;
        extents.push((first * block, (last - first + 1) * block));
    }
    Ok(extents)
}

// ---------------------------------------------------------------------------
// The workload: a local PV on the fault disk, its PVC, a pod writing to it

struct Workload<'a> {
    kube: &'a Kube,
}

impl<'a> Workload<'a> {
    fn create(kube: &'a Kube, node: &str) -> anyhow::Result<Workload<'a>> {
        // Leftovers of an interrupted run would carry old events.
        remove_workload(kube);
        let workload = Workload { kube };
        say("creating the PV, the PVC and the writer pod");
        kube.apply(&workload_yaml(node))?;
        kube.run(&[
            "--namespace",
            TEST_NAMESPACE,
            "wait",
            "--for=condition=Ready",
            &format!("pod/{POD}"),
            "--timeout=180s",
        ])?;
        Ok(workload)
    }
}

impl Drop for Workload<'_> {
    fn drop(&mut self) {
        say("removing the test workload");
        remove_workload(self.kube);
    }
}

/// Deleting the namespace waits for the pod, so kubelet has unmounted the
/// volume before the fault disk goes.
fn remove_workload(kube: &Kube) {
    for args in [
        [
            "delete",
            "namespace",
            TEST_NAMESPACE,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=180s",
        ],
        [
            "delete",
            "persistentvolume",
            PV,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
        ],
    ] {
        if let Err(e) = kube.run(&args) {
            say(format!("cleanup: {e:#}"));
        }
    }
}

fn workload_yaml(node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {TEST_NAMESPACE}
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: {PV}
spec:
  capacity:
    storage: 128Mi
  accessModes: ["ReadWriteOnce"]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  volumeMode: Filesystem
  local:
    path: {NODE_MOUNT}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - key: kubernetes.io/hostname
              operator: In
              values: ["{node}"]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {PVC}
  namespace: {TEST_NAMESPACE}
spec:
  accessModes: ["ReadWriteOnce"]
  storageClassName: ""
  volumeName: {PV}
  resources:
    requests:
      storage: 128Mi
---
apiVersion: v1
kind: Pod
metadata:
  name: {POD}
  namespace: {TEST_NAMESPACE}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
    - name: writer
      image: busybox:1.36
      command:
        - sh
        - -c
        - while true; do dd if=/dev/zero of=/data/probe bs=4096 count=16 conv=notrunc,fsync 2>&1 | tail -n 1; sleep 2; done
      volumeMounts:
        - name: data
          mountPath: /data
  volumes:
    - name: data
      persistentVolumeClaim:
        claimName: {PVC}
"#
    )
}

// ---------------------------------------------------------------------------
// Events

/// Polls the events of one object until `wanted` accepts one.
fn wait_event(
    kube: &Kube,
    kind: &str,
    name: &str,
    timeout: Duration,
    wanted: fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let selector = format!("involvedObject.kind={kind},involvedObject.name={name}");
    let deadline = Instant::now() + timeout;
    loop {
        let text = kube.output(&[
            "--namespace",
            TEST_NAMESPACE,
            "get",
            "events",
            "--field-selector",
            &selector,
            "-o",
            "json",
        ])?;
        let list: Value = serde_json::from_str(&text).context("kubectl get events -o json")?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        if let Some(found) = items.iter().find(|e| wanted(e)) {
            return Ok(found.clone());
        }
        if Instant::now() >= deadline {
            let seen: Vec<String> = items.iter().map(describe_event).collect();
            bail!(
                "no matching event on {kind} {name} within {timeout:?}; its events:\n{}",
                seen.join("\n")
            );
        }
        std::thread::sleep(Duration::from_secs(5));
    }
}

fn is_warning(e: &Value) -> bool {
    e["type"] == "Warning" && e["reason"] == REASON
}

/// The agent's event saying the condition is over: Normal, from the agent
/// (not kubelet's Pulled/Started), naming the condition in its reason or
/// its message.
fn is_clear_event(e: &Value) -> bool {
    // The recorder's recovery event: Normal, `<Reason>Cleared`, from the agent.
    e["type"] == "Normal"
        && e["reason"] == format!("{REASON}Cleared").as_str()
        && e["source"]["component"] == "volume-health-agent"
}

fn describe_event(e: &Value) -> String {
    format!(
        "{} {} x{}: {}",
        e["type"].as_str().unwrap_or("?"),
        e["reason"].as_str().unwrap_or("?"),
        e["count"].as_u64().unwrap_or(1),
        e["message"].as_str().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filefrag_extents_become_byte_ranges() {
        let text = "Filesystem type is: ef53\n\
            File size of /mnt/volume-health-e2e/probe is 1048576 (1024 blocks of 1024 bytes)\n \
            ext:     logical_offset:        physical_offset: length:   expected: flags:\n   \
            0:        0..     511:      33024..     33535:    512:            \n   \
            1:      512..    1023:      40960..     41471:    512:      33536: last,eof\n\
            /mnt/volume-health-e2e/probe: 2 extents found\n";
        assert_eq!(
            parse_filefrag(text).unwrap(),
            vec![(33024 * 1024, 512 * 1024), (40960 * 1024, 512 * 1024)]
        );
        assert!(parse_filefrag("nothing here").is_err());
    }

    #[test]
    fn the_image_is_replaced_exactly_once() {
        let text = "a: 1\n        image: volume-health-agent:0.1.0\nb: 2\n";
        let out = replace_image(text, DEPLOY_IMAGE, E2E_IMAGE).unwrap();
        assert_eq!(out, "a: 1\n        image: volume-health-agent:e2e\nb: 2\n");
        assert!(replace_image("image: other:1\n", DEPLOY_IMAGE, E2E_IMAGE).is_err());
        let twice = format!("{text}{text}");
        assert!(replace_image(&twice, DEPLOY_IMAGE, E2E_IMAGE).is_err());
    }

    #[test]
    fn deploy_names_the_image_the_e2e_replaces() {
        let ds = std::fs::read_to_string(workspace_root().join("deploy/daemonset.yaml")).unwrap();
        assert_eq!(ds.matches(&format!("image: {DEPLOY_IMAGE}\n")).count(), 1);
    }

    #[test]
    fn events_are_told_apart() {
        let warning = serde_json::json!({"type": "Warning", "reason": "BlockIOErrors", "message": "3 failed writes"});
        assert!(is_warning(&warning));
        assert!(!is_clear_event(&warning));
        let cleared = serde_json::json!({"type": "Normal", "reason": "BlockIOErrorsCleared", "message": "BlockIOErrors cleared", "source": {"component": "volume-health-agent"}});
        assert!(is_clear_event(&cleared));
        let kubelet = serde_json::json!({"type": "Normal", "reason": "Started", "message": "Started container writer (BlockIOErrors)", "source": {"component": "kubelet"}});
        assert!(!is_clear_event(&kubelet));
    }

    #[test]
    fn missing_tools_are_named_and_the_reason_given() {
        let msg = missing_tools_message(&["docker", "kind"]);
        assert!(msg.contains("missing: docker, kind."), "{msg}");
        assert!(msg.contains("no Docker engine"), "{msg}");
    }

    #[test]
    fn the_kind_config_mounts_the_shared_dir() {
        let config = kind_config(Path::new("/w/target/kind-e2e/shared"));
        assert!(config.contains("  - role: control-plane\n"));
        assert!(config.contains("      - hostPath: /w/target/kind-e2e/shared\n"));
        assert!(config.contains(&format!("        containerPath: {NODE_SHARED}\n")));
    }
}
