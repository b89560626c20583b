//! Kernel time to wall time: samples carry CLOCK_MONOTONIC nanoseconds
//! (`bpf_ktime_get_ns`), reports carry wall time.

use std::time::{Duration, SystemTime};

/// Converts kernel monotonic timestamps to wall-clock time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// Wall clock minus monotonic clock, at construction.
    offset_ns: i128,
}

impl Clock {
    /// A clock whose wall time is monotonic time plus `offset_ns` (tests,
    /// fuzzing).
    pub const fn with_offset(offset_ns: i128) -> Self {
        Self { offset_ns }
    }

    pub fn new() -> Self {
        let mono = monotonic_ns() as i128;
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        Self {
            offset_ns: wall - mono,
        }
    }

    pub fn wall_time(&self, mono_ns: u64) -> SystemTime {
        let wall = (mono_ns as i128 + self.offset_ns).max(0) as u64;
        SystemTime::UNIX_EPOCH + Duration::from_nanos(wall)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}
