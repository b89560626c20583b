//! A CSI driver's answer: bytes decoded as one of the health responses
//! (`health_csi::fuzzing`), then kept by the condition machine as a node Get
//! and as a controller List would be. Whatever the bytes, every condition that
//! comes out must fit the `VolumeHealth` schema.

use std::time::{Duration, UNIX_EPOCH};

use health_core::conditions::driver_words::{is_camel_case, MAX_ENTRIES, MAX_MESSAGE};
use health_core::conditions::{
    CsiEntry, CsiListSighting, CsiReport, Observation, Source, VolumeHealth,
};
use health_csi::HealthEntry;

pub fn run(data: &[u8]) {
    let answer = health_csi::fuzzing::answer(data);
    let Some(entries) = answer.entries else {
        return;
    };
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let csi: Vec<CsiEntry> = entries.iter().map(HealthEntry::to_evidence).collect();
    let mut health = VolumeHealth::default();
    health.apply(now, Observation::CsiNode(CsiReport::Health(csi.clone())));
    health.apply(
        now,
        Observation::CsiControllerList(CsiListSighting::Listed(csi)),
    );
    let conditions = health.conditions();
    for source in [Source::CsiNode, Source::CsiController] {
        let n = conditions.iter().filter(|c| c.source == source).count();
        assert!(n <= MAX_ENTRIES, "{n} conditions from {source}");
    }
    for c in &conditions {
        assert!(is_camel_case(&c.reason), "reason {:?}", c.reason);
        assert!(
            c.message.len() <= MAX_MESSAGE,
            "message of {} bytes",
            c.message.len()
        );
        assert!(!c.message.chars().any(char::is_control), "{:?}", c.message);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn seed(name: &str) -> Vec<u8> {
        let path = format!("{}/../fuzz/corpus/csi/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn seeds_decode_to_what_they_were_written_as() {
        let reasons = |name: &str| -> Option<Vec<String>> {
            health_csi::fuzzing::answer(&seed(name))
                .entries
                .map(|es| es.into_iter().map(|e| e.reason).collect())
        };
        assert_eq!(
            reasons("node-health-inaccessible"),
            Some(vec!["VolumeNotFound".into(), "Slow".into()])
        );
        assert_eq!(reasons("node-health-healthy"), Some(vec![]));
        // An answer about vol-2 when vol-1 was asked is no answer.
        assert_eq!(reasons("node-health-other-volume"), None);
        assert_eq!(
            reasons("node-stats-abnormal"),
            Some(vec!["VolumeConditionAbnormal".into()])
        );
        assert_eq!(
            reasons("controller-list"),
            Some(vec!["Gone".into(), "FromTheFuture".into()])
        );
        assert_eq!(reasons("controller-get"), Some(vec!["disk-failure".into()]));
        // The seeds carry CSI v1.13.0's numbers (INACCESSIBLE 2, DEGRADED 1,
        // STORAGE_UNREACHABLE 2).
        let statuses: Option<Vec<health_csi::HealthStatus>> =
            health_csi::fuzzing::answer(&seed("node-health-inaccessible"))
                .entries
                .map(|es| es.into_iter().map(|e| e.status).collect());
        assert_eq!(
            statuses,
            Some(vec![
                health_csi::HealthStatus::Inaccessible,
                health_csi::HealthStatus::Degraded
            ])
        );
        let storage = health_csi::fuzzing::answer(&seed("storage-unreachable")).storage;
        assert_eq!(storage.len(), 1);
        assert_eq!(storage[0].reason, "ArrayDown");
        assert_eq!(
            storage[0].status,
            health_csi::StorageHealthStatus::StorageUnreachable
        );
        for name in [
            "node-health-inaccessible",
            "controller-list",
            "controller-get",
            "list-volumes",
            "node-caps",
            "controller-caps",
        ] {
            run(&seed(name));
        }
    }

    proptest! {
        #[test]
        fn any_bytes_as_any_answer_never_panic(
            kind in 0u8..8,
            body in prop::collection::vec(any::<u8>(), 0..2048),
        ) {
            let mut data = vec![kind];
            data.extend(body);
            run(&data);
        }

        #[test]
        fn any_entries_a_driver_can_encode_fit_the_schema(
            entries in prop::collection::vec(
                (0i32..6, prop::collection::vec(any::<u8>(), 0..40), ".{0,200}"),
                0..64,
            ),
        ) {
            use prost::Message;
            let answer = health_csi::proto::NodeGetVolumeHealthResponse {
                volume_health: Some(health_csi::proto::VolumeHealth {
                    volume_id: "vol-1".into(),
                    health_statuses: entries
                        .into_iter()
                        .map(|(status, reason, message)| health_csi::proto::volume_health::VolumeHealthEntry {
                            status,
                            reason: String::from_utf8_lossy(&reason).into_owned(),
                            message,
                        })
                        .collect(),
                }),
            };
            let mut data = vec![0u8];
            answer.encode(&mut data).map_err(|e| TestCaseError::fail(e.to_string()))?;
            run(&data);
        }
    }
}
