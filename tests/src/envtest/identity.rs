//! Who may talk to the test API server: static bearer tokens, one per identity,
//! and a kubeconfig file per identity for the binaries under test.
//!
//! Static tokens (`--token-auth-file`) rather than certificates or ServiceAccount
//! tokens: any user name and groups can be given one without a CA or a
//! ServiceAccount object, and the authorizers (Node, RBAC) see exactly that user.
//! The file is read once at start, so every identity is declared before the
//! server starts (see [`super::Options`]).

use std::fmt::Write as _;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::json;

/// The group kube-apiserver gives every authenticated user, listed explicitly so
/// that the identities read the same as on a real cluster.
const AUTHENTICATED: &str = "system:authenticated";

/// One user of the server: its name, groups and bearer token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    pub token: String,
}

impl Identity {
    /// `user` in `groups` with a fresh random token.
    pub fn new(user: &str, groups: &[&str]) -> Result<Self> {
        Ok(Identity {
            user: user.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            token: random_token()?,
        })
    }

    /// The cluster administrator: group `system:masters`, which RBAC never limits.
    pub fn admin() -> Result<Self> {
        Self::new("admin", &["system:masters", AUTHENTICATED])
    }

    /// A kubelet: `system:node:<name>` in `system:nodes`, so the Node authorizer
    /// and the NodeRestriction admission plugin apply to it.
    pub fn node(name: &str) -> Result<Self> {
        Self::new(
            &format!("system:node:{name}"),
            &["system:nodes", AUTHENTICATED],
        )
    }

    /// What a pod running as ServiceAccount `namespace/name` authenticates as:
    /// RBAC bindings to `kind: ServiceAccount` subjects match this user name.
    pub fn service_account(namespace: &str, name: &str) -> Result<Self> {
        Self::new(
            &service_account_user(namespace, name),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{namespace}"),
                AUTHENTICATED,
            ],
        )
    }
}

/// `system:serviceaccount:<namespace>:<name>`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// 128 random bits as hex: unguessable enough that no test token collides.
fn random_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for a token")?;
    Ok(bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    }))
}

/// The `--token-auth-file` text: `token,user,uid,"group1,group2"` per line (the
/// groups are one quoted CSV field).
pub fn token_file(identities: &[Identity]) -> String {
    identities
        .iter()
        .map(|id| {
            format!(
                "{},{},{},\"{}\"\n",
                id.token,
                id.user,
                id.user,
                id.groups.join(",")
            )
        })
        .collect()
}

/// Writes a kubeconfig for `who` into `dir` and returns its path. The serving
/// certificate is self-signed by kube-apiserver, so TLS verification is skipped
/// (loopback only). JSON, which every kubeconfig reader accepts as YAML.
pub fn write_kubeconfig(dir: &Path, url: &str, who: &Identity) -> Result<PathBuf> {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": {"server": url, "insecure-skip-tls-verify": true}}],
        "users": [{"name": who.user, "user": {"token": who.token}}],
        "contexts": [{
            "name": "envtest",
            "context": {"cluster": "envtest", "user": who.user, "namespace": "default"},
        }],
        "current-context": "envtest",
        "preferences": {},
    });
    let path = dir.join(format!("kubeconfig-{}", file_safe(&who.user)));
    let text = serde_json::to_string_pretty(&config).context("serializing a kubeconfig")?;
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// `system:node:a` -> `system_node_a`: user names hold colons, file names had better not.
fn file_safe(user: &str) -> String {
    user.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_quotes_the_groups_field() {
        let sa = Identity {
            user: "system:serviceaccount:ns:sa".to_string(),
            groups: vec!["a".to_string(), "b".to_string()],
            token: "t0".to_string(),
        };
        assert_eq!(
            token_file(&[sa]),
            "t0,system:serviceaccount:ns:sa,system:serviceaccount:ns:sa,\"a,b\"\n"
        );
    }

    #[test]
    fn service_account_identity_has_the_groups_a_real_token_gets() {
        let sa = Identity::service_account("kube-system", "ctl").unwrap();
        assert_eq!(sa.user, "system:serviceaccount:kube-system:ctl");
        assert_eq!(
            sa.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:kube-system",
                "system:authenticated"
            ]
        );
        assert_eq!(sa.token.len(), 32);
        assert_ne!(sa.token, Identity::admin().unwrap().token);
    }

    #[test]
    fn kubeconfig_file_names_are_plain() {
        assert_eq!(file_safe("system:node:node-1"), "system_node_node-1");
    }
}
