//! `csi-test-driver`, the test driver as a process: its stdin commands reach
//! what a client sees over the socket.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use health_csi::{ControllerClient, HealthStatus};

struct Driver {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Driver {
    fn start(dir: &std::path::Path, volumes: usize) -> Driver {
        Self::start_with(dir, volumes, &[])
    }

    fn start_with(dir: &std::path::Path, volumes: usize, extra: &[&str]) -> Driver {
        let mut child = Command::new(env!("CARGO_BIN_EXE_csi-test-driver"))
            .arg("--dir")
            .arg(dir)
            .args(["--volumes", &volumes.to_string()])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning csi-test-driver");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut driver = Driver {
            child,
            stdin,
            stdout,
        };
        let ready = driver.line();
        assert_eq!(ready, format!("ready {}", dir.join("csi.sock").display()));
        driver
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("reading the driver");
        line.trim_end().to_string()
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("writing the driver");
        self.line()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn stdin_commands_change_what_the_controller_service_answers() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::start(dir.path(), 3);
    let client = ControllerClient::connect(&dir.path().join("csi.sock"), Duration::from_secs(5))
        .await
        .expect("connect");

    // A CSI 1.13 list omits healthy volumes: all three start healthy.
    let listed = client.list_volume_health(0, 10).await.expect("list");
    assert!(listed.volumes.is_empty(), "{:?}", listed.volumes);
    assert!(listed.complete);

    assert_eq!(
        driver.ask("health vol-000001 Inaccessible VolumeGone the backing directory is gone"),
        "ok"
    );
    let listed = client.list_volume_health(0, 10).await.expect("list");
    assert_eq!(
        listed.volumes.keys().cloned().collect::<Vec<_>>(),
        ["vol-000001"]
    );
    let report = client.get_volume_health("vol-000001").await.expect("get");
    let entries = report.entries.expect("health entries");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].status, HealthStatus::Inaccessible);
    assert_eq!(entries[0].reason, "VolumeGone");
    assert_eq!(entries[0].message, "the backing directory is gone");

    assert_eq!(driver.ask("healthy vol-000001"), "ok");
    let report = client.get_volume_health("vol-000001").await.expect("get");
    assert_eq!(report.entries, Some(vec![]));

    let calls: serde_json::Value = serde_json::from_str(&driver.ask("calls")).unwrap();
    assert_eq!(calls["ControllerListVolumeHealth"], 2);
    assert_eq!(calls["ControllerGetVolumeHealth"], 2);
    assert_eq!(calls["ListVolumes"], 0);

    assert_eq!(
        driver.ask("health vol-000001 Broken X y"),
        "error: unknown status \"Broken\""
    );
    assert_eq!(driver.ask("remove vol-000002"), "ok");
    let gone = client.get_volume_health("vol-000002").await.unwrap_err();
    assert!(
        matches!(gone, health_csi::CsiError::VolumeGone { .. }),
        "{gone:?}"
    );
}

#[tokio::test]
async fn unimplemented_flag_leaves_only_per_volume_gets() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::start_with(
        dir.path(),
        2,
        &["--unimplemented", "ControllerListVolumeHealth,ListVolumes"],
    );
    let client = ControllerClient::connect(&dir.path().join("csi.sock"), Duration::from_secs(5))
        .await
        .expect("connect");

    // Neither list is advertised any more, so neither is called.
    let caps = client.capabilities().await.expect("caps");
    assert!(!caps.list_volume_health && !caps.list_volumes);
    assert!(caps.get_volume_health);
    let no_list = client.list_volume_health(0, 10).await.unwrap_err();
    assert!(
        matches!(no_list, health_csi::CsiError::NotAdvertised { .. }),
        "{no_list:?}"
    );
    assert_eq!(
        driver.ask("health vol-000001 Degraded ReplicaLost replica 2 of 3 lost"),
        "ok"
    );
    let report = client.get_volume_health("vol-000001").await.expect("get");
    let entries = report.entries.expect("health entries");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].reason, "ReplicaLost");

    let calls: serde_json::Value = serde_json::from_str(&driver.ask("calls")).unwrap();
    assert_eq!(calls["ControllerGetCapabilities"], 1);
    assert_eq!(calls["ControllerListVolumeHealth"], 0);
    assert_eq!(calls["ListVolumes"], 0);
    assert_eq!(calls["ControllerGetVolumeHealth"], 1);
}

/// `--controller-caps` advertises what it names, served or not: here a list
/// the driver answers UNIMPLEMENTED, which is then an error every time.
#[tokio::test]
async fn capability_flags_set_what_is_advertised() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::start_with(
        dir.path(),
        1,
        &[
            "--unimplemented",
            "ControllerListVolumeHealth",
            "--controller-caps",
            "LIST_VOLUME_HEALTH,GET_VOLUME_HEALTH",
            "--node-caps",
            "",
        ],
    );
    let socket = dir.path().join("csi.sock");
    let client = ControllerClient::connect(&socket, Duration::from_secs(5))
        .await
        .expect("connect");
    let caps = client.capabilities().await.expect("caps");
    assert_eq!(
        caps,
        health_csi::ControllerCapabilities {
            list_volume_health: true,
            get_volume_health: true,
            ..Default::default()
        }
    );
    for _ in 0..2 {
        let err = client.list_volume_health(0, 10).await.unwrap_err();
        assert!(
            matches!(
                err,
                health_csi::CsiError::Unsupported {
                    rpc: "ControllerListVolumeHealth"
                }
            ),
            "{err:?}"
        );
    }
    let node = health_csi::NodeClient::connect(&socket, Duration::from_secs(5))
        .await
        .expect("connect");
    assert_eq!(
        node.capabilities().await.expect("node caps"),
        health_csi::NodeCapabilities::default()
    );

    let calls: serde_json::Value = serde_json::from_str(&driver.ask("calls")).unwrap();
    assert_eq!(calls["ControllerListVolumeHealth"], 2);
    assert_eq!(calls["ListVolumes"], 0);
}

#[test]
fn unknown_capability_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_csi-test-driver"))
        .arg("--dir")
        .arg(dir.path())
        .args(["--node-caps", "GET_VOLUME_HEALTH,STORAGE_HEALTH"])
        .output()
        .expect("running csi-test-driver");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "--node-caps: unknown capability \"STORAGE_HEALTH\"\n"
    );
}

#[test]
fn unknown_rpc_names_are_refused_with_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_csi-test-driver"))
        .arg("--dir")
        .arg(dir.path())
        .args(["--unimplemented", "ListVolume"])
        .output()
        .expect("running csi-test-driver");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(
            "unknown RPC \"ListVolume\"; one of GetPluginInfo, GetPluginCapabilities, "
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("ListVolumes, ControllerGetVolume, "),
        "{stderr}"
    );
}
