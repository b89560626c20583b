//! The bios waiting now, per device: read from the kernel's `WAITING` array
//! (every bio from `block_bio_queue` to `block_bio_complete`), with how many
//! reads and writes wait on each device and since when the oldest has.
//!
//! The array is mapped into this process (`BPF_F_MMAPABLE`): a read is a
//! pass over 384 KiB of memory, not a system call per slot.
//!
//! An entry can outlive its bio: the completion program is kept from
//! nesting inside itself, and a completion it missed leaves the entry. So
//! before a bio old enough to matter is reported, the kernel is asked
//! whether it still waits (`probes::waiting`), and an entry it has
//! completed is removed. Only old entries are asked about, oldest first,
//! and only until one still waits: a few calls per stalled device.

use std::collections::{BTreeMap, HashSet};
use std::num::NonZeroUsize;
use std::os::fd::AsFd;
use std::ptr::{addr_of_mut, NonNull};

use aya::maps::MapData;
use health_common::{op, op_from_opf, Waiting, WAITING_MAX};
use health_core::dev::Dev;
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

use crate::probes::waiting::BioState;

/// The kernel's `WAITING` array, mapped shared into this process.
pub struct WaitingSlots {
    /// Kept open for as long as the mapping is used.
    _map: MapData,
    slots: NonNull<Waiting>,
}

// SAFETY: the mapping belongs to this value alone; reads and writes go
// through volatile accesses of whole `Waiting` values or their `bio`.
unsafe impl Send for WaitingSlots {}

/// The mapping's length: the values, which the kernel rounds up to its
/// own page size (4 KiB or, on some arm64 kernels, 64 KiB).
fn mapped_len() -> NonZeroUsize {
    NonZeroUsize::new(WAITING_MAX as usize * std::mem::size_of::<Waiting>())
        .expect("WAITING has slots")
}

impl WaitingSlots {
    /// Maps `map`, which must be the object's `WAITING`.
    pub(crate) fn new(map: MapData) -> std::io::Result<Self> {
        // SAFETY: a fresh shared mapping of the map's whole value area, which
        // the kernel sizes for WAITING_MAX values of this layout; no Rust
        // reference into it is ever made.
        let mem = unsafe {
            mmap(
                None,
                mapped_len(),
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                map.fd().as_fd(),
                0,
            )
        }
        .map_err(std::io::Error::from)?;
        Ok(Self {
            _map: map,
            slots: mem.cast(),
        })
    }

    /// The slots that hold a bio, with their index.
    fn occupied(&self) -> Vec<(usize, Waiting)> {
        (0..WAITING_MAX as usize)
            .filter_map(|i| {
                // SAFETY: `i` is within the mapping; the programs write the
                // slot concurrently, so it is copied, never referenced.
                let w = unsafe { std::ptr::read_volatile(self.slots.as_ptr().add(i)) };
                (w.bio != 0).then_some((i, w))
            })
            .collect()
    }

    /// Frees slot `i` if it still holds what was read from it (a new bio
    /// may have taken it since); returns whether it did.
    fn free_if_same(&self, i: usize, w: &Waiting) -> bool {
        // SAFETY: as in `occupied`. A program may take the slot between
        // the read and the write: that bio is then not followed, the
        // programs' own race (health-ebpf's waiting.rs).
        unsafe {
            let slot = self.slots.as_ptr().add(i);
            if std::ptr::read_volatile(slot) != *w {
                return false;
            }
            std::ptr::write_volatile(addr_of_mut!((*slot).bio), 0);
        }
        true
    }
}

impl Drop for WaitingSlots {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        if let Err(e) = unsafe { munmap(self.slots.cast(), mapped_len().get()) } {
            tracing::warn!("unmapping WAITING: {e}");
        }
    }
}

/// What waits on one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceWait {
    pub dev: Dev,
    pub reads: u32,
    pub writes: u32,
    /// Flushes, discards and the rest.
    pub other: u32,
    /// The oldest bio: when it was queued (CLOCK_MONOTONIC ns) and its
    /// operation ([`op`]).
    pub oldest_ns: u64,
    pub oldest_op: u8,
    /// The id of the cgroup the oldest bio is charged to, where the kernel
    /// was asked about it (it is old enough) and records one.
    pub oldest_cgroup: Option<u64>,
}

impl DeviceWait {
    pub fn total(&self) -> u32 {
        self.reads + self.writes + self.other
    }
}

/// What one read of the map found and did.
#[derive(Debug, Default)]
pub struct WaitingRead {
    /// Devices with at least one bio waiting, by device number.
    pub devices: Vec<DeviceWait>,
    /// Entries the kernel had completed, removed from the map now.
    pub stale_removed: u64,
}

/// At most this many old entries are asked about per device per read.
const CHECKS_PER_DEVICE: usize = 64;

/// Reads `slots` at `now_ns`; bios queued at or before `old_before_ns` are
/// confirmed with `state` (oldest first, per device) before they count.
pub fn read(
    slots: &WaitingSlots,
    now_ns: u64,
    old_before_ns: u64,
    mut state: impl FnMut(u64) -> Result<BioState, String>,
) -> WaitingRead {
    let mut by_dev: BTreeMap<u32, Vec<(usize, Waiting)>> = BTreeMap::new();
    for (i, w) in slots.occupied() {
        by_dev.entry(w.dev).or_default().push((i, w));
    }
    let mut out = WaitingRead::default();
    for (dev, mut bios) in by_dev {
        bios.sort_by_key(|(_, w)| w.queued_ns);
        let mut stale = HashSet::new();
        let mut cgroup = None;
        for (i, w) in bios.iter().take(CHECKS_PER_DEVICE) {
            if w.queued_ns > old_before_ns {
                break;
            }
            match state(w.bio) {
                Ok(BioState::Waiting { cgroup: c }) => {
                    cgroup = c;
                    break;
                }
                Ok(BioState::Completed | BioState::Unreadable) => {
                    if slots.free_if_same(*i, w) {
                        out.stale_removed += 1;
                    }
                    stale.insert(*i);
                }
                // Cannot ask: report what the map says.
                Err(why) => {
                    tracing::debug!("asking whether a bio still waits: {why}");
                    break;
                }
            }
        }
        bios.retain(|(i, _)| !stale.contains(i));
        if let Some(mut d) = summarize(dev, &bios, now_ns) {
            d.oldest_cgroup = cgroup;
            out.devices.push(d);
        }
    }
    out
}

/// The device's counts by operation and its oldest bio; `None` for none.
fn summarize(dev: u32, bios: &[(usize, Waiting)], now_ns: u64) -> Option<DeviceWait> {
    let (_, oldest) = bios.first()?;
    let mut d = DeviceWait {
        dev: Dev::from_kernel(dev),
        reads: 0,
        writes: 0,
        other: 0,
        oldest_ns: oldest.queued_ns.min(now_ns),
        oldest_op: op_from_opf(oldest.opf),
        oldest_cgroup: None,
    };
    for (_, w) in bios {
        match op_from_opf(w.opf) {
            op::READ => d.reads += 1,
            op::WRITE => d.writes += 1,
            _ => d.other += 1,
        }
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use health_common::{kdev, rq};

    fn bio(dev: u32, queued_ns: u64, opf: u32) -> Waiting {
        Waiting {
            bio: 0xffff_8881_0000_0000 + queued_ns,
            queued_ns,
            dev,
            opf,
        }
    }

    #[test]
    fn a_device_is_summed_by_operation_with_its_oldest_bio() {
        let dev = kdev::make(7, 3);
        let bios = [
            (0x10, bio(dev, 500, rq::OP_WRITE | 1 << 11)),
            (0x20, bio(dev, 300, rq::OP_READ)),
            (0x30, bio(dev, 900, rq::OP_FLUSH)),
            (0x40, bio(dev, 700, rq::OP_WRITE)),
        ];
        let mut sorted = bios.to_vec();
        sorted.sort_by_key(|(_, w)| w.queued_ns);
        let d = summarize(dev, &sorted, 1_000).unwrap();
        assert_eq!((d.reads, d.writes, d.other, d.total()), (1, 2, 1, 4));
        assert_eq!(
            (d.oldest_ns, d.oldest_op, d.oldest_cgroup),
            (300, op::READ, None)
        );
        assert_eq!(d.dev, Dev::from_kernel(dev));
        assert!(summarize(dev, &[], 1_000).is_none());
    }
}
