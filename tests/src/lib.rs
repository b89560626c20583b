//! Real-kernel test harness for volume-health.
//!
//! Real storage errors without device-mapper or fault injection: the `faultdisk` binary
//! (src/bin/faultdisk/) serves a disk image over FUSE and fails chosen requests with
//! chosen errnos; a loop device with direct I/O over that image turns them into genuine
//! block-layer errors, with every tracepoint firing as on hardware.
//!
//! ```no_run
//! use health_tests::{fs, FaultDisk, Op, Rule};
//! # fn main() -> anyhow::Result<()> {
//! health_tests::require_root()?;
//! let disk = FaultDisk::start(64 << 20)?;
//! let lo = disk.attach_loop(false)?;
//! disk.add_rule(Rule::new(Op::Write, libc::EIO).range(1 << 20, 4096))?;
//! let err = fs::o_direct_write(lo.path(), 1 << 20, &[0u8; 4096]).unwrap_err();
//! assert_eq!(err.raw_os_error(), Some(libc::EIO));
//! assert_eq!(disk.stats()?.injected(Op::Write, libc::EIO), 1);
//! # Ok(()) }
//! ```
//!
//! Requirements: root, and the tools losetup, mount (package `mount`), sfdisk (`fdisk`),
//! mkfs.ext4 (`e2fsprogs`), mkfs.xfs (`xfsprogs`), mkfs.btrfs (`btrfs-progs`),
//! blkdiscard (`util-linux`). Missing ones make the helpers fail with the package name.
//! fusermount3 is not needed: the server mounts with mount(2) as root and the client
//! unmounts with umount2(2).
//!
//! [`apiserver::FakeApiServer`], a fake kube-apiserver for cluster mode, needs neither
//! root nor tools. [`envtest::RealApiServer`] runs the real kube-apiserver and etcd
//! (from `HEALTH_K8S_ASSETS`) for what a cluster decides: validation, RBAC;
//! [`controller`] runs `health-controller` against it.

pub mod agent;
pub mod apiserver;
pub mod audit;
pub mod bpffs;
pub mod cgroup;
pub mod cmd;
pub mod controller;
/// The project's CSI driver (loop devices over stretches of files) and its client.
pub mod csi_driver;
pub mod devices;
pub mod envtest;
pub mod faultdisk;
pub mod fs;
pub mod hung_fuse;
pub mod iscsi;
pub mod k8s_tools;
pub mod kubelet;
pub mod kubelet_tree;
pub mod manifests;
pub mod mount_ns;
pub mod nfs_server;
pub mod node_cluster;
pub mod nvmet;
pub mod program_runs;
pub mod protocol;
pub mod qemu;
pub mod real_cluster;
pub mod server_tools;
pub mod smb_server;
pub mod stacks;
pub mod sys;
pub mod vm_report;

use std::sync::{Mutex, MutexGuard, PoisonError};

pub use apiserver::{FakeApiServer, Mode, Recorded};
pub use envtest::{require_api_server, RealApiServer};
pub use faultdisk::{FaultDisk, LoopDevice, LoopOptions, Partition};
pub use fs::{
    drop_caches, file_extents, mkfs_btrfs, mkfs_ext4, mkfs_xfs, o_direct_read, o_direct_write,
    partition, sync_fs, xfs_fail_fast, Extent, Mount,
};
pub use hung_fuse::HungFuse;
pub use protocol::{ByteRange, Injection, Op, Rule, ServerInfo, Stats, TracedRequest};
pub use sys::{require_root, BlockStat, MountInfo};

/// Real-kernel tests run one at a time. Two reasons, both
/// measured: while any BPF tracing program runs on a CPU, an interrupt there
/// that fails a request skips the tracefs programs on `block_rq_error` (a
/// flood, or `block_rq_complete` attached for all completions, keeps
/// programs busy on every core); and agents of tests running side by side
/// attach and detach their own programs on the same tracepoints, during
/// which the kernel was seen not to run a running agent's program at all
/// (8 of 16 failed writes of one test never reached its program, with no
/// recursion miss counted). In production one agent runs per node.
/// The real-kernel suites are modules of one binary (tests/tests/host/, and
/// tests/tests/guest/ in the guests), so a lock per process covers them
/// all.
static KERNEL: Mutex<()> = Mutex::new(());

/// A test's hold on the kernel's error path; released on drop.
#[must_use = "the hold ends when this is dropped"]
pub struct KernelUse(#[allow(dead_code)] MutexGuard<'static, ()>);

/// For a test that asserts exact counts (the same hold as
/// [`kernel_alone`]; the name says what the test does).
pub fn shared_kernel() -> KernelUse {
    kernel_alone()
}

/// For a test that floods the kernel with errors: runs alone.
pub fn kernel_alone() -> KernelUse {
    KernelUse(KERNEL.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Tools the fault-disk tests need, checked up front so a missing one fails with its
/// Debian package named instead of halfway through a test.
pub const BASE_TOOLS: &[&str] = &["losetup", "mount", "sfdisk", "mkfs.ext4", "blkdiscard"];

/// Root plus every tool in [`BASE_TOOLS`] and `extra` (e.g. `&["mkfs.xfs"]`).
pub fn require_env(extra: &[&str]) -> anyhow::Result<()> {
    require_root()?;
    let mut tools: Vec<&str> = BASE_TOOLS.to_vec();
    tools.extend_from_slice(extra);
    cmd::require_tools(&tools)
}

/// The tokio runtime of a plain `#[test]` driving kube clients: two workers,
/// so a test can race two writers (`tokio::join!`) for real.
pub fn multi_thread_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context as _;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the test's tokio runtime")
}
