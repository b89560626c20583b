//! Reads of the stored kinds (pods, PVs, PVCs, VolumeHealths): get, and lists paginated over snapshots. A `watch=true`
//! request is handed on to [`super::watches`].

use std::sync::Arc;

use http::StatusCode;
use serde_json::Map;

use super::json::list_json;
use super::query::{is_watch, param};
use super::reply::{error, not_found, Reply};
use super::select::WatchSpec;
use super::store::{Kind, PageSnapshot, Shared, State};
use super::watches::start_watch;

/// Paginated list snapshots kept for `continue` tokens; older tokens get 410.
const PAGE_SNAPSHOT_LIMIT: usize = 64;

/// List or watch of a stored kind.
pub(super) fn collection(
    shared: &Arc<Shared>,
    kind: Kind,
    namespace: Option<&str>,
    query: &[(String, String)],
) -> Reply {
    let spec = match WatchSpec::parse(kind, namespace, query) {
        Ok(spec) => spec,
        Err(message) => return error(StatusCode::BAD_REQUEST, "BadRequest", message, None),
    };
    if is_watch(query) {
        start_watch(shared, spec, query)
    } else {
        list(&mut shared.lock(), spec, query)
    }
}

/// A list, paginated over a snapshot when `limit` is given (kube-rs's watcher sends
/// `limit=500`), so `continue` pages are consistent with the first.
fn list(st: &mut State, spec: WatchSpec, query: &[(String, String)]) -> Reply {
    let limit = match param(query, "limit").map(str::parse::<usize>) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("invalid limit {:?}", param(query, "limit").unwrap_or("")),
                None,
            )
        }
    };
    let (rv, mut items) = match param(query, "continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let Some(pos) = st
                .pages
                .iter()
                .position(|p| p.token == token && p.kind == spec.kind)
            else {
                return error(
                    StatusCode::GONE,
                    "Expired",
                    format!(
                        "The provided continue parameter is too old to display a consistent list result ({token:?} is unknown to the fake apiserver). You can start a new list without the continue parameter."
                    ),
                    None,
                );
            };
            match st.pages.remove(pos) {
                Some(page) => (page.rv, page.items),
                None => (st.rv, Vec::new()),
            }
        }
        None => {
            if param(query, "resourceVersionMatch") == Some("Exact") {
                let asked = param(query, "resourceVersion").unwrap_or("");
                if asked != st.rv.to_string() {
                    return error(
                        StatusCode::GONE,
                        "Expired",
                        format!(
                            "too old resource version: {asked} ({}); the fake apiserver serves only the current version exactly",
                            st.rv
                        ),
                        None,
                    );
                }
            }
            (st.rv, st.current(&spec))
        }
    };
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), rv.to_string().into());
    if limit > 0 && items.len() > limit {
        let rest = items.split_off(limit);
        let token = format!("fake-continue-{}", st.next_serial());
        metadata.insert("continue".into(), token.clone().into());
        metadata.insert("remainingItemCount".into(), rest.len().into());
        st.pages.push_back(PageSnapshot {
            token,
            rv,
            kind: spec.kind,
            items: rest,
        });
        while st.pages.len() > PAGE_SNAPSHOT_LIMIT {
            st.pages.pop_front();
        }
    }
    let mut body = list_json(spec.kind.list_kind(), metadata, items);
    body["apiVersion"] = spec.kind.api_version().into();
    Reply::Json(StatusCode::OK, body)
}

pub(super) fn get_object(shared: &Arc<Shared>, kind: Kind, namespace: &str, name: &str) -> Reply {
    let st = shared.lock();
    match st
        .objects
        .get(&(kind, namespace.to_string(), name.to_string()))
    {
        Some(obj) => Reply::Json(StatusCode::OK, obj.clone()),
        None => not_found(kind.plural(), name),
    }
}
