//! PromQL checked against the exported series: each expression is parsed
//! with promql-parser, every selector must name an exported series, and
//! every label in a matcher, `by`/`without`, `on`/`ignoring` or
//! `group_left`/`group_right` must be one the series under it carry (their
//! own or a target label). Each expression also yields the labels its
//! result carries, against which legends and alert texts are checked.

use std::collections::BTreeSet;

use promql_parser::label::METRIC_NAME;
use promql_parser::parser::{self, Expr, LabelModifier, VectorMatchCardinality, VectorSelector};

use super::exported::{Exported, TARGET_LABELS};

/// Labels of a result; None for a scalar or a string.
pub type Labels = Option<BTreeSet<String>>;

/// Collects every problem of every expression, so that one run names them
/// all; [`Checker::assert_clean`] fails with the list.
pub struct Checker<'a> {
    exported: &'a Exported,
    pub problems: Vec<String>,
    /// Series names selected so far.
    pub selected: BTreeSet<String>,
}

impl<'a> Checker<'a> {
    pub fn new(exported: &'a Exported) -> Self {
        Checker {
            exported,
            problems: vec![],
            selected: BTreeSet::new(),
        }
    }

    /// Parses and checks `text`; the labels of its result.
    pub fn check(&mut self, text: &str, origin: &str) -> Labels {
        match parser::parse(text) {
            Ok(expr) => self.walk(&expr, origin),
            Err(e) => {
                self.problems
                    .push(format!("{origin}: {text:?} is not PromQL: {e}"));
                None
            }
        }
    }

    /// `text` may only use labels `have` (e.g. a legend's `{{x}}` or an
    /// alert text's `$labels.x` against its expression's result).
    pub fn uses(&mut self, used: &[String], have: &Labels, origin: &str) {
        let empty = BTreeSet::new();
        let have = have.as_ref().unwrap_or(&empty);
        for label in used {
            if !have.contains(label) {
                self.problems.push(format!(
                    "{origin}: uses label {label}, not in the result {have:?}"
                ));
            }
        }
    }

    pub fn assert_clean(&self) {
        assert!(
            self.problems.is_empty(),
            "{} problems:\n{}",
            self.problems.len(),
            self.problems.join("\n")
        );
    }

    fn problem(&mut self, origin: &str, what: String) {
        self.problems.push(format!("{origin}: {what}"));
    }

    fn need(&mut self, labels: &[String], have: &BTreeSet<String>, what: &str, origin: &str) {
        for l in labels {
            if !have.contains(l) {
                self.problem(origin, format!("{what} label {l} is not on {have:?}"));
            }
        }
    }

    fn selector(&mut self, vs: &VectorSelector, origin: &str) -> Labels {
        let name = vs.name.clone().or_else(|| {
            vs.matchers
                .matchers
                .iter()
                .find(|m| m.name == METRIC_NAME)
                .map(|m| m.value.clone())
        });
        let Some(name) = name else {
            self.problem(origin, "a selector without a series name".into());
            return Some(BTreeSet::new());
        };
        let Some(own) = self.exported.get(&name) else {
            self.problem(origin, format!("{name} is not exported by the code"));
            return Some(BTreeSet::new());
        };
        self.selected.insert(name.clone());
        let mut have = own.clone();
        have.extend(TARGET_LABELS.map(String::from));
        let matchers = vs
            .matchers
            .matchers
            .iter()
            .chain(vs.matchers.or_matchers.iter().flatten());
        let used: Vec<String> = matchers
            .map(|m| m.name.clone())
            .filter(|n| n != METRIC_NAME)
            .collect();
        self.need(&used, &have, &format!("matcher of {name}:"), origin);
        Some(have)
    }

    fn walk(&mut self, e: &Expr, origin: &str) -> Labels {
        match e {
            Expr::VectorSelector(vs) => self.selector(vs, origin),
            Expr::MatrixSelector(ms) => self.selector(&ms.vs, origin),
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) => None,
            Expr::Paren(p) => self.walk(&p.expr, origin),
            Expr::Unary(u) => self.walk(&u.expr, origin),
            Expr::Subquery(s) => self.walk(&s.expr, origin),
            Expr::Aggregate(a) => {
                if let Some(param) = &a.param {
                    self.walk(param, origin);
                }
                let inner = self.walk(&a.expr, origin).unwrap_or_default();
                let op = a.op.to_string();
                match &a.modifier {
                    Some(LabelModifier::Include(by)) => {
                        self.need(&by.labels, &inner, &format!("{op} by"), origin);
                        Some(by.labels.iter().cloned().collect())
                    }
                    Some(LabelModifier::Exclude(without)) => {
                        self.need(&without.labels, &inner, &format!("{op} without"), origin);
                        Some(&inner - &without.labels.iter().cloned().collect())
                    }
                    // topk and friends keep the series as they are.
                    None if matches!(op.as_str(), "topk" | "bottomk" | "limitk") => Some(inner),
                    None => Some(BTreeSet::new()),
                }
            }
            Expr::Binary(b) => {
                let (l, r) = (self.walk(&b.lhs, origin), self.walk(&b.rhs, origin));
                let (l, r) = match (l, r) {
                    (Some(l), Some(r)) => (l, r),
                    (l, r) => return l.or(r),
                };
                let Some(m) = &b.modifier else {
                    return Some(l);
                };
                let both: BTreeSet<String> = l.intersection(&r).cloned().collect();
                let either: BTreeSet<String> = l.union(&r).cloned().collect();
                match &m.matching {
                    Some(LabelModifier::Include(on)) => self.need(&on.labels, &both, "on", origin),
                    Some(LabelModifier::Exclude(ign)) => {
                        self.need(&ign.labels, &either, "ignoring", origin)
                    }
                    None => {}
                }
                match &m.card {
                    VectorMatchCardinality::ManyToOne(extra) => {
                        self.need(&extra.labels, &r, "group_left", origin);
                        Some(&l | &extra.labels.iter().cloned().collect())
                    }
                    VectorMatchCardinality::OneToMany(extra) => {
                        self.need(&extra.labels, &l, "group_right", origin);
                        Some(&r | &extra.labels.iter().cloned().collect())
                    }
                    _ => Some(l),
                }
            }
            Expr::Call(c) => {
                let args: Vec<Labels> = c.args.args.iter().map(|a| self.walk(a, origin)).collect();
                if c.func.name == "histogram_quantile" {
                    let buckets = args.get(1).cloned().flatten().unwrap_or_default();
                    if !buckets.contains("le") {
                        self.problem(origin, "histogram_quantile over series without le".into());
                    }
                    return Some(&buckets - &BTreeSet::from(["le".to_string()]));
                }
                args.into_iter().flatten().next()
            }
            Expr::Extension(_) => {
                self.problem(origin, "an extension node".into());
                None
            }
        }
    }
}

/// The labels a text template names: Grafana legends (`{{node}}`) and
/// Prometheus alert texts (`{{ $labels.node }}`).
pub fn template_labels(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let Some(len) = rest[start..].find("}}") else {
            break;
        };
        let inner = rest[start + 2..start + len].trim();
        for word in inner.split(|c: char| c.is_whitespace() || c == '|') {
            if let Some(label) = word.strip_prefix("$labels.") {
                out.push(label.to_string());
            } else if is_label_name(word) && inner == word {
                out.push(word.to_string());
            }
        }
        rest = &rest[start + len + 2..];
    }
    out
}

fn is_label_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[test]
fn the_checker_catches_unknown_series_and_labels() {
    let exported: Exported = [
        ("a_total".to_string(), BTreeSet::from(["x".to_string()])),
        ("b".to_string(), BTreeSet::new()),
    ]
    .into();
    let mut c = Checker::new(&exported);
    let out = c.check("sum by (x, node) (rate(a_total{x!=\"\"}[5m]))", "ok");
    assert_eq!(out, Some(BTreeSet::from(["node".into(), "x".into()])));
    c.assert_clean();
    c.check("rate(nope_total[5m])", "q1");
    c.check("sum by (y) (a_total)", "q2");
    c.check("b{z=\"1\"}", "q3");
    c.check("a_total * on (x) b", "q4");
    c.check("sum(rate(a_total[5m]", "q5");
    assert_eq!(c.problems.len(), 5, "{:#?}", c.problems);
    assert!(c.problems[0].starts_with("q1: nope_total is not exported"));
    assert!(c.problems[1].starts_with("q2: sum by label y is not on"));
    assert!(c.problems[2].starts_with("q3: matcher of b: label z is not on"));
    assert!(c.problems[3].starts_with("q4: on label x is not on"));
    assert!(c.problems[4].starts_with("q5: \"sum(rate(a_total[5m]\" is not PromQL"));
    assert_eq!(
        template_labels("{{node}} {{ $labels.pod }}/{{ $value | humanize }} {{ $labels.a }}"),
        ["node", "pod", "a"]
    );
}
