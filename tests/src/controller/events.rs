//! The controller's Events as the tests read them back (as admin): one
//! [`EventView`] per core/v1 Event object, and [`tally`] of the objects per
//! (kind, object, type, reason).

use std::collections::BTreeMap;

use anyhow::{ensure, Context, Result};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use kube::Client;

use super::{APP_NS, COMPONENT};

/// One core/v1 Event, as the assertions read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventView {
    pub name: String,
    pub resource_version: String,
    /// involvedObject.kind and .name.
    pub kind: String,
    pub object: String,
    pub uid: String,
    pub type_: String,
    pub reason: String,
    pub count: i32,
    pub message: String,
    pub reporting_component: String,
    pub reporting_instance: String,
    pub source_component: String,
}

impl EventView {
    fn of(e: Event) -> EventView {
        EventView {
            name: e.metadata.name.unwrap_or_default(),
            resource_version: e.metadata.resource_version.unwrap_or_default(),
            kind: e.involved_object.kind.unwrap_or_default(),
            object: e.involved_object.name.unwrap_or_default(),
            uid: e.involved_object.uid.unwrap_or_default(),
            type_: e.type_.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            count: e.count.unwrap_or(0),
            message: e.message.unwrap_or_default(),
            reporting_component: e.reporting_component.unwrap_or_default(),
            reporting_instance: e.reporting_instance.unwrap_or_default(),
            source_component: e.source.and_then(|s| s.component).unwrap_or_default(),
        }
    }

    /// What every Event of the controller carries: its component, one of
    /// its replicas as instance.
    pub fn check_origin(&self, instances: &[&str]) -> Result<()> {
        ensure!(
            self.reporting_component == COMPONENT && self.source_component == COMPONENT,
            "not the controller's: {self:?}"
        );
        ensure!(
            instances.contains(&self.reporting_instance.as_str()),
            "reportingInstance {:?} is none of {instances:?}: {self:?}",
            self.reporting_instance
        );
        Ok(())
    }
}

pub(super) async fn list_events(client: &Client, params: &ListParams) -> Result<Vec<EventView>> {
    let mut events: Vec<EventView> = Api::<Event>::namespaced(client.clone(), APP_NS)
        .list(params)
        .await
        .context("listing Events as admin")?
        .items
        .into_iter()
        .map(EventView::of)
        .collect();
    events.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(events)
}

/// Event objects per (kind, object, type, reason): what "exactly one
/// Warning per PVC" is asserted on.
pub fn tally(events: &[EventView]) -> BTreeMap<(String, String, String, String), usize> {
    let mut out = BTreeMap::new();
    for e in events {
        let key = (
            e.kind.clone(),
            e.object.clone(),
            e.type_.clone(),
            e.reason.clone(),
        );
        *out.entry(key).or_insert(0) += 1;
    }
    out
}

/// A tally key, for writing expected tallies.
pub fn key(
    kind: &str,
    object: &str,
    type_: &str,
    reason: &str,
) -> (String, String, String, String) {
    (kind.into(), object.into(), type_.into(), reason.into())
}
