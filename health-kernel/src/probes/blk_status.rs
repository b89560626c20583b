//! The errno the kernel gives each block status (`blk_status_to_errno`), for
//! the `tp_btf` programs, which see the raw `blk_status_t`.
//!
//! The statuses are C macros, so they are not in the kernel's BTF. Codes 1
//! to 13 have kept their numbers since 4.13 (checked against the 6.1 and
//! 6.12 headers). Above 13 the numbering changed once, when
//! `BLK_STS_ZONE_RESOURCE` (14) was removed: 6.1 has the old numbers, 6.12
//! the new ones, and for kernels in between this table does not know which,
//! so those codes are left out and the programs count them as EIO (the
//! kernel's own catch-all) rather than guess.

use health_common::rq::STATUS_COUNT;

use super::release::parse_version;

const STABLE: [(usize, i32); 13] = [
    (1, libc::EOPNOTSUPP),
    (2, libc::ETIMEDOUT),
    (3, libc::ENOSPC),
    (4, libc::ENOLINK),
    (5, libc::EREMOTEIO),
    (6, libc::EBADE),
    (7, libc::ENODATA),
    (8, libc::EILSEQ),
    (9, libc::ENOMEM),
    (10, libc::EIO),
    (11, libc::EREMCHG),
    (12, libc::EAGAIN),
    (13, libc::EBUSY),
];

/// Up to 6.4: zone open/active resource 15/16, offline 17 (6.0+), duration
/// limit 18 (6.5 added it at 18 before the renumbering).
const BEFORE_RENUMBERING: [(usize, i32); 4] = [
    (15, libc::ETOOMANYREFS),
    (16, libc::EOVERFLOW),
    (17, libc::ENODEV),
    (18, libc::ETIME),
];

/// From 6.12 (and the renumbering, somewhere after 6.5): 14 to 17, and
/// `BLK_STS_INVAL` at 19.
const AFTER_RENUMBERING: [(usize, i32); 5] = [
    (14, libc::ETOOMANYREFS),
    (15, libc::EOVERFLOW),
    (16, libc::ENODEV),
    (17, libc::ETIME),
    (19, libc::EINVAL),
];

/// The table for a kernel release (`uname -r`), and whether codes above 13
/// are known on it.
pub fn errno_table(release: &str) -> ([u8; STATUS_COUNT], bool) {
    let mut table = [0u8; STATUS_COUNT];
    let version = parse_version(release);
    let extra: &[(usize, i32)] = match version {
        Some(v) if v <= (6, 4) => &BEFORE_RENUMBERING,
        Some(v) if v >= (6, 12) => &AFTER_RENUMBERING,
        _ => &[],
    };
    for &(status, errno) in STABLE.iter().chain(extra) {
        table[status] = errno as u8;
    }
    (table, !extra.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_by_release() {
        let (t, known) = errno_table("6.18.44-fc-v657");
        assert!(known);
        assert_eq!(t[10], libc::EIO as u8);
        assert_eq!(t[7], libc::ENODATA as u8);
        assert_eq!(t[16], libc::ENODEV as u8);
        assert_eq!(t[14], libc::ETOOMANYREFS as u8);
        let (t, known) = errno_table("6.1.0-56-amd64");
        assert!(known);
        assert_eq!(t[17], libc::ENODEV as u8);
        assert_eq!(t[14], 0, "zone resource: no errno of its own known");
        let (t, known) = errno_table("6.8.0-45-generic");
        assert!(!known);
        assert_eq!(t[16], 0);
        assert_eq!(t[4], libc::ENOLINK as u8);
        assert!(!errno_table("weird").1);
        assert!(t.iter().all(|&e| i32::from(e) < 256));
    }
}
