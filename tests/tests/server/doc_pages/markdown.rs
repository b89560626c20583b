//! Headings, their anchors and the links of a Markdown page. Fenced code
//! blocks and inline code hold neither; a heading's anchor is GitHub's
//! slug of its text: lowercased, every character but letters, digits,
//! `_`, `-` and spaces dropped, spaces made `-`, and a repeated slug given
//! `-1`, `-2`, ... in page order.

use std::collections::BTreeMap;

/// A page's headings and links.
#[derive(Debug, Default)]
pub struct Page {
    /// Heading text as rendered (no `#`, backticks or link syntax), in order.
    pub headings: Vec<String>,
    /// Anchor -> the heading it belongs to.
    pub anchors: BTreeMap<String, String>,
    pub links: Vec<Link>,
}

/// One link target as written, with its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub line: usize,
    pub target: String,
}

impl Link {
    /// Links that leave the repository (a scheme) are not checked here.
    pub fn is_external(&self) -> bool {
        ["http://", "https://", "mailto:"]
            .iter()
            .any(|s| self.target.starts_with(s))
    }

    /// (path, anchor): an empty path is the page itself.
    pub fn split(&self) -> (&str, Option<&str>) {
        match self.target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (self.target.as_str(), None),
        }
    }
}

pub fn parse(text: &str) -> Page {
    let mut page = Page::default();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut fence: Option<&str> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(open) = fence {
            if trimmed.starts_with(open) {
                fence = None;
            }
            continue;
        }
        if let Some(marker) = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m)) {
            fence = Some(marker);
            continue;
        }
        let visible = without_code_spans(line);
        page.links
            .extend(links(&visible).into_iter().map(|target| Link {
                line: i + 1,
                target,
            }));
        if let Some(text) = heading(line) {
            let rendered = rendered(text);
            let base = slug(&rendered);
            let n = seen.entry(base.clone()).or_insert(0);
            let anchor = if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            };
            *n += 1;
            page.anchors.insert(anchor, rendered.clone());
            page.headings.push(rendered);
        }
    }
    page
}

/// The text of an ATX heading (`## Text`), trailing `#`s removed.
fn heading(line: &str) -> Option<&str> {
    let hashes = line.len() - line.trim_start_matches('#').len();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let rest = &line[hashes..];
    if !rest.starts_with(' ') {
        return None;
    }
    Some(rest.trim().trim_end_matches('#').trim_end())
}

/// What a heading shows: inline code without its backticks, links as their text.
pub fn rendered(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    out.push_str(rest);
    out.replace('`', "")
}

/// GitHub's anchor for a heading's rendered text.
pub fn slug(rendered: &str) -> String {
    rendered
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// `line` with the inside of inline code spans blanked (their text is no
/// link, and may hold `](`).
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(c);
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// Targets of `[text](target)` and `![alt](target)` links, titles dropped.
fn links(line: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or_default();
        let target = target.trim_start_matches('<').trim_end_matches('>');
        out.push(target.to_string());
        rest = &after[end..];
    }
    out
}

#[test]
fn anchors_follow_githubs_slugs() {
    let page = parse(
        "# volume-health\n\
         ## Event path priority (`--event-priority`, also for `run`)\n\
         ```\n## not a heading [x](nowhere.md)\n```\n\
         ## Kernel error to Kubernetes Event (cluster mode)\n\
         ### Notes\n### Notes\n### Notes\n\
         ## `health-agent watch --json`\n\
         ## See [the page](a.md#b), `c`\n\
         Text with [a link](docs/x.md#y \"title\") and `[code](not-a-link.md)`.\n",
    );
    let anchors: Vec<&str> = page.anchors.keys().map(String::as_str).collect();
    assert_eq!(
        anchors,
        [
            "event-path-priority---event-priority-also-for-run",
            "health-agent-watch---json",
            "kernel-error-to-kubernetes-event-cluster-mode",
            "notes",
            "notes-1",
            "notes-2",
            "see-the-page-c",
            "volume-health",
        ]
    );
    let links: Vec<(usize, &str)> = page
        .links
        .iter()
        .map(|l| (l.line, l.target.as_str()))
        .collect();
    assert_eq!(links, [(11, "a.md#b"), (12, "docs/x.md#y")]);
}
