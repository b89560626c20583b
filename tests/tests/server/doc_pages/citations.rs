//! Where the code cites the documentation: a page (`README.md` or a page
//! under `docs/`), optionally followed by the headings it means, quoted
//! (`docs/benchmarks.md, "Error flood"`). Comment markers at line starts
//! are folded away first, so a citation may wrap over comment lines.

/// One citation: the page as written, and the headings quoted after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Citation {
    pub page: String,
    pub headings: Vec<String>,
}

/// `text` with each line break, its indentation and a leading comment
/// marker (`//!`, `///`, `//`, `#`, `*`) folded into one space, and `\"`
/// (a quote inside a Rust string) made `"`.
pub fn fold(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.lines().enumerate() {
        let mut t = line.trim_start();
        if i > 0 {
            for marker in ["//!", "///", "//", "#", "*"] {
                if let Some(rest) = t.strip_prefix(marker) {
                    t = rest.trim_start();
                    break;
                }
            }
            out.push(' ');
        }
        out.push_str(t);
    }
    out.replace("\\\"", "\"")
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// Every citation of this repository's pages in folded `text`: tokens
/// `README.md` (or `README` followed by a quoted heading) and `docs/....md`.
/// Other READMEs (`vendor/csi/README.md`) are not this repository's pages.
pub fn citations(text: &str) -> Vec<Citation> {
    let mut out = vec![];
    let mut at = 0;
    while at < text.len() {
        let rest = &text[at..];
        // `at` is at the start or just after a token: the next path
        // character starts one.
        let Some(start) = rest.find(is_path_char) else {
            break;
        };
        let token_len = rest[start..]
            .find(|c: char| !is_path_char(c))
            .unwrap_or(rest.len() - start);
        let token = rest[start..start + token_len].trim_end_matches(['.', '-', '/']);
        let after = &rest[start + token.len()..];
        at += start + token_len.max(1);
        let page = if token == "README.md" || (token.starts_with("docs/") && token.ends_with(".md"))
        {
            token.to_string()
        } else if token == "README" {
            // Only as a citation of a heading: "the README's test command"
            // names no page.
            if quoted(after).is_empty() {
                continue;
            }
            "README".to_string()
        } else {
            continue;
        };
        out.push(Citation {
            page,
            headings: quoted(after),
        });
    }
    out
}

/// The quoted headings right after a page: `, "A"`, `: "A"`, ` "A"`,
/// ` ("A"`, and more of them after `, `.
fn quoted(mut after: &str) -> Vec<String> {
    let mut headings = vec![];
    loop {
        // A separator first: a quote right after the page closes a string.
        let t = after.trim_start_matches([',', ':', ' ', '(']);
        let separator = after.len() - t.len();
        if !(1..=3).contains(&separator) || !t.starts_with('"') {
            return headings;
        }
        let Some(end) = t[1..].find('"') else {
            return headings;
        };
        headings.push(t[1..1 + end].to_string());
        after = &t[end + 2..];
    }
}

#[test]
fn citations_are_found_across_comment_lines() {
    let text = fold(
        "//! skipped as malformed (README, \"Input\n//! handling\"), see docs/benchmarks.md, \"Error flood\", \"CI\".\n\
         # the README's test command; vendor/csi/README.md; docs/runbooks/README.md\n\
         let s = \"See docs/benchmarks.md, \\\"Scale\\\"\"; if p == \"README.md\" { x(\"y\") }",
    );
    assert_eq!(
        citations(&text),
        [
            Citation {
                page: "README".into(),
                headings: vec!["Input handling".into()]
            },
            Citation {
                page: "docs/benchmarks.md".into(),
                headings: vec!["Error flood".into(), "CI".into()]
            },
            Citation {
                page: "docs/runbooks/README.md".into(),
                headings: vec![]
            },
            Citation {
                page: "docs/benchmarks.md".into(),
                headings: vec!["Scale".into()]
            },
            // A string's closing quote is no heading.
            Citation {
                page: "README.md".into(),
                headings: vec![]
            },
        ]
    );
}
