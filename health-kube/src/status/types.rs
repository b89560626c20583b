//! The `VolumeHealth` custom resource (`deploy/volumehealth-crd.yaml`) as the
//! agent reads it. Writes are server-side apply bodies built in `api`, so
//! that each writer sends exactly the fields it owns.

use std::borrow::Cow;
use std::time::{SystemTime, UNIX_EPOCH};

use health_core::conditions::{rfc3339, Status};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "volume-health.io";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "volume-health.io/v1alpha1";
pub const KIND: &str = "VolumeHealth";
pub const PLURAL: &str = "volumehealths";
/// The PVC label kept in step with the worst condition
/// (`kubectl get pvc -l volume-health.io/health=Inaccessible`).
pub const HEALTH_LABEL: &str = "volume-health.io/health";
/// `status.health` of a volume with no condition True.
pub const HEALTHY: &str = "Healthy";

/// The PVC a `VolumeHealth` is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Claim {
    pub namespace: String,
    pub name: String,
    /// The PVC's uid (from the PV's claimRef): owner and precondition.
    pub uid: String,
    pub pv: Option<String>,
}

/// One PVC's health. Named and namespaced like the PVC, owned by it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VolumeHealth {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Spec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<HealthStatus>,
}

impl kube::Resource for VolumeHealth {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub persistent_volume_claim_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_name: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub sources: Vec<SourceEntry>,
}

/// The usual Kubernetes condition, typed by KEP-1432 status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: Status,
    /// "True" or "False".
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Condition {
    pub fn is_true(&self) -> bool {
        self.status == "True"
    }
}

/// Who writes an entry of `status.sources`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EntryKind {
    /// A node's agent: the kernel and its own checks.
    Node,
    /// The CSI driver: its node service as a node's agent saw it (with
    /// `node`), or its controller service as controller mode saw it.
    #[serde(rename = "CSIDriver")]
    CsiDriver,
    /// Controller mode's own findings (node down).
    Controller,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Node => "Node",
            EntryKind::CsiDriver => "CSIDriver",
            EntryKind::Controller => "Controller",
        }
    }

    /// The entry's key: `<kind>/<node>` for a node's, `<kind>` otherwise.
    pub fn entry_name(self, node: Option<&str>) -> String {
        match node {
            Some(n) => format!("{}/{n}", self.as_str()),
            None => self.as_str().to_string(),
        }
    }
}

/// What one source asserts about the volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceEntry {
    pub name: String,
    pub kind: EntryKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_count: Option<u32>,
    pub update_time: String,
    #[serde(default)]
    pub conditions: Vec<EntryCondition>,
}

impl SourceEntry {
    /// Equal in what it asserts and about whom; `updateTime` and `lastSeen`
    /// alone never make a write.
    pub fn same_assertions(&self, other: &SourceEntry) -> bool {
        let strip = |e: &SourceEntry| {
            let mut e = e.clone();
            e.update_time.clear();
            for c in &mut e.conditions {
                c.last_seen = None;
            }
            e
        };
        strip(self) == strip(other)
    }

    /// The `(status, reason)` pairs asserted: a change there is written at
    /// once, other changes (counts, messages) at most every update interval.
    pub fn keys(&self) -> Vec<(Status, &str)> {
        let mut k: Vec<(Status, &str)> = self
            .conditions
            .iter()
            .map(|c| (c.status, c.reason.as_str()))
            .collect();
        k.sort();
        k
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryCondition {
    pub status: Status,
    pub reason: String,
    pub message: String,
    pub since: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    pub origin: String,
}

impl EntryCondition {
    /// A condition of the agent's state machine as an entry shows it.
    pub fn from_condition(c: &health_core::conditions::Condition) -> Self {
        EntryCondition {
            status: c.status,
            reason: c.reason.clone(),
            message: bounded(c.message.clone(), MAX_MESSAGE),
            since: time(c.since),
            last_seen: Some(time(c.last_probe)),
            count: c.occurrences,
            origin: c.source.to_string(),
        }
    }
}

/// The schema's bound on messages; longer ones are cut at a char boundary.
pub const MAX_MESSAGE: usize = 4096;

pub fn bounded(s: String, max: usize) -> String {
    health_core::conditions::clip_to(s, max)
}

pub fn time(t: SystemTime) -> String {
    rfc3339(t)
}

/// Parses what [`rfc3339`] (or the API server) wrote; `None` for anything
/// else.
pub fn parse_time(s: &str) -> Option<SystemTime> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    let secs = u64::try_from(t.unix_timestamp()).ok()?;
    Some(UNIX_EPOCH + std::time::Duration::from_secs(secs))
}
