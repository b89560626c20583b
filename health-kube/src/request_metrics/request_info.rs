//! A request's verb and resource as the API server names them in its
//! audit log and authorization (its `RequestInfo`), from the method and
//! the URL alone.

use http::Method;

/// The verb and resource of a request as the API server's audit log names
/// them (its request info: `k8s.io/apiserver/pkg/endpoints/request/
/// requestinfo.go`, `NewRequestInfo`):
/// - resource requests (`/api/v1/...`, `/apis/<group>/<version>/...`):
///   `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
///   `deletecollection` (or `proxy`), and the resource with its
///   subresource (`volumehealths/status`); the group is not named;
/// - anything else (`/api`, `/apis/<group>`, `/version`, `/readyz`): the
///   lowercase HTTP method, and the path as the resource.
///
/// `path_and_query` is as sent (`/api/v1/pods?watch=true`). Path segments
/// are compared as sent: the API paths kube builds need no escaping.
pub fn classify(method: &Method, path_and_query: &str) -> (String, String) {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let non_resource = || (method.as_str().to_ascii_lowercase(), path.to_string());
    let trimmed = path.trim_matches('/');
    let parts: Vec<&str> = if trimmed.is_empty() {
        Vec::new()
    } else {
        trimmed.split('/').collect()
    };
    // After the prefix (and group) and the version: what names the
    // resource. `/api/<v>/x` needs 3 segments, `/apis/<g>/<v>/x` 4.
    let mut rest = match parts.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => rest,
        ["apis", _group, _version, rest @ ..] if !rest.is_empty() => rest,
        _ => return non_resource(),
    };
    let mut verb = match *method {
        Method::POST => "create",
        Method::GET | Method::HEAD => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    };
    // `/api/v1/watch/...` and `/api/v1/proxy/...`: the verb in the path.
    if let [special @ ("watch" | "proxy"), after @ ..] = rest {
        verb = special;
        if after.is_empty() {
            // The server refuses it; nothing names a resource.
            return (verb.to_string(), String::new());
        }
        rest = after;
    }
    // `namespaces/<ns>/<resource>/...`, except a namespace's own
    // subresources (`namespaces/<ns>/status`, `.../finalize`).
    if let ["namespaces", _ns, next, ..] = rest {
        if !matches!(*next, "status" | "finalize") {
            rest = &rest[2..];
        }
    }
    let named = rest.get(1).is_some_and(|name| !name.is_empty());
    let resource = match rest {
        [resource, _name, sub, ..] if verb != "proxy" => format!("{resource}/{sub}"),
        [resource, ..] => resource.to_string(),
        [] => String::new(),
    };
    if !named && verb == "get" {
        verb = if watch_requested(query) {
            "watch"
        } else {
            "list"
        };
    }
    if !named && verb == "delete" {
        verb = "deletecollection";
    }
    (verb.to_string(), resource)
}

/// The server's reading of `watch=`: its first value, unless `false` (any
/// case) or `0`, means a watch (`watch=`, `watch=1`, `watch=true`).
fn watch_requested(query: &str) -> bool {
    form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == "watch")
        .is_some_and(|(_, value)| !(value == "0" || value.eq_ignore_ascii_case("false")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(method: Method, path: &str) -> (String, String) {
        classify(&method, path)
    }

    fn is(verb: &str, resource: &str) -> (String, String) {
        (verb.to_string(), resource.to_string())
    }

    #[test]
    fn core_group_lists_watches_and_gets() {
        assert_eq!(
            c(
                Method::GET,
                "/api/v1/pods?&fieldSelector=spec.nodeName%3Dnode-1&limit=500&resourceVersion=0"
            ),
            is("list", "pods")
        );
        assert_eq!(
            c(
                Method::GET,
                "/api/v1/pods?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=12"
            ),
            is("watch", "pods")
        );
        assert_eq!(
            c(Method::GET, "/api/v1/persistentvolumes/pv-1"),
            is("get", "persistentvolumes")
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/shop/events?&limit=500"),
            is("list", "events")
        );
        assert_eq!(
            c(
                Method::GET,
                "/api/v1/namespaces/shop/persistentvolumeclaims/data"
            ),
            is("get", "persistentvolumeclaims")
        );
        assert_eq!(c(Method::HEAD, "/api/v1/nodes/n"), is("get", "nodes"));
    }

    #[test]
    fn writes_by_method() {
        assert_eq!(
            c(Method::POST, "/api/v1/namespaces/shop/events?"),
            is("create", "events")
        );
        assert_eq!(
            c(Method::PATCH, "/api/v1/namespaces/shop/events/web-0.1"),
            is("patch", "events")
        );
        assert_eq!(
            c(
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/csi/leases/l"
            ),
            is("update", "leases")
        );
        assert_eq!(
            c(Method::DELETE, "/api/v1/namespaces/shop/pods/web-0"),
            is("delete", "pods")
        );
        assert_eq!(
            c(
                Method::DELETE,
                "/api/v1/namespaces/shop/pods?labelSelector=a%3Db"
            ),
            is("deletecollection", "pods")
        );
        assert_eq!(c(Method::OPTIONS, "/api/v1/pods"), is("", "pods"));
    }

    #[test]
    fn group_paths_and_subresources() {
        let status = "/apis/volume-health.io/v1alpha1/namespaces/shop/volumehealths/data/status?&fieldManager=x&force=true";
        assert_eq!(
            c(Method::PATCH, status),
            is("patch", "volumehealths/status")
        );
        assert_eq!(
            c(
                Method::PATCH,
                "/apis/volume-health.io/v1alpha1/namespaces/shop/volumehealths/data?&fieldManager=x"
            ),
            is("patch", "volumehealths")
        );
        assert_eq!(
            c(Method::GET, "/apis/volume-health.io/v1alpha1/volumehealths?&labelSelector=node.volume-health.io%2Fnode-1&limit=500"),
            is("list", "volumehealths")
        );
        assert_eq!(
            c(
                Method::GET,
                "/apis/coordination.k8s.io/v1/namespaces/csi/leases/l"
            ),
            is("get", "leases")
        );
        assert_eq!(
            c(
                Method::PATCH,
                "/api/v1/namespaces/shop/persistentvolumeclaims/data/status"
            ),
            is("patch", "persistentvolumeclaims/status")
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/shop/pods/web-0/log"),
            is("get", "pods/log")
        );
        // Cluster-scoped, with a subresource.
        assert_eq!(
            c(Method::PATCH, "/api/v1/nodes/node-1/status"),
            is("patch", "nodes/status")
        );
        // Only the first segment after the name is the subresource.
        assert_eq!(
            c(
                Method::GET,
                "/api/v1/namespaces/shop/pods/web-0/proxy/metrics"
            ),
            is("get", "pods/proxy")
        );
    }

    #[test]
    fn namespaces_themselves() {
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces"),
            is("list", "namespaces")
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/shop"),
            is("get", "namespaces")
        );
        assert_eq!(
            c(Method::PUT, "/api/v1/namespaces/shop/finalize"),
            is("update", "namespaces/finalize")
        );
        assert_eq!(
            c(Method::PATCH, "/api/v1/namespaces/shop/status"),
            is("patch", "namespaces/status")
        );
        // A namespace's resources, one of them named like a subresource
        // one level further down.
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/status/pods"),
            is("list", "pods")
        );
    }

    #[test]
    fn the_watch_parameter_as_the_server_reads_it() {
        for watch in [
            "watch=true",
            "watch=1",
            "watch=",
            "watch=yes",
            "watch=TRUE",
            "watch",
        ] {
            assert_eq!(
                c(Method::GET, &format!("/api/v1/pods?limit=1&{watch}")),
                is("watch", "pods"),
                "{watch}"
            );
        }
        for not in ["watch=false", "watch=False", "watch=0", "watching=true", ""] {
            assert_eq!(
                c(Method::GET, &format!("/api/v1/pods?{not}")),
                is("list", "pods"),
                "{not}"
            );
        }
        // The first value counts.
        assert_eq!(
            c(Method::GET, "/api/v1/pods?watch=0&watch=1"),
            is("list", "pods")
        );
        assert_eq!(
            c(Method::GET, "/api/v1/pods?watch=%31"),
            is("watch", "pods")
        );
        // On a named object it is a get, as the server names it.
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/shop/pods/web-0?watch=true"),
            is("get", "pods")
        );
    }

    #[test]
    fn verbs_in_the_path() {
        assert_eq!(
            c(Method::GET, "/api/v1/watch/namespaces/shop/pods"),
            is("watch", "pods")
        );
        assert_eq!(
            c(Method::GET, "/api/v1/watch/namespaces/shop/pods/web-0"),
            is("watch", "pods")
        );
        assert_eq!(
            c(
                Method::GET,
                "/apis/volume-health.io/v1alpha1/watch/volumehealths"
            ),
            is("watch", "volumehealths")
        );
        // A proxy has no subresource: the rest is the proxied path.
        assert_eq!(
            c(
                Method::GET,
                "/api/v1/proxy/namespaces/shop/pods/web-0/metrics"
            ),
            is("proxy", "pods")
        );
        assert_eq!(c(Method::GET, "/api/v1/watch"), is("watch", ""));
    }

    #[test]
    fn discovery_and_other_paths_are_not_resources() {
        for (method, path, verb) in [
            (Method::GET, "/api", "get"),
            (Method::GET, "/api/v1", "get"),
            (Method::GET, "/apis", "get"),
            (Method::GET, "/apis/volume-health.io", "get"),
            (Method::GET, "/apis/volume-health.io/v1alpha1", "get"),
            (Method::GET, "/version", "get"),
            (Method::GET, "/readyz", "get"),
            (Method::GET, "/", "get"),
            (Method::POST, "/logs/x", "post"),
        ] {
            assert_eq!(c(method, path), is(verb, path), "{path}");
        }
        assert_eq!(
            c(Method::GET, "/apis/volume-health.io/v1alpha1?timeout=32s"),
            is("get", "/apis/volume-health.io/v1alpha1")
        );
        // Not an API prefix.
        assert_eq!(
            c(Method::GET, "/openapi/v2/x/y"),
            is("get", "/openapi/v2/x/y")
        );
    }
}
