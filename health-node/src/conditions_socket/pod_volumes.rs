//! What `health-agent volumes` asks the running agent: the conditions of
//! every pod volume on the node as the agent holds them, every source
//! included (kernel errors through their quiet window, the checks, the CSI
//! driver's words, paths it saw go away). A fresh process cannot know what
//! only history shows (a path whose controller was removed is no longer
//! listed anywhere), so `volumes` shows these when an agent answers, and
//! what it judged alone only when none does.

use std::collections::BTreeMap;

use health_core::conditions::{rfc3339, Condition, Status};
use health_core::volume::{VolumeKey, VolumeMode};
use serde::{Deserialize, Serialize};

/// Where `volumes` asks.
pub const POD_VOLUMES_PATH: &str = "/v1/pod-volume-conditions";

/// The question: every pod volume the agent holds a condition of.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodVolumesQuestion {}

/// The agent's conditions of the node's pod volumes; a volume it holds no
/// condition of is not listed (to the agent it is healthy).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodVolumesAnswer {
    pub volumes: Vec<PodVolumeConditions>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodVolumeConditions {
    pub pod_uid: String,
    /// The directory kubelet named the volume by under the pod.
    pub name: String,
    pub block: bool,
    /// Worst first, one per (status, reason).
    pub conditions: Vec<HeldCondition>,
}

/// One condition as the agent holds it (and reports it in Events).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldCondition {
    pub status: Status,
    pub reason: String,
    pub message: String,
    /// RFC 3339: when this (status, reason) became true.
    pub since: String,
    /// RFC 3339: when evidence last confirmed it.
    pub last_probe: String,
    /// Who in the agent says so: `kernel`, `check/read-only`, `csi-node`, ...
    pub source: String,
}

impl HeldCondition {
    pub fn of(c: &Condition) -> HeldCondition {
        HeldCondition {
            status: c.status,
            reason: c.reason.clone(),
            message: c.message.clone(),
            since: rfc3339(c.since),
            last_probe: rfc3339(c.last_probe),
            source: c.source.to_string(),
        }
    }
}

/// (pod uid, name, block) → the conditions of that pod volume.
pub(super) type ByPodVolume = BTreeMap<(String, String, bool), Vec<HeldCondition>>;

/// The board's pod-volume part from each volume's conditions; volumes
/// without any are left out.
pub(super) fn by_pod_volume<'a>(
    volumes: impl IntoIterator<Item = (&'a VolumeKey, Vec<Condition>)>,
) -> ByPodVolume {
    volumes
        .into_iter()
        .filter(|(_, conditions)| !conditions.is_empty())
        .map(|(key, conditions)| {
            (
                (
                    key.pod_uid.clone(),
                    key.name.clone(),
                    key.mode == VolumeMode::Block,
                ),
                conditions.iter().map(HeldCondition::of).collect(),
            )
        })
        .collect()
}

pub(super) fn answer(board: &ByPodVolume) -> PodVolumesAnswer {
    PodVolumesAnswer {
        volumes: board
            .iter()
            .map(|((pod_uid, name, block), conditions)| PodVolumeConditions {
                pod_uid: pod_uid.clone(),
                name: name.clone(),
                block: *block,
                conditions: conditions.clone(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use health_core::conditions::{CheckKind, Source};

    use super::*;

    fn condition(source: Source, status: Status, reason: &str) -> Condition {
        let since = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        Condition {
            source,
            status,
            reason: reason.into(),
            message: format!("{reason} said"),
            since,
            last_probe: since + Duration::from_secs(5),
            occurrences: None,
        }
    }

    fn key(pod: &str, name: &str, mode: VolumeMode) -> VolumeKey {
        VolumeKey {
            pod_uid: pod.into(),
            name: name.into(),
            mode,
        }
    }

    #[test]
    fn every_source_of_a_volume_with_conditions_is_answered_and_healthy_ones_are_not() {
        let (a, b, c) = (
            key("p1", "pv-a", VolumeMode::Filesystem),
            key("p1", "pv-a", VolumeMode::Block),
            key("p2", "pv-c", VolumeMode::Filesystem),
        );
        let board = by_pod_volume([
            (
                &a,
                vec![
                    condition(Source::Kernel, Status::DataLoss, "BlockIOErrors"),
                    condition(Source::CsiNode, Status::Degraded, "DriverSaysSo"),
                ],
            ),
            (
                &b,
                vec![condition(
                    Source::Check(CheckKind::Stack),
                    Status::Inaccessible,
                    "AllPathsDown",
                )],
            ),
            (&c, vec![]),
        ]);
        let answer = answer(&board);
        // (pod, name, block, [(reason, source)])
        type Listed<'a> = (&'a str, &'a str, bool, Vec<(&'a str, &'a str)>);
        let listed: Vec<Listed<'_>> = answer
            .volumes
            .iter()
            .map(|v| {
                (
                    v.pod_uid.as_str(),
                    v.name.as_str(),
                    v.block,
                    v.conditions
                        .iter()
                        .map(|c| (c.reason.as_str(), c.source.as_str()))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            listed,
            [
                (
                    "p1",
                    "pv-a",
                    false,
                    vec![("BlockIOErrors", "kernel"), ("DriverSaysSo", "csi-node")]
                ),
                ("p1", "pv-a", true, vec![("AllPathsDown", "check/stack")]),
            ]
        );
        let wire = serde_json::to_value(&answer.volumes[1]).unwrap();
        assert_eq!(
            wire,
            serde_json::json!({
                "podUid": "p1", "name": "pv-a", "block": true,
                "conditions": [{
                    "status": "Inaccessible", "reason": "AllPathsDown",
                    "message": "AllPathsDown said",
                    "since": "2023-11-14T22:13:20Z", "lastProbe": "2023-11-14T22:13:25Z",
                    "source": "check/stack"
                }]
            })
        );
        let back: PodVolumesAnswer =
            serde_json::from_value(serde_json::to_value(&answer).unwrap()).unwrap();
        assert_eq!(back, answer);
    }
}
