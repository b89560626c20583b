//! What a handler answers: a JSON body with its status or a watch stream, and the
//! error Statuses a real server gives.

use http::StatusCode;
use hyper::body::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::json::status_json;

/// What a handler decided.
pub(super) enum Reply {
    Json(StatusCode, Value),
    Watch(mpsc::Receiver<Bytes>),
}

pub(super) fn error(
    code: StatusCode,
    reason: &str,
    message: String,
    details: Option<Value>,
) -> Reply {
    Reply::Json(code, status_json(code, reason, &message, details))
}

pub(super) fn not_found(resource: &str, name: &str) -> Reply {
    error(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{resource} {name:?} not found"),
        Some(json!({"name": name, "kind": resource})),
    )
}

pub(super) fn invalid(name: &str, cause: String) -> Reply {
    error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("Event {name:?} is invalid: {cause}"),
        Some(json!({"name": name, "kind": "Event"})),
    )
}

pub(super) fn bad_body(raw: &[u8]) -> Reply {
    let shown: String = String::from_utf8_lossy(raw).chars().take(200).collect();
    error(
        StatusCode::BAD_REQUEST,
        "BadRequest",
        format!("the request body is not a JSON object: {shown:?}"),
        None,
    )
}
