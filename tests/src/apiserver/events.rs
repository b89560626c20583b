//! core/v1 Events: list, get, create and merge-patch, with the real server's checks
//! and server-assigned fields.

use std::sync::Arc;

use http::StatusCode;
use serde_json::{json, Map, Value};

use super::json::{list_json, meta_mut, meta_remove, meta_str, name_of, namespace_of, now_rfc3339};
use super::labels::LabelSelector;
use super::query::{dry_run, param};
use super::reply::{bad_body, error, invalid, not_found, Reply};
use super::store::Shared;
use super::Recorded;

/// `GET .../events`, with the `labelSelector` ([`LabelSelector`]) and the
/// `fieldSelector` terms the real server accepts for
/// core/v1 Events (`a=b`, `a==b`, `a!=b`, all of them must hold); any other field
/// is a 400, as there. No pagination: the whole selection in one page, which a
/// client following `continue` takes as the last.
pub(super) fn list_events(
    shared: &Arc<Shared>,
    namespace: Option<&str>,
    query: &[(String, String)],
) -> Reply {
    let terms = match event_terms(param(query, "fieldSelector").unwrap_or("")) {
        Ok(terms) => terms,
        Err(message) => return error(StatusCode::BAD_REQUEST, "BadRequest", message, None),
    };
    let labels = match LabelSelector::parse(param(query, "labelSelector")) {
        Ok(labels) => labels,
        Err(message) => return error(StatusCode::BAD_REQUEST, "BadRequest", message, None),
    };
    let st = shared.lock();
    let items = st
        .events
        .iter()
        .filter(|((ns, _), _)| namespace.is_none_or(|want| ns == want))
        .filter(|(_, e)| labels.matches(e))
        .filter(|(_, e)| {
            terms
                .iter()
                .all(|(path, negate, value)| (json_str(e, path) == value) != *negate)
        })
        .map(|(_, e)| e.clone())
        .collect();
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), st.rv.to_string().into());
    Reply::Json(StatusCode::OK, list_json("EventList", metadata, items))
}

/// One `fieldSelector` term on Events: the field's JSON path, negated, value.
type EventTerm = (&'static [&'static str], bool, String);

/// A field selector on Events as terms.
fn event_terms(selector: &str) -> Result<Vec<EventTerm>, String> {
    let mut terms = Vec::new();
    for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (label, negate, value) = if let Some((f, v)) = term.split_once("!=") {
            (f, true, v)
        } else if let Some((f, v)) = term.split_once("==") {
            (f, false, v)
        } else if let Some((f, v)) = term.split_once('=') {
            (f, false, v)
        } else {
            return Err(format!("invalid selector: '{term}'"));
        };
        // The labels of the real server's selectable fields for core/v1 Events.
        let path: &'static [&'static str] = match label.trim() {
            "metadata.name" => &["metadata", "name"],
            "metadata.namespace" => &["metadata", "namespace"],
            "involvedObject.kind" => &["involvedObject", "kind"],
            "involvedObject.namespace" => &["involvedObject", "namespace"],
            "involvedObject.name" => &["involvedObject", "name"],
            "involvedObject.uid" => &["involvedObject", "uid"],
            "involvedObject.apiVersion" => &["involvedObject", "apiVersion"],
            "involvedObject.resourceVersion" => &["involvedObject", "resourceVersion"],
            "involvedObject.fieldPath" => &["involvedObject", "fieldPath"],
            "reason" => &["reason"],
            "reportingComponent" => &["reportingComponent"],
            "source" => &["source", "component"],
            "type" => &["type"],
            other => return Err(format!("field label not supported: {other}")),
        };
        terms.push((path, negate, value.trim().to_string()));
    }
    Ok(terms)
}

/// The string at `path`, "" when absent (as the server's selectable fields are).
fn json_str<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(v, |v, key| v.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub(super) fn get_event(shared: &Arc<Shared>, namespace: &str, name: &str) -> Reply {
    match shared
        .lock()
        .events
        .get(&(namespace.to_string(), name.to_string()))
    {
        Some(event) => Reply::Json(StatusCode::OK, event.clone()),
        None => not_found("events", name),
    }
}

/// `POST /api/v1/namespaces/{ns}/events`, with the real server's checks that matter
/// to an event writer: a name (or generateName), the namespace agreeing with the path
/// and with `involvedObject.namespace`, no resourceVersion, no duplicate name.
pub(super) fn create_event(
    shared: &Arc<Shared>,
    namespace: &str,
    query: &[(String, String)],
    raw: &[u8],
    body: Option<Value>,
) -> Reply {
    let Some(mut event) = body.filter(Value::is_object) else {
        return bad_body(raw);
    };
    if let Some(kind) = event.get("kind").and_then(Value::as_str) {
        if kind != "Event" {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("the body is a {kind:?}, not an Event"),
                None,
            );
        }
    }
    let body_ns = namespace_of(&event);
    if !body_ns.is_empty() && body_ns != namespace {
        return error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({namespace})"
            ),
            None,
        );
    }
    if meta_str(&event, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "resourceVersion should not be set on objects to be created".to_string(),
            None,
        );
    }
    let mut st = shared.lock();
    let mut name = name_of(&event).to_string();
    if name.is_empty() {
        let prefix = meta_str(&event, "generateName").unwrap_or("").to_string();
        if prefix.is_empty() {
            return invalid(
                "",
                "metadata.name: Required value: name or generateName is required".to_string(),
            );
        }
        name = format!("{prefix}{}", generated_suffix(st.next_serial()));
    }
    if let Some(reply) = validate_event(&event, namespace, &name) {
        return reply;
    }
    if st
        .events
        .contains_key(&(namespace.to_string(), name.clone()))
    {
        return error(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("events {name:?} already exists"),
            Some(json!({"name": name, "kind": "events"})),
        );
    }
    let uid = st.new_uid();
    let rv = st.rv + 1;
    if let Some(o) = event.as_object_mut() {
        o.insert("kind".into(), "Event".into());
        o.insert("apiVersion".into(), "v1".into());
    }
    let meta = meta_mut(&mut event);
    meta["name"] = name.clone().into();
    meta["namespace"] = namespace.into();
    meta["uid"] = uid.into();
    meta["resourceVersion"] = rv.to_string().into();
    meta["creationTimestamp"] = now_rfc3339().into();
    if !dry_run(query) {
        st.rv = rv;
        st.events
            .insert((namespace.to_string(), name), event.clone());
    }
    Reply::Json(StatusCode::CREATED, event)
}

/// `PATCH /api/v1/namespaces/{ns}/events/{name}`: both merge-patch content types are
/// applied as an RFC 7386 merge patch (for an Event's fields strategic merge is the
/// same, as none of them is a list with a merge key). A `metadata.resourceVersion` in
/// the patch is a precondition, as on the real server.
pub(super) fn patch_event(
    shared: &Arc<Shared>,
    namespace: &str,
    name: &str,
    req: &Recorded,
    body: Option<Value>,
) -> Reply {
    let content_type = req
        .content_type
        .as_deref()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if content_type != "application/merge-patch+json"
        && content_type != "application/strategic-merge-patch+json"
    {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json (the fake apiserver does not do {content_type:?})"
            ),
            None,
        );
    }
    let Some(patch) = body.filter(Value::is_object) else {
        return error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the patch is not a JSON object".to_string(),
            None,
        );
    };
    let mut st = shared.lock();
    let key = (namespace.to_string(), name.to_string());
    let Some(current) = st.events.get(&key) else {
        return not_found("events", name);
    };
    let current_rv = meta_str(current, "resourceVersion")
        .unwrap_or("")
        .to_string();
    if let Some(want) = meta_str(&patch, "resourceVersion") {
        if want != current_rv {
            return error(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on events {name:?}: the object has been modified; please apply your changes to the latest version and try again (patch has resourceVersion {want}, stored {current_rv})"
                ),
                Some(json!({"name": name, "kind": "events"})),
            );
        }
    }
    let mut patched = current.clone();
    merge_patch(&mut patched, &patch);
    // What a patch may not change.
    for field in ["name", "namespace", "uid", "creationTimestamp"] {
        match current.get("metadata").and_then(|m| m.get(field)) {
            Some(v) => meta_mut(&mut patched)[field] = v.clone(),
            None => meta_remove(&mut patched, field),
        }
    }
    if let Some(o) = patched.as_object_mut() {
        o.insert("kind".into(), "Event".into());
        o.insert("apiVersion".into(), "v1".into());
    }
    if let Some(reply) = validate_event(&patched, namespace, name) {
        return reply;
    }
    let rv = st.rv + 1;
    meta_mut(&mut patched)["resourceVersion"] = rv.to_string().into();
    if !dry_run(&req.query) {
        st.rv = rv;
        st.events.insert(key, patched.clone());
    }
    Reply::Json(StatusCode::OK, patched)
}

/// The real server's rule for core/v1 Events: the event lives in its involved
/// object's namespace, and one about a cluster-scoped object (a PV, a node) in
/// `default`.
fn validate_event(event: &Value, namespace: &str, name: &str) -> Option<Reply> {
    let involved_ns = event
        .get("involvedObject")
        .and_then(|o| o.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let ok = if involved_ns.is_empty() {
        namespace.is_empty() || namespace == "default"
    } else {
        involved_ns == namespace
    };
    if ok {
        None
    } else {
        Some(invalid(
            name,
            format!(
                "involvedObject.namespace: Invalid value: {involved_ns:?}: does not match event.namespace ({namespace:?})"
            ),
        ))
    }
}

/// RFC 7386 JSON merge patch: objects merge recursively, `null` removes, anything
/// else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// Five characters in the alphabet Kubernetes uses for generateName suffixes.
fn generated_suffix(mut n: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut out = String::with_capacity(5);
    // Spread consecutive serials apart so names do not look sequential.
    n = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for _ in 0..5 {
        out.push(ALPHABET[(n % ALPHABET.len() as u64) as usize] as char);
        n /= ALPHABET.len() as u64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut target = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(
            &mut target,
            &json!({"a": "z", "c": {"f": null}, "l": [3], "n": {"x": 1}}),
        );
        assert_eq!(
            target,
            json!({"a": "z", "c": {"d": "e"}, "l": [3], "n": {"x": 1}})
        );
    }

    #[test]
    fn event_field_selectors() {
        let terms = event_terms("reportingComponent=agent,involvedObject.kind!=Node").unwrap();
        let ev = json!({"reportingComponent": "agent", "involvedObject": {"kind": "Pod"}});
        assert!(terms
            .iter()
            .all(|(p, neg, val)| (json_str(&ev, p) == val) != *neg));
        assert_eq!(json_str(&ev, &["source", "component"]), "");
        assert_eq!(
            event_terms("source.host=node-1").unwrap_err(),
            "field label not supported: source.host"
        );
    }

    #[test]
    fn generated_names_are_distinct() {
        let names: std::collections::BTreeSet<String> = (1..100).map(generated_suffix).collect();
        assert_eq!(names.len(), 99);
        assert!(names.iter().all(|n| n.len() == 5));
    }
}
