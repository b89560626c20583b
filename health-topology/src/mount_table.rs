//! Reading a whole mount table in bounded memory, and what one bad line
//! costs: [`parse_mountinfo`] on text, [`read_mounts`] on the host's table.
//! Each line is parsed by `mountinfo`.
//!
//! The table is streamed line by line; only the parsed entries are kept.
//! Memory bound: one line buffer of at most [`MAX_LINE_BYTES`] plus the
//! reader's buffer, beyond the entries themselves, of which there are at
//! most `fs.mount-max` (the kernel refuses more mounts in one namespace; see
//! [`max_mounts`]). A longer line is skipped without being held, and a table
//! with more lines than that is refused: it cannot be a real mount table.
//!
//! Bad-line policy: a line that does not parse is skipped with a warning
//! and counted (`volume_health_input_errors_total{source="mountinfo"}`),
//! and the other mounts are kept. A busy node has tens of thousands of
//! mounts; one line the parser does not understand (a new kernel's field,
//! a tenant's odd path) must not hide the volumes on all the others, and
//! a mount missing from the view costs at most that mount's attribution.
//! A table in which *no* line parses is an error naming the first bad
//! line: that is a format change or not a mount table at all, and an empty
//! view would silently report nothing.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::mountinfo::{open_with_fallback, parse_line, MountEntry};
use super::{HostPaths, TopologyError};

/// Longest mountinfo line read. The longest real lines are overlayfs mounts:
/// up to 500 lower layers (the kernel's stacking limit) of paths escaped in
/// the super options; 256 KiB holds 500 paths of 500 bytes each.
pub(crate) const MAX_LINE_BYTES: usize = 256 * 1024;

/// `fs.mount-max`'s default: the most mounts one namespace can hold unless
/// the administrator raised it.
pub(crate) const DEFAULT_MAX_MOUNTS: usize = 100_000;

/// The ceiling on a raised `fs.mount-max` that we honour: beyond it the
/// entries alone would take gigabytes.
const MOUNT_MAX_CEILING: usize = 1_000_000;

/// How many bad lines are logged one by one per read; the rest are summed
/// up in one warning (a table full of bad lines must not flood the log).
const LOGGED_BAD_LINES: usize = 5;

/// Limits of one read: see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    pub max_line: usize,
    pub max_mounts: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_line: MAX_LINE_BYTES,
            max_mounts: DEFAULT_MAX_MOUNTS,
        }
    }
}

/// The parsed lines of one mountinfo file.
#[derive(Debug, Default)]
pub(crate) struct ParsedMounts {
    pub entries: Vec<MountEntry>,
    /// Lines skipped under the bad-line policy.
    pub bad_lines: usize,
}

/// The mount table plus the directory through which its mount points can be
/// reached from the agent (the root of the process whose table this is).
pub(crate) struct MountTable {
    pub entries: Vec<MountEntry>,
    pub root: PathBuf,
    pub bad_lines: usize,
}

/// Parses the text of a mountinfo file.
///
/// Blank lines are ignored, and so are lines that do not have mountinfo's
/// shape (the bad-line policy above); a text with no valid line at all is
/// an error naming the (1-based) line of the first bad one.
pub fn parse_mountinfo(text: &str) -> Result<Vec<MountEntry>, TopologyError> {
    read_mountinfo(text.as_bytes(), None, Limits::default()).map(|p| p.entries)
}

/// Reads the host's mount table: `<proc>/1/mountinfo`, or the agent's own
/// (`<proc>/self/mountinfo`) when pid 1's is unreadable, e.g. without
/// `hostPID` or without the capability to read another process's files.
pub fn read_mounts(paths: &HostPaths) -> Result<Vec<MountEntry>, TopologyError> {
    read_mount_table(paths).map(|t| t.entries)
}

pub(crate) fn read_mount_table(paths: &HostPaths) -> Result<MountTable, TopologyError> {
    let (path, file) = open_with_fallback(paths, |p| File::open(p))?;
    let limits = Limits {
        max_mounts: max_mounts(&paths.proc_root),
        ..Limits::default()
    };
    let parsed = read_mountinfo(
        BufReader::with_capacity(64 * 1024, file),
        Some(&path),
        limits,
    )?;
    // `<proc>/<pid>/root` resolves paths in that process's root and mount
    // namespace, so mount points from pid 1's table stay reachable from a
    // container with the host's /proc mounted somewhere.
    let root = path
        .parent()
        .map(|p| p.join("root"))
        .unwrap_or_else(|| PathBuf::from("/"));
    Ok(MountTable {
        entries: parsed.entries,
        root,
        bad_lines: parsed.bad_lines,
    })
}

/// The host's `fs.mount-max`, within [`DEFAULT_MAX_MOUNTS`] and
/// [`MOUNT_MAX_CEILING`]; the default when unreadable.
pub(crate) fn max_mounts(proc_root: &Path) -> usize {
    let path = proc_root.join("sys/fs/mount-max");
    std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map_or(DEFAULT_MAX_MOUNTS, |n| {
            n.clamp(DEFAULT_MAX_MOUNTS, MOUNT_MAX_CEILING)
        })
}

/// Streams mountinfo text from `reader` (see the module documentation for
/// the bounds and the bad-line policy). `origin` names the file in errors.
pub(crate) fn read_mountinfo(
    mut reader: impl BufRead,
    origin: Option<&Path>,
    limits: Limits,
) -> Result<ParsedMounts, TopologyError> {
    let mut out = ParsedMounts::default();
    let mut first_bad: Option<(usize, String)> = None;
    let mut line = Vec::new();
    let mut number = 0;
    let malformed = |line: usize, reason: String| TopologyError::MalformedMountinfo {
        origin: origin.map(Path::to_path_buf),
        line,
        reason,
    };
    loop {
        number += 1;
        let read = read_bounded_line(&mut reader, &mut line, limits.max_line).map_err(|error| {
            TopologyError::MountinfoRead {
                origin: origin.map(Path::to_path_buf),
                line: number,
                error,
            }
        })?;
        let result = match read {
            LineRead::Eof => break,
            LineRead::TooLong(len) => Err(format!(
                "line of {len} bytes or more, longer than the {} accepted; skipped without reading it whole",
                limits.max_line
            )),
            LineRead::Line => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                parse_line(&line)
            }
        };
        match result {
            Ok(entry) => {
                if out.entries.len() == limits.max_mounts {
                    return Err(malformed(
                        number,
                        format!(
                            "more than {} mounts, which the kernel does not allow in one namespace (fs.mount-max); refusing the table",
                            limits.max_mounts
                        ),
                    ));
                }
                out.entries.push(entry);
            }
            Err(reason) => {
                out.bad_lines += 1;
                if out.bad_lines <= LOGGED_BAD_LINES {
                    tracing::warn!(
                        file = %origin_name(origin),
                        line = number,
                        %reason,
                        "skipping a malformed mountinfo line"
                    );
                }
                first_bad.get_or_insert((number, reason));
                // Bad lines count against the same bound as mounts: a file
                // of nothing but bad lines is not read forever either.
                if out.bad_lines > limits.max_mounts {
                    let (line, reason) = first_bad.take().unwrap_or_default();
                    return Err(malformed(
                        line,
                        format!(
                            "{reason} (and more than {} malformed lines after it; refusing the table)",
                            limits.max_mounts
                        ),
                    ));
                }
            }
        }
    }
    if out.bad_lines > LOGGED_BAD_LINES {
        tracing::warn!(
            file = %origin_name(origin),
            skipped = out.bad_lines,
            "skipped malformed mountinfo lines (the first {LOGGED_BAD_LINES} were logged)"
        );
    }
    match first_bad {
        Some((line, reason)) if out.entries.is_empty() => Err(malformed(
            line,
            match out.bad_lines {
                1 => format!("{reason} (no line of the file is a valid mount)"),
                n => format!("{reason} (none of its {n} non-empty lines is a valid mount)"),
            },
        )),
        _ => Ok(out),
    }
}

fn origin_name(origin: Option<&Path>) -> String {
    origin.map_or_else(|| "<text>".to_string(), |p| p.display().to_string())
}

enum LineRead {
    Eof,
    /// `line` holds the next line, without its `\n`.
    Line,
    /// The line had at least this many bytes and was consumed, not kept.
    TooLong(usize),
}

/// Reads the next line into `line` (cleared first), holding at most `max`
/// bytes: a longer line is consumed to its end and reported by length.
fn read_bounded_line(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<LineRead> {
    line.clear();
    let mut seen = 0usize;
    let mut any = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(match (any, seen > max) {
                (false, _) => LineRead::Eof,
                (true, true) => LineRead::TooLong(seen),
                (true, false) => LineRead::Line,
            });
        }
        any = true;
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        seen = seen.saturating_add(chunk.len());
        if seen <= max {
            line.extend_from_slice(chunk);
        } else if !line.is_empty() {
            // Over the bound: drop what was kept and stop keeping.
            *line = Vec::new();
        }
        let used = done.unwrap_or(buf.len());
        reader.consume(used);
        if done.is_some() {
            return Ok(if seen > max {
                LineRead::TooLong(seen)
            } else {
                LineRead::Line
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "27 1 254:0 / / rw - ext4 /dev/vda rw\n";

    fn read(text: &[u8], limits: Limits) -> Result<ParsedMounts, TopologyError> {
        read_mountinfo(text, Some(Path::new("/p/1/mountinfo")), limits)
    }

    #[test]
    fn bad_lines_are_skipped_and_counted_the_rest_kept() {
        let mut text = format!("{GOOD}28 27 25x:0 / /a rw - ext4 /dev/vdb rw\n").into_bytes();
        text.extend(b"\xff\xfe garbage\n29 27 7:1 / /b rw - xfs /dev/loop1 rw");
        let parsed = read(&text, Limits::default()).unwrap();
        let ids: Vec<u32> = parsed.entries.iter().map(|e| e.mount_id).collect();
        assert_eq!(ids, [27, 29]);
        assert_eq!(parsed.bad_lines, 2);
    }

    #[test]
    fn a_table_without_one_valid_mount_is_an_error_naming_file_and_line() {
        let err = read(
            b"\n28 27 25x:0 / /a rw - ext4 /dev/vdb rw\n",
            Limits::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"malformed mountinfo /p/1/mountinfo line 2: invalid MAJ:MIN "25x:0" (no line of the file is a valid mount)"#
        );
        let err = read(b"x\ny\n", Limits::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "malformed mountinfo /p/1/mountinfo line 1: expected at least 8 fields, found 1 (none of its 2 non-empty lines is a valid mount)"
        );
        // Empty is a (strange) valid table, not an error.
        let parsed = read(b"\n\n", Limits::default()).unwrap();
        assert_eq!((parsed.entries.len(), parsed.bad_lines), (0, 0));
    }

    #[test]
    fn an_over_long_line_is_skipped_without_being_kept() {
        let limits = Limits {
            max_line: 64,
            max_mounts: 10,
        };
        let long = format!("30 27 7:2 / /{} rw - ext4 /dev/loop2 rw\n", "x".repeat(100));
        let text = format!("{GOOD}{long}{GOOD}");
        let parsed = read(text.as_bytes(), limits).unwrap();
        assert_eq!((parsed.entries.len(), parsed.bad_lines), (2, 1));

        // A single line, without a newline, longer than the bound.
        let err = read("y".repeat(1000).as_bytes(), limits).unwrap_err();
        assert_eq!(
            err.to_string(),
            "malformed mountinfo /p/1/mountinfo line 1: line of 1000 bytes or more, longer than the 64 accepted; skipped without reading it whole (no line of the file is a valid mount)"
        );
        // Exactly at the bound is accepted.
        let exact = format!("1 0 8:1 / /{} rw - ext4 a b", "z".repeat(64 - 25));
        assert_eq!(exact.len(), 64);
        assert_eq!(read(exact.as_bytes(), limits).unwrap().entries.len(), 1);
    }

    #[test]
    fn more_mounts_than_the_kernel_allows_are_refused() {
        let limits = Limits {
            max_line: 1024,
            max_mounts: 3,
        };
        assert_eq!(
            read(GOOD.repeat(3).as_bytes(), limits)
                .unwrap()
                .entries
                .len(),
            3
        );
        let err = read(GOOD.repeat(4).as_bytes(), limits).unwrap_err();
        assert_eq!(
            err.to_string(),
            "malformed mountinfo /p/1/mountinfo line 4: more than 3 mounts, which the kernel does not allow in one namespace (fs.mount-max); refusing the table"
        );
        let err = read("bad\n".repeat(5).as_bytes(), limits).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "malformed mountinfo /p/1/mountinfo line 1: expected at least 8 fields, found 1 (and more than 3 malformed lines"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_read_error_names_the_file_and_line() {
        struct Failing(usize);
        impl io::Read for Failing {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    return Err(io::Error::other("device gone"));
                }
                let line = GOOD.as_bytes();
                self.0 -= 1;
                buf[..line.len()].copy_from_slice(line);
                Ok(line.len())
            }
        }
        let reader = BufReader::with_capacity(64, Failing(2));
        let err = read_mountinfo(reader, Some(Path::new("/p/1/mountinfo")), Limits::default())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "reading /p/1/mountinfo at line 3: device gone"
        );
    }

    #[test]
    fn mount_max_comes_from_the_host_within_bounds() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(max_mounts(dir.path()), DEFAULT_MAX_MOUNTS);
        std::fs::create_dir_all(dir.path().join("sys/fs")).unwrap();
        let set = |v: &str| std::fs::write(dir.path().join("sys/fs/mount-max"), v).unwrap();
        set("250000\n");
        assert_eq!(max_mounts(dir.path()), 250_000);
        set("10\n");
        assert_eq!(max_mounts(dir.path()), DEFAULT_MAX_MOUNTS);
        set("4294967295\n");
        assert_eq!(max_mounts(dir.path()), MOUNT_MAX_CEILING);
        set("lots\n");
        assert_eq!(max_mounts(dir.path()), DEFAULT_MAX_MOUNTS);
    }

    #[test]
    fn malformed_lines_are_skipped_and_a_table_of_them_names_the_line() {
        let cases = [
            ("garbage", "expected at least 8 fields, found 1"),
            (
                "28 27 7:0 / /x rw shared:1 ext4 /dev/loop0 rw",
                "no ' - ' separator after the optional fields",
            ),
            (
                "28 27 7-0 / /x rw - ext4 /dev/loop0 rw",
                r#"invalid MAJ:MIN "7-0""#,
            ),
            (
                "x 27 7:0 / /x rw - ext4 /dev/loop0 rw",
                r#"invalid mount id "x""#,
            ),
            (
                "28 27 7:0 / relative rw - ext4 /dev/loop0 rw",
                r#"mount point "relative" is not an absolute path"#,
            ),
            (
                "28 27 7:0 sub /x rw - ext4 /dev/loop0 rw",
                r#"root "sub" is not an absolute path"#,
            ),
            (
                "28 27 0:4 net:4026532177 /x rw - nsfs nsfs rw",
                r#"root "net:4026532177" is not an absolute path"#,
            ),
            (
                "28 27 7:0 / /x rw - ext4 /dev/loop0 rw extra",
                "expected 3 fields after the separator (type, source, super options), found 4",
            ),
            (
                "28 27 7:0 / /x rw -  /dev/loop0 rw",
                "empty filesystem type",
            ),
        ];
        for (bad, reason) in cases {
            // Beside a good line: skipped, counted, the good one kept.
            let text = format!("27 1 254:0 / / rw - ext4 /dev/vda rw\n\n{bad}\n");
            let parsed = read_mountinfo(text.as_bytes(), None, Default::default()).unwrap();
            assert_eq!(parsed.entries.len(), 1, "{bad:?}");
            assert_eq!(parsed.bad_lines, 1, "{bad:?}");
            // Alone: an error naming the line and why.
            match parse_mountinfo(&format!("\n\n{bad}\n")) {
                Err(TopologyError::MalformedMountinfo {
                    line,
                    origin,
                    reason: got,
                }) => {
                    assert_eq!(line, 3, "{bad:?}");
                    assert_eq!(origin, None);
                    assert_eq!(
                        got,
                        format!("{reason} (no line of the file is a valid mount)")
                    );
                }
                other => panic!("{bad:?}: expected a parse error, got {other:?}"),
            }
        }
    }

    #[test]
    fn read_mounts_falls_back_to_self() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        std::fs::create_dir_all(proc_root.join("self")).unwrap();
        std::fs::write(
            proc_root.join("self/mountinfo"),
            "27 1 254:0 / / rw - ext4 /dev/vda rw\n",
        )
        .unwrap();
        let paths = HostPaths {
            proc_root: proc_root.clone(),
            sys_root: dir.path().join("sys"),
        };
        let t = read_mount_table(&paths).unwrap();
        assert_eq!(t.entries.len(), 1);
        assert_eq!(t.root, proc_root.join("self/root"));

        // Neither readable: one error that names both files.
        std::fs::remove_file(proc_root.join("self/mountinfo")).unwrap();
        let err = read_mounts(&paths).unwrap_err();
        assert!(
            matches!(err, TopologyError::MountinfoUnreadable { .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("1/mountinfo") && msg.contains("self/mountinfo"),
            "{msg}"
        );

        // A malformed host table is an error carrying the path, not a fallback.
        std::fs::create_dir_all(proc_root.join("1")).unwrap();
        std::fs::write(proc_root.join("1/mountinfo"), "oops\n").unwrap();
        let err = read_mounts(&paths).unwrap_err().to_string();
        assert!(
            err.contains("1/mountinfo") && err.contains("line 1"),
            "{err}"
        );
    }
}
