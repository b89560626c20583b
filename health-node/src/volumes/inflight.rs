//! Stalls without following a single bio: each volume device's own
//! counters, which the kernel keeps whatever runs. A device with requests
//! in flight whose completed count has not moved since a time T has had
//! a request waiting since T at least: every request in flight then is
//! still waiting (none completed). That is `IOStalled`'s evidence when no
//! program follows the bios (`--follow-bios` off, the default), at no cost
//! per request; [`super::stalls`] judges it as it judges the bios.
//!
//! What it cannot see, and following the bios does: a request stuck while
//! others on the same device complete; whose I/O waits; and I/O held
//! above the point where the device counts it in flight (a suspended dm
//! device queues bios before its accounting starts; a request-based disk
//! counts a request from its dispatch to the driver, not while it sits in
//! the I/O scheduler).
//!
//! The files (Documentation/ABI/stable/sysfs-block, Documentation/block/
//! stat.rst): `inflight` holds the reads and writes in flight; `stat`'s
//! fields 1 and 5 are the reads and writes completed, 12 the discards
//! (4.18+) and 16 the flushes (5.5+). A partition has both files too.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io;
use std::path::Path;

use health_common::op;
use health_core::dev::Dev;
use health_kernel::waiting::DeviceWait;

/// One device's counters at one read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) reads_in_flight: u32,
    pub(crate) writes_in_flight: u32,
    /// Reads, writes, discards and flushes completed since the device
    /// appeared, wrapping (only whether it moved matters).
    pub(crate) completed: u64,
}

/// Since when each device has had requests in flight and completed none.
#[derive(Debug, Default)]
pub struct InflightCounters {
    seen: HashMap<Dev, Seen>,
    /// Devices whose files could not be read or parsed, said once each.
    warned: HashSet<Dev>,
}

#[derive(Clone, Debug)]
struct Seen {
    completed: u64,
    /// CLOCK_MONOTONIC ns of the first read that found requests in flight
    /// after one that found none or saw the completed count move: every
    /// request in flight at that read still waits (none has completed),
    /// so the oldest now has waited at least since then. `None` while
    /// nothing is in flight.
    waiting_since_ns: Option<u64>,
    /// What the last read found waiting.
    last: Option<DeviceWait>,
}

impl InflightCounters {
    /// Reads the counters of `devices` under `sys_root` and returns what
    /// waits on each that has requests in flight; `now_ns` is
    /// CLOCK_MONOTONIC. A device gone (its files with it) is forgotten; a
    /// file that cannot be read otherwise is warned of once per device, and
    /// the device's last reading stands meanwhile.
    pub fn read(
        &mut self,
        sys_root: &Path,
        devices: &BTreeSet<Dev>,
        now_ns: u64,
    ) -> Vec<DeviceWait> {
        self.seen.retain(|d, _| devices.contains(d));
        let mut waits = Vec::new();
        for &dev in devices {
            match read_counters(sys_root, dev) {
                Ok(c) => waits.extend(self.advance(dev, c, now_ns)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.seen.remove(&dev);
                }
                // A failed read is not a recovery: what was last seen
                // waiting is kept until a read succeeds again.
                Err(e) => {
                    waits.extend(self.seen.get(&dev).and_then(|s| s.last.clone()));
                    if self.warned.insert(dev) {
                        tracing::warn!(
                            "stalls: the counters of {dev} cannot be read (its last reading stands until they can): {e}"
                        );
                    }
                }
            }
        }
        waits
    }

    /// One read of one device: what waits on it, if anything does. The
    /// wait is timed from a read, never from before one: it is a lower
    /// bound, short of the truth by up to one read's interval.
    fn advance(&mut self, dev: Dev, c: Counters, now_ns: u64) -> Option<DeviceWait> {
        let in_flight = c.reads_in_flight + c.writes_in_flight;
        let seen = self.seen.entry(dev).or_insert(Seen {
            completed: c.completed,
            waiting_since_ns: None,
            last: None,
        });
        let moved = c.completed != seen.completed;
        seen.completed = c.completed;
        seen.waiting_since_ns = match seen.waiting_since_ns {
            _ if in_flight == 0 => None,
            Some(since) if !moved => Some(since),
            _ => Some(now_ns),
        };
        seen.last = seen.waiting_since_ns.map(|since| DeviceWait {
            dev,
            reads: c.reads_in_flight,
            writes: c.writes_in_flight,
            other: 0,
            oldest_ns: since,
            // Which request is the oldest, and whose, is not known.
            oldest_op: op::NONE,
            oldest_cgroup: None,
        });
        seen.last.clone()
    }
}

fn read_counters(sys_root: &Path, dev: Dev) -> io::Result<Counters> {
    let dir = sys_root.join(format!("dev/block/{dev}"));
    let inflight = std::fs::read_to_string(dir.join("inflight"))?;
    let stat = std::fs::read_to_string(dir.join("stat"))?;
    parse(&inflight, &stat).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "unexpected inflight {:?} or stat {:?}",
                inflight.trim(),
                stat.trim()
            ),
        )
    })
}

/// The counters from the two files' text; `None` for anything else.
pub(crate) fn parse(inflight: &str, stat: &str) -> Option<Counters> {
    let mut flight = inflight.split_whitespace().map(str::parse::<u32>);
    let (reads_in_flight, writes_in_flight) = (flight.next()?.ok()?, flight.next()?.ok()?);
    let fields: Vec<u64> = stat
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // 1-based field numbers, as stat.rst numbers them.
    let field = |n: usize| fields.get(n - 1).copied();
    let completed = field(1)?
        .wrapping_add(field(5)?)
        .wrapping_add(field(12).unwrap_or(0))
        .wrapping_add(field(16).unwrap_or(0));
    Some(Counters {
        reads_in_flight,
        writes_in_flight,
        completed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;
    const SDB: Dev = Dev::new(8, 16);

    fn c(reads: u32, writes: u32, completed: u64) -> Counters {
        Counters {
            reads_in_flight: reads,
            writes_in_flight: writes,
            completed,
        }
    }

    /// The wait starts at the first read that sees requests in flight
    /// (after none, or after a completion); it grows while nothing
    /// completes, starts again when something does, and ends when nothing
    /// is in flight.
    #[test]
    fn a_wait_is_timed_from_the_first_read_that_saw_it() {
        let mut counters = InflightCounters::default();
        let mut at = |s: u64, cs: Counters| {
            counters
                .advance(SDB, cs, s * SECOND)
                .map(|w| (w.reads, w.writes, w.oldest_ns / SECOND, w.oldest_op))
        };
        assert_eq!(at(100, c(0, 0, 50)), None);
        assert_eq!(at(101, c(0, 1, 50)), Some((0, 1, 101, op::NONE)));
        assert_eq!(at(140, c(1, 1, 50)), Some((1, 1, 101, op::NONE)));
        // One completed: whatever waits now may be newer.
        assert_eq!(at(141, c(1, 0, 51)), Some((1, 0, 141, op::NONE)));
        assert_eq!(at(150, c(1, 0, 51)), Some((1, 0, 141, op::NONE)));
        assert_eq!(at(151, c(0, 0, 52)), None);
        // Busy and completing: never older than one read.
        assert_eq!(at(152, c(4, 4, 60)), Some((4, 4, 152, op::NONE)));
        assert_eq!(at(153, c(4, 4, 70)), Some((4, 4, 153, op::NONE)));
    }

    /// The first read of a device with requests in flight starts the wait
    /// there: nothing is claimed of the time before the agent looked.
    #[test]
    fn the_first_read_claims_nothing_before_it() {
        let mut counters = InflightCounters::default();
        let w = counters.advance(SDB, c(0, 3, 9), 7 * SECOND).unwrap();
        assert_eq!((w.writes, w.oldest_ns), (3, 7 * SECOND));
    }

    #[test]
    fn the_files_of_a_6_x_kernel_and_of_a_4_x_one_parse() {
        // 17 fields (5.5+): 1 read, 2 writes, 3 discards, 4 flushes done.
        let stat = "       1        0        8        0        2        0       16        4        1        8        4        3        0       24        0        4        0\n";
        assert_eq!(parse("       0        1\n", stat), Some(c(0, 1, 10)));
        // 11 fields (before 4.18): reads and writes only.
        assert_eq!(parse("1 0", "5 0 40 3 6 0 48 2 1 5 5"), Some(c(1, 0, 11)));
        assert_eq!(parse("1", "5 0 40 3 6 0 48 2 1 5 5"), None);
        assert_eq!(parse("0 0", "5 0 x"), None);
        assert_eq!(parse("0 0", "5 0 40 3"), None);
    }

    proptest::proptest! {
        /// Whatever a kernel writes in the two files' shapes (11 to 17
        /// fields, any values) parses to what the fields say; any text
        /// parses or is refused, never panics.
        #[test]
        fn the_files_parse_to_their_fields(
            reads in proptest::num::u32::ANY,
            writes in proptest::num::u32::ANY,
            fields in proptest::collection::vec(proptest::num::u64::ANY, 11..=17),
            junk in ".{0,64}",
        ) {
            let stat = fields.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
            let field = |n: usize| fields.get(n - 1).copied().unwrap_or(0);
            let completed = field(1)
                .wrapping_add(field(5))
                .wrapping_add(field(12))
                .wrapping_add(field(16));
            proptest::prop_assert_eq!(
                parse(&format!("{reads} {writes}\n"), &format!("{stat}\n")),
                Some(c(reads, writes, completed))
            );
            let _ = parse(&junk, &junk);
            let _ = parse(&format!("{reads} {writes}"), &junk);
        }
    }

    /// Through files: a device without them (gone) is forgotten without a
    /// word; one whose file makes no sense is warned of once and keeps its
    /// last reading.
    #[test]
    fn unreadable_counters_keep_the_last_reading_and_a_device_gone_is_forgotten() {
        let root = tempfile::tempdir().unwrap();
        let mut counters = InflightCounters::default();
        let devices = BTreeSet::from([SDB]);
        assert!(counters.read(root.path(), &devices, SECOND).is_empty());
        assert!(counters.warned.is_empty());
        let dir = root.path().join("dev/block/8:16");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("inflight"), "0 2\n").unwrap();
        std::fs::write(dir.join("stat"), "1 0 8 0 2 0 16 4 2 8 4\n").unwrap();
        let waits = counters.read(root.path(), &devices, 2 * SECOND);
        assert_eq!(
            waits
                .iter()
                .map(|w| (w.dev, w.writes, w.oldest_ns))
                .collect::<Vec<_>>(),
            [(SDB, 2, 2 * SECOND)]
        );
        // Unreadable: the last reading stands (a failed read is no
        // recovery), warned of once.
        std::fs::write(dir.join("stat"), "garbage\n").unwrap();
        for now in [3, 4] {
            let waits = counters.read(root.path(), &devices, now * SECOND);
            assert_eq!(
                waits
                    .iter()
                    .map(|w| (w.writes, w.oldest_ns))
                    .collect::<Vec<_>>(),
                [(2, 2 * SECOND)]
            );
        }
        assert_eq!(counters.warned, HashSet::from([SDB]));
        // Gone: forgotten, nothing waits.
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(counters.read(root.path(), &devices, 5 * SECOND).is_empty());
        assert!(counters.seen.is_empty());
    }
}
