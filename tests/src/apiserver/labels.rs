//! `labelSelector`, as the real server reads the equality-based forms:
//! `k=v`, `k==v`, `k!=v`, `k` (the label exists) and `!k` (it does not); all
//! terms must hold. The set-based forms (`in`, `notin`) are refused with a
//! 400 naming the fake, so that a client starting to use them is noticed.

use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Test {
    Equals(String),
    NotEquals(String),
    Exists,
    Absent,
}

#[derive(Clone, Debug, Default)]
pub(super) struct LabelSelector {
    terms: Vec<(String, Test)>,
}

impl LabelSelector {
    /// From the `labelSelector` parameter (absent or empty: everything);
    /// Err is the 400 message.
    pub(super) fn parse(selector: Option<&str>) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in selector.unwrap_or("").split(',').map(str::trim) {
            if term.is_empty() {
                continue;
            }
            if term.contains(" in ") || term.contains(" notin ") || term.contains('(') {
                return Err(format!(
                    "labelSelector term {term:?}: set-based selectors are not supported by the fake apiserver"
                ));
            }
            let (key, test) = if let Some((k, v)) = term.split_once("!=") {
                (k, Test::NotEquals(v.trim().to_string()))
            } else if let Some((k, v)) = term.split_once("==") {
                (k, Test::Equals(v.trim().to_string()))
            } else if let Some((k, v)) = term.split_once('=') {
                (k, Test::Equals(v.trim().to_string()))
            } else if let Some(k) = term.strip_prefix('!') {
                (k, Test::Absent)
            } else {
                (term, Test::Exists)
            };
            let key = key.trim();
            if key.is_empty() {
                return Err(format!("invalid label selector: {term:?}"));
            }
            terms.push((key.to_string(), test));
        }
        Ok(LabelSelector { terms })
    }

    pub(super) fn matches(&self, obj: &Value) -> bool {
        let labels = obj.get("metadata").and_then(|m| m.get("labels"));
        self.terms.iter().all(|(key, test)| {
            let value = labels.and_then(|l| l.get(key)).and_then(Value::as_str);
            match test {
                Test::Equals(v) => value == Some(v.as_str()),
                // As the real server: a missing label is not equal to v.
                Test::NotEquals(v) => value != Some(v.as_str()),
                Test::Exists => value.is_some(),
                Test::Absent => value.is_none(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn equality_and_existence_terms() {
        let obj = json!({"metadata": {"labels": {"volume-health.io/node": "node-1",
                                                   "node.volume-health.io/node-1": ""}}});
        let bare = json!({"metadata": {}});
        let s = |q: &str| LabelSelector::parse(Some(q)).unwrap();
        assert!(s("volume-health.io/node=node-1").matches(&obj));
        assert!(!s("volume-health.io/node=node-2").matches(&obj));
        assert!(!s("volume-health.io/node==node-1").matches(&bare));
        assert!(s("node.volume-health.io/node-1").matches(&obj));
        assert!(!s("node.volume-health.io/node-2").matches(&obj));
        assert!(s("!node.volume-health.io/node-2").matches(&obj));
        assert!(s("volume-health.io/node!=node-2").matches(&bare));
        assert!(!s("volume-health.io/node=node-1,!node.volume-health.io/node-1").matches(&obj));
        assert!(LabelSelector::parse(None).unwrap().matches(&bare));
        assert_eq!(
            LabelSelector::parse(Some("env in (a,b)")).unwrap_err(),
            "labelSelector term \"env in (a\": set-based selectors are not supported by the fake apiserver"
        );
    }
}
