//! Errors of a device that held a number before the device holding it
//! now. Device numbers are reused (a loop device bound to another file,
//! dm, md and NVMe numbers taken lowest-free), so errors the kernel
//! counted while no agent ran may belong to a device that is gone. The
//! kernel side records the failing disk's sequence number with each
//! failed request (`CounterKey::diskseq`), which is never reused; errors
//! whose number is older than the current holder's are counted in the
//! device totals and the metrics by number, attributed to no volume, and
//! said once.

use std::collections::HashSet;

use health_common::CounterKey;
use health_core::dev::Dev;
use health_kernel::collector::KernelError;
use health_topology::{Incarnation, Topology};

fn is_earlier(topo: &Topology, key: &CounterKey) -> bool {
    topo.is_earlier(Dev::from_kernel(key.dev), key.diskseq)
}

/// Moves the errors of earlier devices out of `batch`.
pub(super) fn take(topo: &Topology, batch: &mut Vec<KernelError>) -> Vec<KernelError> {
    if batch.iter().all(|e| !is_earlier(topo, &e.key)) {
        return Vec::new();
    }
    let (earlier, current) = std::mem::take(batch)
        .into_iter()
        .partition(|e| is_earlier(topo, &e.key));
    *batch = current;
    earlier
}

/// The earlier devices already said, by number and sequence number.
#[derive(Default)]
pub(super) struct Said(HashSet<(u32, u64)>);

impl Said {
    /// Says once per earlier device that its errors reach no volume.
    pub(super) fn say(&mut self, topo: &Topology, batch: &[KernelError]) {
        for e in batch {
            let dev = Dev::from_kernel(e.key.dev);
            let Incarnation::Earlier { now } = topo.incarnation(dev, e.key.diskseq) else {
                continue;
            };
            if !self.0.insert((e.key.dev, e.key.diskseq)) {
                continue;
            }
            let holder = topo.device(dev).map_or("?", |d| d.name.as_str());
            tracing::warn!(
                device = %dev,
                diskseq = e.key.diskseq,
                now_held_by = %holder,
                now_diskseq = now,
                "errors of a device that is gone (an earlier holder of this number): counted and shown by number, attributed to no volume"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use health_common::{op, source};

    use health_topology::BlockDevice;

    use super::*;

    fn error(dev: Dev, diskseq: u64, count: u64) -> KernelError {
        let key =
            CounterKey::new(dev.to_kernel(), source::BLOCK_RQ_ERROR, op::WRITE, 5).of_disk(diskseq);
        KernelError {
            key,
            count,
            sample: None,
        }
    }

    /// Only the errors of an earlier holder leave the batch; the current
    /// holder's, and those without a sequence number, stay in order.
    #[test]
    fn the_earlier_holders_errors_are_taken_out_of_the_batch() {
        let loop0 = Dev::new(7, 0);
        let now = BlockDevice {
            dev: loop0,
            name: "loop0".into(),
            whole_disk: None,
            partition: None,
            size_sectors: 8,
            loop_backing_file: None,
            holders: vec![],
            slaves: vec![],
            read_only: false,
            diskseq: Some(13),
        };
        let topo = Topology::from_parts(vec![now], vec![]);
        let mut batch = vec![error(loop0, 13, 3), error(loop0, 11, 5), error(loop0, 0, 2)];
        let earlier = take(&topo, &mut batch);
        let counts = |b: &[KernelError]| -> Vec<(u64, u64)> {
            b.iter().map(|e| (e.key.diskseq, e.count)).collect()
        };
        assert_eq!(counts(&earlier), [(11, 5)]);
        assert_eq!(counts(&batch), [(13, 3), (0, 2)]);
        let mut none = vec![error(loop0, 13, 1)];
        assert!(take(&topo, &mut none).is_empty());
        assert_eq!(none.len(), 1);
    }
}
