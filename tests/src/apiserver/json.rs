//! The JSON shapes of the API: object metadata, list bodies, watch lines, Status
//! objects and Kubernetes timestamps.

use http::StatusCode;
use hyper::body::Bytes;
use serde_json::{json, Map, Value};

use super::store::Kind;

pub(super) fn name_of(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

pub(super) fn namespace_of(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or("")
}

pub(super) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// `obj.metadata`, made an object (and `obj` too) if it was not, so indexing it
/// with a string never panics.
pub(super) fn meta_mut(obj: &mut Value) -> &mut Value {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    // Indexing an object by a string inserts the key if missing.
    let meta = &mut obj["metadata"];
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta
}

/// Removes `obj.metadata.field`.
pub(super) fn meta_remove(obj: &mut Value, field: &str) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove(field);
    }
}

/// A list body; items lose `kind`/`apiVersion`, as in a real server's lists.
pub(super) fn list_json(kind: &str, metadata: Map<String, Value>, items: Vec<Value>) -> Value {
    let items: Vec<Value> = items
        .into_iter()
        .map(|mut item| {
            if let Some(o) = item.as_object_mut() {
                o.remove("kind");
                o.remove("apiVersion");
            }
            item
        })
        .collect();
    json!({"kind": kind, "apiVersion": "v1", "metadata": metadata, "items": items})
}

pub(super) fn watch_line(kind: &str, obj: &Value) -> Bytes {
    line(&json!({"type": kind, "object": obj}))
}

/// A BOOKMARK: only kind, apiVersion and resourceVersion (what kube-rs parses), plus
/// the end-of-initial-events annotation for streaming lists.
pub(super) fn bookmark_line(kind: Kind, rv: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(&json!({
        "type": "BOOKMARK",
        "object": {"kind": kind.kind(), "apiVersion": "v1", "metadata": metadata},
    }))
}

/// The 410 a watch from a compacted version gets: a 200 stream with one ERROR event,
/// as the real server does (kube-rs's watcher relists on it; an HTTP 410 instead would
/// make it retry the same watch forever).
pub(super) fn too_old_line(asked: u64, compacted: u64) -> Bytes {
    line(&json!({
        "type": "ERROR",
        "object": status_json(
            StatusCode::GONE,
            "Expired",
            &format!("too old resource version: {asked} ({compacted})"),
            None,
        ),
    }))
}

fn line(value: &Value) -> Bytes {
    let mut text = value.to_string();
    text.push('\n');
    Bytes::from(text)
}

pub(super) fn status_json(
    code: StatusCode,
    reason: &str,
    message: &str,
    details: Option<Value>,
) -> Value {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    if let Some(details) = details {
        status["details"] = details;
    }
    status
}

/// Now in the second-precision RFC 3339 form of Kubernetes timestamps.
pub(super) fn now_rfc3339() -> String {
    let format =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    time::OffsetDateTime::now_utc()
        .format(format)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}
