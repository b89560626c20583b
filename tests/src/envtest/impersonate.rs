//! Acting as a user the server has no token for, through the admin's
//! impersonation (`system:masters` may impersonate anyone): in particular a
//! node's agent, i.e. the agent's ServiceAccount with the node name that
//! Kubernetes 1.30+ puts in the user info of a pod-bound token
//! (`authentication.kubernetes.io/node-name`), which this 1.26 server's own
//! tokens cannot carry. Admission (and RBAC) see exactly that user.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::identity::service_account_user;
use super::RealApiServer;

/// The user-info key a pod-bound ServiceAccount token carries its node in.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// Who to act as.
#[derive(Clone, Debug)]
pub struct Impersonation {
    pub user: String,
    pub groups: Vec<String>,
    pub extra: HashMap<String, Vec<String>>,
}

impl Impersonation {
    /// A pod of ServiceAccount `namespace/name` running on `node`.
    pub fn service_account_on_node(namespace: &str, name: &str, node: &str) -> Self {
        Impersonation {
            user: service_account_user(namespace, name),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            extra: HashMap::from([(NODE_NAME_EXTRA.to_string(), vec![node.to_string()])]),
        }
    }

    /// A ServiceAccount whose token names no node.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        let mut i = Self::service_account_on_node(namespace, name, "");
        i.extra.clear();
        i
    }
}

impl RealApiServer {
    /// A kubeconfig (JSON, which is YAML) that acts as `who`, for binaries
    /// under test and kubectl; written into the server's directory as
    /// `<file>`.
    pub fn impersonating_kubeconfig(&self, who: &Impersonation, file: &str) -> Result<PathBuf> {
        let mut config = Kubeconfig::read_from(self.kubeconfig(self.admin()))
            .context("reading the admin kubeconfig")?;
        for named in &mut config.auth_infos {
            if let Some(auth) = named.auth_info.as_mut() {
                auth.impersonate = Some(who.user.clone());
                auth.impersonate_groups = Some(who.groups.clone());
                auth.impersonate_user_extra = Some(who.extra.clone());
            }
        }
        let path = self.dir().join(file);
        let text = serde_json::to_string_pretty(&config).context("serializing a kubeconfig")?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// A kube client acting as `who` (no retries: tests see every answer).
    pub async fn impersonating_client(&self, who: &Impersonation) -> Result<kube::Client> {
        let file = format!("impersonate-{}.kubeconfig", sanitize(&who.user, &who.extra));
        let path = self.impersonating_kubeconfig(who, &file)?;
        let kc = Kubeconfig::read_from(&path)?;
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .context("kube config from an impersonating kubeconfig")?;
        config.default_retry = false;
        kube::Client::try_from(config).context("building an impersonating kube client")
    }
}

fn sanitize(user: &str, extra: &HashMap<String, Vec<String>>) -> String {
    let mut s: String = user
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    if let Some(nodes) = extra.get(NODE_NAME_EXTRA) {
        s.push_str("-on-");
        s.push_str(&nodes.join("-"));
    }
    s
}
