//! Parsing `/proc/<pid>/mountinfo` (format in proc(5)):
//!
//! ```text
//! 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//! (1)(2) (3)   (4)   (5)      (6)      (7)  (8) (9)    (10)         (11)
//! ```
//!
//! Fields are separated by single spaces; the number of optional fields (7)
//! varies and the list ends at a lone `-`. The kernel escapes space, tab,
//! newline, backslash and `#` in the string fields as `\ooo` octal.
//!
//! Here: one line as a [`MountEntry`], the escaping, and where the table is
//! opened ([`open_with_fallback`]). Reading a whole table, and the public
//! `parse_mountinfo` and `read_mounts`, are `mount_table`'s, which builds
//! on this module.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use health_core::dev::Dev;

use super::{HostPaths, TopologyError};

/// One line of mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_id: u32,
    pub parent_id: u32,
    /// `st_dev` of the filesystem as the superblock reports it. For btrfs
    /// this is the superblock's anonymous device, which is also what the
    /// filemap/btrfs tracepoints carry (see `btrfs.rs`).
    pub dev: Dev,
    /// The directory of the filesystem that forms the root of this mount
    /// (`/` unless this is a bind mount of a subdirectory or a btrfs subvolume).
    pub root: PathBuf,
    /// Where it is mounted, relative to the reading process's root.
    pub mount_point: PathBuf,
    /// Per-mount options (`ro`/`rw`, `nosuid`, `relatime`, ...).
    pub mount_options: String,
    pub fs_type: String,
    /// The mount source (`/dev/sda1`, `tmpfs`, `none`, ...), unescaped.
    pub source: String,
    /// Per-superblock options: shared by every mount of the same filesystem.
    pub super_options: String,
}

impl MountEntry {
    /// Whether `opt` is set in the mount or the superblock options.
    ///
    /// `opt` matches an option exactly (`errors=remount-ro`); an `opt`
    /// without `=` also matches the key of a `key=value` option, so
    /// `has_option("errors")` is true for `errors=continue`.
    pub fn has_option(&self, opt: &str) -> bool {
        self.has_mount_option(opt) || self.has_super_option(opt)
    }

    /// Whether `opt` is set in the per-mount options (matched as in
    /// [`MountEntry::has_option`]).
    pub fn has_mount_option(&self, opt: &str) -> bool {
        option_in(&self.mount_options, opt)
    }

    /// Whether `opt` is set in the superblock options, which show the
    /// filesystem's own state (`emergency_ro`, `shutdown`) for every mount
    /// of it (matched as in [`MountEntry::has_option`]).
    pub fn has_super_option(&self, opt: &str) -> bool {
        option_in(&self.super_options, opt)
    }

    /// Writes through this mount fail: read-only on purpose (mount or
    /// superblock `ro`) or because the kernel forced it after errors.
    pub fn is_read_only(&self) -> bool {
        option_in(&self.mount_options, "ro")
            || option_in(&self.super_options, "ro")
            || self.is_error_read_only()
    }

    /// What the mount table alone shows of a filesystem the kernel made
    /// read-only because of errors, as opposed to a volume someone mounted
    /// read-only. Many kernels show nothing here (6.1, 6.12: the read-only
    /// check in health-node looks further), and a superblock remounted `ro`
    /// on purpose looks like the second shape through a `rw` bind mount.
    ///
    /// Two shapes, measured on 6.18 and 5.10:
    /// - `emergency_ro` in the superblock options. ext4 with
    ///   `errors=remount-ro` on 6.18 shows exactly this after an error, while
    ///   the mount *and* superblock still say `rw`
    ///   (`... rw,relatime - ext4 /dev/loop1 rw,errors=remount-ro,emergency_ro`).
    /// - The superblock says `ro` while the mount says `rw`: older ext4 and
    ///   btrfs set SB_RDONLY on the superblock only. A `mount -o ro` sets
    ///   both and a read-only bind mount (how kubelet mounts `readOnly: true`
    ///   volumes) only the mount flag, but `mount -o remount,ro` of one mount
    ///   shows this shape through the other (`rw`) bind mounts of it.
    pub fn is_error_read_only(&self) -> bool {
        option_in(&self.super_options, "emergency_ro")
            || (option_in(&self.super_options, "ro") && option_in(&self.mount_options, "rw"))
    }
}

fn option_in(list: &str, opt: &str) -> bool {
    let by_key = !opt.contains('=');
    list.split(',')
        .any(|o| o == opt || (by_key && o.split_once('=').is_some_and(|(key, _)| key == opt)))
}

/// Applies `op` to pid 1's mountinfo, then to our own if that fails. Shared
/// with the watcher so both look at the same table.
pub(crate) fn open_with_fallback<T>(
    paths: &HostPaths,
    mut op: impl FnMut(&Path) -> io::Result<T>,
) -> Result<(PathBuf, T), TopologyError> {
    let primary = paths.mountinfo();
    match op(&primary) {
        Ok(v) => Ok((primary, v)),
        Err(primary_error) => {
            let fallback = paths.self_mountinfo();
            tracing::warn!(
                path = %primary.display(),
                error = %primary_error,
                fallback = %fallback.display(),
                "host mount table unreadable; using the agent's own mount namespace"
            );
            match op(&fallback) {
                Ok(v) => Ok((fallback, v)),
                Err(error) => Err(TopologyError::MountinfoUnreadable {
                    primary,
                    primary_error,
                    fallback,
                    error,
                }),
            }
        }
    }
}

/// One line (without its newline) as a [`MountEntry`], or why not. Works on
/// bytes because paths need not be UTF-8; path fields keep their exact
/// bytes, text fields are decoded lossily.
pub(super) fn parse_line(line: &[u8]) -> Result<MountEntry, String> {
    // Split on single spaces, not runs of whitespace: an empty source is
    // printed as an empty field and must not shift the fields after it.
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    if fields.len() < 8 {
        return Err(format!(
            "expected at least 8 fields, found {}",
            fields.len()
        ));
    }
    // The optional fields end at the first lone "-" after field 6; no
    // earlier field can be "-" (ids, MAJ:MIN, absolute paths, options).
    let sep = fields
        .iter()
        .skip(6)
        .position(|f| *f == b"-")
        .map(|p| p + 6)
        .ok_or_else(|| "no ' - ' separator after the optional fields".to_string())?;
    let tail = &fields[sep + 1..];
    // Super options can in principle be missing (very old kernels); more
    // than three fields means we misread the line.
    if tail.len() < 2 || tail.len() > 3 {
        return Err(format!(
            "expected 3 fields after the separator (type, source, super options), found {}",
            tail.len()
        ));
    }

    let mount_id = parse_num(fields[0], "mount id")?;
    let parent_id = parse_num(fields[1], "parent id")?;
    let dev_text = text(fields[2]);
    let dev: Dev = dev_text
        .parse()
        .map_err(|_| format!("invalid MAJ:MIN {dev_text:?}"))?;
    let root = parse_root(fields[3])?;
    let mount_point = parse_path(fields[4], "mount point")?;
    let fs_type = unescape_text(tail[0]);
    if fs_type.is_empty() {
        return Err("empty filesystem type".to_string());
    }

    Ok(MountEntry {
        mount_id,
        parent_id,
        dev,
        root,
        mount_point,
        mount_options: unescape_text(fields[5]),
        fs_type,
        source: unescape_text(tail[1]),
        super_options: tail.get(2).map(|f| unescape_text(f)).unwrap_or_default(),
    })
}

fn text(field: &[u8]) -> String {
    String::from_utf8_lossy(field).into_owned()
}

fn parse_num(field: &[u8], what: &str) -> Result<u32, String> {
    let s = text(field);
    s.parse().map_err(|_| format!("invalid {what} {s:?}"))
}

fn parse_path(field: &[u8], what: &str) -> Result<PathBuf, String> {
    let bytes = unescape(field);
    // The kernel prints absolute paths; a relative one means the line is
    // not what we think it is. (Unreachable mounts print as "/".)
    if bytes.first() != Some(&b'/') {
        return Err(format!("{what} {:?} is not an absolute path", text(field)));
    }
    Ok(PathBuf::from(OsString::from_vec(bytes)))
}

/// The root field. Besides paths, the kernel prints the synthetic name of a
/// dentry that has no path (`d_dname`): a bind mount of a namespace file,
/// as every CNI node has under `/run/netns`, reads
/// `44 43 0:4 net:[4026532177] /run/netns/cni-1 rw - nsfs nsfs rw`
/// (measured on 6.18). Such a line is a mount, not a misread one.
fn parse_root(field: &[u8]) -> Result<PathBuf, String> {
    let bytes = unescape(field);
    if is_dentry_name(&bytes) {
        return Ok(PathBuf::from(OsString::from_vec(bytes)));
    }
    parse_path(field, "root")
}

/// `<name>:[<id>]`, the shape of every `d_dname` in the kernel (nsfs,
/// pipefs, sockfs, anon inodes).
pub(crate) fn is_dentry_name(root: &[u8]) -> bool {
    root.iter().position(|&b| b == b':').is_some_and(|colon| {
        colon > 0
            && root[..colon]
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
            && root[colon + 1..].starts_with(b"[")
            && root.ends_with(b"]")
    })
}

fn unescape_text(field: &[u8]) -> String {
    String::from_utf8_lossy(&unescape(field)).into_owned()
}

/// Undoes the kernel's `\ooo` escaping. A backslash not followed by three
/// octal digits (that fit a byte) is kept as it is: the kernel never writes
/// one, and keeping it loses nothing.
pub(crate) fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' {
            if let Some(byte) = field.get(i + 1..i + 4).and_then(octal_byte) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

/// The kernel's escaping of a string field (`mangle()` in
/// fs/proc_namespace.c): space, tab, newline, backslash and `#` as `\ooo`.
/// The inverse of [`unescape`]; tests and fuzz targets write lines with it.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn escape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    for &b in field {
        if matches!(b, b' ' | b'\t' | b'\n' | b'\\' | b'#') {
            out.extend(format!("\\{b:03o}").bytes());
        } else {
            out.push(b);
        }
    }
    out
}

fn octal_byte(digits: &[u8]) -> Option<u8> {
    let mut v: u32 = 0;
    for &d in digits {
        if !(b'0'..=b'7').contains(&d) {
            return None;
        }
        v = v * 8 + u32::from(d - b'0');
    }
    u8::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use std::io::BufReader;
    use std::os::unix::ffi::OsStrExt;

    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;
    use crate::fuzzing::mountinfo::to_line;
    // The table reader drives the line parser here, as in use.
    use crate::mount_table::{parse_mountinfo, read_mountinfo, Limits, ParsedMounts};

    const SAMPLE: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
36 27 7:1 / /mnt/with\\040space\\011tab rw,relatime shared:5 master:2 propagate_from:3 unbindable - ext4 /dev/loop1 rw,errors=remount-ro
37 27 7:1 /sub\\134dir /mnt/nl\\012x rw - ext4 /dev/loop1 rw
38 27 0:40 / /mnt/hash\\043 rw - tmpfs  rw,size=4k
";

    #[test]
    fn parses_fields_optional_fields_and_escapes() {
        let m = parse_mountinfo(SAMPLE).unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m[0].mount_id, 22);
        assert_eq!(m[0].parent_id, 27);
        assert_eq!(m[0].dev, Dev::new(0, 21));
        assert_eq!(m[0].fs_type, "proc");
        assert_eq!(m[1].mount_point, Path::new("/"));
        assert_eq!(m[1].source, "/dev/vda");
        assert_eq!(m[1].super_options, "rw,discard");

        // Four optional fields, escaped space and tab.
        assert_eq!(m[2].dev, Dev::new(7, 1));
        assert_eq!(m[2].mount_point, Path::new("/mnt/with space\ttab"));
        assert_eq!(m[2].fs_type, "ext4");
        assert_eq!(m[2].source, "/dev/loop1");
        assert_eq!(m[2].super_options, "rw,errors=remount-ro");

        // Escaped backslash in root, newline in the mount point.
        assert_eq!(m[3].root, Path::new("/sub\\dir"));
        assert_eq!(m[3].mount_point, Path::new("/mnt/nl\nx"));

        // An empty source stays an empty field instead of shifting the rest.
        assert_eq!(m[4].mount_point, Path::new("/mnt/hash#"));
        assert_eq!(m[4].source, "");
        assert_eq!(m[4].super_options, "rw,size=4k");
    }

    #[test]
    fn a_bound_namespace_file_is_a_mount_not_a_malformed_line() {
        // `ip netns add x` on 6.18; CNI plugins leave one per pod sandbox.
        let text = "44 43 0:4 net:[4026532177] /run/netns/cni-1 rw shared:2 - nsfs nsfs rw\n";
        let parsed = read_mountinfo(text.as_bytes(), None, Limits::default()).unwrap();
        assert_eq!(parsed.bad_lines, 0);
        assert_eq!(parsed.entries[0].root, Path::new("net:[4026532177]"));
        assert_eq!(parsed.entries[0].mount_point, Path::new("/run/netns/cni-1"));
        assert_eq!(parsed.entries[0].fs_type, "nsfs");
    }

    #[test]
    fn non_utf8_paths_keep_their_bytes() {
        let line = b"40 27 7:2 / /mnt/caf\xe9 rw - ext4 /dev/loop2 rw\n";
        let m = read_mountinfo(&line[..], None, Default::default())
            .unwrap()
            .entries;
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(m[0].mount_point.as_os_str().as_bytes(), b"/mnt/caf\xe9");
    }

    #[test]
    fn odd_escapes_are_kept_verbatim() {
        assert_eq!(unescape(b"a\\"), b"a\\");
        assert_eq!(unescape(b"a\\9zz"), b"a\\9zz");
        assert_eq!(unescape(b"a\\777"), b"a\\777");
        assert_eq!(unescape(b"a\\04"), b"a\\04");
        assert_eq!(unescape(b"\\101\\102"), b"AB");
    }

    #[test]
    fn error_read_only_versus_read_only_on_purpose() {
        let text = "\
43 27 7:1 / /err rw,relatime - ext4 /dev/loop1 rw,errors=remount-ro,emergency_ro
44 27 7:2 / /old-err rw,relatime - ext4 /dev/loop2 ro,errors=remount-ro
45 27 7:3 / /ro ro,relatime - ext4 /dev/loop3 ro
46 27 7:4 / /ro-bind ro,relatime - ext4 /dev/loop4 rw
47 27 7:5 / /rw rw,relatime - ext4 /dev/loop5 rw,errors=remount-ro
";
        let m = parse_mountinfo(text).unwrap();
        let flags: Vec<(bool, bool)> = m
            .iter()
            .map(|e| (e.is_read_only(), e.is_error_read_only()))
            .collect();
        assert_eq!(
            flags,
            [
                (true, true),   // 6.18 emergency_ro, mount and super still "rw"
                (true, true),   // superblock forced ro under an rw mount
                (true, false),  // mount -o ro
                (true, false),  // read-only bind mount (kubelet readOnly volume)
                (false, false), // healthy
            ]
        );
    }

    #[test]
    fn has_option_matches_whole_options_and_keys() {
        let m = &parse_mountinfo(
            "47 27 7:5 / /rw rw,relatime - ext4 /dev/loop5 rw,errors=remount-ro,data=ordered\n",
        )
        .unwrap()[0];
        assert!(m.has_option("relatime"));
        assert!(m.has_option("errors=remount-ro"));
        assert!(m.has_option("errors"));
        assert!(!m.has_option("errors=continue"));
        assert!(!m.has_option("rel"));
        assert!(!m.has_option("ro"));
        // Each list on its own: `relatime` is the mount's, `errors` the
        // superblock's, `rw` both.
        assert!(m.has_mount_option("relatime") && !m.has_super_option("relatime"));
        assert!(m.has_super_option("errors") && !m.has_mount_option("errors"));
        assert!(m.has_mount_option("rw") && m.has_super_option("rw"));
    }

    // Property tests of the mountinfo reader (`mountinfo`, `mount_table`).

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

    /// A root as the kernel prints a dentry without a path (`d_dname`):
    /// `<name>:[<anything>]`, or any path.
    fn root() -> impl Strategy<Value = Vec<u8>> {
        let dentry = ("[a-z_]{1,12}", path()).prop_map(|(name, inner)| {
            let mut r = format!("{name}:[").into_bytes();
            r.extend(&inner[1..]);
            r.push(b']');
            r
        });
        prop_oneof![dentry, path()]
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
            root in root(),
            point in path(),
            options in text(0),
            fs_type in text(1),
            source in text(0),
            super_options in text(0),
        ) {
            let entry = MountEntry {
                mount_id: ids.0,
                parent_id: ids.1,
                dev: health_core::dev::Dev::new(dev.0, dev.1),
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
}
