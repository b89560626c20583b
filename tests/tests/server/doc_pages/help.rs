//! What clap's `--help` of the built binaries says: the subcommands and the
//! long flags of each.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// `bin args... --help`, which must succeed.
pub fn help(bin: &Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .arg("--help")
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {args:?} --help: {}\n{}",
        bin.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The long flags of a help text's options, without `--help` and
/// `--version` (every command has them).
pub fn long_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|l| {
            let t = l.trim_start();
            // Options start at clap's option column (2 or 6 spaces);
            // descriptions, which may begin with a flag, sit deeper.
            if l.len() - t.len() > 6 {
                return None;
            }
            // `-j, --json` or `--json`: an option's first line.
            let t = match t.split_once(", --") {
                Some((short, rest)) if short.len() == 2 && short.starts_with('-') => rest,
                _ => t.strip_prefix("--")?,
            };
            let name: String = t
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .filter(|n| n != "help" && n != "version")
        .collect()
}

/// The subcommands a help text lists under `Commands:`, without `help`.
pub fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect()
}

#[test]
fn flags_and_commands_are_read_from_clap_help() {
    let text = "Usage: x [OPTIONS] <COMMAND>\n\nCommands:\n  watch  Watch\n  run    Run it\n  help   Print this\n\nOptions:\n  -j, --json             JSON\n      --host-proc <DIR>  Where [default: /proc]\n          --not-an-option in a description\n  -h, --help  Print help\n  -V, --version  Print version\n";
    assert_eq!(commands(text), ["watch", "run"]);
    let flags: Vec<String> = long_flags(text).into_iter().collect();
    assert_eq!(flags, ["host-proc", "json"]);
}
