//! What RBAC lets an identity do, asked of the server itself
//! (SubjectAccessReview), and waiting for a binding to take effect.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::Client;

use super::Identity;

/// `verb` on `group/resource` in `ns` (None: cluster-wide).
pub fn attributes(group: &str, resource: &str, verb: &str, ns: Option<&str>) -> ResourceAttributes {
    ResourceAttributes {
        group: Some(group.to_string()),
        resource: Some(resource.to_string()),
        verb: Some(verb.to_string()),
        namespace: ns.map(str::to_string),
        ..Default::default()
    }
}

/// Whether the server's authorizers allow `who` the call `attributes`.
pub async fn may(admin: &Client, who: &Identity, attributes: ResourceAttributes) -> Result<bool> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(who.user.clone()),
            groups: Some(who.groups.clone()),
            resource_attributes: Some(attributes),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .context("SubjectAccessReview")?;
    Ok(answer.status.map(|s| s.allowed).unwrap_or(false))
}

/// [`wait_allowed`] for every verb of `access`, on each object it names
/// (a grant by name allows nothing unnamed).
pub async fn wait_granted(
    admin: &Client,
    who: &Identity,
    access: &health_kube::ApiAccess,
    ns: Option<&str>,
) -> Result<()> {
    for verb in access.verbs {
        if access.names.is_empty() {
            wait_allowed(admin, who, (access.group, access.resource, verb), ns).await?;
        }
        for name in access.names {
            let mut asked = attributes(access.group, access.resource, verb, ns.or(Some("default")));
            asked.name = Some(name.to_string());
            wait_until(admin, who, asked).await?;
        }
    }
    Ok(())
}

/// RBAC reads bindings through an informer: waits (up to 5 s) until `who`
/// may `verb` `group/resource` in `ns`.
pub async fn wait_allowed(
    admin: &Client,
    who: &Identity,
    (group, resource, verb): (&str, &str, &str),
    ns: Option<&str>,
) -> Result<()> {
    wait_until(admin, who, attributes(group, resource, verb, ns)).await
}

async fn wait_until(admin: &Client, who: &Identity, asked: ResourceAttributes) -> Result<()> {
    for _ in 0..100 {
        if may(admin, who, asked.clone()).await? {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "{} still may not {} {} {:?} after 5 s",
        who.user,
        asked.verb.unwrap_or_default(),
        asked.resource.unwrap_or_default(),
        asked.name
    )
}
