//! What `pvc.status.healthStatus` should say, from a claim's `VolumeHealth`
//! object: pure functions, no API calls.
//!
//! The field's shape and limits are those of Kubernetes 1.37's
//! `VolumeHealthStatus` (k8s.io/api core/v1, as k8s-openapi's `v1_37`
//! carries it): `healthConditions`, at most 16, unique by `(status,
//! reason)`, reason at most 256 bytes, message at most 1024 bytes; and
//! `lastTransitionTime`, when the current set of conditions first appeared.

use std::collections::BTreeMap;
use std::time::SystemTime;

use health_core::conditions::{clip_to, Status};
use health_kube::status::types::{self, VolumeHealth};
use k8s_openapi::api::core::v1::{VolumeHealthCondition, VolumeHealthStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// The API's bound on `healthConditions`.
pub const MAX_CONDITIONS: usize = 16;
/// The API's bound on a condition's reason, in bytes.
pub const MAX_REASON: usize = 256;
/// The API's bound on a condition's message, in bytes.
pub const MAX_MESSAGE: usize = 1024;

/// One condition the union asserts, with the time its oldest assertion
/// started (for the set's `lastTransitionTime` when nothing was stored).
#[derive(Clone, Debug, PartialEq)]
pub struct Wanted {
    pub conditions: Vec<VolumeHealthCondition>,
    /// The latest `since` among the conditions: when the set became whole.
    pub since: Option<SystemTime>,
}

/// The union of every source's assertions in `object` (the nodes' agents'
/// kernel evidence and checks, the CSI node and controller services, node
/// down): one condition per `(status, reason)`, the freshest assertion's
/// message prefixed with who asserts it, worst first, at most
/// [`MAX_CONDITIONS`].
pub fn wanted(object: &VolumeHealth) -> Wanted {
    struct Best<'a> {
        entry: &'a str,
        message: &'a str,
        seen: &'a str,
        since: &'a str,
        others: usize,
    }
    let mut by_key: BTreeMap<(Status, &str), Best<'_>> = BTreeMap::new();
    let sources = object
        .status
        .as_ref()
        .map(|s| &s.sources[..])
        .unwrap_or(&[]);
    for entry in sources {
        for c in &entry.conditions {
            let seen = c.last_seen.as_deref().unwrap_or(&entry.update_time);
            let new = Best {
                entry: &entry.name,
                message: &c.message,
                seen,
                since: &c.since,
                others: 0,
            };
            match by_key.entry((c.status, &c.reason)) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(new);
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    let best = o.get_mut();
                    let others = best.others + 1;
                    let since = best.since.min(new.since);
                    if new.seen > best.seen {
                        *best = new;
                    }
                    best.others = others;
                    best.since = since;
                }
            }
        }
    }
    let mut since = None;
    let conditions = by_key
        .into_iter()
        .take(MAX_CONDITIONS)
        .map(|((status, reason), best)| {
            let started = types::parse_time(best.since);
            since = since.max(started);
            let mut message = format!("{}: {}", best.entry, best.message);
            if best.others > 0 {
                message.push_str(&format!(" (and {} more)", best.others));
            }
            VolumeHealthCondition {
                status: status.to_string(),
                reason: clip_to(reason.to_string(), MAX_REASON),
                message: Some(clip_to(message, MAX_MESSAGE)),
            }
        })
        .collect();
    Wanted { conditions, since }
}

/// The `(status, reason)` pairs of a stored or wanted status: what makes a
/// transition (a message alone does not).
fn keys(conditions: &[VolumeHealthCondition]) -> Vec<(&str, &str)> {
    let mut k: Vec<(&str, &str)> = conditions
        .iter()
        .map(|c| (c.status.as_str(), c.reason.as_str()))
        .collect();
    k.sort_unstable();
    k
}

/// The status to write given what the claim has now (`stored`: `None` when
/// it has no `healthStatus`): the stored `lastTransitionTime` is kept while
/// the set of `(status, reason)` stays the same, so a restart or a new
/// message moves nothing; a new set takes `now`, except a first set, which
/// takes the time its evidence began.
pub fn next(
    stored: Option<&VolumeHealthStatus>,
    wanted: Wanted,
    now: SystemTime,
) -> VolumeHealthStatus {
    let stored_conditions = stored
        .and_then(|s| s.health_conditions.as_deref())
        .unwrap_or(&[]);
    let same_set = stored.is_some() && keys(stored_conditions) == keys(&wanted.conditions);
    let transition = match stored {
        Some(s) if same_set => s.last_transition_time.clone(),
        Some(_) => Some(to_time(now)),
        None => Some(to_time(wanted.since.unwrap_or(now))),
    };
    VolumeHealthStatus {
        health_conditions: Some(wanted.conditions),
        last_transition_time: transition,
    }
}

/// Whether writing `new` over `stored` changes anything.
pub fn differs(stored: Option<&VolumeHealthStatus>, new: &VolumeHealthStatus) -> bool {
    let empty = |s: &VolumeHealthStatus| s.health_conditions.as_ref().is_none_or(Vec::is_empty);
    match stored {
        // Nothing stored and nothing to say: no write.
        None => !empty(new),
        Some(s) => {
            let conditions =
                |s: &VolumeHealthStatus| s.health_conditions.clone().unwrap_or_default();
            conditions(s) != conditions(new) || s.last_transition_time != new.last_transition_time
        }
    }
}

/// `t` to the second, as the API server stores a `metav1.Time` (so that a
/// time read back compares equal to the one written).
pub fn to_time(t: SystemTime) -> Time {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    Time(Timestamp::from_second(secs).unwrap_or(Timestamp::MAX))
}

#[cfg(test)]
mod tests {
    use health_core::testing::t;
    use health_kube::status::types::{time, EntryCondition, EntryKind, HealthStatus, SourceEntry};

    use super::*;

    fn cond(status: Status, reason: &str, message: &str, since: u64, seen: u64) -> EntryCondition {
        EntryCondition {
            status,
            reason: reason.into(),
            message: message.into(),
            since: time(t(since)),
            last_seen: Some(time(t(seen))),
            count: None,
            origin: "kernel".into(),
        }
    }

    fn entry(name: &str, kind: EntryKind, conditions: Vec<EntryCondition>) -> SourceEntry {
        SourceEntry {
            name: name.into(),
            kind,
            node: None,
            driver: None,
            pods: vec![],
            pod_count: None,
            update_time: time(t(0)),
            conditions,
        }
    }

    fn object(sources: Vec<SourceEntry>) -> VolumeHealth {
        VolumeHealth {
            status: Some(HealthStatus {
                sources,
                ..HealthStatus::default()
            }),
            ..VolumeHealth::default()
        }
    }

    fn view(w: &Wanted) -> Vec<(String, String, String)> {
        w.conditions
            .iter()
            .map(|c| {
                (
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    #[test]
    fn the_union_of_every_source_worst_first_one_per_status_and_reason() {
        let o = object(vec![
            entry(
                "Node/node-a",
                EntryKind::Node,
                vec![cond(Status::Degraded, "BlockIOErrors", "2 errors", 10, 20)],
            ),
            entry(
                "Node/node-b",
                EntryKind::Node,
                vec![
                    cond(Status::Degraded, "BlockIOErrors", "5 errors", 5, 30),
                    cond(Status::DataLoss, "MediumErrors", "1 medium error", 40, 40),
                ],
            ),
            entry(
                "CSIDriver",
                EntryKind::CsiDriver,
                vec![cond(Status::Inaccessible, "VolumeGone", "gone", 30, 30)],
            ),
        ]);
        let w = wanted(&o);
        let s = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(
            view(&w),
            [
                s("Inaccessible", "VolumeGone", "CSIDriver: gone"),
                s("DataLoss", "MediumErrors", "Node/node-b: 1 medium error"),
                // The freshest assertion speaks; the other is counted.
                s(
                    "Degraded",
                    "BlockIOErrors",
                    "Node/node-b: 5 errors (and 1 more)"
                ),
            ]
        );
        // The set was whole once its last member appeared.
        assert_eq!(w.since, Some(t(40)));
    }

    #[test]
    fn limits_are_the_apis_sixteen_worst_and_bytes_on_a_char_boundary() {
        let many: Vec<EntryCondition> = (0..20)
            .map(|i| cond(Status::Degraded, &format!("Reason{i:02}"), "m", 0, 0))
            .chain([cond(Status::Inaccessible, "AllPathsDown", "m", 0, 0)])
            .collect();
        let w = wanted(&object(vec![entry("Node/n", EntryKind::Node, many)]));
        assert_eq!(w.conditions.len(), MAX_CONDITIONS);
        assert_eq!(w.conditions[0].reason, "AllPathsDown", "worst first");
        assert_eq!(w.conditions[15].reason, "Reason14");

        let long_reason = "Ü".repeat(200); // 400 bytes
        let long_message = "é".repeat(1000); // 2000 bytes
        let w = wanted(&object(vec![entry(
            "Node/n",
            EntryKind::Node,
            vec![cond(Status::DataLoss, &long_reason, &long_message, 0, 0)],
        )]));
        let c = &w.conditions[0];
        assert!(
            c.reason.len() <= MAX_REASON && c.reason.len() > MAX_REASON - 4,
            "{}",
            c.reason.len()
        );
        let m = c.message.as_deref().unwrap_or_default();
        assert!(
            m.len() <= MAX_MESSAGE && m.len() > MAX_MESSAGE - 4,
            "{}",
            m.len()
        );
        assert!(m.starts_with("Node/n: éé") && m.ends_with("..."), "{m}");
    }

    fn status(conditions: &[(&str, &str, &str)], at: u64) -> VolumeHealthStatus {
        VolumeHealthStatus {
            health_conditions: Some(
                conditions
                    .iter()
                    .map(|(s, r, m)| VolumeHealthCondition {
                        status: s.to_string(),
                        reason: r.to_string(),
                        message: Some(m.to_string()),
                    })
                    .collect(),
            ),
            last_transition_time: Some(to_time(t(at))),
        }
    }

    fn want(conditions: &[(&str, &str, &str)], since: u64) -> Wanted {
        Wanted {
            since: Some(t(since)),
            ..Wanted {
                conditions: status(conditions, 0).health_conditions.unwrap_or_default(),
                since: None,
            }
        }
    }

    #[test]
    fn last_transition_time_moves_only_when_the_set_does() {
        let dl = [("DataLoss", "MediumErrors", "2")];
        let dl3 = [("DataLoss", "MediumErrors", "3")];
        // First: when the evidence began.
        let first = next(None, want(&dl, 7), t(100));
        assert_eq!(first, status(&dl, 7));
        assert!(differs(None, &first));
        // A message alone: kept.
        let again = next(Some(&first), want(&dl3, 7), t(200));
        assert_eq!(again, status(&dl3, 7));
        // Another member: now.
        let more = [
            ("DataLoss", "MediumErrors", "3"),
            ("Degraded", "PathsDown", "p"),
        ];
        assert_eq!(
            next(Some(&again), want(&more, 150), t(300)),
            status(&more, 300)
        );
        // Recovery: now; and nothing stored with nothing to say writes nothing.
        let clear = next(Some(&again), want(&[], 0), t(400));
        assert_eq!(clear, status(&[], 400));
        assert!(!differs(None, &next(None, want(&[], 0), t(500))));
        assert!(!differs(
            Some(&clear),
            &next(Some(&clear), want(&[], 0), t(600))
        ));
    }
}
