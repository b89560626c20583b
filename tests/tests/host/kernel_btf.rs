//! The host's kernel BTF as the block programs read it: the members exist
//! where the kernel says they do. Values of the host's kernel (6.18, whose
//! BTF names the request flag bits, as 6.1 does not); `cargo xtask vm`
//! does not run this on the guests' kernels.

use std::path::Path;

use health_common::{bio, rq};
use health_kernel::probes::btf::{bio_layout, counts_early, request_layout, KernelBtf};

/// The running kernel's BTF: the members the block programs read exist
/// where the kernel says they do.
#[test]
fn running_kernel_request_layout() {
    let btf = KernelBtf::read(Path::new("/sys/kernel/btf/vmlinux")).unwrap();
    let layout = request_layout(&btf).unwrap();
    assert_eq!(layout[rq::Q], 0, "request.q is the first member");
    assert!(layout[rq::SECTOR] > 0 && layout[rq::SECTOR] < 512);
    assert_eq!(
        layout[rq::RQ_DISK],
        rq::ABSENT,
        "6.x keeps the disk in the queue"
    );
    assert_ne!(layout[rq::Q_DISK], rq::ABSENT);
    assert_eq!(layout[rq::COMPLETE_ARG_ERRNO], 0, "6.x passes blk_status_t");
    assert_eq!(
        btf.tracepoint_arg_type("block_rq_error", 1).as_deref(),
        Some("blk_status_t")
    );
    let bits: Vec<u32> = [
        rq::BIT_PREFLUSH,
        rq::BIT_FUA,
        rq::BIT_RAHEAD,
        rq::BIT_SYNC,
        rq::BIT_META,
    ]
    .iter()
    .map(|&s| layout[s])
    .collect();
    assert!(bits.iter().all(|&b| (8..32).contains(&b)), "{bits:?}");
    // 6.18 names the request flag bits in its BTF (6.1 does not).
    assert!(counts_early(&layout), "{layout:?}");
    assert_eq!(layout[rq::BIT_RQF_QUIET], 7, "__RQF_QUIET on 6.18");
    assert!(layout[rq::RQ_BIO] > layout[rq::CMD_FLAGS]);
    assert!(layout[rq::DISK_STATE] > 0 && layout[rq::DISK_STATE] < 1024);
    // 5.15 gave disks a sequence number, which failed requests carry.
    assert!(
        layout[rq::DISK_SEQ] > 0 && layout[rq::DISK_SEQ] < 2048,
        "gendisk.diskseq at {}",
        layout[rq::DISK_SEQ]
    );
}

/// The running kernel's BTF as the `WAITING` programs read a bio: 6.x
/// passes `block_bio_queue(bio)` and `block_bio_complete(q, bio)`, names
/// the device by `bi_bdev`, and has `BIO_TRACE_COMPLETION` among the first
/// 16 bio flags; and the way from a bio to its cgroup.
#[test]
fn running_kernel_bio_layout() {
    let btf = KernelBtf::read(Path::new("/sys/kernel/btf/vmlinux")).unwrap();
    let layout = bio_layout(&btf).unwrap();
    assert_eq!(layout[bio::ENABLED], 1);
    assert_eq!(
        (layout[bio::QUEUE_ARG], layout[bio::COMPLETE_ARG]),
        (0, 1),
        "{layout:?}"
    );
    assert_ne!(layout[bio::BDEV], rq::ABSENT);
    assert_ne!(layout[bio::BD_DEV], rq::ABSENT);
    assert_eq!(layout[bio::DISK], rq::ABSENT, "6.x bios have no bi_disk");
    assert_eq!(layout[bio::SECTOR], rq::ABSENT);
    assert_eq!(
        btf.enum_value("BIO_TRACE_COMPLETION"),
        Some(i64::from(layout[bio::BIT_TRACE_COMPLETION]))
    );
    assert!(layout[bio::BIT_TRACE_COMPLETION] < 16);
    assert!(layout[bio::OPF] > 0 && layout[bio::OPF] < 64);
    assert!(layout[bio::FLAGS] > layout[bio::OPF]);
    assert_eq!(layout[bio::BI_NEXT], 0, "bio.bi_next is the first member");
    assert!(layout[bio::BI_SIZE] > layout[bio::FLAGS] && layout[bio::BI_SIZE] < 64);
    assert_ne!(layout[bio::RQ_BIO], rq::ABSENT);
    // Debian builds with CONFIG_BLK_CGROUP: the chain to the cgroup's id.
    for slot in [
        bio::BLKG,
        bio::BLKG_BLKCG,
        bio::BLKCG_CGROUP,
        bio::CGROUP_KN,
        bio::KN_ID,
    ] {
        assert_ne!(layout[slot], rq::ABSENT, "slot {slot}: {layout:?}");
        assert!(layout[slot] < 4096, "slot {slot}: {layout:?}");
    }
}
