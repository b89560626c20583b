//! What a list or watch selects (kind, namespace, `fieldSelector` and
//! `labelSelector` terms), and the
//! watch event a change means for a selection.

use hyper::body::Bytes;
use serde_json::Value;

use super::json::{meta_mut, name_of, namespace_of, watch_line};
use super::labels::LabelSelector;
use super::query::param;
use super::store::{Change, Kind};

/// A field a selector may test: the ones the real server indexes for these kinds
/// that the agent could use. Others are refused, as the real server refuses them.
#[derive(Clone, Copy, Debug)]
enum Field {
    Name,
    Namespace,
    NodeName,
}

#[derive(Clone, Debug)]
struct Term {
    field: Field,
    negate: bool,
    value: String,
}

/// What a list or watch selects: kind, namespace (None: all) and field terms (all
/// must hold).
#[derive(Clone, Debug)]
pub(super) struct WatchSpec {
    pub(super) kind: Kind,
    namespace: Option<String>,
    terms: Vec<Term>,
    labels: LabelSelector,
}

impl WatchSpec {
    /// From the request's namespace and `fieldSelector`/`labelSelector`; Err is the
    /// 400 message.
    pub(super) fn parse(
        kind: Kind,
        namespace: Option<&str>,
        query: &[(String, String)],
    ) -> Result<Self, String> {
        let labels = LabelSelector::parse(param(query, "labelSelector"))?;
        let mut terms = Vec::new();
        for term in param(query, "fieldSelector").unwrap_or("").split(',') {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let (field, negate, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, false, v)
            } else {
                return Err(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                ));
            };
            let field = match (field.trim(), kind) {
                ("metadata.name", _) => Field::Name,
                ("metadata.namespace", _) => Field::Namespace,
                ("spec.nodeName", Kind::Pod) => Field::NodeName,
                (other, _) => return Err(format!("field label not supported: {other}")),
            };
            terms.push(Term {
                field,
                negate,
                value: value.trim().to_string(),
            });
        }
        Ok(WatchSpec {
            kind,
            namespace: namespace.map(str::to_string),
            terms,
            labels,
        })
    }

    pub(super) fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if namespace_of(obj) != ns {
                return false;
            }
        }
        if !self.labels.matches(obj) {
            return false;
        }
        self.terms.iter().all(|t| {
            let actual = match t.field {
                Field::Name => name_of(obj),
                Field::Namespace => namespace_of(obj),
                // An unscheduled pod has nodeName "" for selectors.
                Field::NodeName => obj
                    .get("spec")
                    .and_then(|s| s.get("nodeName"))
                    .and_then(Value::as_str)
                    .unwrap_or(""),
            };
            (actual == t.value) != t.negate
        })
    }

    /// The watch event a change means for this selection, if any: an object that
    /// starts matching is ADDED, one that stops is DELETED with its previous content
    /// at the change's version (as the real watch cache does).
    pub(super) fn event_for(&self, change: &Change) -> Option<Bytes> {
        let before = change.before.as_ref().filter(|o| self.matches(o));
        let after = change.after.as_ref().filter(|o| self.matches(o));
        match (before, after) {
            (Some(_), Some(obj)) => Some(watch_line("MODIFIED", obj)),
            (None, Some(obj)) => Some(watch_line("ADDED", obj)),
            (Some(obj), None) => {
                let mut obj = obj.clone();
                meta_mut(&mut obj)["resourceVersion"] = change.rv.to_string().into();
                Some(watch_line("DELETED", &obj))
            }
            (None, None) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn selector_terms() {
        let q = vec![(
            "fieldSelector".to_string(),
            "spec.nodeName=node-1".to_string(),
        )];
        let spec = WatchSpec::parse(Kind::Pod, None, &q).unwrap();
        assert!(spec.matches(&json!({"metadata": {"name": "a"}, "spec": {"nodeName": "node-1"}})));
        assert!(!spec.matches(&json!({"metadata": {"name": "a"}, "spec": {"nodeName": "node-2"}})));
        assert!(!spec.matches(&json!({"metadata": {"name": "a"}, "spec": {}})));
        let q = vec![(
            "fieldSelector".to_string(),
            "spec.nodeName!=,metadata.namespace==ns".to_string(),
        )];
        let spec = WatchSpec::parse(Kind::Pod, None, &q).unwrap();
        assert!(spec.matches(&json!({"metadata": {"namespace": "ns"}, "spec": {"nodeName": "x"}})));
        assert!(!spec.matches(&json!({"metadata": {"namespace": "ns"}, "spec": {}})));
        let q = vec![("fieldSelector".to_string(), "spec.nodeName=x".to_string())];
        let err = WatchSpec::parse(Kind::PersistentVolume, None, &q).unwrap_err();
        assert_eq!(err, "field label not supported: spec.nodeName");
    }
}
