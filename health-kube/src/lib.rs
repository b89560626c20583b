//! Kubernetes plumbing shared by the node agent (`health-node`'s cluster
//! mode) and the controller (`health-controller`):
//! - [`events`]: the recorder that aggregates condition changes into Events
//!   per (object, reason) within a per-object budget, and continues them
//!   across restarts; [`writer`] creates and patches them;
//! - [`status`]: the `VolumeHealth` object per PVC and its label, written
//!   by server-side apply;
//! - [`reflect`], [`paged_list`], [`pv`]: watching, paged listing, slim PVs;
//! - [`node_label`]: the label that finds a node's own Events and
//!   `VolumeHealth` objects;
//! - [`uninstalled`]: whether the agent's DaemonSet was removed, asked as
//!   it stops;
//! - [`metrics`]: the API traffic families, whose requests [`request_metrics`]
//!   counts inside the client; [`http`]: `/metrics`,
//!   `/healthz` and `/readyz`;
//! - [`ApiAccess`] (what each component declares it calls), the client and
//!   the writers' [`backoff`].
//!
//! Uses `health-core` (the condition vocabulary) and kube-rs; never aya or
//! the node's stages.

pub mod backoff;
pub mod events;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod node_label;
pub mod observer;
pub mod paged_list;
pub mod pv;
pub mod reflect;
pub mod request_metrics;
pub mod status;
#[cfg(feature = "testing")]
pub mod testing;
pub mod uninstalled;
pub mod writer;

use anyhow::Context as _;

/// One RBAC rule: every API call a component makes is listed in its
/// `API_ACCESS` (`health_node::cluster`, `health_controller`), and
/// `deploy/` grants exactly these (checked by the manifest tests in
/// `tests/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiAccess {
    /// API group; "" is the core group.
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// Only these objects, by name (RBAC's `resourceNames`); empty: any.
    pub names: &'static [&'static str],
}

/// The client configuration: from `kubeconfig` when given, else in-cluster
/// (or `KUBECONFIG`, for development).
pub async fn config(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Config> {
    match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))
        }
        None => kube::Config::infer().await.context(
            "no Kubernetes configuration: not in a pod with a service account, and no --kubeconfig",
        ),
    }
}

/// A client from [`config`] whose every request is counted on `observer`
/// ([`request_metrics`]).
pub async fn client(
    kubeconfig: Option<&std::path::Path>,
    observer: std::sync::Arc<dyn observer::Observer>,
) -> anyhow::Result<kube::Client> {
    let config = config(kubeconfig).await?;
    request_metrics::client(config, observer).context("creating the Kubernetes client")
}
