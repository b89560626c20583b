//! The report stage: what the agent says about the errors and conditions
//! the earlier stages produced. [`Reporter`] is the interface the agent loop
//! calls; [`watch::View`] prints (standalone), `crate::cluster` writes Events.
//! [`event`] is the JSON Lines schema, [`metrics`] and [`http`] serve
//! Prometheus. Uses `kernel`, `topology` and `volumes`; never the loop.

use std::collections::BTreeMap;

use health_common::CounterKey;
use health_kernel::clock::Clock;
use health_kernel::collector::{KernelError, KernelStats};
use health_topology::{InputErrors, Topology};

use crate::volumes::latency::StorageClasses;
use crate::volumes::waiters::PodNames;
use crate::volumes::{Handled, LiveVolumes, VolumeIndex, VolumeKey};

pub mod event;
pub mod metrics;
pub mod watch;

/// What the agent loop tells the outside world. `watch` prints ([`watch::View`]);
/// cluster mode (`cluster::report`) turns the same calls into Events and
/// metrics. Every call is made from the loop, so none may block.
#[allow(async_fn_in_trait)]
pub trait Reporter {
    /// Something else the reporter waits on (API stores, a server).
    type Wake;
    /// The kernel programs are attached; `active` sources, and the volumes
    /// found. The loop prints the ready line after this returns.
    fn ready(&mut self, _active: usize, _volumes: Option<&LiveVolumes>) {}
    /// A batch of kernel errors, after the volumes recorded it.
    fn errors(
        &mut self,
        batch: &[KernelError],
        topo: &Topology,
        clock: &Clock,
        volumes: Option<&VolumeIndex>,
    ) -> anyhow::Result<()>;
    /// Condition changes, and volumes that left the index.
    fn changes(&mut self, handled: &Handled, gone: &[VolumeKey], volumes: &LiveVolumes);
    /// Once per reconcile interval: the kernel side's own counters.
    fn kernel_stats(&mut self, _stats: &KernelStats) {}
    /// After each topology scan: what it skipped as malformed.
    fn input_errors(&mut self, _errors: &InputErrors) {}
    /// The periodic per-device totals.
    fn totals(
        &mut self,
        _totals: &BTreeMap<CounterKey, u64>,
        _topo: &Topology,
    ) -> anyhow::Result<()> {
        Ok(())
    }
    /// Names for the pods and containers a cgroup path names (cluster
    /// mode's pod store); `None` by default.
    fn pod_names(&self) -> Option<&dyn PodNames> {
        None
    }
    /// The StorageClass of a PV (cluster mode's PV lookups), for
    /// `--storage-class-latency-limit`; `None` by default.
    fn storage_classes(&self) -> Option<&dyn StorageClasses> {
        None
    }
    /// Waits for the reporter's own next thing; never resolves by default.
    async fn wake(&mut self) -> Self::Wake {
        std::future::pending().await
    }
    fn handle(&mut self, _wake: Self::Wake, _volumes: Option<&LiveVolumes>) {}
    /// After detaching: the exact totals and what the kernel side dropped.
    fn finish(
        &mut self,
        totals: &BTreeMap<CounterKey, u64>,
        topo: &Topology,
        stats: &KernelStats,
    ) -> anyhow::Result<()>;
}
