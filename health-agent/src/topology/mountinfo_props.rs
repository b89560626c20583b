//! Property tests of the mountinfo reader (`mountinfo`, `mount_table`).

use std::io::BufReader;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use proptest::collection::vec;
use proptest::prelude::*;

use super::mount_table::{read_mountinfo, Limits, ParsedMounts};
use super::mountinfo::{escape, MountEntry};
use super::TopologyError;
use crate::fuzz_targets::mountinfo::to_line;

/// Absolute paths of any bytes but NUL (which no path holds), weighted
/// towards the characters the kernel escapes.
fn path() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        3 => proptest::sample::select(b" \t\n\\#-".to_vec()),
        1 => Just(b'/'),
        6 => 1u8..=255,
    ];
    vec(byte, 0..40).prop_map(|mut tail| {
        let mut p = vec![b'/'];
        p.append(&mut tail);
        p
    })
}

/// Text fields as the kernel prints them: any UTF-8.
fn text(min: usize) -> impl Strategy<Value = String> {
    vec(any::<char>(), min..12).prop_map(|c| c.into_iter().collect())
}

/// Optional fields: anything without a space that is not the lone `-`.
fn optional_field() -> impl Strategy<Value = String> {
    "[a-z_]{1,12}(:[0-9]{1,4})?"
}

fn read(data: &[u8]) -> Result<ParsedMounts, TopologyError> {
    read_mountinfo(
        data,
        Some(Path::new("/proc/1/mountinfo")),
        Limits::default(),
    )
}

proptest! {
    /// escape(path) parses back to the path, for the root and the mount
    /// point, byte for byte; text fields come back as they were.
    #[test]
    fn escaped_fields_parse_back_to_themselves(
        ids in (any::<u32>(), any::<u32>()),
        dev in (any::<u32>(), any::<u32>()),
        root in path(),
        point in path(),
        options in text(0),
        fs_type in text(1),
        source in text(0),
        super_options in text(0),
    ) {
        let entry = MountEntry {
            mount_id: ids.0,
            parent_id: ids.1,
            dev: crate::dev::Dev::new(dev.0, dev.1),
            root: std::ffi::OsStr::from_bytes(&root).into(),
            mount_point: std::ffi::OsStr::from_bytes(&point).into(),
            mount_options: options,
            fs_type,
            source,
            super_options,
        };
        let parsed = read(&to_line(&entry)).unwrap();
        prop_assert_eq!(parsed.bad_lines, 0);
        prop_assert_eq!(parsed.entries.len(), 1);
        let got = &parsed.entries[0];
        prop_assert_eq!(got.root.as_os_str().as_bytes(), &root[..]);
        prop_assert_eq!(got.mount_point.as_os_str().as_bytes(), &point[..]);
        prop_assert_eq!(got, &entry);
    }

    /// Any number of optional fields before the separator leaves the
    /// entry unchanged.
    #[test]
    fn optional_fields_do_not_shift_the_rest(fields in vec(optional_field(), 0..6), point in path()) {
        let line = |optional: &[String]| {
            let mut l = b"36 27 7:1 / ".to_vec();
            l.extend(escape(&point));
            l.extend(b" rw,relatime ");
            for f in optional {
                l.extend(f.as_bytes());
                l.push(b' ');
            }
            l.extend(b"- ext4 /dev/loop1 rw,errors=remount-ro\n");
            l
        };
        let with = read(&line(&fields)).unwrap().entries;
        let without = read(&line(&[])).unwrap().entries;
        prop_assert_eq!(with, without);
    }

    /// Streaming does not depend on where the reader's buffer ends: any
    /// buffer size gives what one read of the whole text gives.
    #[test]
    fn chunk_boundaries_do_not_matter(
        lines in vec(prop_oneof![
            3 => path().prop_map(|p| {
                let mut l = b"1 0 8:1 / ".to_vec();
                l.extend(escape(&p));
                l.extend(b" rw - ext4 /dev/sda1 rw");
                l
            }),
            1 => vec(any::<u8>(), 0..30),
        ], 0..12),
        capacity in 1usize..40,
        max_line in 8usize..200,
    ) {
        let data = lines.join(&b'\n');
        let limits = Limits { max_line, max_mounts: 100 };
        let whole = read_mountinfo(&data[..], None, limits);
        let chunked = read_mountinfo(BufReader::with_capacity(capacity, &data[..]), None, limits);
        match (whole, chunked) {
            (Ok(a), Ok(b)) => {
                prop_assert_eq!(a.entries, b.entries);
                prop_assert_eq!(a.bad_lines, b.bad_lines);
            }
            (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
            (a, b) => prop_assert!(false, "{:?} vs {:?}", a.map(|p| p.entries), b.map(|p| p.entries)),
        }
    }

    /// Arbitrary bytes: never a panic; a refusal names the file and a line
    /// that exists.
    #[test]
    fn arbitrary_bytes_are_parsed_or_refused_with_file_and_line(data in vec(any::<u8>(), 0..600)) {
        let lines = data.split(|&b| b == b'\n').count();
        match read(&data) {
            Ok(p) => prop_assert!(p.entries.len() + p.bad_lines <= lines),
            Err(TopologyError::MalformedMountinfo { origin, line, .. }) => {
                prop_assert_eq!(origin.as_deref(), Some(Path::new("/proc/1/mountinfo")));
                prop_assert!((1..=lines).contains(&line), "line {} of {}", line, lines);
            }
            Err(e) => prop_assert!(false, "unexpected error {}", e),
        }
    }
}
