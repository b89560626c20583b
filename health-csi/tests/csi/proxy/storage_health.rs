//! NodeGetStorageHealth through the proxy: the driver's backend entries and
//! the agent's stack findings for the driver's storage, merged within the
//! API's limits; the agent's alone from a driver without the capability;
//! the driver's alone when the agent cannot answer.

use health_csi::proxy::{NODE_GET_CAPABILITIES, NODE_GET_STORAGE_HEALTH};
use health_csi::testing::{DriverMode, Rpc, TestDriver};
use health_csi::{StorageHealthEntry, StorageHealthStatus};
use tempfile::TempDir;

use super::*;

/// CSI v1.13.0 `StorageHealthErrorType` numbers.
const STORAGE_DEGRADED: i32 = 1;
const STORAGE_UNREACHABLE: i32 = 2;

const DRIVER_NAME: &str = "test.csi.volume-health";

/// The (status, reason, message) of each backend entry of an OK answer.
fn backends(answer: &RawAnswer) -> Vec<(i32, String, String)> {
    assert_eq!(answer.grpc_status(), Some("0"), "{answer:?}");
    let decoded =
        proto::NodeGetStorageHealthResponse::decode(answer.message().expect("one message"))
            .unwrap();
    decoded
        .backend_health
        .into_iter()
        .map(|b| (b.status, b.reason, b.message))
        .collect()
}

fn backend(status: i32, reason: &str, message: &str) -> (i32, String, String) {
    (status, reason.into(), message.into())
}

fn stack_findings() -> Vec<AgentCondition> {
    vec![
        condition(
            Status::Degraded,
            "PathsDown",
            "dm-3 (mpatha): 1 of 2 paths down",
            "check/stack",
        ),
        condition(
            Status::Inaccessible,
            "ThinPoolFull",
            "pool vg0/tp: data 100%",
            "check/stack",
        ),
    ]
}

#[tokio::test]
async fn storage_health_merges_the_drivers_backends_with_the_agents_findings() {
    let dir = TempDir::new().unwrap();
    let driver = TestDriver::start(dir.path(), DriverMode::Modern)
        .await
        .unwrap();
    driver.set_storage_health(vec![StorageHealthEntry::new(
        StorageHealthStatus::StorageDegraded,
        "ReplicaSlow",
        "replica 2 lags",
    )]);
    let agent = FakeAgent::new(AgentMode::Answer(stack_findings()));
    let proxy = start_proxy(dir.path(), driver.socket_path(), agent.clone());

    let answer = call(
        &client(&proxy.socket).await,
        NODE_GET_STORAGE_HEALTH,
        &proto::NodeGetStorageHealthRequest::default().encode_to_vec(),
    )
    .await;
    assert_eq!(
        backends(&answer),
        [
            backend(
                STORAGE_UNREACHABLE,
                "ThinPoolFull",
                "volume-health check/stack: pool vg0/tp: data 100%"
            ),
            backend(STORAGE_DEGRADED, "ReplicaSlow", "replica 2 lags"),
            backend(
                STORAGE_DEGRADED,
                "PathsDown",
                "volume-health check/stack: dm-3 (mpatha): 1 of 2 paths down"
            ),
        ]
    );
    assert_eq!(driver.calls(Rpc::NodeGetStorageHealth), 1);
    assert_eq!(agent.asked_storage(), [Some(DRIVER_NAME.to_string())]);
    assert_eq!(agent.asked(), []);
    let stats = proxy.proxy.stats();
    assert_eq!((stats.storage_answers, stats.agent_unavailable), (1, 0));
}

#[tokio::test]
async fn a_driver_without_storage_health_is_not_asked_and_the_agent_answers() {
    let dir = TempDir::new().unwrap();
    let driver = TestDriver::start(dir.path(), DriverMode::LegacyOnly)
        .await
        .unwrap();
    let agent = FakeAgent::new(AgentMode::Answer(stack_findings()));
    let proxy = start_proxy(dir.path(), driver.socket_path(), agent.clone());
    // The kubelet asks the capabilities first: the proxy learns from them.
    call(&client(&proxy.socket).await, NODE_GET_CAPABILITIES, &[]).await;
    let answer = call(
        &client(&proxy.socket).await,
        NODE_GET_STORAGE_HEALTH,
        &proto::NodeGetStorageHealthRequest::default().encode_to_vec(),
    )
    .await;
    assert_eq!(
        backends(&answer),
        [
            backend(
                STORAGE_UNREACHABLE,
                "ThinPoolFull",
                "volume-health check/stack: pool vg0/tp: data 100%"
            ),
            backend(
                STORAGE_DEGRADED,
                "PathsDown",
                "volume-health check/stack: dm-3 (mpatha): 1 of 2 paths down"
            ),
        ]
    );
    assert_eq!(driver.calls(Rpc::NodeGetStorageHealth), 0);
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 1);

    // Nothing found: an empty list, which the kubelet reads as healthy
    // storage (what it writes into CSINode.status.storageHealth).
    *agent.mode.lock().unwrap() = AgentMode::Answer(Vec::new());
    let answer = call(
        &client(&proxy.socket).await,
        NODE_GET_STORAGE_HEALTH,
        &proto::NodeGetStorageHealthRequest::default().encode_to_vec(),
    )
    .await;
    assert_eq!(backends(&answer), []);
    assert_eq!(proxy.proxy.stats().storage_answers, 2);
}

#[tokio::test]
async fn with_the_agent_down_the_storage_answer_is_the_drivers_own() {
    let dir = TempDir::new().unwrap();
    let driver = TestDriver::start(dir.path(), DriverMode::Modern)
        .await
        .unwrap();
    driver.set_storage_health(vec![StorageHealthEntry::new(
        StorageHealthStatus::StorageUnreachable,
        "ArrayOffline",
        "array b is offline",
    )]);
    for mode in [AgentMode::Fail, AgentMode::Hang] {
        let agent = FakeAgent::new(mode);
        let dir = TempDir::new_in(dir.path()).unwrap();
        let proxy = start_proxy(dir.path(), driver.socket_path(), agent);
        let answer = call(
            &client(&proxy.socket).await,
            NODE_GET_STORAGE_HEALTH,
            &proto::NodeGetStorageHealthRequest::default().encode_to_vec(),
        )
        .await;
        assert_eq!(
            backends(&answer),
            [backend(
                STORAGE_UNREACHABLE,
                "ArrayOffline",
                "array b is offline"
            )]
        );
        let stats = proxy.proxy.stats();
        assert_eq!((stats.storage_answers, stats.agent_unavailable), (1, 1));
    }
}
