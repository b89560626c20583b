//! The one device-mapper call the agent makes: `DM_TABLE_STATUS`, by device
//! number, for a device's table (target types) or its status lines (paths of
//! a multipath device, usage of a thin pool).
//!
//! Written here rather than taken from the `devicemapper` crate: that crate
//! generates its bindings with bindgen at build time (libclang and, in recent
//! versions, libdevmapper's headers on every build machine) to reach one
//! fixed-layout struct and one ioctl number. The layout and numbers below are
//! the kernel's UAPI, `include/uapi/linux/dm-ioctl.h` (interface version 4,
//! unchanged since Linux 2.6).
//!
//! Status is asked with `DM_NOFLUSH_FLAG`: without it a thin pool commits its
//! metadata before answering, which is I/O, and may block on the very device
//! whose health is being asked.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use health_core::dev::Dev;

/// `struct dm_ioctl`: 312 bytes, every field native-endian.
const HEADER_LEN: usize = 312;
/// `struct dm_target_spec` before its parameter string.
const SPEC_LEN: usize = 40;
/// Offsets of `struct dm_ioctl` fields.
const OFF_DATA_SIZE: usize = 12;
const OFF_DATA_START: usize = 16;
const OFF_TARGET_COUNT: usize = 20;
const OFF_FLAGS: usize = 28;
const OFF_DEV: usize = 40;

const DM_STATUS_TABLE_FLAG: u32 = 1 << 4;
const DM_BUFFER_FULL_FLAG: u32 = 1 << 8;
const DM_NOFLUSH_FLAG: u32 = 1 << 11;
/// `DM_VERSION_MAJOR`; minor 0 asks for nothing newer than the first 4.x.
const VERSION: [u32; 3] = [4, 0, 0];
/// The status of a device with many paths or targets fits in a few pages;
/// beyond this the device is reported unreadable instead of growing forever.
const MAX_BUFFER: usize = 1 << 20;

nix::ioctl_readwrite_bad!(
    dm_table_status,
    nix::request_code_readwrite!(0xfd, 12, HEADER_LEN),
    u8
);

/// One line of a table or status: what `dmsetup table`/`status` prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DmTarget {
    pub start: u64,
    pub length: u64,
    pub target_type: String,
    pub params: String,
}

/// Which answer to ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Query {
    /// The loaded table (`dmsetup table`): target types and their arguments.
    Table,
    /// Each target's status (`dmsetup status`).
    Status,
}

/// An open `/dev/mapper/control`.
#[derive(Debug)]
pub struct DmControl {
    file: File,
}

impl DmControl {
    /// Opens the control node, read-only: the status call writes nothing
    /// (the kernel asks CAP_SYS_ADMIN of every call, whatever the mode).
    pub fn open(path: &Path) -> io::Result<DmControl> {
        let file = OpenOptions::new().read(true).open(path)?;
        Ok(DmControl { file })
    }

    /// The targets of the device `dev`, as `query` asks.
    pub fn targets(&self, dev: Dev, query: Query) -> io::Result<Vec<DmTarget>> {
        let mut size = 16 * 1024;
        loop {
            let mut buf = request(dev, query, size);
            // SAFETY: `buf` is `size` bytes, at least HEADER_LEN, and its
            // header says so in data_size: the kernel writes no further.
            unsafe { dm_table_status(self.file.as_raw_fd(), buf.as_mut_ptr()) }
                .map_err(io::Error::from)?;
            if u32_at(&buf, OFF_FLAGS) & DM_BUFFER_FULL_FLAG == 0 {
                return parse_targets(&buf).map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("{dev}: {e}"))
                });
            }
            if size >= MAX_BUFFER {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{dev}: the status is longer than {MAX_BUFFER} bytes"),
                ));
            }
            size *= 4;
        }
    }
}

/// A `DM_TABLE_STATUS` request for `dev` in a buffer of `size` bytes.
fn request(dev: Dev, query: Query, size: usize) -> Vec<u8> {
    let mut buf = vec![0u8; size.max(HEADER_LEN)];
    for (i, v) in VERSION.iter().enumerate() {
        put_u32(&mut buf, i * 4, *v);
    }
    let len = buf.len() as u32;
    put_u32(&mut buf, OFF_DATA_SIZE, len);
    put_u32(&mut buf, OFF_DATA_START, HEADER_LEN as u32);
    let flags = match query {
        Query::Table => DM_STATUS_TABLE_FLAG,
        Query::Status => DM_NOFLUSH_FLAG,
    };
    put_u32(&mut buf, OFF_FLAGS, flags);
    // The kernel decodes `dev` with huge_decode_dev, the same encoding as
    // glibc's makedev for every real device number.
    let encoded = libc::makedev(dev.major, dev.minor);
    buf[OFF_DEV..OFF_DEV + 8].copy_from_slice(&encoded.to_ne_bytes());
    buf
}

/// The target specs of a `DM_TABLE_STATUS` answer. Each spec's `next` is
/// its successor's offset from the first spec (the UAPI header's comment on
/// `next` for this command); a spec's parameters are a NUL-terminated
/// string after it. Anything that points outside the answer is an error,
/// never a panic: the buffer is the kernel's, but a bug there must not take
/// the agent down.
pub fn parse_targets(buf: &[u8]) -> Result<Vec<DmTarget>, String> {
    if buf.len() < HEADER_LEN {
        return Err(format!(
            "answer of {} bytes, shorter than its header",
            buf.len()
        ));
    }
    let data_size = (u32_at(buf, OFF_DATA_SIZE) as usize).min(buf.len());
    let first = u32_at(buf, OFF_DATA_START) as usize;
    let count = u32_at(buf, OFF_TARGET_COUNT) as usize;
    let mut out = Vec::new();
    let mut at = first;
    for i in 0..count {
        let Some(spec) = buf
            .get(at..at + SPEC_LEN)
            .filter(|_| at + SPEC_LEN <= data_size)
        else {
            return Err(format!("target {i} at offset {at} lies outside the answer"));
        };
        let start = u64::from_ne_bytes(spec[0..8].try_into().expect("8 bytes"));
        let length = u64::from_ne_bytes(spec[8..16].try_into().expect("8 bytes"));
        let next = u32::from_ne_bytes(spec[20..24].try_into().expect("4 bytes")) as usize;
        let target_type = c_string(&spec[24..40]);
        let params = c_string(&buf[at + SPEC_LEN..data_size]);
        out.push(DmTarget {
            start,
            length,
            target_type,
            params,
        });
        let following = first.saturating_add(next);
        if i + 1 < count && following <= at {
            return Err(format!(
                "target {i}'s next offset {next} does not move forward"
            ));
        }
        at = following;
    }
    Ok(out)
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn u32_at(buf: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(buf[off..off + 4].try_into().expect("4 bytes"))
}

fn put_u32(buf: &mut [u8], off: usize, v: u32) {
    buf[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer laid out as the kernel writes one.
    fn answer(targets: &[(u64, u64, &str, &str)]) -> Vec<u8> {
        let mut buf = request(Dev::new(253, 0), Query::Status, 4096);
        let mut at = HEADER_LEN;
        for (start, length, ty, params) in targets {
            let spec_at = at;
            buf[at..at + 8].copy_from_slice(&start.to_ne_bytes());
            buf[at + 8..at + 16].copy_from_slice(&length.to_ne_bytes());
            buf[at + 24..at + 24 + ty.len()].copy_from_slice(ty.as_bytes());
            at += SPEC_LEN;
            buf[at..at + params.len()].copy_from_slice(params.as_bytes());
            at += params.len() + 1;
            at = at.next_multiple_of(8);
            put_u32(&mut buf, spec_at + 20, (at - HEADER_LEN) as u32);
        }
        put_u32(&mut buf, OFF_TARGET_COUNT, targets.len() as u32);
        buf
    }

    #[test]
    fn targets_are_read_in_order_with_their_parameters() {
        let buf = answer(&[
            (0, 2048, "linear", "8:1 2048"),
            (
                2048,
                4096,
                "multipath",
                "2 0 0 0 1 1 A 0 2 0 8:0 A 0 8:16 F 1",
            ),
        ]);
        let t = parse_targets(&buf).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].start, t[0].length), (0, 2048));
        assert_eq!(t[0].target_type, "linear");
        assert_eq!(t[0].params, "8:1 2048");
        assert_eq!(t[1].target_type, "multipath");
        assert_eq!(t[1].params, "2 0 0 0 1 1 A 0 2 0 8:0 A 0 8:16 F 1");
    }

    #[test]
    fn the_request_names_the_device_and_asks_not_to_flush() {
        let buf = request(Dev::new(253, 3), Query::Status, 1024);
        assert_eq!(u32_at(&buf, 0), 4);
        assert_eq!(u32_at(&buf, OFF_DATA_SIZE), 1024);
        assert_eq!(u32_at(&buf, OFF_DATA_START), HEADER_LEN as u32);
        assert_eq!(u32_at(&buf, OFF_FLAGS), DM_NOFLUSH_FLAG);
        let dev = u64::from_ne_bytes(buf[OFF_DEV..OFF_DEV + 8].try_into().unwrap());
        assert_eq!((libc::major(dev), libc::minor(dev)), (253, 3));
        let table = request(Dev::new(253, 3), Query::Table, 1024);
        assert_eq!(u32_at(&table, OFF_FLAGS), DM_STATUS_TABLE_FLAG);
    }

    #[test]
    fn answers_pointing_outside_themselves_are_errors() {
        let mut buf = answer(&[(0, 8, "thin-pool", "1 2/3 4/5 - rw")]);
        put_u32(&mut buf, OFF_TARGET_COUNT, 3);
        put_u32(&mut buf, HEADER_LEN + 20, 0);
        assert!(parse_targets(&buf)
            .unwrap_err()
            .contains("does not move forward"));
        let mut far = answer(&[(0, 8, "error", "")]);
        put_u32(&mut far, OFF_DATA_START, 1 << 30);
        assert!(parse_targets(&far)
            .unwrap_err()
            .contains("outside the answer"));
        assert!(parse_targets(&[0u8; 10]).is_err());
    }
}
