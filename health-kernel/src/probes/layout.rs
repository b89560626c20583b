//! Which tracepoint each kernel program reads, and which fields: checked
//! against this kernel's formats, their offsets become the object's `LAYOUT`.

use health_common::field;

use super::ProbeError;
use crate::tracefs::{EventFormat, Tracefs};

/// One field a program reads: its `LAYOUT` slot, name, and accepted sizes.
struct FieldSpec {
    slot: usize,
    name: &'static str,
    /// Accepted sizes; a `__data_loc` field is always 4.
    sizes: &'static [u32],
    /// At least this many bytes (for `rwbs`, whose array grew from 8 to 10).
    min_size: Option<u32>,
}

const fn exact(slot: usize, name: &'static str, sizes: &'static [u32]) -> FieldSpec {
    FieldSpec {
        slot,
        name,
        sizes,
        min_size: None,
    }
}

pub(super) struct ProgramSpec {
    pub(super) program: &'static str,
    /// Tracepoints to try in order; the first this kernel has is used.
    tracepoints: &'static [(&'static str, &'static str)],
    fields: &'static [FieldSpec],
}

/// The fields every block tracepoint program reads, the same names in
/// `block_rq_error`, `block_rq_complete` and `block_bio_complete`, each in
/// its own slots. `slots`: dev, sector, nr_sector, error, rwbs.
const fn block_fields(slots: [usize; 5]) -> [FieldSpec; 5] {
    let [dev, sector, nr_sector, error, rwbs] = slots;
    [
        exact(dev, "dev", &[4]),
        exact(sector, "sector", &[8]),
        exact(nr_sector, "nr_sector", &[4]),
        exact(error, "error", &[4]),
        FieldSpec {
            slot: rwbs,
            name: "rwbs",
            sizes: &[],
            min_size: Some(8),
        },
    ]
}

const RQ_ERROR_FIELDS: [FieldSpec; 5] = block_fields([
    field::RQ_ERROR_DEV,
    field::RQ_ERROR_SECTOR,
    field::RQ_ERROR_NR_SECTOR,
    field::RQ_ERROR_ERROR,
    field::RQ_ERROR_RWBS,
]);

const RQ_COMPLETE_FIELDS: [FieldSpec; 5] = block_fields([
    field::RQ_COMPLETE_DEV,
    field::RQ_COMPLETE_SECTOR,
    field::RQ_COMPLETE_NR_SECTOR,
    field::RQ_COMPLETE_ERROR,
    field::RQ_COMPLETE_RWBS,
]);

const BIO_COMPLETE_FIELDS: [FieldSpec; 5] = block_fields([
    field::BIO_COMPLETE_DEV,
    field::BIO_COMPLETE_SECTOR,
    field::BIO_COMPLETE_NR_SECTOR,
    field::BIO_COMPLETE_ERROR,
    field::BIO_COMPLETE_RWBS,
]);

pub(super) const BLOCK_RQ_ERROR: ProgramSpec = ProgramSpec {
    program: "block_rq_error",
    tracepoints: &[("block", "block_rq_error")],
    fields: &RQ_ERROR_FIELDS,
};

pub(super) const BLOCK_RQ_COMPLETE: ProgramSpec = ProgramSpec {
    program: "block_rq_complete",
    tracepoints: &[("block", "block_rq_complete")],
    fields: &RQ_COMPLETE_FIELDS,
};

/// Every bio completion of every layer; the program counts failed bios of
/// bio-based dm/md devices only (see `health_common::source::BLOCK_BIO_ERROR`).
pub(super) const BLOCK_BIO_COMPLETE: ProgramSpec = ProgramSpec {
    program: "block_bio_complete",
    tracepoints: &[("block", "block_bio_complete")],
    fields: &BIO_COMPLETE_FIELDS,
};

/// The programs on the block layer's tracepoints.
const BLOCK_PROGRAMS: [&ProgramSpec; 3] =
    [&BLOCK_RQ_ERROR, &BLOCK_RQ_COMPLETE, &BLOCK_BIO_COMPLETE];

/// The block layer's tracepoints the programs attach to, `(group, name)`:
/// they sit on every I/O's path. `cargo xtask vm` keeps them hooked in its
/// guests (`code_patching_guard` in xtask/src/vm/guest.rs).
pub fn block_tracepoints() -> impl Iterator<Item = (&'static str, &'static str)> {
    BLOCK_PROGRAMS
        .into_iter()
        .flat_map(|spec| spec.tracepoints.iter().copied())
}

pub(super) const FS_PROGRAMS: &[ProgramSpec] = &[
    ProgramSpec {
        program: "ext4_error",
        tracepoints: &[("ext4", "ext4_error")],
        fields: &[
            exact(field::EXT4_ERROR_DEV, "dev", &[4]),
            exact(field::EXT4_ERROR_FUNCTION, "function", &[8]),
            exact(field::EXT4_ERROR_LINE, "line", &[4]),
        ],
    },
    ProgramSpec {
        program: "ext4_shutdown",
        tracepoints: &[("ext4", "ext4_shutdown")],
        fields: &[
            exact(field::EXT4_SHUTDOWN_DEV, "dev", &[4]),
            exact(field::EXT4_SHUTDOWN_FLAGS, "flags", &[4]),
        ],
    },
    ProgramSpec {
        program: "xfs_force_shutdown",
        tracepoints: &[("xfs", "xfs_force_shutdown")],
        fields: &[
            exact(field::XFS_SHUTDOWN_DEV, "dev", &[4]),
            exact(field::XFS_SHUTDOWN_FLAGS, "flags", &[4]),
            exact(field::XFS_SHUTDOWN_FNAME, "fname", &[4]),
            exact(field::XFS_SHUTDOWN_LINE, "line_num", &[4]),
        ],
    },
    ProgramSpec {
        program: "xfs_fs_mark_corrupt",
        tracepoints: &[("xfs", "xfs_fs_mark_corrupt")],
        fields: &[
            exact(field::XFS_FS_CORRUPT_DEV, "dev", &[4]),
            exact(field::XFS_FS_CORRUPT_FLAGS, "flags", &[4]),
        ],
    },
    ProgramSpec {
        program: "xfs_group_mark_corrupt",
        // Renamed from the per-AG marker when xfs grew realtime groups.
        tracepoints: &[
            ("xfs", "xfs_group_mark_corrupt"),
            ("xfs", "xfs_ag_mark_corrupt"),
        ],
        fields: &[
            exact(field::XFS_GROUP_CORRUPT_DEV, "dev", &[4]),
            exact(field::XFS_GROUP_CORRUPT_FLAGS, "flags", &[4]),
        ],
    },
    ProgramSpec {
        program: "xfs_inode_mark_corrupt",
        tracepoints: &[("xfs", "xfs_inode_mark_corrupt")],
        fields: &[
            exact(field::XFS_INODE_CORRUPT_DEV, "dev", &[4]),
            exact(field::XFS_INODE_CORRUPT_INO, "ino", &[8]),
            exact(field::XFS_INODE_CORRUPT_FLAGS, "flags", &[4]),
        ],
    },
    ProgramSpec {
        program: "filemap_set_wb_err",
        tracepoints: &[("filemap", "filemap_set_wb_err")],
        fields: &[
            exact(field::WB_ERR_INO, "i_ino", &[8]),
            exact(field::WB_ERR_DEV, "s_dev", &[4]),
            exact(field::WB_ERR_ERRSEQ, "errseq", &[4]),
        ],
    },
];

/// Checks the fields `spec` reads against the kernel's format and writes
/// their offsets into `layout`. `Err` is the reason the source cannot be
/// used on this kernel (no such tracepoint, or a layout it does not know);
/// the other sources still attach.
pub(super) fn plan(
    tracefs: &Tracefs,
    spec: &ProgramSpec,
    layout: &mut [u32; field::COUNT],
) -> Result<(&'static str, &'static str), String> {
    for &(group, name) in spec.tracepoints {
        let format = match tracefs.event_format(group, name) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => return Err(e.to_string()),
        };
        check_fields(group, name, &format, spec.fields, layout).map_err(|e| e.to_string())?;
        return Ok((group, name));
    }
    Err(missing_reason(spec, |group| tracefs.has_group(group)))
}

/// No tracepoint record is longer than this: records live in one page of
/// the trace buffer. A field said to end beyond it is a format we misread.
const MAX_RECORD_END: u32 = 64 * 1024;

/// Checks `format` against every program's fields as if it were each
/// program's tracepoint: the offsets each would read, or why not. For the
/// fuzz target and property tests, which have no tracefs.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn check_against_every_program(format: &EventFormat) -> Vec<Result<Vec<u32>, String>> {
    BLOCK_PROGRAMS
        .into_iter()
        .chain(FS_PROGRAMS)
        .map(|spec| {
            let mut layout = [0; field::COUNT];
            let (group, name) = spec.tracepoints[0];
            check_fields(group, name, format, spec.fields, &mut layout)
                .map(|()| spec.fields.iter().map(|f| layout[f.slot]).collect())
                .map_err(|e| e.to_string())
        })
        .collect()
}

fn check_fields(
    group: &str,
    name: &str,
    format: &EventFormat,
    fields: &[FieldSpec],
    layout: &mut [u32; field::COUNT],
) -> Result<(), ProbeError> {
    let layout_error = |problem: String| ProbeError::Layout {
        tracepoint: format!("{group}:{name}"),
        problem,
    };
    for spec in fields {
        let f = format.field(spec.name).ok_or_else(|| {
            layout_error(format!("has no field `{}`; refusing to read it", spec.name))
        })?;
        let size_ok = match spec.min_size {
            Some(min) => f.size >= min,
            None => spec.sizes.contains(&f.size),
        };
        if f.offset
            .checked_add(f.size)
            .is_none_or(|end| end > MAX_RECORD_END)
        {
            return Err(layout_error(format!(
                "field `{}` ({}) at offset {} size {} ends beyond any record; refusing to read it",
                spec.name, f.decl, f.offset, f.size
            )));
        }
        if !size_ok {
            return Err(layout_error(format!(
                "field `{}` ({}) is {} bytes, expected {}; refusing to read it",
                spec.name,
                f.decl,
                f.size,
                match spec.min_size {
                    Some(min) => format!("at least {min}"),
                    None => format!("{:?}", spec.sizes),
                }
            )));
        }
        layout[spec.slot] = f.offset;
    }
    Ok(())
}

/// Why `spec`'s tracepoints are not there: a filesystem module not loaded
/// yet (none of its group's tracepoints exist), or a kernel that predates
/// them (its group is there without them: Debian's 6.1 has xfs's
/// shutdown tracepoint and no corruption markers).
fn missing_reason(spec: &ProgramSpec, has_group: impl Fn(&str) -> bool) -> String {
    let names: Vec<String> = spec
        .tracepoints
        .iter()
        .map(|(g, n)| format!("{g}:{n}"))
        .collect();
    let group = spec.tracepoints[0].0;
    let hint = match group {
        "xfs" | "ext4" if !has_group(group) => {
            format!(" (the {group} module is not loaded; it is attached at the next start)")
        }
        _ => String::new(),
    };
    format!("this kernel has no {}{hint}", names.join(" or "))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::tracefs::parse_format;

    fn format(text: &str) -> EventFormat {
        parse_format(Path::new("t"), text).unwrap()
    }

    #[test]
    fn a_missing_tracepoint_blames_the_module_only_when_its_group_is_absent() {
        let corrupt = FS_PROGRAMS
            .iter()
            .find(|p| p.program == "xfs_fs_mark_corrupt")
            .unwrap();
        assert_eq!(
            missing_reason(corrupt, |_| false),
            "this kernel has no xfs:xfs_fs_mark_corrupt \
             (the xfs module is not loaded; it is attached at the next start)"
        );
        // Debian's 6.1: xfs loaded, its shutdown tracepoint there, no marker.
        assert_eq!(
            missing_reason(corrupt, |group| group == "xfs"),
            "this kernel has no xfs:xfs_fs_mark_corrupt"
        );
        assert_eq!(
            missing_reason(&BLOCK_RQ_ERROR, |_| false),
            "this kernel has no block:block_rq_error"
        );
    }

    #[test]
    fn layout_check_takes_offsets_from_the_format() {
        let f = format(
            "\tfield:dev_t dev;\toffset:12;\tsize:4;\tsigned:0;\n\
             \tfield:sector_t sector;\toffset:24;\tsize:8;\tsigned:0;\n\
             \tfield:unsigned int nr_sector;\toffset:32;\tsize:4;\tsigned:0;\n\
             \tfield:int error;\toffset:36;\tsize:4;\tsigned:1;\n\
             \tfield:char rwbs[8];\toffset:40;\tsize:8;\tsigned:0;\n",
        );
        let mut layout = [0; field::COUNT];
        check_fields(
            "block",
            "block_rq_error",
            &f,
            BLOCK_RQ_ERROR.fields,
            &mut layout,
        )
        .unwrap();
        assert_eq!(layout[field::RQ_ERROR_DEV], 12);
        assert_eq!(layout[field::RQ_ERROR_SECTOR], 24);
        assert_eq!(layout[field::RQ_ERROR_NR_SECTOR], 32);
        assert_eq!(layout[field::RQ_ERROR_ERROR], 36);
        assert_eq!(layout[field::RQ_ERROR_RWBS], 40);
    }

    #[test]
    fn layout_check_refuses_missing_or_resized_fields() {
        let mut layout = [0; field::COUNT];
        let f = format("\tfield:dev_t dev;\toffset:8;\tsize:8;\tsigned:0;\n");
        let err = check_fields(
            "ext4",
            "ext4_shutdown",
            &f,
            FS_PROGRAMS[1].fields,
            &mut layout,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "tracepoint ext4:ext4_shutdown: field `dev` (dev_t dev) is 8 bytes, expected [4]; refusing to read it"
        );
        let f = format("\tfield:dev_t dev;\toffset:8;\tsize:4;\tsigned:0;\n");
        let err = check_fields(
            "ext4",
            "ext4_shutdown",
            &f,
            FS_PROGRAMS[1].fields,
            &mut layout,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "tracepoint ext4:ext4_shutdown: has no field `flags`; refusing to read it"
        );
        let f = format("\tfield:char rwbs[6];\toffset:8;\tsize:6;\tsigned:0;\n");
        let rwbs_only = &BLOCK_RQ_ERROR.fields[4..];
        let err = check_fields("block", "block_rq_error", &f, rwbs_only, &mut layout).unwrap_err();
        assert!(
            err.to_string().contains("is 6 bytes, expected at least 8"),
            "{err}"
        );
    }
}
