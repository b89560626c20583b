//! The per-event userspace path: what the agent does for every sample that
//! reaches it (`ErrorEvent::resolve` against the device topology, then JSON
//! or the human line), and the topology build it redoes on every rescan.
//!
//! The topology is synthetic but shaped like a busy node: 64 disks with 4
//! partitions each, 4 mounts per partition (a filesystem plus the bind
//! mounts kubelet makes for each pod using a volume) and a few hundred
//! unrelated mounts (proc, tmpfs, overlay) that lookups must skip.
//!
//! Run by `cargo xtask bench` (which records the estimates in
//! docs/benchmarks.md), or alone: `cargo bench -p health-agent --bench event_path`.

use std::hint::black_box;
use std::time::SystemTime;

use criterion::{criterion_group, criterion_main, Criterion};
use health_common::{op, source, CounterKey, ErrorSample};
use health_core::dev::Dev;
use health_kernel::clock::Clock;
use health_kernel::collector::KernelError;
use health_node::report::event::ErrorEvent;
use health_topology::{BlockDevice, MountEntry, Partition, Topology};

const DISKS: u32 = 64;
const PARTS_PER_DISK: u32 = 4;
const MOUNTS_PER_PART: u32 = 4;
const OTHER_MOUNTS: u32 = 300;
/// Major number for the synthetic partitions (the kernel's extended block major).
const PART_MAJOR: u32 = 259;
const DISK_MAJOR: u32 = 8;
const PART_SECTORS: u64 = 1 << 21;

fn part_dev(disk: u32, part: u32) -> Dev {
    Dev::new(PART_MAJOR, disk * PARTS_PER_DISK + part)
}

fn devices() -> Vec<BlockDevice> {
    let mut out = Vec::new();
    for d in 0..DISKS {
        let disk = Dev::new(DISK_MAJOR, d * 16);
        out.push(BlockDevice {
            dev: disk,
            name: format!("sd{d}"),
            whole_disk: None,
            partition: None,
            size_sectors: PART_SECTORS * u64::from(PARTS_PER_DISK) + 2048,
            loop_backing_file: None,
            holders: vec![],
            slaves: vec![],
            read_only: false,
            diskseq: None,
        });
        for p in 0..PARTS_PER_DISK {
            out.push(BlockDevice {
                dev: part_dev(d, p),
                name: format!("sd{d}p{}", p + 1),
                whole_disk: Some(disk),
                partition: Some(Partition {
                    number: p + 1,
                    start: 2048 + u64::from(p) * PART_SECTORS,
                    sectors: PART_SECTORS,
                }),
                size_sectors: PART_SECTORS,
                loop_backing_file: None,
                holders: vec![],
                slaves: vec![],
                read_only: false,
                diskseq: None,
            });
        }
    }
    out
}

fn mount(id: u32, dev: Dev, point: String, fs_type: &str, source: String) -> MountEntry {
    MountEntry {
        mount_id: id,
        parent_id: 1,
        dev,
        root: "/".into(),
        mount_point: point.into(),
        mount_options: "rw,relatime".into(),
        fs_type: fs_type.into(),
        source,
        super_options: "rw,errors=remount-ro".into(),
    }
}

fn mounts() -> Vec<MountEntry> {
    let mut out = vec![mount(
        1,
        Dev::new(254, 0),
        "/".into(),
        "ext4",
        "/dev/vda".into(),
    )];
    let mut id = 2;
    // Unrelated mounts first, as on a real node, so per-device lookups
    // cannot get lucky with an early match.
    for i in 0..OTHER_MOUNTS {
        out.push(mount(
            id,
            Dev::new(0, 100 + i),
            format!("/run/containers/overlay/{i}/merged"),
            "overlay",
            "overlay".into(),
        ));
        id += 1;
    }
    for d in 0..DISKS {
        for p in 0..PARTS_PER_DISK {
            let dev = part_dev(d, p);
            out.push(mount(
                id,
                dev,
                format!("/var/lib/kubelet/plugins/csi/pv-{d}-{p}/globalmount"),
                "ext4",
                format!("/dev/sd{d}p{}", p + 1),
            ));
            id += 1;
            for pod in 1..MOUNTS_PER_PART {
                out.push(mount(
                    id,
                    dev,
                    format!("/var/lib/kubelet/pods/pod-{d}-{p}-{pod}/volumes/kubernetes.io~csi/pv-{d}-{p}/mount"),
                    "ext4",
                    format!("/dev/sd{d}p{}", p + 1),
                ));
                id += 1;
            }
        }
    }
    out
}

/// A sampled write error on the last disk's third partition, as the kernel
/// program reports it (partition already resolved, absolute sector).
fn block_error() -> KernelError {
    let dev = part_dev(DISKS - 1, 2);
    let key = CounterKey::new(dev.to_kernel(), source::BLOCK_RQ_ERROR, op::WRITE, 5);
    let mut detail = [0u8; 32];
    detail[..2].copy_from_slice(b"WS");
    let mut comm = [0u8; 16];
    comm[..11].copy_from_slice(b"kworker/1:2");
    let sample = ErrorSample {
        key,
        cpu: 1,
        seq: 17,
        mono_ns: 123_456_789_000,
        sector: 2048 + 2 * PART_SECTORS + 4096,
        ino: 0,
        cgroup: 0,
        raw_dev: Dev::new(DISK_MAJOR, (DISKS - 1) * 16).to_kernel(),
        nr_sectors: 8,
        flags: 0,
        pid: 4242,
        comm,
        detail,
        _pad: 0,
    };
    KernelError {
        key,
        count: 1,
        sample: Some(sample),
    }
}

/// Errors whose samples were rate-limited away: a summary line.
fn summary() -> KernelError {
    let key = CounterKey::new(
        part_dev(7, 1).to_kernel(),
        source::BLOCK_RQ_ERROR,
        op::READ,
        5,
    );
    KernelError {
        key,
        count: 250,
        sample: None,
    }
}

fn event_path(c: &mut Criterion) {
    let topo = Topology::from_parts(devices(), mounts());
    let clock = Clock::new();
    let now = SystemTime::now();
    let sampled = block_error();
    let summarized = summary();
    // Sanity: the synthetic event must really resolve to a named device with
    // its four mounts, or the benchmark would time the cheap miss path.
    let ev = ErrorEvent::resolve(&sampled, &topo, &clock, now);
    assert_eq!(ev.mounts.len(), MOUNTS_PER_PART as usize, "{ev:?}");
    assert!(ev.disk.is_some() && ev.parent_disk.is_some(), "{ev:?}");

    let mut g = c.benchmark_group("event");
    g.bench_function("resolve", |b| {
        b.iter(|| ErrorEvent::resolve(black_box(&sampled), &topo, &clock, now))
    });
    let mut buf = Vec::with_capacity(1024);
    g.bench_function("resolve_json", |b| {
        b.iter(|| {
            buf.clear();
            let ev = ErrorEvent::resolve(black_box(&sampled), &topo, &clock, now);
            serde_json::to_writer(&mut buf, &ev).expect("serializing to memory cannot fail");
            buf.push(b'\n');
            black_box(buf.len())
        })
    });
    g.bench_function("resolve_human", |b| {
        b.iter(|| ErrorEvent::resolve(black_box(&sampled), &topo, &clock, now).human_line())
    });
    g.bench_function("summary_json", |b| {
        b.iter(|| {
            buf.clear();
            let ev = ErrorEvent::resolve(black_box(&summarized), &topo, &clock, now);
            serde_json::to_writer(&mut buf, &ev).expect("serializing to memory cannot fail");
            black_box(buf.len())
        })
    });
    g.finish();

    let (devs, mnts) = (devices(), mounts());
    let mut g = c.benchmark_group("topology");
    g.bench_function("from_parts", |b| {
        b.iter_batched(
            || (devs.clone(), mnts.clone()),
            |(d, m)| Topology::from_parts(d, m),
            criterion::BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, event_path);
criterion_main!(benches);
