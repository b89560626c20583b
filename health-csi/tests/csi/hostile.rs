//! Answers no well-behaved driver sends, over a real socket: bytes framed by
//! the raw endpoint, decoded by the real clients.

use std::path::Path;
use std::time::Duration;

use health_csi::proto;
use health_csi::raw_driver::{RawAnswers, RawDriver};
use health_csi::{
    ControllerClient, CsiError, HealthEntry, HealthStatus, NodeClient, NodeVolumeReport,
    MAX_ENTRIES_PER_VOLUME,
};
use prost::encoding::{bytes as wire_bytes, int32, string};
use prost::Message;

const TIMEOUT: Duration = Duration::from_secs(10);
const HEALTH: &str = "/csi.v1.Node/NodeGetVolumeHealth";
const NODE_CAPABILITIES: &str = "/csi.v1.Node/NodeGetCapabilities";

/// CSI v1.13.0 `VolumeHealthErrorType` numbers.
const DEGRADED: i32 = 1;
const INACCESSIBLE: i32 = 2;

/// A NodeGetCapabilities answer advertising GET_VOLUME_HEALTH, without
/// which the client would not ask NodeGetVolumeHealth at all.
fn node_capabilities() -> Vec<u8> {
    use proto::node_service_capability::{rpc::Type, Rpc, Type as Arm};
    proto::NodeGetCapabilitiesResponse {
        capabilities: vec![proto::NodeServiceCapability {
            r#type: Some(Arm::Rpc(Rpc {
                r#type: Type::GetVolumeHealth as i32,
            })),
        }],
    }
    .encode_to_vec()
}

/// A ControllerGetCapabilities answer advertising LIST_VOLUME_HEALTH.
fn controller_capabilities() -> Vec<u8> {
    use proto::controller_service_capability::{rpc::Type, Rpc, Type as Arm};
    proto::ControllerGetCapabilitiesResponse {
        capabilities: vec![proto::ControllerServiceCapability {
            r#type: Some(Arm::Rpc(Rpc {
                r#type: Type::ListVolumeHealth as i32,
            })),
        }],
    }
    .encode_to_vec()
}

/// `VolumeHealth.VolumeHealthEntry{status, reason, message}` with the reason
/// as raw bytes.
fn entry(status: i32, reason: &[u8], message: &str) -> Vec<u8> {
    let mut out = Vec::new();
    int32::encode(1, &status, &mut out);
    wire_bytes::encode(2, &reason.to_vec(), &mut out);
    string::encode(3, &message.to_string(), &mut out);
    out
}

/// `VolumeHealth{volume_id, health_statuses}`.
fn volume_health(volume_id: &str, entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    string::encode(1, &volume_id.to_string(), &mut out);
    for e in entries {
        wire_bytes::encode(2, e, &mut out);
    }
    out
}

/// `NodeGetVolumeHealthResponse{volume_health}`.
fn health_response(health: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    wire_bytes::encode(1, &health.to_vec(), &mut out);
    out
}

async fn ask(dir: &Path, answer: Vec<u8>) -> Result<NodeVolumeReport, CsiError> {
    let answers = RawAnswers::from([
        (NODE_CAPABILITIES.to_string(), node_capabilities()),
        (HEALTH.to_string(), answer),
    ]);
    let driver = RawDriver::start(dir, answers).await.expect("raw driver");
    let client = NodeClient::connect(driver.socket_path(), TIMEOUT)
        .await
        .expect("connect");
    client
        .volume_health("vol-1", Path::new("/pods/p/volumes/v/mount"), None)
        .await
}

#[tokio::test]
async fn a_reason_that_is_not_utf8_fails_the_call_with_the_decoder_error() {
    let dir = tempfile::tempdir().unwrap();
    let answer = health_response(&volume_health(
        "vol-1",
        &[entry(DEGRADED, b"Bad\xff\xfe", "m")],
    ));
    let err = ask(dir.path(), answer).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "CSI NodeGetVolumeHealth failed with Internal: failed to decode Protobuf message: \
         VolumeHealthEntry.reason: VolumeHealth.health_statuses: NodeGetVolumeHealthResponse.volume_health: \
         invalid string value: data is not UTF-8 encoded"
    );
}

#[tokio::test]
async fn an_answer_about_another_volume_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let answer = health_response(&volume_health("vol-2", &[entry(DEGRADED, b"Gone", "m")]));
    let err = ask(dir.path(), answer).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "CSI NodeGetVolumeHealth returned an unusable response: \
         asked about volume \"vol-1\", answer is about \"vol-2\""
    );
}

#[tokio::test]
async fn unknown_status_values_and_unknown_fields_are_kept_as_unknown_conditions() {
    let dir = tempfile::tempdir().unwrap();
    let mut health = volume_health("vol-1", &[entry(42, b"FromTheFuture", "m")]);
    // A field a newer spec might add (number 99, a string).
    string::encode(99, &"extension".to_string(), &mut health);
    let report = ask(dir.path(), health_response(&health)).await.unwrap();
    assert_eq!(
        report.entries,
        Some(vec![HealthEntry::new(
            HealthStatus::Unknown,
            "FromTheFuture",
            "m"
        )])
    );
}

#[tokio::test]
async fn an_empty_answer_is_no_health_information_not_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let report = ask(dir.path(), Vec::new()).await.unwrap();
    assert_eq!(report.entries, None);
    assert!(!report.has_health_info());
}

#[tokio::test]
async fn a_length_that_lies_fails_the_call() {
    let dir = tempfile::tempdir().unwrap();
    // Field 1, length-delimited, claims 100 bytes and carries 3.
    let err = ask(dir.path(), vec![0x0a, 100, 1, 2, 3]).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "CSI NodeGetVolumeHealth failed with Internal: failed to decode Protobuf message: \
         NodeGetVolumeHealthResponse.volume_health: buffer underflow"
    );
}

#[tokio::test]
async fn an_answer_over_four_megabytes_is_refused_before_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let huge = "x".repeat(5 << 20);
    let answer = health_response(&volume_health("vol-1", &[entry(DEGRADED, b"Big", &huge)]));
    let size = answer.len();
    let err = ask(dir.path(), answer).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "CSI NodeGetVolumeHealth failed with OutOfRange: Error, decoded message length too \
             large: found {size} bytes, the limit is: 4194304 bytes"
        )
    );
}

#[tokio::test]
async fn hundreds_of_thousands_of_conditions_are_cut_to_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let entries: Vec<Vec<u8>> = (0..200_000)
        .map(|i| entry(DEGRADED, format!("R{i}").as_bytes(), ""))
        .collect();
    let answer = health_response(&volume_health("vol-1", &entries));
    assert!(answer.len() < 4 << 20, "{}", answer.len());
    let report = ask(dir.path(), answer).await.unwrap();
    let got = report.entries.unwrap();
    assert_eq!(got.len(), MAX_ENTRIES_PER_VOLUME);
    assert_eq!(
        got[1023],
        HealthEntry::new(HealthStatus::Degraded, "R1023", "")
    );
}

#[tokio::test]
async fn a_controller_list_that_repeats_its_token_stops_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    // Every page names vol-1 and the next token "t1".
    let mut page = Vec::new();
    wire_bytes::encode(
        1,
        &volume_health("vol-1", &[entry(INACCESSIBLE, b"Gone", "m")]),
        &mut page,
    );
    string::encode(2, &"t1".to_string(), &mut page);
    let answers = RawAnswers::from([
        (
            "/csi.v1.Controller/ControllerGetCapabilities".to_string(),
            controller_capabilities(),
        ),
        (
            "/csi.v1.Controller/ControllerListVolumeHealth".to_string(),
            page,
        ),
    ]);
    let driver = RawDriver::start(dir.path(), answers).await.unwrap();
    let client = ControllerClient::connect(driver.socket_path(), TIMEOUT)
        .await
        .unwrap();
    // The raw endpoint answers every page the same: the token repeats on the
    // second page, which stops the walk as incomplete.
    let list = client.list_volume_health(500, 10).await.unwrap();
    assert_eq!((list.complete, list.pages), (false, 2));
    assert_eq!(
        list.volumes.get("vol-1"),
        Some(&Some(vec![HealthEntry::new(
            HealthStatus::Inaccessible,
            "Gone",
            "m"
        )]))
    );
}
