//! Writes by server-side apply (`application/apply-patch+yaml`): `VolumeHealth`
//! objects (created by an apply of the object, status by an apply of the `status`
//! subresource) and PVC labels. Field ownership is kept by [`super::apply`]; the
//! preconditions (`metadata.resourceVersion`, `metadata.uid` in the body) and the
//! error Statuses are the real server's. Reads (get, list, watch) of both kinds are
//! the generic ones of `list`, as they are stored like pods.

use std::sync::Arc;

use http::StatusCode;
use serde_json::{json, Value};

use super::apply::{apply, entries, fields_under, Field};
use super::json::meta_str;
use super::query::{dry_run, param};
use super::reply::{error, not_found, Reply};
use super::store::{Kind, Shared};
use super::Recorded;

pub(super) const GROUP: &str = "volume-health.io";
pub(super) const VERSION: &str = "v1alpha1";
/// The resource as the real server names it in messages.
const QUALIFIED: &str = "volumehealths.volume-health.io";

/// What every apply request carries: the field manager and `force`.
struct ApplyRequest {
    manager: String,
    force: bool,
    dry_run: bool,
    body: Value,
    /// `Some("status")` for an apply of the status subresource.
    subresource: Option<&'static str>,
}

/// The apply's parameters, its body checked to be `kind` and name the object.
fn apply_request(
    req: &Recorded,
    body: Option<Value>,
    kind: Kind,
    namespace: &str,
    name: &str,
) -> Result<ApplyRequest, Reply> {
    let content_type = req.content_type.as_deref().unwrap_or("");
    if content_type.split(';').next().map(str::trim) != Some("application/apply-patch+yaml") {
        return Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!("the fake apiserver takes only server-side apply (application/apply-patch+yaml) here, not {content_type:?}"),
            None,
        ));
    }
    let Some(manager) = param(&req.query, "fieldManager").filter(|m| !m.is_empty()) else {
        return Err(bad_request("PATCH /apply requires fieldManager"));
    };
    let Some(body) = body.filter(Value::is_object) else {
        return Err(bad_request("the apply body is not a JSON object"));
    };
    if let Some(reply) = check_identity(&body, kind, namespace, name) {
        return Err(reply);
    }
    Ok(ApplyRequest {
        manager: manager.to_string(),
        force: matches!(param(&req.query, "force"), Some("true" | "1")),
        dry_run: dry_run(&req.query),
        body,
        subresource: req.path.ends_with("/status").then_some("status"),
    })
}

fn bad_request(message: &str) -> Reply {
    error(
        StatusCode::BAD_REQUEST,
        "BadRequest",
        message.to_string(),
        None,
    )
}

/// The body must be this kind and name this object.
fn check_identity(body: &Value, kind: Kind, namespace: &str, name: &str) -> Option<Reply> {
    let (api_version, k) = (body["apiVersion"].as_str(), body["kind"].as_str());
    if api_version != Some(kind.api_version()) || k != Some(kind.kind()) {
        return Some(bad_request(&format!(
            "the body is {api_version:?}/{k:?}, not {}/{}",
            kind.api_version(),
            kind.kind()
        )));
    }
    let body_ns = meta_str(body, "namespace").unwrap_or(namespace);
    if meta_str(body, "name") != Some(name) || body_ns != namespace {
        return Some(bad_request(&format!(
            "the body names {body_ns}/{:?}, the path {namespace}/{name}",
            meta_str(body, "name")
        )));
    }
    None
}

/// `metadata.resourceVersion` and `metadata.uid` in the body are preconditions.
fn preconditions(current: &Value, body: &Value, resource: &str, name: &str) -> Option<Reply> {
    let conflict = |why: String| {
        error(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Operation cannot be fulfilled on {resource} {name:?}: {why}"),
            Some(json!({"name": name, "kind": resource})),
        )
    };
    let stored = |f| meta_str(current, f).unwrap_or("");
    match meta_str(body, "resourceVersion").filter(|v| !v.is_empty()) {
        Some(rv) if rv != stored("resourceVersion") => {
            return Some(conflict(
                "the object has been modified; please apply your changes to the latest version and try again".into(),
            ))
        }
        _ => {}
    }
    match meta_str(body, "uid").filter(|v| !v.is_empty()) {
        Some(uid) if uid != stored("uid") => Some(conflict(format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
            stored("uid")
        ))),
        _ => None,
    }
}

/// Applies `sent` to the stored object (or `fresh`, creating it) and stores the
/// result under a new resourceVersion if anything changed.
fn commit(
    shared: &Arc<Shared>,
    key: (Kind, &str, &str),
    fresh: Option<Value>,
    ar: ApplyRequest,
    sent: Vec<(Field, Value)>,
) -> Reply {
    let (kind, namespace, name) = key;
    let key = (kind, namespace.to_string(), name.to_string());
    let mut st = shared.lock();
    let (current, created) = match (st.objects.get(&key).cloned(), fresh) {
        (Some(c), _) => (c, false),
        (None, Some(f)) => (f, true),
        (None, None) => return not_found(kind.plural(), name),
    };
    let resource = if kind == Kind::VolumeHealth {
        QUALIFIED
    } else {
        kind.plural()
    };
    if let Some(reply) = preconditions(&current, &ar.body, resource, name) {
        return reply;
    }
    let mut obj = current.clone();
    let mut owners = st.owners.get(&key).cloned().unwrap_or_default();
    let owners_before = owners.clone();
    let subresource = ar.subresource;
    if let Err(conflict) = apply(
        &mut obj,
        &mut owners,
        &ar.manager,
        subresource,
        sent,
        ar.force,
    ) {
        return error(StatusCode::CONFLICT, "Conflict", conflict, None);
    }
    if current.get("spec") != obj.get("spec") && !created {
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
        obj["metadata"]["generation"] = json!(generation + 1);
    }
    let unchanged = !created && obj == current && owners == owners_before;
    if unchanged || ar.dry_run {
        return Reply::Json(StatusCode::OK, obj);
    }
    st.put_object(kind, obj);
    st.owners.insert(key.clone(), owners);
    let stored = st.objects.get(&key).cloned().unwrap_or(Value::Null);
    let rv = st.rv;
    drop(st);
    shared.changes.send_replace(rv);
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Reply::Json(code, stored)
}

/// `PATCH .../volumehealths/NAME` (apply): creates the object or applies its
/// metadata (owner references, labels, annotations) and spec. A `status` here is
/// ignored, as with a status subresource.
pub(super) fn apply_volume_health(
    shared: &Arc<Shared>,
    namespace: &str,
    name: &str,
    req: &Recorded,
    body: Option<Value>,
) -> Reply {
    let ar = match apply_request(req, body, Kind::VolumeHealth, namespace, name) {
        Ok(ar) => ar,
        Err(reply) => return reply,
    };
    let meta = &ar.body["metadata"];
    let mut sent = Vec::new();
    if let Some(refs) = meta.get("ownerReferences") {
        sent.push((
            Field::At(vec!["metadata".into(), "ownerReferences".into()]),
            refs.clone(),
        ));
    }
    for map in ["labels", "annotations"] {
        if let Some(v) = meta.get(map) {
            sent.extend(fields_under(&["metadata", map], v));
        }
    }
    if let Some(spec) = ar.body.get("spec") {
        sent.extend(fields_under(&["spec"], spec));
    }
    let fresh = json!({
        "apiVersion": Kind::VolumeHealth.api_version(),
        "kind": Kind::VolumeHealth.kind(),
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
    });
    commit(
        shared,
        (Kind::VolumeHealth, namespace, name),
        Some(fresh),
        ar,
        sent,
    )
}

/// `PATCH .../volumehealths/NAME/status` (apply): `status.sources` entries per
/// manager, every other status field as a whole. 404 for a missing object.
pub(super) fn apply_volume_health_status(
    shared: &Arc<Shared>,
    namespace: &str,
    name: &str,
    req: &Recorded,
    body: Option<Value>,
) -> Reply {
    let ar = match apply_request(req, body, Kind::VolumeHealth, namespace, name) {
        Ok(ar) => ar,
        Err(reply) => return reply,
    };
    let mut status = ar.body.get("status").cloned().unwrap_or(json!({}));
    let sources = status.as_object_mut().and_then(|s| s.remove("sources"));
    let mut sent = fields_under(&["status"], &status);
    if let Some(list) = sources {
        match entries(&["status", "sources"], &list) {
            Ok(e) => sent.extend(e),
            Err(cause) => return invalid(QUALIFIED, name, cause),
        }
    }
    commit(
        shared,
        (Kind::VolumeHealth, namespace, name),
        None,
        ar,
        sent,
    )
}

/// `PATCH /api/v1/namespaces/NS/persistentvolumeclaims/NAME` (apply) of labels
/// only; a PVC the test did not put is 404, never created.
pub(super) fn apply_pvc_labels(
    shared: &Arc<Shared>,
    namespace: &str,
    name: &str,
    req: &Recorded,
    body: Option<Value>,
) -> Reply {
    let ar = match apply_request(req, body, Kind::PersistentVolumeClaim, namespace, name) {
        Ok(ar) => ar,
        Err(reply) => return reply,
    };
    let body = &ar.body;
    let extra: Vec<&String> = body
        .as_object()
        .into_iter()
        .flat_map(|o| o.keys())
        .filter(|k| !["apiVersion", "kind", "metadata"].contains(&k.as_str()))
        .chain(
            body["metadata"]
                .as_object()
                .into_iter()
                .flat_map(|m| m.keys())
                .filter(|k| {
                    !["name", "namespace", "uid", "resourceVersion", "labels"].contains(&k.as_str())
                }),
        )
        .collect();
    if !extra.is_empty() {
        return invalid(
            "persistentvolumeclaims",
            name,
            format!("the fake apiserver applies only metadata.labels of a PVC, not {extra:?}"),
        );
    }
    let sent = match body["metadata"].get("labels") {
        Some(labels) => fields_under(&["metadata", "labels"], labels),
        None => Vec::new(),
    };
    commit(
        shared,
        (Kind::PersistentVolumeClaim, namespace, name),
        None,
        ar,
        sent,
    )
}

fn invalid(resource: &str, name: &str, cause: String) -> Reply {
    error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("{resource} {name:?} is invalid: {cause}"),
        Some(json!({"name": name, "kind": resource})),
    )
}
