//! docs/benchmarks.md: hand-written method and notes around generated result
//! blocks. Each block sits between `<!-- bench:ID:begin -->` and
//! `<!-- bench:ID:end -->` and is replaced by the next run of that part, so a
//! partial run (`--only`) leaves the other parts' last results alone.

use std::path::Path;

use anyhow::{Context, Result};

/// Replaces block `id` of the file at `path` with `body` (appending the block
/// if the file has none; creating the file if missing).
pub fn update(path: &Path, id: &str, body: &str) -> Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let new = replace_block(&text, id, body);
    // Written next to it and renamed: an interrupted run never leaves half a file.
    let tmp = path.with_extension("md.tmp");
    std::fs::write(&tmp, new).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
}

fn replace_block(text: &str, id: &str, body: &str) -> String {
    let begin = format!("<!-- bench:{id}:begin -->");
    let end = format!("<!-- bench:{id}:end -->");
    let body = body.trim_end();
    if let Some(b) = text.find(&begin) {
        let inner_start = b + begin.len();
        if let Some(e) = text[inner_start..].find(&end) {
            let inner_end = inner_start + e;
            return format!("{}\n{body}\n{}", &text[..inner_start], &text[inner_end..]);
        }
    }
    let mut out = text.trim_end().to_string();
    if !out.is_empty() {
        out.push_str("\n\n");
    }
    out.push_str(&format!("{begin}\n{body}\n{end}\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_replaced_in_place_or_appended() {
        let text = "# T\n\n<!-- bench:a:begin -->\nold\n<!-- bench:a:end -->\n\nnotes\n";
        let out = replace_block(text, "a", "new\n");
        assert_eq!(
            out,
            "# T\n\n<!-- bench:a:begin -->\nnew\n<!-- bench:a:end -->\n\nnotes\n"
        );
        let out = replace_block(&out, "b", "bee");
        assert!(
            out.ends_with("notes\n\n<!-- bench:b:begin -->\nbee\n<!-- bench:b:end -->\n"),
            "{out}"
        );
        assert_eq!(
            replace_block("", "c", "x"),
            "<!-- bench:c:begin -->\nx\n<!-- bench:c:end -->\n"
        );
    }
}
