//! Resolving kernel events to pod volumes on a node with 1,000 pod volumes,
//! and what the index costs in memory.
//!
//! The node is synthetic but shaped like a busy one: 64 disks with 4
//! partitions each; each partition holds 4 LVM volumes (device-mapper
//! devices, 1,024 in all) that are CSI PVs, each mounted at its staging path
//! and bind-mounted into its pod; one PV in ten is shared by two pods, for
//! 1,000 pod volumes (plus a few hundred unrelated mounts). An error on a
//! dm device reaches one or two pod volumes, on a partition about 4, on a
//! whole disk (a failed flush) about 16.
//!
//! Measured:
//! - `volumes/lookup_*`: [`VolumeIndex::indices_for`], the per-event lookup;
//! - `volumes/monitor_record`: [`VolumeMonitor::record`] per event (lookup
//!   plus per-volume aggregation);
//! - `volumes/monitor_flush_all`: handing errors on all 1,000 volumes to
//!   their condition machines (`watch` flushes at most once a second);
//! - `volumes/watch_line_*`: the whole `watch --json` path of one event:
//!   resolve, then one JSON line per pod volume it reaches;
//! - `volumes/index_build`: rebuilding the index (on every topology rescan).
//!
//! The memory figures (heap bytes held by the index, and RSS growth) are
//! printed before the timings. Run: `cargo bench -p health-agent --bench volumes`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use criterion::{BatchSize, Criterion, Throughput};
use health_common::{op, source, CounterKey};
use health_core::conditions::ConditionConfig;
use health_core::dev::Dev;
use health_kernel::clock::Clock;
use health_kernel::collector::KernelError;
use health_node::report::event::ErrorEvent;
use health_node::volumes::kubelet::{KubeletVolume, VolumeKind, VolumeMode};
use health_node::volumes::{VolumeIndex, VolumeMonitor};
use health_topology::{BlockDevice, MountEntry, Partition, Topology};

/// Counts live heap bytes, to measure what the index holds.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: defers to the system allocator; only adds bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const DISKS: u32 = 64;
const PARTS: u32 = 4;
const LVS_PER_PART: u32 = 4;
const POD_VOLUMES: usize = 1000;
const OTHER_MOUNTS: u32 = 300;
const PART_SECTORS: u64 = 1 << 24;

fn disk_dev(d: u32) -> Dev {
    Dev::new(8, d * 16)
}
fn part_dev(d: u32, p: u32) -> Dev {
    Dev::new(259, d * PARTS + p)
}
fn lv_dev(d: u32, p: u32, l: u32) -> Dev {
    Dev::new(253, (d * PARTS + p) * LVS_PER_PART + l)
}

fn block(dev: Dev, name: String) -> BlockDevice {
    BlockDevice {
        dev,
        name,
        whole_disk: None,
        partition: None,
        size_sectors: PART_SECTORS,
        loop_backing_file: None,
        holders: vec![],
        slaves: vec![],
        read_only: false,
        diskseq: None,
    }
}

fn devices() -> Vec<BlockDevice> {
    let mut out = Vec::new();
    for d in 0..DISKS {
        out.push(block(disk_dev(d), format!("sd{d}")));
        for p in 0..PARTS {
            let mut part = block(part_dev(d, p), format!("sd{d}p{}", p + 1));
            part.whole_disk = Some(disk_dev(d));
            part.partition = Some(Partition {
                number: p + 1,
                start: 2048 + u64::from(p) * PART_SECTORS,
                sectors: PART_SECTORS,
            });
            for l in 0..LVS_PER_PART {
                part.holders.push(lv_dev(d, p, l));
                let mut lv = block(lv_dev(d, p, l), format!("dm-{}", lv_dev(d, p, l).minor));
                lv.slaves = vec![part_dev(d, p)];
                out.push(lv);
            }
            out.push(part);
        }
    }
    out
}

fn mount(id: u32, dev: Dev, point: String, fs_type: &str) -> MountEntry {
    MountEntry {
        mount_id: id,
        parent_id: 1,
        dev,
        root: "/".into(),
        mount_point: point.into(),
        mount_options: "rw,relatime".into(),
        fs_type: fs_type.into(),
        source: format!("/dev/dm-{}", dev.minor),
        super_options: "rw,errors=remount-ro".into(),
    }
}

fn pod_uid(n: usize) -> String {
    format!("{n:08x}-0000-4000-8000-{n:012x}")
}

fn pod_path(pod: &str, pv: &str) -> String {
    format!("/var/lib/kubelet/pods/{pod}/volumes/kubernetes.io~csi/{pv}/mount")
}

/// The node: topology plus the kubelet's view of its pod volumes.
fn node() -> (Topology, Vec<KubeletVolume>) {
    let mut mounts = vec![mount(1, Dev::new(254, 0), "/".into(), "ext4")];
    let mut id = 2;
    for i in 0..OTHER_MOUNTS {
        mounts.push(mount(
            id,
            Dev::new(0, 100 + i),
            format!("/run/containers/overlay/{i}/merged"),
            "overlay",
        ));
        id += 1;
    }
    let mut volumes = Vec::new();
    let lvs: Vec<Dev> = (0..DISKS)
        .flat_map(|d| (0..PARTS).flat_map(move |p| (0..LVS_PER_PART).map(move |l| lv_dev(d, p, l))))
        .collect();
    let mut pods = 0;
    for (n, &lv) in lvs.iter().enumerate() {
        if volumes.len() >= POD_VOLUMES {
            break;
        }
        let pv = format!("pvc-{n:08x}-1111-4222-8333-{n:012x}");
        mounts.push(mount(
            id,
            lv,
            format!("/var/lib/kubelet/plugins/kubernetes.io/csi/pv/{pv}/globalmount"),
            "ext4",
        ));
        id += 1;
        // One PV in ten is shared by two pods.
        let users = if n % 10 == 0 { 2 } else { 1 };
        for _ in 0..users {
            if volumes.len() >= POD_VOLUMES {
                break;
            }
            let pod = pod_uid(pods);
            pods += 1;
            let path = pod_path(&pod, &pv);
            mounts.push(mount(id, lv, path.clone(), "ext4"));
            id += 1;
            volumes.push(KubeletVolume {
                pod_uid: pod,
                pv: Some(pv.clone()),
                pod_volume_dir_name: pv.clone(),
                driver: Some("lvm.csi.example.com".into()),
                volume_handle: Some(format!("vg0/{pv}")),
                volume_mode: VolumeMode::Filesystem,
                kind: VolumeKind::Csi,
                path: PathBuf::from(path),
                staging_path: Some(
                    format!("/var/lib/kubelet/plugins/kubernetes.io/csi/pv/{pv}/globalmount")
                        .into(),
                ),
                node_name: Some("node-1".into()),
            });
        }
    }
    (Topology::from_parts(devices(), mounts), volumes)
}

fn error_on(dev: Dev) -> KernelError {
    KernelError {
        key: CounterKey::new(dev.to_kernel(), source::BLOCK_RQ_ERROR, op::WRITE, 5),
        count: 1,
        sample: None,
    }
}

fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4
}

/// Heap held by an index of 1,000 pod volumes, and the RSS it added.
fn report_memory() {
    let (topo, volumes) = node();
    let resolved: Vec<(KubeletVolume, Option<Dev>)> = volumes
        .into_iter()
        .map(|v| {
            let dev = health_node::volumes::kubelet::resolve_device(&v, topo.mounts());
            (v, dev)
        })
        .collect();
    let input_bytes: usize = resolved.iter().map(|(v, _)| approx_volume_bytes(v)).sum();
    let rss_before = rss_kib();
    let heap_before = LIVE.load(Ordering::Relaxed);
    let index = VolumeIndex::from_resolved(&topo, resolved);
    let heap_after = LIVE.load(Ordering::Relaxed);
    let rss_after = rss_kib();
    let monitor_before = LIVE.load(Ordering::Relaxed);
    let monitor = VolumeMonitor::new(index.clone(), ConditionConfig::default());
    let monitor_after = LIVE.load(Ordering::Relaxed);
    println!(
        "volumes/memory: {} pod volumes, {} devices indexed; the index adds {} KiB ({} B per pod volume) to the \
         volumes it holds (~{} B each); the monitor adds {} KiB; RSS grew {} KiB while building the index",
        index.len(),
        index.device_count(),
        (heap_after - heap_before) / 1024,
        (heap_after - heap_before) / index.len() as isize,
        input_bytes / index.len(),
        (monitor_after - monitor_before) / 1024,
        rss_after.saturating_sub(rss_before),
    );
    black_box(monitor);
}

fn approx_volume_bytes(v: &KubeletVolume) -> usize {
    std::mem::size_of::<KubeletVolume>()
        + v.pod_uid.len()
        + v.pv.as_ref().map_or(0, String::len)
        + v.pod_volume_dir_name.len()
        + v.driver.as_ref().map_or(0, String::len)
        + v.volume_handle.as_ref().map_or(0, String::len)
        + v.path.as_os_str().len()
        + v.staging_path.as_ref().map_or(0, |p| p.as_os_str().len())
        + v.node_name.as_ref().map_or(0, String::len)
}

fn volumes(c: &mut Criterion) {
    let (topo, vols) = node();
    let index = VolumeIndex::build(&topo, vols.clone());
    assert_eq!(index.len(), POD_VOLUMES);
    let shared_lv = lv_dev(0, 0, 0);
    let lone_lv = lv_dev(0, 0, 1);
    let part = part_dev(3, 2);
    let disk = disk_dev(5);
    // Sanity: the fan-out the doc comment promises, or we would time misses.
    assert_eq!(index.indices_for(shared_lv).len(), 2);
    assert_eq!(index.indices_for(lone_lv).len(), 1);
    assert!(index.indices_for(part).len() >= 4);
    assert!(index.indices_for(disk).len() >= 16);
    // Events over every LV, in an order that defeats the cache a little.
    let stream: Vec<Dev> = (0..POD_VOLUMES as u32)
        .map(|i| {
            let n = (i * 7919) % (DISKS * PARTS * LVS_PER_PART);
            let (d, rest) = (n / (PARTS * LVS_PER_PART), n % (PARTS * LVS_PER_PART));
            lv_dev(d, rest / LVS_PER_PART, rest % LVS_PER_PART)
        })
        .collect();

    let mut g = c.benchmark_group("volumes");
    g.throughput(Throughput::Elements(1));
    g.bench_function("lookup_lv", |b| {
        b.iter(|| black_box(index.indices_for(black_box(lone_lv))).len())
    });
    g.bench_function("lookup_disk", |b| {
        b.iter(|| black_box(index.indices_for(black_box(disk))).len())
    });
    g.bench_function("lookup_miss", |b| {
        b.iter(|| black_box(index.indices_for(black_box(Dev::new(1, 1)))).len())
    });

    g.throughput(Throughput::Elements(stream.len() as u64));
    let errors: Vec<KernelError> = stream.iter().map(|&d| error_on(d)).collect();
    let now = SystemTime::now();
    // Per event: lookup and aggregation only. The flush into the condition
    // machines happens at most once a second in `watch`, whatever the event
    // rate, so it is timed separately below.
    let mut m = VolumeMonitor::new(index.clone(), ConditionConfig::default());
    g.bench_function("monitor_record", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                for e in &errors {
                    m.record(black_box(e), now);
                }
                spent += start.elapsed();
                black_box(m.flush_kernel(now).len());
            }
            spent
        })
    });
    // One flush after errors on every volume: each of the 1,000 condition
    // machines updates its kernel condition (steady state: counts grow).
    g.bench_function("monitor_flush_all", |b| {
        let mut at = now;
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                for e in &errors {
                    m.record(e, at);
                }
                at += Duration::from_millis(1);
                let start = Instant::now();
                black_box(m.flush_kernel(at).len());
                spent += start.elapsed();
            }
            spent
        })
    });

    let clock = Clock::new();
    let mut buf = Vec::with_capacity(1 << 16);
    for (name, dev) in [("watch_line_lv", shared_lv), ("watch_line_disk", disk)] {
        let e = error_on(dev);
        g.throughput(Throughput::Elements(1));
        g.bench_function(name, |b| {
            b.iter(|| {
                buf.clear();
                let mut ev = ErrorEvent::resolve(black_box(&e), &topo, &clock, now);
                for v in index.volumes_for(dev) {
                    ev.set_volume(Some(&v.volume));
                    serde_json::to_writer(&mut buf, &ev)
                        .expect("serializing to memory cannot fail");
                    buf.push(b'\n');
                }
                black_box(buf.len())
            })
        });
    }

    g.throughput(Throughput::Elements(POD_VOLUMES as u64));
    g.sample_size(20);
    g.bench_function("index_build", |b| {
        b.iter_batched(
            || vols.clone(),
            |v| VolumeIndex::build(&topo, v),
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn main() {
    report_memory();
    let mut c = Criterion::default().configure_from_args();
    volumes(&mut c);
    c.final_summary();
}
