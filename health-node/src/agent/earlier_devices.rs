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
