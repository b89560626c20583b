//! The part of server-side apply the agent relies on: each field is owned by the
//! field managers that applied it, an apply sets what it sends (taking ownership,
//! and with `force` taking it away from managers that set another value), and a
//! field the manager owned and no longer sends is removed once nobody owns it.
//!
//! Fields are coarser than the real server's: a value at a path is atomic (a whole
//! `spec.x`, a whole `status.conditions` list), and a list-map entry keyed by `name`
//! (`status.sources[name=Node/a]`) is owned as a whole. That is what the agent's
//! writers need: each owns whole entries and the shared summary fields.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

/// One field as apply tracks it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Field {
    /// The value at this path of object keys.
    At(Vec<String>),
    /// The entry named `.1` of the list at path `.0` (a list-map keyed by `name`).
    Entry(Vec<String>, String),
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::At(path) => write!(f, ".{}", path.join(".")),
            Field::Entry(path, name) => write!(f, ".{}[name={name:?}]", path.join(".")),
        }
    }
}

impl Field {
    /// `Some("status")` for the status subresource's fields.
    fn subresource(&self) -> Option<&str> {
        let (Field::At(path) | Field::Entry(path, _)) = self;
        path.first().map(String::as_str).filter(|p| *p == "status")
    }
}

/// Field → the managers owning it, per stored object.
pub(super) type Owners = BTreeMap<Field, BTreeSet<String>>;

/// The fields of `value` under `path`: one per key of an object, `At` otherwise.
pub(super) fn fields_under(path: &[&str], value: &Value) -> Vec<(Field, Value)> {
    let base: Vec<String> = path.iter().map(|s| s.to_string()).collect();
    match value.as_object() {
        Some(map) => map
            .iter()
            .map(|(k, v)| {
                let mut p = base.clone();
                p.push(k.clone());
                (Field::At(p), v.clone())
            })
            .collect(),
        None => vec![(Field::At(base), value.clone())],
    }
}

/// The entries of a list-map keyed by `name`; Err names what is wrong (an entry
/// without a name, a name twice), as the real server's 422 does.
pub(super) fn entries(path: &[&str], list: &Value) -> Result<Vec<(Field, Value)>, String> {
    let base: Vec<String> = path.iter().map(|s| s.to_string()).collect();
    let Some(items) = list.as_array() else {
        return Err(format!(".{}: must be a list", base.join(".")));
    };
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for item in items {
        let Some(name) = item.get("name").and_then(Value::as_str) else {
            return Err(format!(".{}: an entry has no name: {item}", base.join(".")));
        };
        if !seen.insert(name.to_string()) {
            return Err(format!(
                ".{}: duplicate entries for key [name={name:?}]",
                base.join(".")
            ));
        }
        out.push((Field::Entry(base.clone(), name.to_string()), item.clone()));
    }
    Ok(out)
}

/// Applies `sent` for `manager` to `obj`; Err is the conflict message (409) when
/// not forced and another manager owns a field sent with a different value.
/// Only fields of `subresource` are the apply's ("status", or `None` for the
/// object without its status): what the same manager applied to the other is
/// kept, as the real server tracks them apart.
pub(super) fn apply(
    obj: &mut Value,
    owners: &mut Owners,
    manager: &str,
    subresource: Option<&str>,
    sent: Vec<(Field, Value)>,
    force: bool,
) -> Result<(), String> {
    if !force {
        let conflicts: Vec<String> = sent
            .iter()
            .filter(|(f, v)| get(obj, f).is_some_and(|cur| cur != v))
            .filter_map(|(f, _)| {
                let others: Vec<&String> =
                    owners.get(f)?.iter().filter(|m| *m != manager).collect();
                (!others.is_empty()).then(|| format!("conflict with {others:?}: {f}"))
            })
            .collect();
        if !conflicts.is_empty() {
            return Err(format!(
                "Apply failed with {} conflict(s): {}",
                conflicts.len(),
                conflicts.join("; ")
            ));
        }
    }
    let sent_fields: BTreeSet<&Field> = sent.iter().map(|(f, _)| f).collect();
    let mut dropped = Vec::new();
    for (field, managers) in owners.iter_mut() {
        if field.subresource() != subresource || sent_fields.contains(field) {
            continue;
        }
        if managers.remove(manager) && managers.is_empty() {
            dropped.push(field.clone());
        }
    }
    for field in dropped {
        owners.remove(&field);
        remove(obj, &field);
    }
    for (field, value) in sent {
        let same = get(obj, &field) == Some(&value);
        set(obj, &field, value);
        let managers = owners.entry(field).or_default();
        // A new value is this manager's alone (forced or uncontested).
        if !same {
            managers.clear();
        }
        managers.insert(manager.to_string());
    }
    Ok(())
}

fn parent<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(obj, |v, k| v.get(k))
}

fn get<'a>(obj: &'a Value, field: &Field) -> Option<&'a Value> {
    match field {
        Field::At(path) => parent(obj, path),
        Field::Entry(path, name) => parent(obj, path)?
            .as_array()?
            .iter()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(name)),
    }
}

/// The value at `path`, objects made on the way (anything else there replaced).
fn slot<'a>(obj: &'a mut Value, path: &[String]) -> &'a mut Value {
    path.iter().fold(obj, |v, k| {
        if !v.is_object() {
            *v = Value::Object(Map::new());
        }
        &mut v[k.as_str()]
    })
}

fn set(obj: &mut Value, field: &Field, value: Value) {
    match field {
        Field::At(path) => *slot(obj, path) = value,
        Field::Entry(path, name) => {
            let list = slot(obj, path);
            if !list.is_array() {
                *list = Value::Array(Vec::new());
            }
            if let Some(items) = list.as_array_mut() {
                match items
                    .iter_mut()
                    .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
                {
                    Some(e) => *e = value,
                    // New entries go last, existing ones keep their place.
                    None => items.push(value),
                }
            }
        }
    }
}

fn remove(obj: &mut Value, field: &Field) {
    let (path, name) = match field {
        Field::At(path) => (path, None),
        Field::Entry(path, name) => (path, Some(name)),
    };
    let mut v = obj;
    let last = match name {
        Some(_) => path.len(),
        None => path.len().saturating_sub(1),
    };
    for k in &path[..last] {
        match v.get_mut(k) {
            Some(next) => v = next,
            None => return,
        }
    }
    match name {
        Some(name) => {
            if let Some(items) = v.as_array_mut() {
                items.retain(|e| e.get("name").and_then(Value::as_str) != Some(name));
            }
        }
        None => {
            if let (Some(map), Some(k)) = (v.as_object_mut(), path.last()) {
                map.remove(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sources(obj: &Value) -> Vec<&str> {
        obj["status"]["sources"]
            .as_array()
            .map(|a| a.iter().filter_map(|e| e["name"].as_str()).collect())
            .unwrap_or_default()
    }

    const S: Option<&str> = Some("status");

    #[test]
    fn entries_belong_to_their_manager_and_shared_fields_to_the_last() {
        let mut obj = json!({"metadata": {"name": "x"}});
        let mut owners = Owners::new();
        let status = |health: &str, names: &[&str]| {
            let list: Vec<Value> = names.iter().map(|n| json!({"name": n, "v": 1})).collect();
            let mut sent = fields_under(&["status"], &json!({"health": health}));
            sent.extend(entries(&["status", "sources"], &json!(list)).unwrap());
            sent
        };
        apply(
            &mut obj,
            &mut owners,
            "a",
            S,
            status("Degraded", &["A"]),
            true,
        )
        .unwrap();
        apply(
            &mut obj,
            &mut owners,
            "b",
            S,
            status("Inaccessible", &["B"]),
            true,
        )
        .unwrap();
        assert_eq!(sources(&obj), ["A", "B"]);
        assert_eq!(obj["status"]["health"], "Inaccessible");
        // `a` no longer sends its entry: it goes; `b`'s stays.
        apply(&mut obj, &mut owners, "a", S, status("Degraded", &[]), true).unwrap();
        assert_eq!(sources(&obj), ["B"]);
        assert_eq!(obj["status"]["health"], "Degraded");
        // `b` stops sending health, but `a` owns it now: it stays.
        apply(
            &mut obj,
            &mut owners,
            "b",
            S,
            entries(&["status", "sources"], &json!([{"name": "B"}])).unwrap(),
            true,
        )
        .unwrap();
        assert_eq!(obj["status"]["health"], "Degraded");
        // Unforced, a different value of another's field is a conflict.
        let err = apply(
            &mut obj,
            &mut owners,
            "b",
            S,
            status("Healthy", &["B"]),
            false,
        )
        .unwrap_err();
        assert_eq!(
            err,
            "Apply failed with 1 conflict(s): conflict with [\"a\"]: .status.health"
        );
        // The same value is shared ownership: both must drop it for it to go.
        apply(
            &mut obj,
            &mut owners,
            "b",
            S,
            status("Degraded", &["B"]),
            false,
        )
        .unwrap();
        apply(&mut obj, &mut owners, "a", S, vec![], true).unwrap();
        assert_eq!(obj["status"]["health"], "Degraded");
        apply(&mut obj, &mut owners, "b", S, vec![], true).unwrap();
        assert_eq!(obj["status"], json!({"sources": []}));
        assert!(owners.is_empty());
    }

    #[test]
    fn the_object_and_its_status_are_applied_apart() {
        let mut obj = json!({});
        let mut owners = Owners::new();
        let spec = fields_under(&["spec"], &json!({"claim": "data"}));
        apply(&mut obj, &mut owners, "m", None, spec, true).unwrap();
        let status = fields_under(&["status"], &json!({"health": "Healthy"}));
        apply(&mut obj, &mut owners, "m", S, status, true).unwrap();
        assert_eq!(
            obj,
            json!({"spec": {"claim": "data"}, "status": {"health": "Healthy"}})
        );
        apply(&mut obj, &mut owners, "m", None, vec![], true).unwrap();
        assert_eq!(obj, json!({"spec": {}, "status": {"health": "Healthy"}}));
    }

    #[test]
    fn list_maps_need_unique_names() {
        assert_eq!(
            entries(&["s"], &json!([{"name": "a"}, {"name": "a"}])).unwrap_err(),
            ".s: duplicate entries for key [name=\"a\"]"
        );
        assert_eq!(
            entries(&["s"], &json!([{}])).unwrap_err(),
            ".s: an entry has no name: {}"
        );
        assert_eq!(
            entries(&["s"], &json!({})).unwrap_err(),
            ".s: must be a list"
        );
    }
}
