//! An NVMe controller's own view of its health: the SMART / Health
//! Information log page. A drive raises a critical warning (spare blocks
//! used up, media turned read-only, reliability degraded by media errors,
//! ...) before, or without, any request failing; reading it is how a
//! failing SSD shows on its volumes while they still work.
//!
//! The page is read with the kernel's admin passthrough
//! (`NVME_IOCTL_ADMIN_CMD` on the controller's character device, opened
//! read-only), which the kernel allows with CAP_SYS_ADMIN only. Without it
//! the agent says so once and goes on without the page. Written here: no
//! maintained crate reads the log page without bringing a whole NVMe
//! management library (and libnvme through bindgen) along.
//!
//! Layouts and numbers, as facts:
//! - `struct nvme_passthru_cmd` and `NVME_IOCTL_ADMIN_CMD` = `_IOWR('N',
//!   0x41, struct nvme_admin_cmd)`: the kernel's UAPI,
//!   `include/uapi/linux/nvme_ioctl.h`.
//! - Get Log Page (admin opcode 02h), CDW10 = NUMDL (0-based dword count)
//!   in bits 31:16, RAE (retain asynchronous event) in bit 15, LID in bits
//!   7:0; the SMART / Health Information page is LID 02h, 512 bytes, and
//!   its fields' byte offsets: NVM Express Base Specification 2.0, section
//!   5.16.1.3 (Figure 207).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

/// `struct nvme_passthru_cmd` (72 bytes).
#[repr(C)]
#[derive(Default)]
struct PassthruCmd {
    opcode: u8,
    flags: u8,
    rsvd1: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    metadata: u64,
    addr: u64,
    metadata_len: u32,
    data_len: u32,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
    timeout_ms: u32,
    result: u32,
}

nix::ioctl_readwrite!(nvme_admin_cmd, b'N', 0x41, PassthruCmd);

const GET_LOG_PAGE: u8 = 0x02;
const LID_SMART: u32 = 0x02;
const RAE: u32 = 1 << 15;
const LOG_LEN: usize = 512;
/// The controller-wide page (all namespaces).
const NSID_ALL: u32 = 0xffff_ffff;

/// The fields of the SMART / Health Information page the agent uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SmartLog {
    /// Byte 0: one bit per warning ([`WARNINGS`]).
    pub critical_warning: u8,
    /// Bytes 1-2, kelvin.
    pub temperature_kelvin: u16,
    /// Byte 3, percent of the spare capacity left.
    pub available_spare: u8,
    /// Byte 4, the percent below which bit 0 of the warning is set.
    pub available_spare_threshold: u8,
    /// Byte 5, the vendor's estimate of life used (may exceed 100).
    pub percentage_used: u8,
    /// Bytes 160-175: unrecovered data integrity errors in the drive's life
    /// (saturated at u64).
    pub media_errors: u64,
}

/// The critical warning bits (byte 0), with what each means for a volume.
pub const WARNINGS: [(u8, &str); 6] = [
    (0x01, "available spare below its threshold"),
    (0x02, "temperature beyond a threshold"),
    (0x04, "reliability degraded by media or internal errors"),
    (0x08, "media placed in read-only mode"),
    (0x10, "volatile memory backup failed"),
    (0x20, "persistent memory region read-only or unreliable"),
];

/// The named bits set in `warning`, and the unnamed ones as a hex mask.
pub fn warning_words(warning: u8) -> Vec<String> {
    let mut words: Vec<String> = WARNINGS
        .iter()
        .filter(|(bit, _)| warning & bit != 0)
        .map(|(_, w)| w.to_string())
        .collect();
    let known: u8 = WARNINGS.iter().map(|(b, _)| b).fold(0, |a, b| a | b);
    if warning & !known != 0 {
        words.push(format!("reserved bits {:#04x}", warning & !known));
    }
    words
}

/// The page's fields from its bytes; errors on a page shorter than the
/// fields read.
pub fn parse(page: &[u8]) -> Result<SmartLog, String> {
    if page.len() < 176 {
        return Err(format!(
            "SMART log of {} bytes, need at least 176",
            page.len()
        ));
    }
    let media = u128::from_le_bytes(page[160..176].try_into().expect("16 bytes"));
    Ok(SmartLog {
        critical_warning: page[0],
        temperature_kelvin: u16::from_le_bytes([page[1], page[2]]),
        available_spare: page[3],
        available_spare_threshold: page[4],
        percentage_used: page[5],
        media_errors: u64::try_from(media).unwrap_or(u64::MAX),
    })
}

/// Reads the page from a controller's character device (`/dev/nvme0`).
pub fn read(ctrl_dev: &Path) -> std::io::Result<SmartLog> {
    let file = File::open(ctrl_dev)?;
    let mut page = [0u8; LOG_LEN];
    let numd = (LOG_LEN / 4 - 1) as u32;
    let mut cmd = PassthruCmd {
        opcode: GET_LOG_PAGE,
        nsid: NSID_ALL,
        addr: page.as_mut_ptr() as u64,
        data_len: LOG_LEN as u32,
        cdw10: ((numd & 0xffff) << 16) | RAE | LID_SMART,
        cdw11: numd >> 16,
        ..Default::default()
    };
    // SAFETY: `cmd` is the kernel's struct, `addr` points at `page`, which
    // outlives the call and holds `data_len` bytes.
    let status =
        unsafe { nvme_admin_cmd(file.as_raw_fd(), &mut cmd) }.map_err(std::io::Error::from)?;
    if status != 0 {
        // A positive return is the command's NVMe status, not an errno.
        return Err(std::io::Error::other(format!(
            "Get Log Page failed with NVMe status {status:#x}"
        )));
    }
    parse(&page).map_err(std::io::Error::other)
}

/// What the stack shows of a controller's page: the last page read, or
/// why none could be.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NvmeHealth {
    pub controller: String,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub log: Option<SmartLog>,
    #[serde(rename = "health_error", skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The controllers' pages, each read at most once per `interval`, and
/// sooner when its [`SmartCache::trigger`] was set (an error on a disk:
/// the first error of an episode reads the page within a round) but never
/// twice within [`MIN_SPACING`]. A failed read keeps the last good page:
/// an unreadable page is no recovery. Permission errors end the reading
/// for good, said once.
#[derive(Debug)]
pub struct SmartCache {
    dev_dir: PathBuf,
    interval: Duration,
    entries: HashMap<String, Entry>,
    /// Set by [`SmartCache::trigger`]'s holders (the kernel side, at an
    /// error) without the reader's lock.
    soon: Arc<AtomicBool>,
    /// Set once the kernel refused the passthrough for lack of privilege.
    refused: Option<String>,
}

#[derive(Debug)]
struct Entry {
    read_at: Instant,
    health: NvmeHealth,
    /// Read at the next round, asked through the trigger.
    due: bool,
}

/// Reads closer together than this are not made, whatever asks.
pub const MIN_SPACING: Duration = Duration::from_secs(5);

impl SmartCache {
    /// `dev_dir` holds the controllers' character devices (`/dev`).
    pub fn new(dev_dir: &Path, interval: Duration) -> Self {
        SmartCache {
            dev_dir: dev_dir.to_path_buf(),
            interval,
            entries: HashMap::new(),
            soon: Arc::new(AtomicBool::new(false)),
            refused: None,
        }
    }

    /// Storing `true` here reads every page again at the next round (rate
    /// limited by [`MIN_SPACING`]).
    pub fn trigger(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.soon)
    }

    /// Called once per stack round, before [`SmartCache::health`].
    pub fn start_round(&mut self, now: Instant) {
        if self.soon.swap(false, Ordering::Relaxed) {
            for e in self.entries.values_mut() {
                e.due |= now.duration_since(e.read_at) >= MIN_SPACING;
            }
        }
    }

    /// The page of controller `ctrl` (`nvme0`), read when due.
    pub fn health(&mut self, ctrl: &str, now: Instant) -> Option<NvmeHealth> {
        if self.refused.is_some() {
            return None;
        }
        if let Some(e) = self.entries.get(ctrl) {
            if !e.due && now.duration_since(e.read_at) < self.interval {
                return Some(e.health.clone());
            }
        }
        let path = self.dev_dir.join(ctrl);
        let last = self.entries.get(ctrl).and_then(|e| e.health.log);
        let health = match read(&path) {
            Ok(log) => NvmeHealth {
                controller: ctrl.to_string(),
                log: Some(log),
                error: None,
            },
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => {
                let why = format!(
                    "reading the SMART log of {}: {e} (the admin passthrough needs CAP_SYS_ADMIN)",
                    path.display()
                );
                tracing::warn!("NVMe critical warnings are not read: {why}");
                self.refused = Some(why);
                self.entries.clear();
                return None;
            }
            Err(e) => {
                let error = format!("reading the SMART log of {}: {e}", path.display());
                // The last good page stands (the controller may be
                // resetting): an unreadable page is no recovery.
                tracing::debug!("{error}");
                NvmeHealth {
                    controller: ctrl.to_string(),
                    log: last,
                    error: Some(error),
                }
            }
        };
        self.entries.insert(
            ctrl.to_string(),
            Entry {
                read_at: now,
                health: health.clone(),
                due: false,
            },
        );
        Some(health)
    }

    /// Forget controllers not asked about in the last round's `kept`.
    pub fn retain(&mut self, kept: &std::collections::HashSet<String>) {
        self.entries.retain(|k, _| kept.contains(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> [u8; 512] {
        let mut p = [0u8; 512];
        p[0] = 0x05;
        p[1..3].copy_from_slice(&310u16.to_le_bytes());
        p[3] = 7;
        p[4] = 10;
        p[5] = 104;
        p[160..176].copy_from_slice(&3u128.to_le_bytes());
        p
    }

    #[test]
    fn fields_come_from_their_offsets() {
        assert_eq!(
            parse(&page()).unwrap(),
            SmartLog {
                critical_warning: 0x05,
                temperature_kelvin: 310,
                available_spare: 7,
                available_spare_threshold: 10,
                percentage_used: 104,
                media_errors: 3,
            }
        );
    }

    #[test]
    fn a_short_page_is_an_error_and_huge_counts_saturate() {
        assert_eq!(
            parse(&[0u8; 100]).unwrap_err(),
            "SMART log of 100 bytes, need at least 176"
        );
        let mut p = page();
        p[160..176].copy_from_slice(&u128::MAX.to_le_bytes());
        assert_eq!(parse(&p).unwrap().media_errors, u64::MAX);
    }

    #[test]
    fn warning_bits_are_named() {
        assert_eq!(
            warning_words(0x0c),
            [
                "reliability degraded by media or internal errors",
                "media placed in read-only mode"
            ]
        );
        assert_eq!(warning_words(0xc1).len(), 2);
        assert_eq!(warning_words(0xc1)[1], "reserved bits 0xc0");
        assert!(warning_words(0).is_empty());
    }

    proptest::proptest! {
        /// Any bytes: read exactly when the fields are there, never a panic.
        #[test]
        fn any_page_is_read_or_refused(page in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            crate::fuzzing::nvme_smart::run(&page);
        }
    }

    #[test]
    fn the_command_struct_has_the_kernels_size() {
        assert_eq!(std::mem::size_of::<PassthruCmd>(), 72);
    }

    #[test]
    fn a_missing_device_is_unreadable_not_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = SmartCache::new(dir.path(), Duration::from_secs(60));
        let now = Instant::now();
        let h = c.health("nvme9", now).expect("not refused");
        assert_eq!((h.controller.as_str(), h.log), ("nvme9", None));
        let error = h.error.expect("an error");
        assert!(
            error.contains("nvme9") && error.contains("No such file"),
            "{error}"
        );
    }
}
