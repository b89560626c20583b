//! `health-agent csi-proxy` as the binary runs: between a CSI driver and a
//! client, asking a real conditions socket of the agent, and stopping on
//! SIGTERM with its socket removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use health_core::conditions::{CheckKind, Condition, Source, Status};
use health_csi::proto;
use health_csi::replay::RawClient;
use health_csi::testing::{DriverMode, Rpc, TestDriver};
use health_node::conditions_socket;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use prost::Message;

fn proxy_command(listen: &Path, driver: &Path, agent: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_health-agent"));
    command
        .args(["--log", "info", "csi-proxy", "--listen"])
        .arg(listen)
        .arg("--csi-address")
        .arg(driver)
        .arg("--volume-health-socket")
        .arg(agent)
        .env("NO_COLOR", "1");
    command
}

/// Waits for the proxy's socket to appear (it binds before serving).
fn wait_for_socket(child: &mut Child, socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("csi-proxy exited before serving: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "no socket at {} after 10 s",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
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

/// `health-agent <args> --help`.
fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_health-agent"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// The names of the environment the first container of a patch in
/// deploy/components/csi-proxy sets (`relative` to that directory), or the
/// agent component's added variables.
fn deploy_env(relative: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/components/csi-proxy")
        .join(relative);
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: serde_json::Value = serde_yaml::from_str(&text).unwrap();
    doc["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "volume-health-csi-proxy")
        .flat_map(|c| c["env"].as_array().unwrap().iter())
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_deploy_patches_set_the_environment_the_commands_read() {
    let proxy = help(&["csi-proxy"]);
    for patch in ["node-plugin.yaml", "example-hostpath/node-plugin.yaml"] {
        let names = deploy_env(patch);
        assert_eq!(
            names,
            [
                "CSI_ADDRESS",
                "CSI_PROXY_ADDRESS",
                "HEALTH_VOLUME_HEALTH_SOCKET"
            ],
            "{patch}"
        );
        for name in &names {
            assert!(
                proxy.contains(&format!("[env: {name}=]")),
                "{name}:\n{proxy}"
            );
        }
    }
    // The agent's side (the component's JSON patch adds this variable).
    let component = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/components/csi-proxy/kustomization.yaml"),
    )
    .unwrap();
    assert!(component.contains("{name: HEALTH_VOLUME_HEALTH_SOCKET, value: "));
    assert!(help(&["run"]).contains("[env: HEALTH_VOLUME_HEALTH_SOCKET=]"));
}

#[test]
fn refuses_to_replace_the_drivers_socket() {
    let dir = tempfile::tempdir().unwrap();
    let same = dir.path().join("csi.sock");
    let out = proxy_command(&same, &same, &dir.path().join("agent.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.lines().last().unwrap_or_default(),
        format!(
            "health-agent: --listen and --csi-address are the same path ({}): the proxy would replace the driver's socket",
            same.display()
        )
    );
}

#[test]
fn refuses_an_agent_timeout_of_zero() {
    let dir = tempfile::tempdir().unwrap();
    let out = proxy_command(
        &dir.path().join("proxy.sock"),
        &dir.path().join("csi.sock"),
        &dir.path().join("agent.sock"),
    )
    .args(["--agent-timeout", "0"])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.lines().last().unwrap_or_default(),
        "health-agent: --agent-timeout must be a positive number of seconds, got 0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_the_drivers_answers_with_the_agents_conditions_until_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let driver = TestDriver::start(dir.path(), DriverMode::LegacyOnly)
        .await
        .unwrap();
    let agent_socket = dir.path().join("run/conditions.sock");
    let agent = conditions_socket::serve(&agent_socket).await.unwrap();
    agent.board().set([(
        Some(driver.name()),
        Some("vol-1"),
        vec![
            condition(
                Source::Kernel,
                Status::DataLoss,
                "BlockIOErrors",
                "3 write errors (EIO) on sdb",
            ),
            condition(
                Source::Check(CheckKind::ReadOnly),
                Status::Inaccessible,
                "ReadOnlyRemount",
                "ext4 remounted the filesystem read-only",
            ),
        ],
    )]);
    let listen: PathBuf = dir.path().join("proxy/csi.sock");
    let mut child = proxy_command(&listen, driver.socket_path(), &agent_socket)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_socket(&mut child, &listen);

    let kubelet = RawClient::connect(&listen).await.unwrap();
    let caps = kubelet
        .call("/csi.v1.Node/NodeGetCapabilities", &[])
        .await
        .unwrap();
    let caps = proto::NodeGetCapabilitiesResponse::decode(caps.message().unwrap()).unwrap();
    use proto::node_service_capability::{rpc::Type, Type as Arm};
    let types: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref().map(|Arm::Rpc(rpc)| rpc.r#type))
        .collect();
    // The proxy appends both health calls the driver does not advertise.
    assert_eq!(
        types[types.len().saturating_sub(2)..],
        [Type::GetVolumeHealth as i32, Type::GetStorageHealth as i32]
    );

    let asked = proto::NodeGetVolumeHealthRequest {
        volume_id: "vol-1".into(),
        volume_publish_path: "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount".into(),
        staging_target_path: String::new(),
    };
    let answer = kubelet
        .call("/csi.v1.Node/NodeGetVolumeHealth", &asked.encode_to_vec())
        .await
        .unwrap();
    let health = proto::NodeGetVolumeHealthResponse::decode(answer.message().unwrap())
        .unwrap()
        .volume_health
        .unwrap();
    let entries: Vec<(i32, String, String)> = health
        .health_statuses
        .into_iter()
        .map(|e| (e.status, e.reason, e.message))
        .collect();
    assert_eq!(health.volume_id, "vol-1");
    assert_eq!(
        entries,
        [
            (
                proto::VolumeHealthErrorType::Inaccessible as i32,
                "ReadOnlyRemount".to_string(),
                "volume-health check/read-only: ext4 remounted the filesystem read-only"
                    .to_string()
            ),
            (
                proto::VolumeHealthErrorType::DataLoss as i32,
                "BlockIOErrors".to_string(),
                "volume-health kernel: 3 write errors (EIO) on sdb".to_string()
            ),
        ]
    );
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 0);
    drop(kubelet);

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!listen.exists(), "the proxy left its socket behind");
    assert!(
        stderr.contains("CSI proxy stopped connections=1 driver_unreachable=0 capabilities_added=1 health_answers=1 agent_unavailable=0"),
        "{stderr}"
    );
}
