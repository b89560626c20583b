//! `health-agent csi-proxy` in front of the project's own CSI driver
//! (`csi-loop-driver`, cargo's build): the kubelet's session for a volume
//! gives the same answers, byte for byte, directly and through the proxy;
//! the conformance suite csi-sanity (v5.6.0, CSI 1.13) gives the result it
//! gives directly for every spec, but where the proxy answers itself; the
//! merged NodeGetVolumeHealth comes from the agent's real conditions
//! socket; and the agent or the driver going away is what it would be.
//!
//! csi-sanity is `$HEALTH_CSI_ASSETS/csi-sanity` (`cargo xtask test` builds
//! it); missing, the test fails. Root: the driver attaches loop devices and
//! mounts. Everything lives on a tmpfs of the test's own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use health_core::conditions::{CheckKind, Condition, Source, Status};
use health_csi::proto;
use health_csi::proxy::{
    Proxy, ProxyConfig, ProxyStats, NODE_GET_CAPABILITIES, NODE_GET_VOLUME_HEALTH,
};
use health_csi::replay::{
    create_volume_request, created_volume_id, delete_volume_request, frame, node_session,
    RawAnswer, RawClient, ReplayError, SessionVolume,
};
use health_node::conditions_socket::{self, AgentSocket, Served};
use health_tests::csi_driver::client::DriverProcess;
use health_tests::csi_driver::DEFAULT_DRIVER_NAME as DRIVER;
use health_tests::Mount;
use prost::Message;
use serde_json::Value;
use tokio::task::JoinHandle;

const CREATE_VOLUME: &str = "/csi.v1.Controller/CreateVolume";
const DELETE_VOLUME: &str = "/csi.v1.Controller/DeleteVolume";
const BIN: &str = env!("CARGO_BIN_EXE_csi-loop-driver");

/// csi-sanity, from `$HEALTH_CSI_ASSETS` (where `cargo xtask test` puts
/// the build of its pinned version).
fn csi_sanity() -> PathBuf {
    let dir = std::env::var_os("HEALTH_CSI_ASSETS").unwrap_or_else(|| {
        panic!("HEALTH_CSI_ASSETS is unset: it names the directory holding csi-sanity v5.6.0 (cargo xtask test sets it)")
    });
    let bin = Path::new(&dir).join("csi-sanity");
    assert!(
        bin.is_file(),
        "{} is missing (HEALTH_CSI_ASSETS)",
        bin.display()
    );
    bin
}

/// The driver serving Identity, Controller and Node on `dir/csi.sock`,
/// its state in `dir/state`; killed on drop.
fn start_driver(dir: &Path, args: &[&str]) -> DriverProcess {
    DriverProcess::start(Path::new(BIN), dir, "node1", args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The proxy, in this process, on `socket`.
struct Running {
    proxy: Proxy,
    socket: PathBuf,
    task: JoinHandle<std::io::Result<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn start_proxy(socket: &Path, driver: &Path, agent: &Path, add_capability: bool) -> Running {
    let listener = conditions_socket::bind_fresh(socket).unwrap();
    let proxy = Proxy::new(
        ProxyConfig {
            driver_socket: driver.to_path_buf(),
            agent_timeout: Duration::from_secs(1),
            add_capability,
        },
        Arc::new(AgentSocket::new(agent)),
    );
    let serving = proxy.clone();
    let task = tokio::spawn(async move { serving.serve(listener, std::future::pending()).await });
    Running {
        proxy,
        socket: socket.to_path_buf(),
        task,
    }
}

/// One call on a connection of its own, as the kubelet makes them.
async fn call(socket: &Path, path: &str, message: &[u8]) -> RawAnswer {
    let client = RawClient::connect(socket)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    client
        .call(path, message)
        .await
        .unwrap_or_else(|e| panic!("{path}: {e:#}"))
}

fn condition(source: Source, status: Status, reason: &str, message: &str) -> Condition {
    Condition {
        source,
        status,
        reason: reason.into(),
        message: message.into(),
        since: std::time::UNIX_EPOCH,
        last_probe: std::time::UNIX_EPOCH,
        occurrences: None,
    }
}

fn tmpfs() -> Mount {
    health_tests::require_root().unwrap_or_else(|e| panic!("{e:#}"));
    Mount::new("tmpfs", "tmpfs", "size=256m,mode=0755").unwrap_or_else(|e| panic!("{e:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_answers_a_kubelet_session_the_same_through_the_proxy() {
    let fs = tmpfs();
    let root = fs.path();
    let mut driver = start_driver(&root.join("driver"), &[]);
    let agent_socket = root.join("run/conditions.sock");
    let agent: Served = conditions_socket::serve(&agent_socket).await.unwrap();
    let proxy = start_proxy(
        &root.join("proxy/csi.sock"),
        driver.socket(),
        &agent_socket,
        true,
    );

    let created = call(
        driver.socket(),
        CREATE_VOLUME,
        &create_volume_request("proxy-session", 64 << 20),
    )
    .await;
    assert_eq!(created.grpc_status(), Some("0"), "{created:?}");
    let volume_id = created_volume_id(created.message().unwrap()).unwrap();
    assert!(!volume_id.is_empty());
    let staging = root
        .join("kubelet/plugins/kubernetes.io/csi")
        .join(DRIVER)
        .join("stage");
    let target = root.join("kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let session = node_session(&SessionVolume {
        volume_id: &volume_id,
        staging_path: &staging,
        target_path: &target,
        expand_to: 64 << 20,
    });

    // The whole session directly, then the whole session through the proxy:
    // each leaves the driver as it found it.
    let mut direct = Vec::new();
    for c in &session {
        direct.push(call(driver.socket(), &c.path, &c.message).await);
    }
    let mut proxied = Vec::new();
    for c in &session {
        proxied.push(call(&proxy.socket, &c.path, &c.message).await);
    }
    for ((c, d), p) in session.iter().zip(&direct).zip(&proxied) {
        assert_eq!(d, p, "{}", c.name);
    }
    let statuses: Vec<(&str, Option<&str>)> = session
        .iter()
        .zip(&direct)
        .map(|(c, a)| (c.name, a.grpc_status()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("NodeGetInfo", Some("0")),
            ("NodeStageVolume", Some("0")),
            ("NodePublishVolume", Some("0")),
            ("NodeGetVolumeStats", Some("0")),
            // Not served (no EXPAND_VOLUME): the generated stub's answer.
            ("NodeExpandVolume", Some("12")),
            ("NodeUnpublishVolume", Some("0")),
            ("NodeUnstageVolume", Some("0")),
            ("unknown method", Some("12")),
            ("unknown service", Some("12")),
        ]
    );
    let info = proto::NodeGetInfoResponse::decode(proxied[0].message().unwrap()).unwrap();
    assert_eq!(info.node_id, "node1");
    let stats = proto::NodeGetVolumeStatsResponse::decode(proxied[3].message().unwrap()).unwrap();
    assert_eq!(stats.usage.len(), 2, "{stats:?}");
    assert_eq!(
        stats.volume_condition,
        Some(proto::VolumeCondition {
            abnormal: false,
            message: "healthy".to_string()
        })
    );
    // tonic answers an unknown method or service UNIMPLEMENTED without a
    // message; the proxy passes exactly that.
    assert_eq!(
        (proxied[7].grpc_message(), proxied[8].grpc_message()),
        (None, None)
    );

    // The driver speaks the legacy health only (without --volume-health):
    // the proxy adds GET_VOLUME_HEALTH and GET_STORAGE_HEALTH after its
    // bytes, and answers NodeGetVolumeHealth from the agent without asking
    // it.
    let caps = call(driver.socket(), NODE_GET_CAPABILITIES, &[]).await;
    let caps_proxied = call(&proxy.socket, NODE_GET_CAPABILITIES, &[]).await;
    let mut expected = caps.message().unwrap().to_vec();
    expected.extend_from_slice(b"\x0a\x04\x0a\x02\x08\x07\x0a\x04\x0a\x02\x08\x08");
    assert_eq!(caps_proxied.body, frame(&expected));
    assert_eq!(caps_proxied.trailers, caps.trailers);

    agent.board().set([(
        Some(DRIVER),
        Some(volume_id.as_str()),
        vec![
            condition(
                Source::Kernel,
                Status::DataLoss,
                "BlockIOErrors",
                "3 write errors (EIO) on sdb",
            ),
            condition(
                Source::Check(CheckKind::Capacity),
                Status::Degraded,
                "CapacityLow",
                "2% free",
            ),
        ],
    )]);
    let asked = proto::NodeGetVolumeHealthRequest {
        volume_id: volume_id.clone(),
        volume_publish_path: target.display().to_string(),
        staging_target_path: staging.display().to_string(),
    }
    .encode_to_vec();
    let health = call(&proxy.socket, NODE_GET_VOLUME_HEALTH, &asked).await;
    assert_eq!(
        health_entries(&health),
        (
            volume_id.clone(),
            vec![
                (
                    proto::VolumeHealthErrorType::DataLoss as i32,
                    "BlockIOErrors".to_string(),
                    "volume-health kernel: 3 write errors (EIO) on sdb".to_string()
                ),
                (
                    proto::VolumeHealthErrorType::Degraded as i32,
                    "CapacityLow".to_string(),
                    "volume-health check/capacity: 2% free".to_string()
                ),
            ]
        )
    );
    // The driver itself does not know the call.
    assert_eq!(
        call(driver.socket(), NODE_GET_VOLUME_HEALTH, &asked)
            .await
            .grpc_status(),
        Some("12")
    );

    // The agent goes: the answer is the driver's words alone (none here).
    drop(agent);
    let alone = call(&proxy.socket, NODE_GET_VOLUME_HEALTH, &asked).await;
    assert_eq!(health_entries(&alone), (volume_id.clone(), vec![]));
    assert_eq!(
        proxy.proxy.stats(),
        ProxyStats {
            connections: 12,
            driver_unreachable: 0,
            capabilities_added: 1,
            health_answers: 2,
            storage_answers: 0,
            agent_unavailable: 1,
        }
    );

    let deleted = call(
        driver.socket(),
        DELETE_VOLUME,
        &delete_volume_request(&volume_id),
    )
    .await;
    assert_eq!(deleted.grpc_status(), Some("0"));

    // The driver goes while a kubelet connection is open: the connection
    // ends as the driver's own would; a new one is closed at once, as a
    // connection to the dead driver's socket is refused.
    let kubelet = RawClient::connect(&proxy.socket).await.unwrap();
    assert_eq!(
        kubelet
            .call("/csi.v1.Node/NodeGetInfo", &[])
            .await
            .unwrap()
            .grpc_status(),
        Some("0")
    );
    driver.kill();
    assert!(connection_lost(
        &kubelet.call("/csi.v1.Node/NodeGetInfo", &[]).await
    ));
    assert!(matches!(
        RawClient::connect(driver.socket()).await,
        Err(ReplayError::Connect { .. })
    ));
    assert!(closed_unanswered(&proxy.socket).await);
    assert_eq!(proxy.proxy.stats().driver_unreachable, 1);
}

fn health_entries(answer: &RawAnswer) -> (String, Vec<(i32, String, String)>) {
    assert_eq!(answer.grpc_status(), Some("0"), "{answer:?}");
    let health = proto::NodeGetVolumeHealthResponse::decode(answer.message().unwrap())
        .unwrap()
        .volume_health
        .unwrap();
    let entries = health
        .health_statuses
        .into_iter()
        .map(|e| (e.status, e.reason, e.message))
        .collect();
    (health.volume_id, entries)
}

/// Whether a new connection to `socket` is closed before a call on it is
/// answered: during the handshake, or with the call.
async fn closed_unanswered(socket: &Path) -> bool {
    match RawClient::connect(socket).await {
        Ok(client) => connection_lost(&client.call("/csi.v1.Node/NodeGetInfo", &[]).await),
        Err(ReplayError::Handshake { .. }) => true,
        Err(_) => false,
    }
}

/// A call that failed because the connection went away (what a gRPC client
/// reports as UNAVAILABLE), not with an answer or a stream reset.
fn connection_lost(result: &Result<RawAnswer, ReplayError>) -> bool {
    let Err(ReplayError::Call { error, .. }) = result else {
        return false;
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return !h2.is_reset() && !h2.is_go_away();
        }
        cause = e.source();
    }
    true
}

/// Each spec csi-sanity ran or skipped, by its full name: (state, failure
/// message).
type Specs = BTreeMap<String, (String, String)>;

/// csi-sanity against `endpoint`, its directories under `dir`.
async fn sanity(endpoint: &Path, dir: &Path) -> Specs {
    std::fs::create_dir_all(dir).unwrap();
    let report = dir.join("report.json");
    let mut command = Command::new(csi_sanity());
    command
        .arg(format!("--csi.endpoint={}", endpoint.display()))
        .arg(format!("--csi.mountdir={}", dir.join("mount").display()))
        .arg(format!("--csi.stagingdir={}", dir.join("stage").display()))
        // 64 MiB volumes (the default is 10 GiB): ext4 is made on each
        // staged one, in the test's tmpfs.
        .arg(format!("--csi.testvolumesize={}", 64 << 20))
        .arg("--ginkgo.no-color")
        .arg(format!("--ginkgo.json-report={}", report.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Blocking, off the runtime: the proxy serves on it meanwhile.
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "no report from csi-sanity ({e}); it said:\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let suites: Value = serde_json::from_str(&text).unwrap();
    let mut specs = Specs::new();
    for spec in suites[0]["SpecReports"].as_array().unwrap() {
        let mut name: Vec<&str> = spec["ContainerHierarchyTexts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        name.push(spec["LeafNodeText"].as_str().unwrap());
        let state = spec["State"].as_str().unwrap().to_string();
        let failure = spec["Failure"]["Message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(specs.insert(name.join(" / "), (state, failure)).is_none());
    }
    specs
}

fn counts(specs: &Specs) -> BTreeMap<&str, usize> {
    let mut out = BTreeMap::new();
    for (state, _) in specs.values() {
        *out.entry(state.as_str()).or_default() += 1;
    }
    out
}

/// Each spec whose outcome in `run` is not its outcome in `base` (or that
/// did not run in `base`), with that outcome.
fn differences(base: &Specs, run: &Specs) -> Specs {
    run.iter()
        .filter(|(name, a)| base.get(*name) != Some(*a))
        .map(|(name, a)| (name.clone(), a.clone()))
        .collect()
}

fn spec(state: &str, failure: &str) -> (String, String) {
    (state.to_string(), failure.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_through_the_proxy_matches_it_directly() {
    let fs = tmpfs();
    let root = fs.path();
    let driver = start_driver(&root.join("driver"), &[]);
    let agent_socket = root.join("run/conditions.sock");
    let _agent = conditions_socket::serve(&agent_socket).await.unwrap();
    let keeping = start_proxy(
        &root.join("keep/csi.sock"),
        driver.socket(),
        &agent_socket,
        false,
    );
    let adding = start_proxy(
        &root.join("add/csi.sock"),
        driver.socket(),
        &agent_socket,
        true,
    );

    let started = Instant::now();
    let direct = sanity(driver.socket(), &root.join("sanity-direct")).await;
    eprintln!(
        "csi-sanity against the driver: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Every spec the driver's capabilities enable passes; the others are
    // skipped by csi-sanity itself (snapshots, publish, expansion,
    // capacity, modification, group snapshots, CSI 1.13 health).
    assert_eq!(
        counts(&direct),
        BTreeMap::from([("passed", 40), ("pending", 1), ("skipped", 62)]),
        "{direct:#?}"
    );
    // Passing NodeGetCapabilities as the driver answers it: every spec as
    // directly.
    let kept = sanity(&keeping.socket, &root.join("sanity-keep")).await;
    assert_eq!(kept, direct);
    // Adding GET_VOLUME_HEALTH and GET_STORAGE_HEALTH: csi-sanity v5.6.0
    // knows CSI 1.13, so their specs run, against the proxy's own answers
    // (the driver serves neither), and pass; every other spec as directly.
    let added = sanity(&adding.socket, &root.join("sanity-add")).await;
    let node_health = [
        "Node Service / NodeGetStorageHealth / should return appropriate response",
        "Node Service / NodeGetVolumeHealth / should fail when no volume id is provided",
        "Node Service / NodeGetVolumeHealth / should return health for a valid volume",
    ];
    let passed = |names: &[&str]| -> Specs {
        names
            .iter()
            .map(|n| (n.to_string(), spec("passed", "")))
            .collect()
    };
    assert_eq!(differences(&direct, &added), passed(&node_health));
    assert_eq!(added.len(), direct.len());
    assert_eq!(keeping.proxy.stats().capabilities_added, 0);
    assert!(adding.proxy.stats().capabilities_added > 0);

    // The driver serving CSI 1.13's health itself (`--volume-health`):
    // its five specs pass directly, and through a proxy that adds only the
    // storage health it lacks, that spec too.
    let modern = start_driver(&root.join("modern"), &["--volume-health"]);
    let fronting = start_proxy(
        &root.join("front/csi.sock"),
        modern.socket(),
        &agent_socket,
        true,
    );
    let modern_direct = sanity(modern.socket(), &root.join("sanity-modern")).await;
    assert_eq!(
        differences(&direct, &modern_direct),
        passed(&[
            "ControllerGetVolumeHealth [Controller Server] / should fail when no volume id is provided",
            "ControllerGetVolumeHealth [Controller Server] / should return health for a valid volume",
            "ControllerListVolumeHealth [Controller Server] / should return appropriate response",
            node_health[1],
            node_health[2],
        ])
    );
    let modern_added = sanity(&fronting.socket, &root.join("sanity-front")).await;
    assert_eq!(
        differences(&modern_direct, &modern_added),
        passed(&node_health[..1])
    );
    assert_eq!(
        counts(&modern_added),
        BTreeMap::from([("passed", 46), ("pending", 1), ("skipped", 56)])
    );
}
