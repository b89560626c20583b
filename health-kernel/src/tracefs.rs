//! tracefs: where it is, and the field layout of each tracepoint.
//!
//! The kernel programs read tracepoint records at byte offsets; those
//! offsets change between kernel versions, so they are taken from the
//! running kernel's `format` files rather than compiled in.
//!
//! Bad-line policy: one malformed `field:` line makes the whole format
//! unusable (an error naming the file and line), never skipped. The
//! offsets are what a kernel program reads at; a format we only half
//! understand could put a program's reads in the wrong place, and a wrong
//! device or errno is worse than no source. The error stays with that one
//! tracepoint (`probes::layout::plan` turns it into the reason that source
//! is not attached); the other sources attach. Lines that are not `field:`
//! lines (name, ID, print fmt) are not read.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Longest format file read. Real ones are a few KiB (the longest print
/// formats of xfs events are under 4 KiB); a longer file is refused.
const MAX_FORMAT_BYTES: u64 = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    #[error(
        "tracefs is not mounted (looked for {tried}); mount it with \
         `mount -t tracefs nodev /sys/kernel/tracing`"
    )]
    Missing { tried: String },
    // The cause in the message and not as `source()`: see TopologyError.
    #[error("reading {}: {error}", .path.display())]
    Read { path: PathBuf, error: io::Error },
    #[error("{}: malformed line {line}: {text:?}", .path.display())]
    Malformed {
        path: PathBuf,
        line: usize,
        text: String,
    },
    #[error("{}: longer than {MAX_FORMAT_BYTES} bytes; not a tracepoint format", .path.display())]
    TooLong { path: PathBuf },
}

/// A tracefs mount.
#[derive(Clone, Debug)]
pub struct Tracefs {
    root: PathBuf,
}

/// One field of a tracepoint record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The C declaration as the kernel prints it, e.g. `char rwbs[10]`.
    pub decl: String,
    pub name: String,
    pub offset: u32,
    pub size: u32,
    pub signed: bool,
}

impl Field {
    /// `__data_loc` fields hold a (length << 16 | offset) word, not the data.
    pub fn is_data_loc(&self) -> bool {
        self.decl.starts_with("__data_loc")
    }
}

/// The parsed `format` file of one tracepoint.
#[derive(Clone, Debug, Default)]
pub struct EventFormat {
    pub fields: Vec<Field>,
}

impl EventFormat {
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }
}

impl Tracefs {
    /// Finds tracefs under `sys_root`: `kernel/tracing`, then the older
    /// `kernel/debug/tracing`. An empty `kernel/tracing` (the mount point
    /// exists but nothing is mounted) is mounted when we are allowed to.
    pub fn locate(sys_root: &Path) -> Result<Self, TracefsError> {
        let candidates = [
            sys_root.join("kernel/tracing"),
            sys_root.join("kernel/debug/tracing"),
        ];
        if let Some(found) = candidates.iter().find(|c| c.join("events").is_dir()) {
            return Ok(Self {
                root: found.clone(),
            });
        }
        let primary = &candidates[0];
        if primary.is_dir() && try_mount_tracefs(primary) && primary.join("events").is_dir() {
            tracing::info!(path = %primary.display(), "mounted tracefs");
            return Ok(Self {
                root: primary.clone(),
            });
        }
        Err(TracefsError::Missing {
            tried: candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether any tracepoint of `group` exists: a module's group appears
    /// when it is loaded.
    pub fn has_group(&self, group: &str) -> bool {
        self.root.join("events").join(group).is_dir()
    }

    /// The format of `group:name`, or `None` when this kernel has no such
    /// tracepoint (the module is not loaded, or the kernel predates it).
    pub fn event_format(
        &self,
        group: &str,
        name: &str,
    ) -> Result<Option<EventFormat>, TracefsError> {
        let path = self
            .root
            .join("events")
            .join(group)
            .join(name)
            .join("format");
        let mut bytes = Vec::new();
        match std::fs::File::open(&path)
            .and_then(|f| f.take(MAX_FORMAT_BYTES + 1).read_to_end(&mut bytes))
        {
            Ok(_) if bytes.len() as u64 > MAX_FORMAT_BYTES => Err(TracefsError::TooLong { path }),
            Ok(_) => parse_format_bytes(&path, &bytes).map(Some),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(TracefsError::Read { path, error }),
        }
    }
}

fn try_mount_tracefs(at: &Path) -> bool {
    nix::mount::mount(
        Some("nodev"),
        at,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .is_ok()
}

/// [`parse_format`] on the bytes of a file: a `field:` line that is not
/// UTF-8 is malformed (the kernel prints C declarations in ASCII).
pub fn parse_format_bytes(path: &Path, bytes: &[u8]) -> Result<EventFormat, TracefsError> {
    let mut fields = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        match std::str::from_utf8(line) {
            Ok(text) => {
                if let Some(field) = parse_field_line(path, i + 1, text)? {
                    fields.push(field);
                }
            }
            Err(_) => {
                let text = String::from_utf8_lossy(line);
                if text.trim().starts_with("field:") {
                    return Err(TracefsError::Malformed {
                        path: path.to_path_buf(),
                        line: i + 1,
                        text: text.trim().to_string(),
                    });
                }
            }
        }
    }
    Ok(EventFormat { fields })
}

/// Parses the `field:` lines of a format file:
/// `\tfield:unsigned int nr_sector;\toffset:24;\tsize:4;\tsigned:0;`
pub fn parse_format(path: &Path, text: &str) -> Result<EventFormat, TracefsError> {
    parse_format_bytes(path, text.as_bytes())
}

/// One line (1-based `number`): `Some` field for a `field:` line, `None`
/// for any other line.
fn parse_field_line(path: &Path, number: usize, line: &str) -> Result<Option<Field>, TracefsError> {
    let line = line.trim();
    let Some(rest) = line.strip_prefix("field:") else {
        return Ok(None);
    };
    let malformed = || TracefsError::Malformed {
        path: path.to_path_buf(),
        line: number,
        text: line.to_string(),
    };
    let mut decl = None;
    let (mut offset, mut size, mut signed) = (None, None, false);
    for part in rest.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some(v) = part.strip_prefix("offset:") {
            offset = v.parse().ok();
        } else if let Some(v) = part.strip_prefix("size:") {
            size = v.parse().ok();
        } else if let Some(v) = part.strip_prefix("signed:") {
            signed = v == "1";
        } else if decl.is_none() {
            decl = Some(part.to_string());
        }
    }
    let decl = decl.ok_or_else(malformed)?;
    let name = field_name(&decl).ok_or_else(malformed)?;
    Ok(Some(Field {
        name,
        offset: offset.ok_or_else(malformed)?,
        size: size.ok_or_else(malformed)?,
        signed,
        decl,
    }))
}

/// The identifier at the end of a C declaration, after dropping a trailing
/// array suffix: `char rwbs[10]` → `rwbs`, `const char * function` →
/// `function`, `__data_loc char[] fname` → `fname`.
fn field_name(decl: &str) -> Option<String> {
    let mut base = decl.trim_end();
    while let Some(stripped) = base.strip_suffix(']') {
        base = stripped[..stripped.rfind('[')?].trim_end();
    }
    // After the last character that cannot be in an identifier, which may
    // be several bytes long: slicing one byte after its start would panic.
    let start = base
        .char_indices()
        .rev()
        .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let name = &base[start..];
    (!name.is_empty()).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK_RQ_ERROR: &str = "name: block_rq_error
ID: 1234
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:dev_t dev;\toffset:8;\tsize:4;\tsigned:0;
\tfield:sector_t sector;\toffset:16;\tsize:8;\tsigned:0;
\tfield:unsigned int nr_sector;\toffset:24;\tsize:4;\tsigned:0;
\tfield:int error;\toffset:28;\tsize:4;\tsigned:1;
\tfield:char rwbs[10];\toffset:34;\tsize:10;\tsigned:0;
\tfield:__data_loc char[] cmd;\toffset:44;\tsize:4;\tsigned:0;
\tfield:unsigned long stack[4][2];\toffset:64;\tsize:64;\tsigned:0;
\tfield:const char * function;\toffset:48;\tsize:8;\tsigned:0;

print fmt: \"%d,%d\", REC->dev
";

    #[test]
    fn parses_fields_with_offsets_sizes_and_names() {
        let f = parse_format(Path::new("x"), BLOCK_RQ_ERROR).unwrap();
        let names: Vec<_> = f.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "common_type",
                "common_pid",
                "dev",
                "sector",
                "nr_sector",
                "error",
                "rwbs",
                "cmd",
                "stack",
                "function"
            ]
        );
        let rwbs = f.field("rwbs").unwrap();
        assert_eq!((rwbs.offset, rwbs.size, rwbs.signed), (34, 10, false));
        let error = f.field("error").unwrap();
        assert_eq!((error.offset, error.size, error.signed), (28, 4, true));
        assert!(f.field("cmd").unwrap().is_data_loc());
        assert_eq!(f.field("function").unwrap().offset, 48);
    }

    #[test]
    fn malformed_field_lines_are_errors_not_panics() {
        let err =
            parse_format(Path::new("fmt"), "\tfield:int x;\toffset:zz;\tsize:4;\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"fmt: malformed line 1: "field:int x;\toffset:zz;\tsize:4;""#
        );
        assert!(parse_format(Path::new("fmt"), "\tfield:;\toffset:1;\tsize:4;\n").is_err());
    }

    /// Found by the fuzz target (fuzz/corpus/tracefs/regression-non-ascii-decl):
    /// a declaration ending in a non-ASCII character made the name
    /// extraction slice inside that character and panic.
    #[test]
    fn non_ascii_declarations_are_malformed_not_a_panic() {
        let err = parse_format(
            Path::new("f"),
            "x\n\tfield:int \u{e9};\toffset:8;\tsize:4;\n",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "f: malformed line 2: \"field:int \u{e9};\\toffset:8;\\tsize:4;\""
        );
        let err = parse_format_bytes(Path::new("f"), b"\tfield:int \xff;\toffset:8;\tsize:4;\n")
            .unwrap_err();
        assert!(
            err.to_string().starts_with("f: malformed line 1: "),
            "{err}"
        );
    }

    fn field_strategy() -> impl proptest::strategy::Strategy<Value = Field> {
        use proptest::prelude::*;
        (
            proptest::sample::select(vec![
                "int",
                "unsigned int",
                "dev_t",
                "const char *",
                "__data_loc char[]",
                "unsigned long",
            ]),
            "[a-z_][a-z0-9_]{0,15}",
            proptest::option::of(1u32..64),
            0u32..60_000,
            1u32..256,
            any::<bool>(),
        )
            .prop_map(|(ty, name, array, offset, size, signed)| Field {
                decl: match array {
                    Some(n) => format!("{ty} {name}[{n}]"),
                    None => format!("{ty} {name}"),
                },
                name,
                offset,
                size,
                signed,
            })
    }

    proptest::proptest! {
        /// A format printed the way the kernel prints it parses back to
        /// the same fields.
        #[test]
        fn printed_formats_parse_back(fields in proptest::collection::vec(field_strategy(), 0..12)) {
            let mut text = String::from("name: t\nID: 7\nformat:\n");
            for f in &fields {
                text.push_str(&format!(
                    "\tfield:{};\toffset:{};\tsize:{};\tsigned:{};\n",
                    f.decl, f.offset, f.size, u8::from(f.signed)
                ));
            }
            text.push_str("\nprint fmt: \"%d\", REC->x\n");
            let parsed = parse_format(Path::new("f"), &text).unwrap();
            proptest::prop_assert_eq!(parsed.fields, fields);
        }

        /// Arbitrary bytes: parsed, or refused naming the file and a line
        /// that exists; never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..400)) {
            let lines = data.split(|&b| b == b'\n').count();
            match parse_format_bytes(Path::new("f"), &data) {
                Ok(_) => {}
                Err(TracefsError::Malformed { path, line, .. }) => {
                    proptest::prop_assert_eq!(path, Path::new("f"));
                    proptest::prop_assert!((1..=lines).contains(&line));
                }
                Err(e) => proptest::prop_assert!(false, "unexpected {}", e),
            }
        }
    }
}
