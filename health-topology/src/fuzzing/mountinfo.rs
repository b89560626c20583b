//! mountinfo (`topology::mount_table`): the streaming reader over arbitrary
//! bytes, with small limits so that afl reaches the bounds quickly.
//!
//! Properties: no panic; every entry that parses has an absolute mount
//! point and an absolute root or a dentry name (`net:[4026532177]`); and escaping the parsed entry's fields the kernel's way and
//! parsing that line again gives the same entry (escapes round-trip).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::mount_table::{read_mountinfo, Limits};
use crate::mountinfo::{escape, is_dentry_name, MountEntry};

pub fn run(data: &[u8]) {
    let limits = Limits {
        max_line: 4096,
        max_mounts: 64,
    };
    let Ok(parsed) = read_mountinfo(data, Some(Path::new("fuzz/mountinfo")), limits) else {
        return;
    };
    for entry in &parsed.entries {
        assert!(entry.mount_point.is_absolute());
        assert!(entry.root.is_absolute() || is_dentry_name(entry.root.as_os_str().as_bytes()));
        let line = to_line(entry);
        let again = read_mountinfo(&line[..], None, Limits::default())
            .expect("a line written from a parsed entry parses");
        assert_eq!(again.entries.len(), 1);
        assert_eq!(
            &again.entries[0],
            entry,
            "{:?}",
            String::from_utf8_lossy(&line)
        );
    }
}

/// The line the kernel would print for `e` (no optional fields).
pub(crate) fn to_line(e: &MountEntry) -> Vec<u8> {
    let mut line = format!("{} {} {} ", e.mount_id, e.parent_id, e.dev).into_bytes();
    let fields: [&[u8]; 6] = [
        e.root.as_os_str().as_bytes(),
        e.mount_point.as_os_str().as_bytes(),
        e.mount_options.as_bytes(),
        b"-",
        e.fs_type.as_bytes(),
        e.source.as_bytes(),
    ];
    for (i, f) in fields.iter().enumerate() {
        if i == 3 {
            line.extend(b"- ");
            continue;
        }
        line.extend(escape(f));
        line.push(b' ');
    }
    line.extend(escape(e.super_options.as_bytes()));
    line.push(b'\n');
    line
}
