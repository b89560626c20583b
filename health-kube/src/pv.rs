//! PersistentVolumes as the agent and the controller hold them: every PV
//! of the cluster sits in a reflector, and k8s-openapi's `PersistentVolume`
//! is 3.5 KB per object before its strings (an inline field per volume
//! source), ~50 MB at 10,000 PVs (docs/benchmarks.md, "Controller"). kube's
//! `Object` over the few fields read here decodes only those.

use kube::core::{NotUsed, Object};
use kube::ResourceExt as _;
use serde::Deserialize;

/// What the agent and the controller read of a PV's spec; serde skips the rest.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PvSpec {
    pub csi: Option<PvCsi>,
    pub claim_ref: Option<PvClaimRef>,
    /// For the agent's latency limits per StorageClass.
    pub storage_class_name: Option<String>,
}

/// `spec.csi`: the driver and its id for the volume.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PvCsi {
    pub driver: String,
    pub volume_handle: String,
}

/// `spec.claimRef`: the claim bound to the PV.
#[derive(Clone, Debug, Deserialize)]
pub struct PvClaimRef {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uid: Option<String>,
}

/// A PersistentVolume as the PV reflector holds it: kube's typed object
/// over the fields above (`Object` exists for exactly this).
pub type SlimPv = Object<PvSpec, NotUsed>;

/// Drops what neither reads of a PV (it is all kept for every PV of the
/// cluster): managed fields, annotations, labels, status.
pub fn slim(pv: &mut SlimPv) {
    pv.managed_fields_mut().clear();
    pv.annotations_mut().clear();
    pv.labels_mut().clear();
    pv.status = None;
}
