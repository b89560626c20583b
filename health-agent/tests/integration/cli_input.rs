//! What `health-agent volumes` says about a hostile mount table, through
//! the real binary and a fake /proc and /sys: the exact message (file and
//! line once, not repeated by the error chain), a bad line skipped while
//! the rest of the table is used, and a huge single line refused without
//! being read whole.

use std::path::Path;
use std::process::Command;

/// A fake host: an empty `sys/class/block`, `proc/1/mountinfo` holding
/// `mountinfo`, and an empty kubelet root. Returns the run's exit code,
/// stdout and stderr.
fn volumes(dir: &Path, mountinfo: &[u8]) -> (i32, String, String) {
    std::fs::create_dir_all(dir.join("sys/class/block")).unwrap();
    std::fs::create_dir_all(dir.join("proc/1")).unwrap();
    std::fs::create_dir_all(dir.join("kubelet")).unwrap();
    std::fs::write(dir.join("proc/1/mountinfo"), mountinfo).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_health-agent"))
        .arg("--host-proc")
        .arg(dir.join("proc"))
        .arg("--host-sys")
        .arg(dir.join("sys"))
        .args(["--log", "warn", "volumes", "--json", "--kubelet-root"])
        .arg(dir.join("kubelet"))
        .arg("--pin-dir")
        .arg(dir.join("pins"))
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_table_without_a_valid_line_names_file_and_line_once() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = volumes(dir.path(), b"27 1 25x:0 / / rw - ext4 /dev/vda rw\n");
    let file = dir.path().join("proc/1/mountinfo");
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stdout, "");
    let last = stderr.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!(
            r#"health-agent: reading the device topology: malformed mountinfo {} line 1: invalid MAJ:MIN "25x:0" (no line of the file is a valid mount)"#,
            file.display()
        )
    );
}

#[test]
fn a_bad_line_is_skipped_with_a_warning_and_the_rest_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let table = b"1 0 254:1 / / rw - ext4 /dev/vda1 rw\n\xff\xfe random\n2 1 0:40 / /tmp rw - tmpfs tmpfs rw\n";
    let (code, stdout, stderr) = volumes(dir.path(), table);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), "[]");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("skipping a malformed mountinfo line"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains("line=2")
            && warnings[0].contains("expected at least 8 fields, found 2"),
        "{}",
        warnings[0]
    );
}

#[test]
fn a_huge_single_line_is_refused_not_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let line = vec![b'x'; 1 << 20];
    let (code, _, stderr) = volumes(dir.path(), &line);
    assert_eq!(code, 1, "{stderr}");
    let file = dir.path().join("proc/1/mountinfo");
    assert_eq!(
        stderr.lines().last().unwrap_or_default(),
        format!(
            "health-agent: reading the device topology: malformed mountinfo {} line 1: line of 1048576 bytes or more, longer than the 262144 accepted; skipped without reading it whole (no line of the file is a valid mount)",
            file.display()
        )
    );
}

/// `watch` with `args` (and a kubelet root, so that pod volumes exist):
/// exit code and stderr.
fn watch(args: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("kubelet")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_health-agent"))
        .args(["--log", "warn", "watch", "--kubelet-root"])
        .arg(dir.path().join("kubelet"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Latency limits that cannot apply are refused before anything is
/// attached, each with its reason.
#[test]
fn latency_limits_that_cannot_apply_are_refused() {
    assert_eq!(
        watch(&["--latency-limit", "ssd=20"]),
        (
            1,
            "health-agent: --latency-limit and --storage-class-latency-limit need --latency-window\n"
                .to_string()
        )
    );
    assert_eq!(
        watch(&["--latency-window", "2", "--storage-class-latency-limit", "fast=20"]),
        (
            1,
            "health-agent: --storage-class-latency-limit needs `run`: watch reads no PersistentVolume\n"
                .to_string()
        )
    );
    assert_eq!(
        watch(&["--latency-window", "2", "--latency-limit", "tape=20"]),
        (
            1,
            "health-agent: --latency-limit \"tape=20\": unknown class \"tape\" (rotational, ssd or network)\n"
                .to_string()
        )
    );
}
