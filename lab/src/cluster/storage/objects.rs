//! The API objects of the storage: the CSIDriver, the StorageClass and the
//! statically provisioned PVs (server-side applied, typed), and the
//! kubelet's registration of the driver as its CSINode shows it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use health_tests::csi_driver::client::CreatedVolume;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolume, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, CSINode, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::Client;
use xtask::util::say;

use super::super::State;
use super::{driver::DRIVER, Description, Mode, Volume, STORAGE_CLASS};

const FIELD_MANAGER: &str = "volume-health-cluster";
/// Marks what `cluster up` made.
const LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "volume-health-cluster");

pub(super) async fn client(state: &State) -> anyhow::Result<Client> {
    let path = state.kubeconfig();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)
        .with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .with_context(|| format!("using {}", path.display()))?;
    Client::try_from(config).context("building a kube client")
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(BTreeMap::from([(LABEL.0.to_string(), LABEL.1.to_string())])),
        ..ObjectMeta::default()
    }
}

async fn apply<K>(api: &Api<K>, name: &str, object: &K) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .with_context(|| format!("applying {} {name}", K::kind(&())))?;
    Ok(())
}

/// No attach step (the kubelet would wait for VolumeAttachments no
/// attacher makes), the pod's identity in NodePublish, persistent volumes.
pub(super) async fn apply_csi_driver(client: &Client) -> anyhow::Result<()> {
    let object = CSIDriver {
        metadata: meta(DRIVER),
        spec: CSIDriverSpec {
            attach_required: Some(false),
            pod_info_on_mount: Some(true),
            volume_lifecycle_modes: Some(vec!["Persistent".to_string()]),
            ..CSIDriverSpec::default()
        },
    };
    apply(&Api::<CSIDriver>::all(client.clone()), DRIVER, &object).await
}

/// Until the node's CSINode lists the driver: the kubelet has called
/// NodeGetInfo on the socket the driver's registration announced (the
/// proxy's).
pub(super) async fn wait_registered(
    client: &Client,
    node: &str,
    within: Duration,
) -> anyhow::Result<()> {
    let api = Api::<CSINode>::all(client.clone());
    let deadline = Instant::now() + within;
    loop {
        let drivers = registered(&api, node).await?;
        if drivers.iter().any(|d| d == DRIVER) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the kubelet did not register {DRIVER} within {within:?}: CSINode {node} lists {drivers:?} \
                 (the driver's and the proxy's logs tell why)"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn registered(api: &Api<CSINode>, node: &str) -> anyhow::Result<Vec<String>> {
    Ok(api
        .get_opt(node)
        .await
        .with_context(|| format!("reading CSINode {node}"))?
        .map(|n| n.spec.drivers.into_iter().map(|d| d.name).collect())
        .unwrap_or_default())
}

/// The cluster's default class: a claim without a class lands here too.
/// Immediate binding, so a claim is Bound before any pod uses it.
pub(super) async fn apply_storage_class(client: &Client) -> anyhow::Result<()> {
    let mut metadata = meta(STORAGE_CLASS);
    metadata.annotations = Some(BTreeMap::from([(
        "storageclass.kubernetes.io/is-default-class".to_string(),
        "true".to_string(),
    )]));
    let object = StorageClass {
        metadata,
        provisioner: DRIVER.to_string(),
        reclaim_policy: Some("Retain".to_string()),
        volume_binding_mode: Some("Immediate".to_string()),
        ..StorageClass::default()
    };
    apply(
        &Api::<StorageClass>::all(client.clone()),
        STORAGE_CLASS,
        &object,
    )
    .await
}

/// The PV of `volume`, as an external-provisioner would have written it
/// from CreateVolume's answer. A PV of an older fault disk (another volume
/// handle: its source cannot change) is replaced; a Released one is made
/// Available again (its data stays).
pub(super) async fn apply_pv(
    client: &Client,
    node: &str,
    volume: &Volume,
    created: &CreatedVolume,
) -> anyhow::Result<()> {
    let api = Api::<PersistentVolume>::all(client.clone());
    if let Some(old) = api.get_opt(&volume.pv).await? {
        let handle = old
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.as_str());
        if handle != Some(volume.volume_handle.as_str()) {
            replace(&api, &old).await?;
        } else if phase(&old) == "Released" {
            let unclaim = serde_json::json!({"spec": {"claimRef": null}});
            api.patch(&volume.pv, &PatchParams::default(), &Patch::Merge(&unclaim))
                .await
                .with_context(|| format!("making the Released PV {} Available", volume.pv))?;
            say(format!("PV {} was Released: Available again", volume.pv));
        }
    }
    apply(&api, &volume.pv, &pv(node, volume, created)).await
}

fn pv(node: &str, volume: &Volume, created: &CreatedVolume) -> PersistentVolume {
    // The driver reports no topology: the node's hostname label pins it.
    let terms = vec![NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: "kubernetes.io/hostname".to_string(),
            operator: "In".to_string(),
            values: Some(vec![node.to_string()]),
        }]),
        ..NodeSelectorTerm::default()
    }];
    let (mode, fs_type) = match volume.mode {
        Mode::Filesystem => ("Filesystem", Some("ext4".to_string())),
        Mode::Block => ("Block", None),
    };
    PersistentVolume {
        metadata: meta(&volume.pv),
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([(
                "storage".to_string(),
                Quantity(format!("{}Mi", volume.capacity_bytes >> 20)),
            )])),
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            persistent_volume_reclaim_policy: Some("Retain".to_string()),
            storage_class_name: Some(STORAGE_CLASS.to_string()),
            volume_mode: Some(mode.to_string()),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.to_string(),
                volume_handle: volume.volume_handle.clone(),
                volume_attributes: (!created.context.is_empty()).then(|| created.context.clone()),
                fs_type,
                ..CSIPersistentVolumeSource::default()
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: terms,
                }),
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

/// `<namespace>/<name>` of the claim a PV is bound to, if any.
fn claimant(pv: &PersistentVolume) -> Option<String> {
    let c = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some(format!(
        "{}/{}",
        c.namespace.as_deref().unwrap_or(""),
        c.name.as_deref().unwrap_or("")
    ))
}

fn phase(pv: &PersistentVolume) -> &str {
    pv.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Deletes `old` and waits until it is gone; a PV still bound to a claim
/// stays (pv-protection), which is said.
async fn replace(api: &Api<PersistentVolume>, old: &PersistentVolume) -> anyhow::Result<()> {
    let name = old.metadata.name.clone().unwrap_or_default();
    say(format!(
        "PV {name} belongs to an older fault disk: replacing it"
    ));
    api.delete(&name, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting PV {name}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.get_opt(&name).await?.is_some() {
        if Instant::now() > deadline {
            let claim = claimant(old);
            bail!(
                "PV {name} of an older fault disk is still there 30 s after its deletion \
                 (bound to {}): delete that claim and its pods, or run `cargo xtask cluster down`",
                claim.unwrap_or_else(|| "no claim".to_string())
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// The registration and each PV's phase.
pub(super) async fn status(
    state: &State,
    d: &Description,
) -> anyhow::Result<Vec<(String, bool, String)>> {
    let client = client(state).await?;
    let mut out = Vec::new();
    let node = state.node_name();
    let drivers = registered(&Api::<CSINode>::all(client.clone()), node).await?;
    out.push((
        format!("CSINode {node}"),
        drivers.iter().any(|n| n == DRIVER),
        format!("drivers {drivers:?}"),
    ));
    let driver = Api::<CSIDriver>::all(client.clone())
        .get_opt(DRIVER)
        .await?;
    out.push((
        format!("CSIDriver {DRIVER}"),
        driver.is_some(),
        if driver.is_some() {
            "present"
        } else {
            "missing"
        }
        .to_string(),
    ));
    let class = Api::<StorageClass>::all(client.clone())
        .get_opt(&d.storage_class)
        .await?;
    out.push((
        format!("StorageClass {}", d.storage_class),
        class.is_some(),
        if class.is_some() {
            "present (default class)"
        } else {
            "missing"
        }
        .to_string(),
    ));
    let api = Api::<PersistentVolume>::all(client);
    for v in &d.volumes {
        let row = match api.get_opt(&v.pv).await? {
            None => (false, "missing".to_string()),
            Some(pv) => {
                let claim = claimant(&pv).map(|c| format!(" by {c}"));
                let phase = phase(&pv).to_string();
                // A Released PV takes no new claim until `up` frees it.
                let ok = phase == "Available" || phase == "Bound";
                let hint = match phase.as_str() {
                    "Released" => "; `cargo xtask cluster up` makes it Available again",
                    _ => "",
                };
                (
                    ok,
                    format!(
                        "{phase}{} ({:?}, {}){hint}",
                        claim.unwrap_or_default(),
                        v.mode,
                        v.device.display()
                    ),
                )
            }
        };
        out.push((format!("PV {}", v.pv), row.0, row.1));
    }
    Ok(out)
}
