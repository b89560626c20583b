//! NodeGetVolumeHealth through the proxy: the driver's entries and the
//! agent's, merged within the API's limits, and the driver's words alone
//! when the agent cannot answer.

use health_csi::proxy::{MAX_ENTRIES, NODE_GET_CAPABILITIES, NODE_GET_VOLUME_HEALTH};
use health_csi::testing::{DriverMode, Rpc, TestDriver};
use health_csi::{HealthEntry, HealthStatus};
use tempfile::TempDir;

use super::*;

#[tokio::test]
async fn volume_health_merges_the_drivers_entries_with_the_agents() {
    let dir = TempDir::new().unwrap();
    let driver = TestDriver::start(dir.path(), DriverMode::Modern)
        .await
        .unwrap();
    driver.set_volume_health(
        VOLUME,
        vec![
            HealthEntry::new(HealthStatus::Degraded, "BackendSlow", "replica 2 lags"),
            HealthEntry::new(
                HealthStatus::DataLoss,
                "BlockIOErrors",
                "the array saw errors",
            ),
        ],
    );
    let agent = FakeAgent::new(AgentMode::Answer(vec![
        condition(
            Status::Inaccessible,
            "ReadOnlyRemount",
            "ext4 remounted read-only",
            "check/read-only",
        ),
        condition(
            Status::DataLoss,
            "BlockIOErrors",
            "3 write errors (EIO) on sdb",
            "kernel",
        ),
        condition(Status::Degraded, "CapacityLow", "2% free", "check/usage"),
    ]));
    let proxy = start_proxy(dir.path(), driver.socket_path(), agent.clone());

    let answer = call(
        &client(&proxy.socket).await,
        NODE_GET_VOLUME_HEALTH,
        &health_request(VOLUME),
    )
    .await;
    assert_eq!(
        entries(&answer),
        (
            VOLUME.to_string(),
            vec![
                entry(
                    INACCESSIBLE,
                    "ReadOnlyRemount",
                    "volume-health check/read-only: ext4 remounted read-only"
                ),
                entry(DATA_LOSS, "BlockIOErrors", "the array saw errors"),
                entry(DEGRADED, "BackendSlow", "replica 2 lags"),
                entry(
                    DEGRADED,
                    "CapacityLow",
                    "volume-health check/usage: 2% free"
                ),
            ]
        )
    );
    // The driver was asked once, its capabilities once (the proxy's own
    // question, nothing learnt yet) and its name once.
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 1);
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 1);
    assert_eq!(driver.calls(Rpc::GetPluginInfo), 1);
    assert_eq!(
        agent.asked(),
        [(
            Some("test.csi.volume-health".to_string()),
            VOLUME.to_string()
        )]
    );
    // Learnt: a second answer asks neither again.
    call(
        &client(&proxy.socket).await,
        NODE_GET_VOLUME_HEALTH,
        &health_request(VOLUME),
    )
    .await;
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 1);
    assert_eq!(driver.calls(Rpc::GetPluginInfo), 1);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 2);
    let stats = proxy.proxy.stats();
    assert_eq!((stats.health_answers, stats.agent_unavailable), (2, 0));
}

#[tokio::test]
async fn a_driver_without_the_capability_is_not_asked_and_the_agent_answers() {
    let dir = TempDir::new().unwrap();
    let driver = TestDriver::start(dir.path(), DriverMode::LegacyOnly)
        .await
        .unwrap();
    let agent = FakeAgent::new(AgentMode::Answer(vec![condition(
        Status::DataLoss,
        "BlockIOErrors",
        "3 write errors (EIO) on sdb",
        "kernel",
    )]));
    let proxy = start_proxy(dir.path(), driver.socket_path(), agent);

    // As the kubelet does: capabilities first (the proxy learns from the
    // answer it passes on), then the health call.
    let kubelet = client(&proxy.socket).await;
    call(&kubelet, NODE_GET_CAPABILITIES, &[]).await;
    let answer = call(&kubelet, NODE_GET_VOLUME_HEALTH, &health_request("vol-9")).await;
    assert_eq!(
        entries(&answer),
        (
            "vol-9".to_string(),
            vec![entry(
                DATA_LOSS,
                "BlockIOErrors",
                "volume-health kernel: 3 write errors (EIO) on sdb"
            )]
        )
    );
    assert_eq!(answer.headers["content-type"], ["application/grpc"]);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 0);
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 1);

    // Answering it itself, the proxy refuses what the spec refuses.
    let refused = call(&kubelet, NODE_GET_VOLUME_HEALTH, &health_request("")).await;
    assert_eq!(
        (refused.grpc_status(), refused.grpc_message()),
        (Some("3"), Some("volume_id is required"))
    );
    assert_eq!(refused.message(), None);
}

#[tokio::test]
async fn the_merged_answer_keeps_to_the_api_limits() {
    let dir = TempDir::new().unwrap();
    let driver = TestDriver::start(dir.path(), DriverMode::Modern)
        .await
        .unwrap();
    let long = "x".repeat(2000);
    driver.set_volume_health(
        VOLUME,
        (0..10)
            .map(|i| {
                HealthEntry::new(
                    HealthStatus::Degraded,
                    format!("Driver{i:02}"),
                    long.clone(),
                )
            })
            .collect(),
    );
    let agent = FakeAgent::new(AgentMode::Answer(
        (0..10)
            .map(|i| {
                condition(
                    Status::DataLoss,
                    &format!("Agent{i:02}{}", "R".repeat(300)),
                    "m",
                    "kernel",
                )
            })
            .collect(),
    ));
    let proxy = start_proxy(dir.path(), driver.socket_path(), agent);

    let answer = call(
        &client(&proxy.socket).await,
        NODE_GET_VOLUME_HEALTH,
        &health_request(VOLUME),
    )
    .await;
    let (_, got) = entries(&answer);
    assert_eq!(got.len(), MAX_ENTRIES);
    let clipped_message = format!("{}...", "x".repeat(1021));
    let mut want: Vec<(i32, String, String)> = (0..10)
        .map(|i| {
            let reason = format!("Agent{i:02}{}", "R".repeat(300));
            entry(
                DATA_LOSS,
                &format!("{}...", &reason[..253]),
                "volume-health kernel: m",
            )
        })
        .collect();
    want.extend((0..6).map(|i| entry(DEGRADED, &format!("Driver{i:02}"), &clipped_message)));
    assert_eq!(got, want);
}

#[tokio::test]
async fn with_the_agent_down_the_answer_is_the_drivers_own() {
    let dir = TempDir::new().unwrap();
    let driver = TestDriver::start(dir.path(), DriverMode::Modern)
        .await
        .unwrap();
    driver.set_volume_health(
        VOLUME,
        vec![HealthEntry::new(
            HealthStatus::Degraded,
            "BackendSlow",
            "replica 2 lags",
        )],
    );
    let agent = FakeAgent::new(AgentMode::Fail);
    let proxy = start_proxy(dir.path(), driver.socket_path(), agent.clone());

    let direct = call(
        &client(driver.socket_path()).await,
        NODE_GET_VOLUME_HEALTH,
        &health_request(VOLUME),
    )
    .await;
    let refused = call(
        &client(&proxy.socket).await,
        NODE_GET_VOLUME_HEALTH,
        &health_request(VOLUME),
    )
    .await;
    assert_eq!(refused, direct);
    assert_eq!(
        entries(&refused).1,
        [entry(DEGRADED, "BackendSlow", "replica 2 lags")]
    );

    // An agent that never answers costs the call the agent timeout, no more.
    *agent.mode.lock().unwrap() = AgentMode::Hang;
    let started = std::time::Instant::now();
    let hung = call(
        &client(&proxy.socket).await,
        NODE_GET_VOLUME_HEALTH,
        &health_request(VOLUME),
    )
    .await;
    assert!(
        started.elapsed() >= AGENT_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    assert_eq!(hung, direct);
    let stats = proxy.proxy.stats();
    assert_eq!((stats.health_answers, stats.agent_unavailable), (2, 2));
}

#[tokio::test]
async fn driver_errors_pass_through_unchanged() {
    let dir = TempDir::new().unwrap();
    let driver = TestDriver::start(dir.path(), DriverMode::Modern)
        .await
        .unwrap();
    let proxy = start_proxy(
        dir.path(),
        driver.socket_path(),
        FakeAgent::new(AgentMode::Answer(vec![condition(
            Status::Degraded,
            "R",
            "m",
            "kernel",
        )])),
    );
    // The driver does not know the volume: NOT_FOUND, as the driver says it.
    let direct = call(
        &client(driver.socket_path()).await,
        NODE_GET_VOLUME_HEALTH,
        &health_request("gone"),
    )
    .await;
    let proxied = call(
        &client(&proxy.socket).await,
        NODE_GET_VOLUME_HEALTH,
        &health_request("gone"),
    )
    .await;
    assert_eq!(proxied, direct);
    assert_eq!(proxied.grpc_status(), Some("5"));
    // grpc-message as on the wire: percent-encoded.
    assert_eq!(
        proxied.grpc_message(),
        Some("volume%20gone%20does%20not%20exist")
    );
    // A request the proxy cannot read goes to the driver as it is.
    let garbage = b"\xff\xff\xff";
    let direct = call(
        &client(driver.socket_path()).await,
        NODE_GET_VOLUME_HEALTH,
        garbage,
    )
    .await;
    let proxied = call(
        &client(&proxy.socket).await,
        NODE_GET_VOLUME_HEALTH,
        garbage,
    )
    .await;
    assert_eq!(proxied, direct);
    assert_eq!(proxied.grpc_status(), Some("13"));
}
