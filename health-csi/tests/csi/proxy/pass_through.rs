//! Every call the proxy does not change: the same bytes, headers and
//! trailers as from the driver directly; and the driver's absence.

use std::path::Path;

use health_csi::proto;
use health_csi::proxy::{ProxyStats, NODE_GET_CAPABILITIES, NODE_GET_VOLUME_HEALTH};
use health_csi::raw_driver::{RawAnswers, RawDriver};
use health_csi::replay::{frame, node_session, RawAnswer, RawClient, ReplayError, SessionVolume};
use health_csi::testing::{DriverMode, Rpc, TestDriver, TestDriverHandle};
use health_csi::{Usage, UsageNumbers};
use prost::Message;
use tempfile::TempDir;

use super::*;

fn session() -> Vec<health_csi::replay::SessionCall> {
    node_session(&SessionVolume {
        volume_id: VOLUME,
        staging_path: Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/test/x/globalmount"),
        target_path: Path::new("/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/pv/mount"),
        expand_to: 2 << 30,
    })
}

/// Each call of the session directly and through the proxy (each on a
/// connection of its own, as the kubelet makes them): (name, direct,
/// proxied).
async fn replay_both(driver: &Path, proxy: &Path) -> Vec<(&'static str, RawAnswer, RawAnswer)> {
    let mut out = Vec::new();
    for c in session() {
        let direct = call(&client(driver).await, &c.path, &c.message).await;
        let proxied = call(&client(proxy).await, &c.path, &c.message).await;
        out.push((c.name, direct, proxied));
    }
    out
}

fn statuses(answers: &[(&'static str, RawAnswer, RawAnswer)]) -> Vec<(&'static str, String)> {
    answers
        .iter()
        .map(|(name, direct, _)| (*name, direct.grpc_status().unwrap_or("none").to_string()))
        .collect()
}

async fn modern_driver(dir: &TempDir) -> TestDriverHandle {
    let driver = TestDriver::start(dir.path(), DriverMode::Modern)
        .await
        .unwrap();
    driver.set_volume_usage(
        VOLUME,
        Usage {
            bytes: Some(UsageNumbers {
                available: 700,
                total: 1000,
                used: 300,
            }),
            inodes: None,
        },
    );
    driver
}

#[tokio::test]
async fn the_test_driver_answers_a_session_the_same_through_the_proxy() {
    let dir = TempDir::new().unwrap();
    let driver = modern_driver(&dir).await;
    let agent = FakeAgent::new(AgentMode::Answer(Vec::new()));
    let proxy = start_proxy(dir.path(), driver.socket_path(), agent.clone());

    let answers = replay_both(driver.socket_path(), &proxy.socket).await;
    for (name, direct, proxied) in &answers {
        assert_eq!(direct, proxied, "{name}");
    }
    // The test driver serves NodeGetInfo and NodeGetVolumeStats; the rest
    // of the node service and both unknown methods are UNIMPLEMENTED.
    assert_eq!(
        statuses(&answers),
        [
            ("NodeGetInfo", "0"),
            ("NodeStageVolume", "12"),
            ("NodePublishVolume", "12"),
            ("NodeGetVolumeStats", "0"),
            ("NodeExpandVolume", "12"),
            ("NodeUnpublishVolume", "12"),
            ("NodeUnstageVolume", "12"),
            ("unknown method", "12"),
            ("unknown service", "12"),
        ]
        .map(|(n, s)| (n, s.to_string()))
    );
    let stats = proto::NodeGetVolumeStatsResponse::decode(answers[3].2.message().unwrap()).unwrap();
    assert_eq!(stats.usage.len(), 1);
    assert_eq!(
        (stats.usage[0].available, stats.usage[0].total),
        (700, 1000)
    );
    // Twice each: the direct call and the proxied one, nothing of the
    // proxy's own.
    assert_eq!(driver.calls(Rpc::NodeGetInfo), 2);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeStats), 2);
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 0);
    assert_eq!(driver.calls(Rpc::GetPluginInfo), 0);
    assert!(agent.asked().is_empty());
    assert_eq!(
        proxy.proxy.stats(),
        ProxyStats {
            connections: 9,
            ..ProxyStats::default()
        }
    );
}

/// Answers with fields no `csi.proto` of this project declares, and one of
/// 3 MiB: what a pass-through must carry without decoding.
fn raw_answers() -> RawAnswers {
    let unknown_fields = b"\xfa\x01\x05extra\x80\x02\x07".to_vec();
    let mut answers = RawAnswers::new();
    for c in session().into_iter().take(7) {
        answers.insert(c.path, unknown_fields.clone());
    }
    answers.insert(
        "/csi.v1.Node/NodeGetInfo".into(),
        proto::NodeGetInfoResponse {
            node_id: "n".repeat(3 << 20),
            max_volumes_per_node: 7,
        }
        .encode_to_vec(),
    );
    answers
}

#[tokio::test]
async fn unknown_fields_and_large_answers_pass_as_they_are() {
    let dir = TempDir::new().unwrap();
    let driver = RawDriver::start(dir.path(), raw_answers()).await.unwrap();
    let proxy = start_proxy(
        dir.path(),
        driver.socket_path(),
        FakeAgent::new(AgentMode::Fail),
    );

    let answers = replay_both(driver.socket_path(), &proxy.socket).await;
    let expected = raw_answers();
    for (name, direct, proxied) in &answers {
        assert_eq!(direct, proxied, "{name}");
    }
    for ((name, _, proxied), c) in answers.iter().zip(session()).take(7) {
        assert_eq!(proxied.grpc_status(), Some("0"), "{name}");
        assert_eq!(proxied.body, frame(&expected[&c.path]), "{name}");
    }
    assert_eq!(
        answers[0].2.body.len(),
        5 + expected["/csi.v1.Node/NodeGetInfo"].len()
    );
    // A large request streams through as well.
    let big = vec![7u8; 3 << 20];
    let direct = call(
        &client(driver.socket_path()).await,
        health_csi::replay::UNKNOWN_METHOD,
        &big,
    )
    .await;
    let proxied = call(
        &client(&proxy.socket).await,
        health_csi::replay::UNKNOWN_METHOD,
        &big,
    )
    .await;
    assert_eq!(direct, proxied);
    assert_eq!(proxied.grpc_status(), Some("12"));
}

fn capabilities_of(answer: &RawAnswer) -> Vec<i32> {
    use proto::node_service_capability::Type as Arm;
    proto::NodeGetCapabilitiesResponse::decode(answer.message().unwrap())
        .unwrap()
        .capabilities
        .into_iter()
        .map(|c| match c.r#type {
            Some(Arm::Rpc(rpc)) => rpc.r#type,
            None => -1,
        })
        .collect()
}

#[tokio::test]
async fn node_capabilities_gain_get_volume_health_after_the_drivers_own_bytes() {
    use proto::node_service_capability::rpc::Type;
    let dir = TempDir::new().unwrap();
    let driver = TestDriver::start(dir.path(), DriverMode::LegacyOnly)
        .await
        .unwrap();
    let proxy = start_proxy(
        dir.path(),
        driver.socket_path(),
        FakeAgent::new(AgentMode::Fail),
    );

    let direct = call(
        &client(driver.socket_path()).await,
        NODE_GET_CAPABILITIES,
        &[],
    )
    .await;
    let proxied = call(&client(&proxy.socket).await, NODE_GET_CAPABILITIES, &[]).await;
    // Field 1 (capabilities), 4 bytes: field 1 (rpc), 2 bytes: field 1
    // (type) = 7, GET_VOLUME_HEALTH; then the same with 8,
    // GET_STORAGE_HEALTH.
    let mut expected = direct.message().unwrap().to_vec();
    expected.extend_from_slice(b"\x0a\x04\x0a\x02\x08\x07\x0a\x04\x0a\x02\x08\x08");
    assert_eq!(proxied.body, frame(&expected));
    assert_eq!(
        (&proxied.headers, &proxied.trailers),
        (&direct.headers, &direct.trailers)
    );
    assert_eq!(
        capabilities_of(&proxied),
        [
            Type::StageUnstageVolume as i32,
            Type::GetVolumeStats as i32,
            Type::VolumeCondition as i32,
            Type::GetVolumeHealth as i32,
            Type::GetStorageHealth as i32,
        ]
    );
    assert_eq!(proxy.proxy.stats().capabilities_added, 1);

    // A driver that advertises both already gets its answer back unchanged.
    driver.set_mode(DriverMode::Modern);
    let direct = call(
        &client(driver.socket_path()).await,
        NODE_GET_CAPABILITIES,
        &[],
    )
    .await;
    let proxied = call(&client(&proxy.socket).await, NODE_GET_CAPABILITIES, &[]).await;
    assert_eq!(direct, proxied);
    assert!(capabilities_of(&proxied).contains(&(Type::GetVolumeHealth as i32)));
    assert_eq!(proxy.proxy.stats().capabilities_added, 1);
}

#[tokio::test]
async fn node_capabilities_pass_unchanged_when_told_not_to_add() {
    let dir = TempDir::new().unwrap();
    let driver = TestDriver::start(dir.path(), DriverMode::LegacyOnly)
        .await
        .unwrap();
    let agent = FakeAgent::new(AgentMode::Answer(vec![condition(
        Status::Degraded,
        "R",
        "m",
        "kernel",
    )]));
    let proxy = start_proxy_adding(dir.path(), driver.socket_path(), agent, false);
    let direct = call(
        &client(driver.socket_path()).await,
        NODE_GET_CAPABILITIES,
        &[],
    )
    .await;
    let proxied = call(&client(&proxy.socket).await, NODE_GET_CAPABILITIES, &[]).await;
    assert_eq!(direct, proxied);
    assert_eq!(proxy.proxy.stats().capabilities_added, 0);
    // What it learnt still decides NodeGetVolumeHealth: the driver lacks
    // it, so the agent answers alone.
    let answer = call(
        &client(&proxy.socket).await,
        NODE_GET_VOLUME_HEALTH,
        &health_request(VOLUME),
    )
    .await;
    assert_eq!(
        entries(&answer).1,
        [entry(DEGRADED, "R", "volume-health kernel: m")]
    );
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 0);
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

/// Whether a call failed because the connection went away (what a gRPC
/// client reports as UNAVAILABLE), not because of an answer or a reset.
fn connection_lost(result: &Result<RawAnswer, ReplayError>) -> bool {
    match result {
        Err(ReplayError::Call { error, .. }) => {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
            while let Some(e) = cause {
                if let Some(h2) = e.downcast_ref::<h2::Error>() {
                    return !h2.is_reset() && !h2.is_go_away();
                }
                cause = e.source();
            }
            true
        }
        _ => false,
    }
}

#[tokio::test]
async fn with_the_driver_down_the_client_loses_its_connection_as_it_would_directly() {
    let dir = TempDir::new().unwrap();
    let missing = dir.path().join("csi.sock");
    let proxy = start_proxy(dir.path(), &missing, FakeAgent::new(AgentMode::Fail));

    // Directly: no socket to connect to.
    assert!(matches!(
        RawClient::connect(&missing).await,
        Err(ReplayError::Connect { .. })
    ));
    // Through the proxy: the connection is closed before any answer.
    assert!(closed_unanswered(&proxy.socket).await);
    assert_eq!(proxy.proxy.stats().driver_unreachable, 1);

    // The driver comes (back): the proxy forwards without a restart.
    let driver = modern_driver(&dir).await;
    let answer = call(
        &client(&proxy.socket).await,
        "/csi.v1.Node/NodeGetInfo",
        &[],
    )
    .await;
    assert_eq!(answer.grpc_status(), Some("0"));

    // The driver goes while a kubelet connection is open: that connection
    // ends, as the driver's own would have.
    let kubelet = client(&proxy.socket).await;
    call(&kubelet, "/csi.v1.Node/NodeGetInfo", &[]).await;
    driver.shutdown().await;
    let result = kubelet.call("/csi.v1.Node/NodeGetInfo", &[]).await;
    assert!(connection_lost(&result), "{result:?}");
    assert_eq!(proxy.proxy.stats().driver_unreachable, 1);
}
