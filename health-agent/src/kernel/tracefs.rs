//! tracefs: where it is, and the field layout of each tracepoint.
//!
//! The kernel programs read tracepoint records at byte offsets; those
//! offsets change between kernel versions, so they are taken from the
//! running kernel's `format` files rather than compiled in.

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    #[error(
        "tracefs is not mounted (looked for {tried}); mount it with \
         `mount -t tracefs nodev /sys/kernel/tracing`"
    )]
    Missing { tried: String },
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}: malformed line {line}: {text:?}")]
    Malformed {
        path: PathBuf,
        line: usize,
        text: String,
    },
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
        match std::fs::read_to_string(&path) {
            Ok(text) => parse_format(&path, &text).map(Some),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(TracefsError::Read { path, source }),
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

/// Parses the `field:` lines of a format file:
/// `\tfield:unsigned int nr_sector;\toffset:24;\tsize:4;\tsigned:0;`
pub fn parse_format(path: &Path, text: &str) -> Result<EventFormat, TracefsError> {
    let mut fields = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let malformed = || TracefsError::Malformed {
            path: path.to_path_buf(),
            line: i + 1,
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
        fields.push(Field {
            name,
            offset: offset.ok_or_else(malformed)?,
            size: size.ok_or_else(malformed)?,
            signed,
            decl,
        });
    }
    Ok(EventFormat { fields })
}

/// The identifier at the end of a C declaration, after dropping a trailing
/// array suffix: `char rwbs[10]` → `rwbs`, `const char * function` →
/// `function`, `__data_loc char[] fname` → `fname`.
fn field_name(decl: &str) -> Option<String> {
    let mut base = decl.trim_end();
    while let Some(stripped) = base.strip_suffix(']') {
        base = stripped[..stripped.rfind('[')?].trim_end();
    }
    let start = base
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
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

    #[test]
    fn reads_this_kernels_block_rq_complete() {
        let tracefs = Tracefs::locate(Path::new("/sys")).expect("tracefs on the test machine");
        let format = tracefs
            .event_format("block", "block_rq_complete")
            .unwrap()
            .expect("block_rq_complete exists on every supported kernel");
        assert_eq!(format.field("dev").unwrap().size, 4);
        assert_eq!(format.field("sector").unwrap().size, 8);
        assert!(tracefs
            .event_format("block", "no_such_event")
            .unwrap()
            .is_none());
    }
}
