//! ext4's own error record: the superblock keeps a count of errors and the
//! first and last of them until the next fsck, and the kernel shows them in
//! `/sys/fs/ext4/<dev>/`. For a one-shot view this is the kernel evidence of
//! the past that no tracepoint can give: it survives remounts and reboots.
//!
//! Reading these attributes does no I/O on the filesystem (they are fields
//! of the in-memory superblock), so it cannot hang on a dead disk.

use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use health_core::conditions::{errno_name, rfc3339, Status};

/// What `/sys/fs/ext4/<name>/` says about past errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ext4Errors {
    pub name: String,
    pub count: u64,
    pub first: Option<SystemTime>,
    pub last: Option<SystemTime>,
    pub first_function: Option<String>,
    pub last_function: Option<String>,
    /// Positive errno of the last error, when the kernel recorded one.
    pub last_errno: Option<i32>,
}

impl Ext4Errors {
    pub const STATUS: Status = Status::DataLoss;
    /// The reason the kernel collector uses for `ext4_error` too, so the two
    /// sources agree on one condition.
    pub const REASON: &'static str = "FilesystemErrors";

    pub fn message(&self) -> String {
        let mut m = format!(
            "ext4 on {} has recorded {} error{} since its last fsck",
            self.name,
            self.count,
            if self.count == 1 { "" } else { "s" }
        );
        if let Some(first) = self.first {
            m.push_str(&format!("; first at {}", rfc3339(first)));
            if let Some(f) = &self.first_function {
                m.push_str(&format!(" in {f}"));
            }
        }
        if let (Some(last), true) = (self.last, self.count > 1) {
            m.push_str(&format!("; last at {}", rfc3339(last)));
            if let Some(f) = &self.last_function {
                m.push_str(&format!(" in {f}"));
            }
        }
        if let Some(e) = self.last_errno {
            m.push_str(&format!(" ({})", errno_name(e)));
        }
        m
    }
}

/// The error record of the ext4 filesystem on block device `name` (`loop3`,
/// `dm-0`), `Ok(None)` when it has no errors. `sys_root` is the host's /sys.
pub fn ext4_error_evidence(sys_root: &Path, name: &str) -> io::Result<Option<Ext4Errors>> {
    let dir = sys_root.join("fs/ext4").join(name);
    let count = read_u64(&dir.join("errors_count"))?;
    if count == 0 {
        return Ok(None);
    }
    // The rest is detail: older kernels lack some attributes.
    let time = |f: &str| {
        read_u64(&dir.join(f))
            .ok()
            .filter(|&s| s > 0)
            .map(|s| UNIX_EPOCH + Duration::from_secs(s))
    };
    let text = |f: &str| {
        fs::read_to_string(dir.join(f))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    Ok(Some(Ext4Errors {
        name: name.to_string(),
        count,
        first: time("first_error_time"),
        last: time("last_error_time"),
        first_function: text("first_error_func"),
        last_function: text("last_error_func"),
        last_errno: read_u64(&dir.join("last_error_errcode"))
            .ok()
            .filter(|&e| e > 0 && e < 4096)
            .map(|e| e as i32),
    }))
}

fn read_u64(path: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(path)?;
    text.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a number: {text:?}", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_superblock_error_record() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("fs/ext4/loop7");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("errors_count"), "0\n").unwrap();
        assert_eq!(ext4_error_evidence(tmp.path(), "loop7").unwrap(), None);
        fs::write(dir.join("errors_count"), "3\n").unwrap();
        fs::write(dir.join("first_error_time"), "1700000000\n").unwrap();
        fs::write(dir.join("last_error_time"), "1700000060\n").unwrap();
        fs::write(dir.join("first_error_func"), "ext4_lookup\n").unwrap();
        fs::write(dir.join("last_error_func"), "\n").unwrap();
        fs::write(dir.join("last_error_errcode"), "5\n").unwrap();
        let e = ext4_error_evidence(tmp.path(), "loop7").unwrap().unwrap();
        assert_eq!(e.count, 3);
        assert_eq!(e.last_function, None);
        assert_eq!(
            e.message(),
            "ext4 on loop7 has recorded 3 errors since its last fsck; first at 2023-11-14T22:13:20Z in ext4_lookup; last at 2023-11-14T22:14:20Z (EIO)"
        );
        // Not an ext4 device at all: an error, which callers treat as "no evidence".
        assert!(ext4_error_evidence(tmp.path(), "sda").is_err());
    }
}
