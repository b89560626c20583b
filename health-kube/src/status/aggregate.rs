//! `status.conditions` and the summary columns of a `VolumeHealth`, derived
//! from its `status.sources` alone. Every writer recomputes them from the
//! version it read and writes them with that version as precondition, so
//! the result never depends on which writer came last.

use std::collections::BTreeSet;

use health_core::conditions::Status;

use super::types::{bounded, parse_time, Condition, SourceEntry, HEALTHY, MAX_MESSAGE};

/// `status.health`, `.reason`, `.since`, `.nodes`: what `kubectl get` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub health: String,
    pub reason: String,
    pub since: Option<String>,
    pub nodes: String,
}

/// The schema's bound on `status.nodes`.
const MAX_NODES_TEXT: usize = 1024;

/// Conditions for `sources`, given the object's `previous` conditions:
/// one per status ever asserted, True while some entry asserts it (its
/// `lastTransitionTime` kept while it stays True), False with reason
/// `<Reason>Cleared` once none does. A condition becoming True takes the
/// time its speaking assertion began ([`became_true`]), so that it says
/// what the Event of that episode says; `now` is used for the other
/// transitions only, so the same input gives the same output and no write.
pub fn conditions(
    sources: &[SourceEntry],
    previous: &[Condition],
    generation: Option<i64>,
    now: &str,
) -> Vec<Condition> {
    let mut out = Vec::new();
    for status in [Status::Inaccessible, Status::DataLoss, Status::Degraded] {
        let before = previous.iter().find(|c| c.type_ == status);
        let mut asserting: Vec<(&SourceEntry, &super::types::EntryCondition)> = sources
            .iter()
            .flat_map(|e| e.conditions.iter().map(move |c| (e, c)))
            .filter(|(_, c)| c.status == status)
            .collect();
        // The longest-standing assertion speaks for the condition.
        asserting.sort_by(|a, b| (&a.1.since, &a.0.name).cmp(&(&b.1.since, &b.0.name)));
        let condition = match (asserting.first(), before) {
            (Some((entry, c)), _) => {
                let mut others: Vec<&str> = asserting[1..]
                    .iter()
                    .map(|(e, _)| e.name.as_str())
                    .filter(|n| *n != entry.name)
                    .collect();
                others.dedup();
                let mut message = format!("{}: {}", entry.name, c.message);
                if !others.is_empty() {
                    message.push_str(&format!(" (also asserted by {})", others.join(", ")));
                }
                let since = match before {
                    Some(b) if b.is_true() => b.last_transition_time.clone(),
                    _ => became_true(&c.since, before, now),
                };
                Condition {
                    type_: status,
                    status: "True".into(),
                    reason: c.reason.clone(),
                    message: bounded(message, MAX_MESSAGE),
                    last_transition_time: since,
                    observed_generation: generation,
                }
            }
            (None, Some(b)) if b.is_true() => Condition {
                type_: status,
                status: "False".into(),
                reason: format!("{}Cleared", b.reason),
                message: bounded(
                    format!("no source asserts {status} any more; last: {}", b.message),
                    MAX_MESSAGE,
                ),
                last_transition_time: now.to_string(),
                observed_generation: generation,
            },
            (None, Some(b)) => Condition {
                observed_generation: generation,
                ..b.clone()
            },
            (None, None) => continue,
        };
        out.push(condition);
    }
    out
}

/// When a condition not True before became True: when the assertion that
/// speaks for it began (a writer that restarted, or wrote its entry late,
/// still tells the episode's start), unless that is before the condition
/// last changed (an earlier episode's clearing) or after `now` (another
/// node's clock), when it is `now`.
fn became_true(began: &str, before: Option<&Condition>, now: &str) -> String {
    let (Some(began_at), Some(now_at)) = (parse_time(began), parse_time(now)) else {
        return now.to_string();
    };
    let changed_at = before.and_then(|b| parse_time(&b.last_transition_time));
    if began_at > now_at || changed_at.is_some_and(|c| began_at < c) {
        return now.to_string();
    }
    began.to_string()
}

/// The summary of `conditions` (from [`conditions`]) and `sources`.
pub fn summary(sources: &[SourceEntry], conditions: &[Condition]) -> Summary {
    let worst = conditions
        .iter()
        .filter(|c| c.is_true())
        .min_by_key(|c| c.type_);
    let nodes: BTreeSet<&str> = sources
        .iter()
        .filter(|e| !e.conditions.is_empty())
        .filter_map(|e| e.node.as_deref())
        .collect();
    let nodes = bounded(
        nodes.into_iter().collect::<Vec<_>>().join(","),
        MAX_NODES_TEXT,
    );
    match worst {
        Some(c) => Summary {
            health: c.type_.to_string(),
            reason: c.reason.clone(),
            since: Some(c.last_transition_time.clone()),
            nodes,
        },
        None => Summary {
            health: HEALTHY.into(),
            reason: String::new(),
            // When it became healthy: the latest clearing.
            since: conditions
                .iter()
                .map(|c| c.last_transition_time.clone())
                .max(),
            nodes,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::types::{EntryCondition, EntryKind};

    fn entry(kind: EntryKind, node: Option<&str>, conds: &[(Status, &str, &str)]) -> SourceEntry {
        SourceEntry {
            name: kind.entry_name(node),
            kind,
            node: node.map(String::from),
            driver: None,
            pods: vec![],
            pod_count: None,
            update_time: "2026-11-24T10:00:00Z".into(),
            conditions: conds
                .iter()
                .map(|(s, r, since)| EntryCondition {
                    status: *s,
                    reason: r.to_string(),
                    message: format!("{r} seen"),
                    since: since.to_string(),
                    last_seen: None,
                    count: None,
                    origin: "kernel".into(),
                })
                .collect(),
        }
    }

    const T0: &str = "2026-11-24T10:00:00Z";
    const T1: &str = "2026-11-24T10:01:00Z";
    const T2: &str = "2026-11-24T10:02:00Z";

    #[test]
    fn the_union_of_entries_with_the_oldest_assertion_speaking() {
        let a = entry(
            EntryKind::Node,
            Some("node-a"),
            &[(Status::Degraded, "BlockIOErrors", T1)],
        );
        let b = entry(
            EntryKind::Node,
            Some("node-b"),
            &[
                (Status::Degraded, "WritebackErrors", T0),
                (Status::Inaccessible, "PathHung", T1),
            ],
        );
        let c = conditions(&[a.clone(), b.clone()], &[], Some(1), T2);
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[0].type_, c[0].reason.as_str(), c[0].status.as_str()),
            (Status::Inaccessible, "PathHung", "True")
        );
        assert_eq!(c[0].message, "Node/node-b: PathHung seen");
        assert_eq!(c[1].reason, "WritebackErrors");
        assert_eq!(
            c[1].message,
            "Node/node-b: WritebackErrors seen (also asserted by Node/node-a)"
        );
        // Each became True when the assertion speaking for it began.
        assert_eq!(c[0].last_transition_time, T1);
        assert_eq!(c[1].last_transition_time, T0);
        assert_eq!(c[1].observed_generation, Some(1));
        let s = summary(&[a, b], &c);
        assert_eq!(
            s,
            Summary {
                health: "Inaccessible".into(),
                reason: "PathHung".into(),
                since: Some(T1.into()),
                nodes: "node-a,node-b".into()
            }
        );
    }

    #[test]
    fn becoming_true_takes_the_episode_start_never_before_the_last_change_nor_after_now() {
        const T3: &str = "2026-11-24T10:03:00Z";
        let raised = |since: &str| {
            entry(
                EntryKind::Node,
                Some("node-a"),
                &[(Status::Degraded, "BlockIOErrors", since)],
            )
        };
        // Written late (a restart, a slow writer): the episode began at T0.
        let first = conditions(&[raised(T0)], &[], None, T2);
        assert_eq!(first[0].last_transition_time, T0);
        // Cleared at T2; a new episode that began at T3 is True since T3.
        let healthy = entry(EntryKind::Node, Some("node-a"), &[]);
        let cleared = conditions(std::slice::from_ref(&healthy), &first, None, T2);
        assert_eq!(
            (
                cleared[0].status.as_str(),
                cleared[0].last_transition_time.as_str()
            ),
            ("False", T2)
        );
        let again = conditions(&[raised(T3)], &cleared, None, T3);
        assert_eq!(again[0].last_transition_time, T3);
        // An assertion older than that clearing, or from a clock ahead of
        // this one, makes it True now.
        let stale = conditions(&[raised(T1)], &cleared, None, T3);
        assert_eq!(stale[0].last_transition_time, T3);
        let ahead = conditions(&[raised(T3)], &[], None, T2);
        assert_eq!(ahead[0].last_transition_time, T2);
        // A since that is no time at all (outside input): now.
        let garbled = conditions(&[raised("yesterday")], &[], None, T2);
        assert_eq!(garbled[0].last_transition_time, T2);
    }

    #[test]
    fn true_keeps_its_transition_time_and_clearing_goes_false_once() {
        let a = entry(
            EntryKind::Node,
            Some("node-a"),
            &[(Status::Degraded, "BlockIOErrors", T0)],
        );
        let first = conditions(std::slice::from_ref(&a), &[], Some(1), T0);
        let again = conditions(std::slice::from_ref(&a), &first, Some(1), T2);
        assert_eq!(again, first, "no change, no new transition time");

        let healthy = entry(EntryKind::Node, Some("node-a"), &[]);
        let cleared = conditions(std::slice::from_ref(&healthy), &first, Some(1), T1);
        assert_eq!(cleared.len(), 1);
        assert_eq!(cleared[0].status, "False");
        assert_eq!(cleared[0].reason, "BlockIOErrorsCleared");
        assert_eq!(cleared[0].last_transition_time, T1);
        assert_eq!(
            cleared[0].message,
            "no source asserts Degraded any more; last: Node/node-a: BlockIOErrors seen"
        );
        let later = conditions(std::slice::from_ref(&healthy), &cleared, Some(1), T2);
        assert_eq!(later, cleared, "False stays as it was");
        let s = summary(&[healthy], &later);
        assert_eq!(
            (
                s.health.as_str(),
                s.reason.as_str(),
                s.since.as_deref(),
                s.nodes.as_str()
            ),
            ("Healthy", "", Some(T1), "")
        );
    }

    #[test]
    fn entries_without_a_node_count_but_name_no_node() {
        let csi = entry(
            EntryKind::CsiDriver,
            None,
            &[(Status::DataLoss, "VolumeCorrupt", T0)],
        );
        let c = conditions(std::slice::from_ref(&csi), &[], None, T0);
        assert_eq!(c[0].message, "CSIDriver: VolumeCorrupt seen");
        assert_eq!(summary(&[csi], &c).nodes, "");
    }
}
