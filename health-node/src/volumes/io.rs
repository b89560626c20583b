//! Each volume's I/O as the kernel side sees it, for the metrics: the bios
//! waiting on the volume's own device at every stall poll, and the
//! completions of each latency window. The same device set as the
//! judgements use ([`health_topology::Topology::filesystem_backing_devices`]
//! of the volume's device: the top of its stack, every member of a btrfs),
//! so what a dashboard shows is what `IOStalled` and `HighLatency` judged.

use std::collections::HashMap;
use std::time::Duration;

use health_common::{op, LATENCY_BUCKETS};
use health_core::dev::Dev;
use health_kernel::latency::DeviceLatency;
use health_kernel::waiting::DeviceWait;
use health_topology::Topology;

use super::{IndexedVolume, VolumeKey};

/// One volume's I/O, as one stall poll or latency window saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeIo {
    /// The bios waiting on the volume's devices now, and how long the
    /// oldest of them has (zero when none waits).
    Waiting {
        reads: u32,
        writes: u32,
        other: u32,
        oldest: Duration,
    },
    /// One window's completed reads ([`op::READ`]) or writes
    /// ([`op::WRITE`]), by kernel latency bucket, and their summed latency.
    Latency {
        op: u8,
        buckets: Box<[u64; LATENCY_BUCKETS]>,
        sum_ns: u64,
    },
}

/// Reads, then writes: the operations latency is kept for.
pub const LATENCY_OPS: [u8; 2] = [op::READ, op::WRITE];

/// What waits on each volume with a device, from one read of the waiting
/// bios; `now_ns` is CLOCK_MONOTONIC, as the bios' times.
pub fn waiting(
    volumes: &[IndexedVolume],
    topo: &Topology,
    waits: &[DeviceWait],
    now_ns: u64,
) -> Vec<(VolumeKey, VolumeIo)> {
    let by_dev: HashMap<Dev, &DeviceWait> = waits.iter().map(|w| (w.dev, w)).collect();
    volumes
        .iter()
        .filter_map(|v| {
            let device = v.device?;
            let (mut reads, mut writes, mut other, mut oldest) = (0, 0, 0, Duration::ZERO);
            for w in topo
                .filesystem_backing_devices(device)
                .into_iter()
                .filter_map(|d| by_dev.get(&d))
            {
                reads += w.reads;
                writes += w.writes;
                other += w.other;
                oldest = oldest.max(Duration::from_nanos(now_ns.saturating_sub(w.oldest_ns)));
            }
            let io = VolumeIo::Waiting {
                reads,
                writes,
                other,
                oldest,
            };
            Some((v.key.clone(), io))
        })
        .collect()
}

/// One window's completions of `op` on `devices`, summed: the buckets and
/// the latency.
pub fn window_of(
    devices: &[Dev],
    window: &[DeviceLatency],
    op: u8,
) -> ([u64; LATENCY_BUCKETS], u64) {
    let mut buckets = [0u64; LATENCY_BUCKETS];
    let mut sum_ns = 0u64;
    for w in window
        .iter()
        .filter(|w| w.op == op && devices.contains(&w.dev))
    {
        for (b, n) in buckets.iter_mut().zip(w.buckets) {
            *b += n;
        }
        sum_ns = sum_ns.saturating_add(w.sum_ns);
    }
    (buckets, sum_ns)
}

/// Each volume's completed reads and writes in one window; an op with no
/// completion is left out (nothing to add to its histogram).
pub fn latency(
    volumes: &[IndexedVolume],
    topo: &Topology,
    window: &[DeviceLatency],
) -> Vec<(VolumeKey, VolumeIo)> {
    let mut out = Vec::new();
    for v in volumes {
        let Some(device) = v.device else { continue };
        let devices = topo.filesystem_backing_devices(device);
        for op in LATENCY_OPS {
            let (buckets, sum_ns) = window_of(&devices, window, op);
            if buckets.iter().any(|&n| n > 0) {
                out.push((
                    v.key.clone(),
                    VolumeIo::Latency {
                        op,
                        buckets: Box::new(buckets),
                        sum_ns,
                    },
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use health_common::latency_bucket;
    use health_core::dev::Dev;

    use super::*;
    use crate::volumes::testing::{block_volume, device};

    const SDB: Dev = Dev::new(8, 16);
    const SDC: Dev = Dev::new(8, 32);

    fn world() -> (Topology, Vec<IndexedVolume>) {
        let topo = Topology::from_parts(
            vec![device(SDB, "sdb", vec![]), device(SDC, "sdc", vec![])],
            vec![],
        );
        (topo, vec![block_volume(SDB, "sdb")])
    }

    fn wait(dev: Dev, reads: u32, writes: u32, oldest_ns: u64) -> DeviceWait {
        DeviceWait {
            dev,
            reads,
            writes,
            other: 1,
            oldest_ns,
            oldest_op: op::WRITE,
            oldest_cgroup: None,
        }
    }

    #[test]
    fn a_volume_gets_its_own_devices_waits_and_zero_when_none() {
        let (topo, vols) = world();
        let now = 50_000_000_000;
        let waits = [wait(SDB, 2, 3, now - 7_500_000_000), wait(SDC, 9, 9, 1)];
        assert_eq!(
            waiting(&vols, &topo, &waits, now),
            [(
                vols[0].key.clone(),
                VolumeIo::Waiting {
                    reads: 2,
                    writes: 3,
                    other: 1,
                    oldest: Duration::from_millis(7500),
                }
            )]
        );
        assert_eq!(
            waiting(&vols, &topo, &waits[1..], now),
            [(
                vols[0].key.clone(),
                VolumeIo::Waiting {
                    reads: 0,
                    writes: 0,
                    other: 0,
                    oldest: Duration::ZERO,
                }
            )]
        );
    }

    #[test]
    fn a_window_gives_each_op_of_its_volume_with_completions() {
        let (topo, vols) = world();
        let mut buckets = [0; LATENCY_BUCKETS];
        buckets[latency_bucket(3000)] = 4;
        let lat = |dev, op, sum_ns| DeviceLatency {
            dev,
            op,
            buckets,
            sum_ns,
        };
        let window = [lat(SDB, op::WRITE, 12_000_000), lat(SDC, op::READ, 7)];
        assert_eq!(
            latency(&vols, &topo, &window),
            [(
                vols[0].key.clone(),
                VolumeIo::Latency {
                    op: op::WRITE,
                    buckets: Box::new(buckets),
                    sum_ns: 12_000_000,
                }
            )]
        );
    }
}
