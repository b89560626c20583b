//! `VolumeHealth` source entries as the tests of the status writers build them
//! (tests/server/apiserver_status.rs on a real API server, tests/server/apiserver_volumehealth.rs
//! on the fake): a node's entry in namespace `shop`, kernel conditions.

use health_core::conditions::Status;
use health_kube::status::{EntryCondition, EntryKind, SourceEntry};

pub fn cond(status: Status, reason: &str, count: Option<u64>) -> EntryCondition {
    EntryCondition {
        status,
        reason: reason.into(),
        message: format!("{reason} message"),
        since: "2026-11-24T10:00:00Z".into(),
        last_seen: Some("2026-11-24T10:00:05Z".into()),
        count,
        origin: "kernel".into(),
    }
}

pub fn node_entry(node: &str, conditions: Vec<EntryCondition>) -> SourceEntry {
    SourceEntry {
        name: EntryKind::Node.entry_name(Some(node)),
        kind: EntryKind::Node,
        node: Some(node.into()),
        driver: None,
        pods: vec![format!("shop/web-{node}")],
        pod_count: Some(1),
        update_time: "2026-11-24T10:00:06Z".into(),
        conditions,
    }
}
