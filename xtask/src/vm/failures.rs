//! What a failed test said, in a few lines, for the end of the run.
//!
//! Guests running side by side interleave their output, and a failing
//! test's message comes before its backtrace: CI systems that keep the
//! tail of a log keep the frames and lose the message. The summary at
//! the end repeats each failure's message without the frames.

/// The lines kept of a longer failure's message: its first (what failed)
/// and its last (a log's last lines, where a process says why it ended).
const FIRST: usize = 4;
const LAST: usize = 8;

/// One line per failed test: its name and its panic or error (the first
/// and last lines of a long one), from libtest's `---- <name> stdout ----`
/// sections in `stdout` (the guest's, whole).
pub fn digest(stdout: &str) -> Vec<String> {
    let mut failures = Vec::new();
    let mut lines = stdout.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(name) = section_name(line) else {
            continue;
        };
        let mut message: Vec<&str> = Vec::new();
        let mut in_message = false;
        let in_section = |l: &&str| section_name(l).is_none() && l.trim() != "failures:";
        while let Some(next) = lines.next_if(in_section) {
            // A Result-returning test's `Error: `, or a panic's header.
            if next.starts_with("Error: ") || next.contains("' panicked at ") {
                in_message = true;
            }
            if !in_message || is_frame(next) || next.trim() == "Stack backtrace:" {
                continue;
            }
            if !next.trim().is_empty() {
                message.push(next.trim_end());
            }
        }
        if message.len() > FIRST + LAST {
            let last = message.split_off(message.len() - LAST);
            message.truncate(FIRST);
            message.push("…");
            message.extend(last);
        }
        let said = if message.is_empty() {
            "(no panic or error line in its output)".to_string()
        } else {
            message.join(" | ")
        };
        failures.push(format!("{name}: {said}"));
    }
    failures
}

/// `---- stalls::a_test stdout ----` names `stalls::a_test`.
fn section_name(line: &str) -> Option<&str> {
    line.strip_prefix("---- ")?.strip_suffix(" stdout ----")
}

/// A backtrace's frame (`  12: name`) or its location (`      at
/// file:line`), both indented, unlike a message's own lines.
fn is_frame(line: &str) -> bool {
    let t = line.trim_start();
    if t.len() == line.len() {
        return false;
    }
    t.starts_with("at ")
        || t.split_once(": ")
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        || t.strip_suffix(':')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_is_its_name_and_message_without_frames() {
        let stdout = "\
running 2 tests
test stalls::a ... FAILED
test stalls::b ... FAILED

failures:

---- stalls::a stdout ----
agent started
Error: PathHung raised false, cleared true:
volume pod p pv v: cleared

Stack backtrace:
   0: msg<alloc::string::String>
             at /root/anyhow/src/backtrace.rs:10:14
  26: clone3
---- stalls::b stdout ----

thread 'stalls::b' panicked at tests/tests/host/stalls.rs:322:5:
assertion `left == right` failed
  left: 0
 right: 4096
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace

failures:
    stalls::a
    stalls::b
";
        assert_eq!(
            digest(stdout),
            [
                "stalls::a: Error: PathHung raised false, cleared true: | volume pod p pv v: cleared",
                "stalls::b: thread 'stalls::b' panicked at tests/tests/host/stalls.rs:322:5: | \
                 assertion `left == right` failed |   left: 0 |  right: 4096 | \
                 note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace",
            ]
        );
    }

    #[test]
    fn a_passing_run_has_no_failure_and_a_silent_one_says_so() {
        assert!(digest("running 1 test\ntest a ... ok\n").is_empty());
        let log: String = (1..=20).map(|i| format!("log line {i}\n")).collect();
        assert_eq!(
            digest(&format!(
                "---- a stdout ----\nError: agent exited with 1:\n{log}\nfailures:\n"
            )),
            [
                "a: Error: agent exited with 1: | log line 1 | log line 2 | log line 3 | … | \
              log line 13 | log line 14 | log line 15 | log line 16 | log line 17 | \
              log line 18 | log line 19 | log line 20"
            ]
        );
        assert_eq!(
            digest("---- a stdout ----\nonly chatter\n\nfailures:\n    a\n"),
            ["a: (no panic or error line in its output)"]
        );
    }
}
