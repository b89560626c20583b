//! `cargo xtask <lab command> --help` and usage errors are answered by xtask
//! itself: the lab (minutes of release build on a fresh machine) is neither
//! built nor run for them. The binary runs with a cargo that cannot start,
//! so any build attempt would fail the command.

use std::process::{Command, Output};

fn xtask(words: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(words)
        .env("CARGO", "/nonexistent/cargo")
        .output()
        .expect("running xtask")
}

#[test]
fn help_of_every_lab_command_prints_without_building_the_lab() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "--help"], "Usage: cargo xtask bench [OPTIONS]"),
        (&["demo", "--help"], "Usage: cargo xtask demo"),
        (
            &["cluster", "--help"],
            "Usage: cargo xtask cluster [OPTIONS] <COMMAND>",
        ),
        (&["cluster", "up", "--help"], "--agent-archive <FILE>"),
        (
            &["cluster", "down", "--help"],
            "Usage: cargo xtask cluster down",
        ),
        (
            &["cluster", "status", "--help"],
            "Usage: cargo xtask cluster status",
        ),
        (
            &["cluster", "fault", "--help"],
            "Usage: cargo xtask cluster fault [OPTIONS] <COMMAND>",
        ),
        (&["cluster", "fault", "add", "--help"], "--errno <ERRNO>"),
        (&["cluster", "fault", "stats", "--help"], "--json"),
        (&["cluster", "test", "--help"], "[FILTER]..."),
        (
            &["help", "cluster", "fault"],
            "Usage: cargo xtask cluster fault",
        ),
    ];
    for (words, expected) in cases {
        let out = xtask(words);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{words:?}: {}\n{stderr}", out.status);
        assert!(stdout.contains(expected), "{words:?}: {stdout}");
        assert_eq!(stderr, "", "{words:?}");
    }
}

#[test]
fn usage_errors_are_told_without_building_the_lab() {
    let cases: &[(&[&str], &str)] = &[
        (&["cluster", "upp"], "unrecognized subcommand 'upp'"),
        (
            &["cluster", "fault", "add", "--errno", "EWHATEVER"],
            "\"EWHATEVER\" is not an errno name or number",
        ),
        (
            &["bench", "--only", "latencyy"],
            "invalid value 'latencyy' for '--only",
        ),
        (&["demo", "--nope"], "unexpected argument '--nope'"),
        (
            &["cluster", "--state-dir", "/tmp/x", "test"],
            "`cluster test` uses the default state directory",
        ),
    ];
    for (words, expected) in cases {
        let out = xtask(words);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{words:?} succeeded");
        assert!(stderr.contains(expected), "{words:?}: {stderr}");
        assert!(!stderr.contains("building the lab"), "{words:?}: {stderr}");
    }
}
