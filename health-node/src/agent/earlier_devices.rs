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
use health_kernel::clock::Clock;
use health_kernel::collector::KernelError;
use health_topology::{Incarnation, Topology};

use crate::report::Reporter;

fn is_earlier(topo: &Topology, key: &CounterKey) -> bool {
    topo.is_earlier(Dev::from_kernel(key.dev), key.diskseq)
}

/// Reports an earlier holder's errors by number only (the topology's
/// device of that number is another), to no volume.
pub(super) fn report<R: Reporter>(
    reporter: &mut R,
    earlier: &[KernelError],
    clock: &Clock,
) -> anyhow::Result<()> {
    if earlier.is_empty() {
        return Ok(());
    }
    reporter.errors(earlier, &Topology::default(), clock, None)
}

/// The earlier devices already said, by number and sequence number.
#[derive(Default)]
pub(super) struct Said(HashSet<(u32, u64)>);

impl Said {
    /// Moves the errors of earlier devices out of `batch`, and says once
    /// per earlier device that its errors reach no volume. One lookup per
    /// error when there are none, as almost always.
    pub(super) fn take(
        &mut self,
        topo: &Topology,
        batch: &mut Vec<KernelError>,
    ) -> Vec<KernelError> {
        if batch.iter().all(|e| !is_earlier(topo, &e.key)) {
            return Vec::new();
        }
        let (earlier, current): (Vec<KernelError>, Vec<KernelError>) = std::mem::take(batch)
            .into_iter()
            .partition(|e| is_earlier(topo, &e.key));
        *batch = current;
        for e in &earlier {
            self.say(topo, &e.key);
        }
        earlier
    }

    fn say(&mut self, topo: &Topology, key: &CounterKey) {
        let dev = Dev::from_kernel(key.dev);
        let Incarnation::Earlier { now } = topo.incarnation(dev, key.diskseq) else {
            return;
        };
        if !self.0.insert((key.dev, key.diskseq)) {
            return;
        }
        let holder = topo.device(dev).map_or("?", |d| d.name.as_str());
        tracing::warn!(
            device = %dev,
            diskseq = key.diskseq,
            now_held_by = %holder,
            now_diskseq = now,
            "errors of a device that is gone (an earlier holder of this number): counted and shown by number, attributed to no volume"
        );
    }
}

#[cfg(test)]
mod tests {
    use health_common::{op, source};

    use super::*;
    use crate::volumes::testing::device;

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
        let mut now = device(loop0, "loop0", vec![]);
        now.diskseq = Some(13);
        let topo = Topology::from_parts(vec![now], vec![]);
        let mut batch = vec![error(loop0, 13, 3), error(loop0, 11, 5), error(loop0, 0, 2)];
        let mut said = Said::default();
        let earlier = said.take(&topo, &mut batch);
        let counts = |b: &[KernelError]| -> Vec<(u64, u64)> {
            b.iter().map(|e| (e.key.diskseq, e.count)).collect()
        };
        assert_eq!(counts(&earlier), [(11, 5)]);
        assert_eq!(counts(&batch), [(13, 3), (0, 2)]);
        // Said once: a second turn with the same device adds nothing.
        assert_eq!(said.0.len(), 1);
        let mut again = vec![error(loop0, 11, 1)];
        assert_eq!(counts(&said.take(&topo, &mut again)), [(11, 1)]);
        assert_eq!(said.0.len(), 1);
        let mut none = vec![error(loop0, 13, 1)];
        assert!(said.take(&topo, &mut none).is_empty());
        assert_eq!(none.len(), 1);
    }
}
