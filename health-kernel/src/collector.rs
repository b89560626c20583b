//! From kernel maps to exact error records.
//!
//! The kernel counts every error in per-CPU counters and sends a sample of
//! them. Each sample carries `seq`, its CPU's counter for its key after the
//! error, so per (key, CPU) this module knows how many errors it has
//! accounted for (`accounted`). A sample accounts for itself plus any
//! suppressed errors of the same key and CPU before it. Errors that never
//! get a sample are accounted for by [`Collector::reconcile`], which emits
//! summaries for counter values seen one tick earlier: by then any sample
//! for them has long been read, so nothing is counted twice. The sum of
//! `count` over everything emitted equals the kernel's counters.
//!
//! Across a restart: with pinned state (`kernel::probes::pins`), `accounted`
//! is written to the kernel map `ACCOUNTED` after every loop turn that
//! reported something ([`Collector::persist`]), and a new process starts
//! from it, so it reports only what no earlier process did. It is written
//! *after* reporting: a process killed between the two re-reports that one
//! turn's errors (at-least-once; at most one batch repeats, never one lost).
//! Writing first would lose them instead.
//!
//! Bounded: the keys of devices gone from the topology are pruned
//! ([`Collector::prune`]) after what they still held is reported.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;

use aya::maps::{MapData, PerCpuArray, PerCpuHashMap, PerCpuValues, RingBuf};
use health_common::{source, stat, CounterKey, ErrorSample, ErrorTimes};
use tokio::io::unix::AsyncFd;

use crate::device_maps::KernelMapsRest;
use crate::probes::KernelMaps;

/// Errors of one key: either a sample, standing for `count` errors (itself
/// and the suppressed ones before it), or a summary without a sample.
#[derive(Clone, Debug)]
pub struct KernelError {
    pub key: CounterKey,
    pub count: u64,
    pub sample: Option<ErrorSample>,
}

/// What the kernel side dropped or merged, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    pub samples_suppressed: u64,
    pub ringbuf_full: u64,
    pub counter_map_full: u64,
    pub writeback_repeats: u64,
    /// Failed bios of a stacking device (dm, md) that carried up an error
    /// already counted on a device below: the same failure, not counted twice.
    pub bio_propagated: u64,
    /// Bios not followed for stalls because the `WAITING` map was full.
    pub waiting_full: u64,
    /// Devices' first latencies not counted because `LATENCY` was full.
    pub latency_full: u64,
    /// Samples that arrived after a summary had already covered them.
    pub late_samples: u64,
    /// Program runs the kernel skipped (errors nothing counted); filled in
    /// from [`crate::probes::Attached::program_misses`], not from a map.
    pub program_misses: u64,
    /// Ring-buffer records of another size than a sample, skipped.
    pub bad_records: u64,
    /// Failed requests the kernel's tracer saw at `block_rq_error` since
    /// the witness was made (with pinned state, by the first agent on those
    /// pins), `None` without a tracer witness; filled in by
    /// the agent loop from [`crate::witness`], not from a map.
    pub traced: Option<u64>,
    /// Of those, the ones no program counted (the kernel ran none for
    /// them): errors not in any count.
    pub uncounted: u64,
}

/// Each cause is either in the message or the `source()`, never both:
/// anyhow's `{:#}` prints the chain, and would print it twice.
#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    #[error("waiting on the sample ring buffer")]
    Poll(#[from] io::Error),
    #[error("counting the possible CPUs: {0}")]
    Cpus(io::Error),
    #[error("reading kernel map {map}: {error}")]
    Map {
        map: &'static str,
        error: aya::maps::MapError,
    },
}

/// A counter key and the CPU whose samples it had.
#[doc(hidden)] // the ringbuf fuzz target
pub type Slot = (CounterKey, u32);

pub struct Collector {
    samples: AsyncFd<RingBuf<MapData>>,
    counts: PerCpuHashMap<MapData, CounterKey, u64>,
    times: PerCpuHashMap<MapData, CounterKey, ErrorTimes>,
    stats: PerCpuArray<MapData, u64>,
    /// Errors already emitted, per key and CPU.
    accounted: HashMap<Slot, u64>,
    /// `accounted` as the kernel map keeps it across processes, and the
    /// number of possible CPUs its values span; `None` when nothing is
    /// pinned (no later process will read it).
    persisted: Option<(PerCpuHashMap<MapData, CounterKey, u64>, usize)>,
    /// Keys whose `accounted` changed since the last [`Collector::persist`].
    dirty: HashSet<CounterKey>,
    /// Devices (number, sequence number) absent from the previous topology
    /// (see [`Collector::prune`]).
    absent: HashSet<(u32, u64)>,
    /// Counter values seen at the previous reconcile tick.
    settled: HashMap<Slot, u64>,
    late_samples: u64,
    bad_records: u64,
    /// What the pruned keys had counted, per source (see [`Collector::counted`]);
    /// `block_rq_error`'s is kept pinned (`stat::PRUNED_RQ_ERRORS`).
    pruned: HashMap<u8, u64>,
    /// The counters' sums per source as the last [`Collector::reconcile`]
    /// read them (`None` before the first).
    reconciled: Option<HashMap<u8, u64>>,
}

impl Collector {
    /// Takes the sample, counter and stats maps; the partition and device
    /// maps stay with the caller, which keeps them current. With `persist`
    /// (pinned state), starts from what earlier processes reported.
    pub fn new(
        maps: &mut Option<KernelMaps>,
        persist: bool,
    ) -> Result<(Self, KernelMapsRest), CollectorError> {
        let KernelMaps {
            samples,
            counts,
            times,
            accounted: accounted_map,
            stats,
            partitions,
            block_devs,
            bio_devs,
            stacked,
            disk_names,
            waiting,
            latency,
        } = maps
            .take()
            .ok_or_else(|| io::Error::other("kernel maps already taken"))?;
        let mut accounted = HashMap::new();
        if persist {
            for entry in accounted_map.iter() {
                let (key, per_cpu) = entry.map_err(|error| CollectorError::Map {
                    map: "ACCOUNTED",
                    error,
                })?;
                for (cpu, &n) in per_cpu.iter().enumerate() {
                    if n > 0 {
                        accounted.insert((key, cpu as u32), n);
                    }
                }
            }
        }
        let mut collector = Self {
            // SAFETY: the RingBuf owns its map descriptor for as long as the
            // AsyncFd holds it, and always reports that same descriptor.
            samples: unsafe {
                AsyncFd::register_with_interest(samples, tokio::io::Interest::READABLE)
            }
            .map_err(|e| e.into_parts().1)?,
            counts,
            times,
            stats,
            accounted,
            // Read once: `persist` runs after every batch of samples.
            persisted: match persist {
                true => Some((
                    accounted_map,
                    aya::util::nr_cpus().map_err(|(_, e)| CollectorError::Cpus(e))?,
                )),
                false => None,
            },
            dirty: HashSet::new(),
            absent: HashSet::new(),
            settled: HashMap::new(),
            late_samples: 0,
            bad_records: 0,
            pruned: HashMap::new(),
            reconciled: None,
        };
        if persist {
            let pruned = collector.stat(stat::PRUNED_RQ_ERRORS)?;
            collector.pruned.insert(source::BLOCK_RQ_ERROR, pruned);
        }
        Ok((
            collector,
            KernelMapsRest {
                partitions,
                block_devs,
                bio_devs,
                stacked,
                disk_names,
                waiting,
                latency,
            },
        ))
    }

    /// Waits until the ring buffer has samples, then reads all of them.
    pub async fn next_batch(&mut self, out: &mut Vec<KernelError>) -> Result<(), CollectorError> {
        let mut guard = self.samples.readable_mut().await?;
        guard.clear_ready();
        drop(guard);
        self.drain(out);
        Ok(())
    }

    /// Reads every sample now in the ring buffer, without waiting.
    pub fn drain(&mut self, out: &mut Vec<KernelError>) {
        let ring = self.samples.get_mut();
        while let Some(item) = ring.next() {
            let Some(sample) = decode(&item) else {
                // Skipped and counted, never fatal: the other records are
                // still exact, and a short read must not stop the loop.
                self.bad_records += 1;
                tracing::warn!(
                    len = item.len(),
                    expected = std::mem::size_of::<ErrorSample>(),
                    "skipping a ring buffer record that is not an error sample"
                );
                continue;
            };
            drop(item);
            if let Some(e) = account_sample(&mut self.accounted, &mut self.late_samples, sample) {
                self.dirty.insert(e.key);
                out.push(e);
            }
        }
    }

    /// Emits summaries for errors no sample accounted for, after reading
    /// the samples already in the ring buffer (a turn that comes late
    /// would otherwise tell errors whose samples wait unread as summaries,
    /// without their sectors). With `final_` (the programs are detached),
    /// everything counted is settled; otherwise only what was counted a
    /// tick ago.
    pub fn reconcile(
        &mut self,
        final_: bool,
        out: &mut Vec<KernelError>,
    ) -> Result<(), CollectorError> {
        self.drain(out);
        let mut sums = HashMap::new();
        for entry in self.counts.iter() {
            let (key, per_cpu) = entry.map_err(|error| CollectorError::Map {
                map: "COUNTS",
                error,
            })?;
            *sums.entry(key.source).or_insert(0) += per_cpu.iter().sum::<u64>();
            for (cpu, &value) in per_cpu.iter().enumerate() {
                if value == 0 {
                    continue;
                }
                let slot = (key, cpu as u32);
                let target = if final_ {
                    value
                } else {
                    // Counters only grow, so last tick's value is <= value.
                    self.settled.insert(slot, value).unwrap_or(0)
                };
                let acct = self.accounted.entry(slot).or_insert(0);
                if target > *acct {
                    out.push(KernelError {
                        key,
                        count: target - *acct,
                        sample: None,
                    });
                    *acct = target;
                    self.dirty.insert(key);
                }
            }
        }
        self.reconciled = Some(sums);
        Ok(())
    }

    /// Writes what changed in `accounted` to the pinned map; call it after
    /// the errors emitted so far were reported (see the module comment).
    pub fn persist(&mut self) -> Result<(), CollectorError> {
        let Some((map, cpus)) = &mut self.persisted else {
            self.dirty.clear();
            return Ok(());
        };
        for key in self.dirty.drain() {
            let values: Vec<u64> = (0..*cpus as u32)
                .map(|cpu| self.accounted.get(&(key, cpu)).copied().unwrap_or(0))
                .collect();
            let values = PerCpuValues::try_from(values).map_err(CollectorError::Cpus)?;
            map.insert(key, values, 0)
                .map_err(|error| CollectorError::Map {
                    map: "ACCOUNTED",
                    error,
                })?;
        }
        Ok(())
    }

    /// Removes the keys of devices gone from the topology (`is_gone` says
    /// which: devices the topology knew and no longer does, and earlier
    /// holders of a number another device holds now) from the kernel maps,
    /// after emitting what they still held. A key must be gone in two
    /// scans in a row: a device attached after a scan has its first errors
    /// counted before the next scan sees it. A gone device fails no more I/O, so nothing
    /// is counted between the read and the removal. Returns how many keys
    /// went.
    pub fn prune(
        &mut self,
        is_gone: impl Fn(&CounterKey) -> bool,
        out: &mut Vec<KernelError>,
    ) -> Result<usize, CollectorError> {
        let mut gone = Vec::new();
        let mut absent = HashSet::new();
        for entry in self.counts.iter() {
            let (key, per_cpu) = entry.map_err(|error| CollectorError::Map {
                map: "COUNTS",
                error,
            })?;
            if key.dev == 0 || !is_gone(&key) {
                continue;
            }
            let device = (key.dev, key.diskseq);
            absent.insert(device);
            if self.absent.contains(&device) {
                gone.push((key, per_cpu.iter().copied().collect::<Vec<u64>>()));
            }
        }
        self.absent = absent;
        if gone.is_empty() {
            return Ok(0);
        }
        for (key, per_cpu) in &gone {
            *self.pruned.entry(key.source).or_insert(0) += per_cpu.iter().sum::<u64>();
        }
        // Kept before the keys go: a process killed in between counts them
        // twice, and the witness's figure can only fall short.
        let pruned = self.pruned.get(&source::BLOCK_RQ_ERROR).copied();
        self.keep_stat(stat::PRUNED_RQ_ERRORS, pruned.unwrap_or(0))?;
        for (key, per_cpu) in &gone {
            for (cpu, &value) in per_cpu.iter().enumerate() {
                let slot = (*key, cpu as u32);
                let acct = self.accounted.remove(&slot).unwrap_or(0);
                self.settled.remove(&slot);
                if value > acct {
                    out.push(KernelError {
                        key: *key,
                        count: value - acct,
                        sample: None,
                    });
                }
            }
            self.dirty.remove(key);
            for (map, result) in [
                ("COUNTS", self.counts.remove(key)),
                ("TIMES", self.times.remove(key)),
                (
                    "ACCOUNTED",
                    self.persisted
                        .as_mut()
                        .map_or(Ok(()), |(m, _)| m.remove(key)),
                ),
            ] {
                // TIMES lacks a key whose first error found it full.
                if let Err(e) = result {
                    tracing::debug!("pruning {map} key of device {}: {e}", key.dev);
                }
            }
        }
        Ok(gone.len())
    }

    /// Exact totals per key, summed over CPUs.
    pub fn totals(&self) -> Result<BTreeMap<CounterKey, u64>, CollectorError> {
        let mut totals = BTreeMap::new();
        for entry in self.counts.iter() {
            let (key, per_cpu) = entry.map_err(|error| CollectorError::Map {
                map: "COUNTS",
                error,
            })?;
            let sum: u64 = per_cpu.iter().sum();
            if sum > 0 {
                totals.insert(key, sum);
            }
        }
        Ok(totals)
    }

    /// Everything the programs counted under `source` since the counters
    /// were made, pruned keys included, plus the errors no counter could
    /// hold (the counter map was full; not told apart by source, so they
    /// are added whatever it is): the figure [`crate::witness`]
    /// compares with the tracer's. The counters are taken as the last
    /// [`Collector::reconcile`] read them, which walks them all anyway (call
    /// it right after one), and read now only before the first.
    pub fn counted(&self, source: u8) -> Result<u64, CollectorError> {
        let in_counters = match &self.reconciled {
            Some(sums) => sums.get(&source).copied().unwrap_or(0),
            None => self
                .totals()?
                .iter()
                .filter(|(key, _)| key.source == source)
                .map(|(_, n)| n)
                .sum(),
        };
        let pruned = self.pruned.get(&source).copied().unwrap_or(0);
        Ok(pruned + in_counters + self.stat(stat::COUNTER_MAP_FULL)?)
    }

    /// The programs' `block_rq_error` count when the pinned tracer witness
    /// was made (0 if never set: the figure then only falls short).
    pub fn witness_base(&self) -> Result<u64, CollectorError> {
        self.stat(stat::WITNESS_BASE)
    }

    /// Records the pinned witness's baseline (see [`Collector::witness_base`]).
    pub fn set_witness_base(&mut self, counted: u64) -> Result<(), CollectorError> {
        self.keep_stat(stat::WITNESS_BASE, counted)
    }

    /// Writes a userspace-owned stat slot (no program touches it) for the
    /// next process; nothing when nothing is pinned.
    fn keep_stat(&mut self, slot: u32, value: u64) -> Result<(), CollectorError> {
        let Some((_, cpus)) = &self.persisted else {
            return Ok(());
        };
        let values: Vec<u64> = (0..*cpus)
            .map(|cpu| if cpu == 0 { value } else { 0 })
            .collect();
        let values = PerCpuValues::try_from(values).map_err(CollectorError::Cpus)?;
        self.stats
            .set(slot, values, 0)
            .map_err(|error| CollectorError::Map {
                map: "STATS",
                error,
            })
    }

    /// One kernel stat, summed over CPUs.
    fn stat(&self, slot: u32) -> Result<u64, CollectorError> {
        let per_cpu = self
            .stats
            .get(&slot, 0)
            .map_err(|error| CollectorError::Map {
                map: "STATS",
                error,
            })?;
        Ok(per_cpu.iter().sum())
    }

    pub fn kernel_stats(&self) -> Result<KernelStats, CollectorError> {
        let read = |slot| self.stat(slot);
        Ok(KernelStats {
            samples_suppressed: read(stat::SAMPLES_SUPPRESSED)?,
            ringbuf_full: read(stat::RINGBUF_FULL)?,
            counter_map_full: read(stat::COUNTER_MAP_FULL)?,
            writeback_repeats: read(stat::WRITEBACK_REPEATS)?,
            bio_propagated: read(stat::BIO_PROPAGATED)?,
            waiting_full: read(stat::WAITING_FULL)?,
            latency_full: read(stat::LATENCY_FULL)?,
            late_samples: self.late_samples,
            program_misses: 0,
            bad_records: self.bad_records,
            traced: None,
            uncounted: 0,
        })
    }
}

/// The sample in one ring-buffer record, which must be exactly one
/// [`ErrorSample`]: the kernel programs reserve that size, so a shorter or
/// longer record was written by something else (another build of the
/// programs left pinned) and its fields cannot be trusted.
#[doc(hidden)] // the ringbuf fuzz target
pub fn decode(bytes: &[u8]) -> Option<ErrorSample> {
    if bytes.len() != std::mem::size_of::<ErrorSample>() {
        return None;
    }
    // SAFETY: ErrorSample is plain #[repr(C)] data valid for any bytes, and
    // the length was checked; ring buffer records are only 8-byte aligned.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ErrorSample>()) })
}

/// How many errors a sample stands for, given what is already accounted.
#[doc(hidden)] // the ringbuf fuzz target
pub fn account_sample(
    accounted: &mut HashMap<Slot, u64>,
    late: &mut u64,
    sample: ErrorSample,
) -> Option<KernelError> {
    if sample.seq == 0 {
        // The counter map was full: this error is in no counter, so the
        // sample is its only record.
        return Some(KernelError {
            key: sample.key,
            count: 1,
            sample: Some(sample),
        });
    }
    let acct = accounted.entry((sample.key, sample.cpu)).or_insert(0);
    if sample.seq <= *acct {
        *late += 1;
        return None;
    }
    let count = sample.seq - *acct;
    *acct = sample.seq;
    Some(KernelError {
        key: sample.key,
        count,
        sample: Some(sample),
    })
}

#[cfg(test)]
mod tests {
    use health_common::{op, source};

    use super::*;

    fn sample(key: CounterKey, cpu: u32, seq: u64) -> ErrorSample {
        ErrorSample {
            key,
            cpu,
            seq,
            mono_ns: 0,
            sector: 0,
            ino: 0,
            cgroup: 0,
            raw_dev: key.dev,
            nr_sectors: 8,
            flags: 0,
            pid: 0,
            comm: [0; 16],
            detail: [0; 32],
            _pad: 0,
        }
    }

    #[test]
    fn samples_account_for_suppressed_predecessors_per_key_and_cpu() {
        let a = CounterKey::new(1, source::BLOCK_RQ_ERROR, op::WRITE, 5);
        let b = CounterKey::new(1, source::BLOCK_RQ_ERROR, op::READ, 5);
        let mut acct = HashMap::new();
        let mut late = 0;
        let counts: Vec<u64> = [(a, 0, 1), (a, 0, 2), (a, 0, 7), (b, 0, 1), (a, 1, 3)]
            .into_iter()
            .map(|(k, cpu, seq)| {
                account_sample(&mut acct, &mut late, sample(k, cpu, seq))
                    .unwrap()
                    .count
            })
            .collect();
        assert_eq!(counts, [1, 1, 5, 1, 3]);
        // A sample already covered by a summary is dropped, not double counted.
        acct.insert((a, 0), 10);
        assert!(account_sample(&mut acct, &mut late, sample(a, 0, 9)).is_none());
        assert_eq!(late, 1);
        // An uncounted error (counter map full) still counts once.
        let e = account_sample(&mut acct, &mut late, sample(b, 1, 0)).unwrap();
        assert_eq!(e.count, 1);
    }

    #[test]
    fn short_records_are_refused() {
        assert!(decode(&[0u8; 16]).is_none());
        let s = sample(CounterKey::new(7, 1, 2, 5), 1, 42);
        // SAFETY: ErrorSample is plain #[repr(C)] data (aya::Pod), an array
        // of its size holds any of its values.
        let bytes: [u8; std::mem::size_of::<ErrorSample>()] = unsafe { std::mem::transmute(s) };
        let back = decode(&bytes).unwrap();
        assert_eq!((back.key, back.cpu, back.seq), (s.key, 1, 42));
        // Longer records are not samples either (another layout).
        let mut long = bytes.to_vec();
        long.extend([0; 8]);
        assert!(decode(&long).is_none());
        assert!(decode(&[]).is_none());
    }
}
