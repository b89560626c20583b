//! Real-kernel tests of the fault-disk harness itself (no agent involved).
//!
//! They need root and the tools in `health_tests::BASE_TOOLS` (+ mkfs.xfs, mkfs.btrfs)
//! and FAIL, never skip, without them. Each test has its own disk, so they run in
//! parallel.

use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use health_tests::protocol::mono_ns;
use health_tests::{cmd, fs, sys, FaultDisk, LoopDevice, Op, Rule};

const MIB: u64 = 1 << 20;

fn start(size: u64) -> Result<FaultDisk> {
    health_tests::require_env(&["mkfs.xfs", "mkfs.btrfs"])?;
    FaultDisk::start_with(Path::new(env!("CARGO_BIN_EXE_faultdisk")), size)
}

fn errno(res: &io::Result<impl Sized>) -> Option<i32> {
    res.as_ref().err().and_then(|e| e.raw_os_error())
}

#[test]
fn o_direct_write_into_failing_range_is_eio_counted_once() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let disk = start(64 * MIB)?;
    let lo = disk.attach_loop(false)?;
    disk.add_rule(Rule::new(Op::Write, libc::EIO).range(MIB, 4096))?;

    let before = mono_ns();
    let res = fs::o_direct_write(lo.path(), MIB, &[0xab; 4096]);
    let after = mono_ns();
    ensure!(errno(&res) == Some(libc::EIO), "expected EIO, got {res:?}");

    // Writes next to the range succeed and are not counted.
    fs::o_direct_write(lo.path(), MIB - 4096, &[1; 4096]).context("write before range")?;
    fs::o_direct_write(lo.path(), MIB + 4096, &[2; 4096]).context("write after range")?;

    let stats = disk.stats()?;
    assert_eq!(stats.total_injected, 1, "{stats:?}");
    assert_eq!(stats.injected(Op::Write, libc::EIO), 1, "{stats:?}");
    assert_eq!(stats.injected_op(Op::Read), 0, "{stats:?}");
    assert_eq!(stats.requests.write, 3, "{stats:?}");

    let log = disk.injections()?;
    assert_eq!(log.len(), 1, "{log:?}");
    let inj = &log[0];
    assert_eq!(
        (inj.op, inj.offset, inj.len, inj.errno),
        (Op::Write, MIB, 4096, libc::EIO)
    );
    assert!(
        before <= inj.mono_ns && inj.mono_ns <= after,
        "answer time {} outside the syscall [{before}, {after}]",
        inj.mono_ns
    );
    eprintln!(
        "timing: syscall start -> FUSE error answer {} us, answer -> syscall return {} us",
        (inj.mono_ns - before) / 1000,
        (after - inj.mono_ns) / 1000
    );
    Ok(())
}

#[test]
fn errno_passes_through_to_o_direct_callers() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let disk = start(16 * MIB)?;
    let lo = disk.attach_loop(false)?;
    // (errno answered by FUSE, errno the O_DIRECT caller sees), per the measured table in
    // shared/notes/real-io-errors.md.
    let cases = [
        (libc::EIO, libc::EIO),
        (libc::ENOSPC, libc::ENOSPC),
        (libc::ETIMEDOUT, libc::ETIMEDOUT),
        (libc::ENODATA, libc::ENODATA),
        (libc::ENOLINK, libc::ENOLINK),
        (libc::EILSEQ, libc::EILSEQ),
        (libc::EOPNOTSUPP, libc::EOPNOTSUPP),
        (libc::EAGAIN, libc::EAGAIN),
        (libc::ENOMEM, libc::ENOMEM),
        (libc::EINVAL, libc::EINVAL),
        (libc::EPERM, libc::EIO),
        (libc::EACCES, libc::EIO),
        (libc::EROFS, libc::EIO),
        (libc::EDQUOT, libc::EIO),
        (libc::EINTR, libc::EIO),
    ];
    let mut mismatches = Vec::new();
    for (i, &(injected, seen)) in cases.iter().enumerate() {
        let off = i as u64 * 8192;
        disk.add_rule(Rule::new(Op::Write, injected).range(off, 4096).limit(1))?;
        disk.add_rule(Rule::new(Op::Read, injected).range(off, 4096).limit(1))?;
        let w = fs::o_direct_write(lo.path(), off, &[7; 4096]);
        let r = fs::o_direct_read(lo.path(), off, 4096);
        if errno(&w) != Some(seen) || errno(&r) != Some(seen) {
            mismatches.push(format!(
                "injected {injected}: write {w:?}, read {:?}, expected errno {seen}",
                r.map(|v| v.len())
            ));
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:#?}");

    let stats = disk.stats()?;
    assert_eq!(stats.total_injected, 2 * cases.len() as u64, "{stats:?}");
    for &(injected, _) in &cases {
        assert_eq!(stats.injected(Op::Write, injected), 1, "write {injected}");
        assert_eq!(stats.injected(Op::Read, injected), 1, "read {injected}");
    }
    // Every rule had limit 1: the same I/O now succeeds.
    fs::o_direct_write(lo.path(), 0, &[7; 4096]).context("write after limits used up")?;
    Ok(())
}

#[test]
fn reads_outside_the_range_succeed_and_are_not_counted() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let disk = start(32 * MIB)?;
    let lo = disk.attach_loop(false)?;
    let bad = 8 * MIB;
    disk.add_rule(Rule::new(Op::Read, libc::EIO).range(bad, 64 * 1024))?;

    for off in [0, bad - 4096, bad + 64 * 1024, 31 * MIB] {
        let data = fs::o_direct_read(lo.path(), off, 4096)
            .with_context(|| format!("read at {off} outside the range"))?;
        assert_eq!(data.len(), 4096);
    }
    let stats = disk.stats()?;
    assert_eq!(stats.total_injected, 0, "{stats:?}");
    assert_eq!(stats.requests.read, 4, "{stats:?}");

    // Last byte of the range and a read straddling its start both fail.
    let r1 = fs::o_direct_read(lo.path(), bad + 60 * 1024, 4096);
    let r2 = fs::o_direct_read(lo.path(), bad - 4096, 8192);
    assert_eq!(errno(&r1), Some(libc::EIO));
    assert_eq!(errno(&r2), Some(libc::EIO));
    let stats = disk.stats()?;
    assert_eq!(stats.injected(Op::Read, libc::EIO), 2, "{stats:?}");
    assert_eq!(stats.requests.read, 6, "{stats:?}");
    Ok(())
}

#[test]
fn limit_fails_at_most_n_times_and_rules_can_be_cleared() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let disk = start(16 * MIB)?;
    let lo = disk.attach_loop(false)?;
    disk.add_rule(Rule::new(Op::Write, libc::ENOSPC).limit(2))?;

    let results: Vec<Option<i32>> = (0..4u64)
        .map(|i| errno(&fs::o_direct_write(lo.path(), i * 4096, &[3; 4096])))
        .collect();
    assert_eq!(
        results,
        vec![Some(libc::ENOSPC), Some(libc::ENOSPC), None, None]
    );
    let stats = disk.stats()?;
    assert_eq!(stats.injected(Op::Write, libc::ENOSPC), 2, "{stats:?}");
    let log = disk.injections()?;
    let offsets: Vec<u64> = log.iter().map(|i| i.offset).collect();
    assert_eq!(offsets, vec![0, 4096]);

    // Delay applies to every request.
    disk.set_delay(Duration::from_millis(50))?;
    let t = std::time::Instant::now();
    fs::o_direct_read(lo.path(), 0, 4096)?;
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(50),
        "delayed read took {took:?}"
    );
    disk.set_delay(Duration::ZERO)?;

    // An everything-rule, cleared: I/O works again, counters keep the history.
    disk.add_rule(Rule::new(Op::Any, libc::EIO))?;
    assert_eq!(
        errno(&fs::o_direct_read(lo.path(), 0, 4096)),
        Some(libc::EIO)
    );
    disk.clear_rules()?;
    fs::o_direct_read(lo.path(), 0, 4096).context("read after clear_rules")?;
    assert_eq!(disk.stats()?.total_injected, 3);

    disk.reset_stats()?;
    let stats = disk.stats()?;
    assert_eq!((stats.total_injected, stats.requests.read), (0, 0));
    // Sequence numbers go on after a reset.
    disk.add_rule(Rule::new(Op::Read, libc::EIO).limit(1))?;
    let _ = fs::o_direct_read(lo.path(), 0, 4096);
    let log = disk.injections()?;
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].seq, 3);
    // Bad rules are refused with a reason.
    let err = disk
        .add_rule(Rule::new(Op::Read, 600))
        .expect_err("errno 600 must be refused");
    assert!(format!("{err:#}").contains("out of range"), "{err:#}");
    Ok(())
}

#[test]
fn discard_and_flush_rules_are_counted() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let disk = start(32 * MIB)?;
    let lo = disk.attach_loop(false)?;
    let dev = lo.path().to_string_lossy().into_owned();
    disk.add_rule(Rule::new(Op::Discard, libc::ENOSPC).range(4 * MIB, MIB))?;

    // -f: no signature probing (which would read the device first).
    let ok = cmd::run(
        "blkdiscard",
        &["-f", "-o", "0", "-l", &MIB.to_string(), dev.as_str()],
    );
    ok.context("discard outside the range")?;
    let err = cmd::run(
        "blkdiscard",
        &[
            "-f",
            "-o",
            &(4 * MIB).to_string(),
            "-l",
            &MIB.to_string(),
            dev.as_str(),
        ],
    )
    .expect_err("discard in the failing range must fail");
    // The loop driver turns any fallocate error but EINVAL/EOPNOTSUPP into EIO.
    assert!(format!("{err:#}").contains("Input/output error"), "{err:#}");
    let stats = disk.stats()?;
    assert_eq!(stats.injected(Op::Discard, libc::ENOSPC), 1, "{stats:?}");
    assert_eq!(stats.total_injected, 1);
    assert_eq!(stats.requests.discard, 2, "{stats:?}");
    let log = disk.injections()?;
    assert_eq!(log.len(), 1);
    assert_eq!((log[0].offset, log[0].len), (4 * MIB, MIB));
    assert_eq!(
        log[0].mode,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
    );

    // A failed flush: fsync of the block device sends a loop FLUSH (FUSE_FSYNC).
    disk.add_rule(Rule::new(Op::Flush, libc::EIO).limit(1))?;
    fs::o_direct_write(lo.path(), 0, &[9; 4096])?;
    let f = std::fs::OpenOptions::new().write(true).open(lo.path())?;
    let res = f.sync_all();
    assert_eq!(errno(&res), Some(libc::EIO), "fsync: {res:?}");
    f.sync_all().context("second fsync, rule used up")?;
    let stats = disk.stats()?;
    assert_eq!(stats.injected(Op::Flush, libc::EIO), 1, "{stats:?}");
    assert_eq!(stats.total_injected, 2);
    Ok(())
}

fn assert_nothing_left(image: &Path, loop_name: &str, maj_min: &str, mount_dir: &Path) {
    let mounts = sys::mountinfo().expect("mountinfo");
    let dev = format!("/dev/{loop_name}");
    let left: Vec<_> = mounts
        .iter()
        .filter(|m| m.maj_min == maj_min || m.source == dev || m.mount_point == mount_dir)
        .collect();
    assert!(left.is_empty(), "mounts left behind: {left:#?}");
    let by_sysfs = sys::loops_backed_by(image).expect("scan loops");
    assert!(by_sysfs.is_empty(), "loop devices left: {by_sysfs:?}");
    let out =
        cmd::run("losetup", &[std::ffi::OsStr::new("-j"), image.as_os_str()]).expect("losetup -j");
    assert_eq!(out.stdout.trim(), "", "losetup -j {}", image.display());
}

#[test]
fn vanish_fails_all_io_and_drop_still_cleans_up() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let disk = start(64 * MIB)?;
    let lo = disk.attach_loop(false)?;
    fs::mkfs_ext4(lo.path())?;
    let mnt = fs::Mount::new(lo.path(), "ext4", "errors=remount-ro")?;
    std::fs::write(mnt.path().join("before"), b"data")?;
    fs::sync_fs(mnt.path())?;

    let image = disk.image_path().to_path_buf();
    let mount_dir = disk.mount_dir().to_path_buf();
    let work_dir = disk.work_dir().to_path_buf();
    let (name, maj_min) = (lo.name().to_string(), lo.maj_min().to_string());
    let pid = disk.server_pid();

    disk.vanish()?;
    assert!(disk.has_vanished());
    let r = fs::o_direct_read(lo.path(), 0, 4096);
    assert_eq!(errno(&r), Some(libc::EIO), "read after vanish: {r:?}");
    let w = fs::o_direct_write(lo.path(), MIB, &[1; 4096]);
    assert_eq!(errno(&w), Some(libc::EIO), "write after vanish: {w:?}");
    assert!(disk.stats().is_err(), "stats must fail once vanished");

    // Worst order: the disk goes first while the mount and loop guards are still alive.
    drop(disk);
    assert_nothing_left(&image, &name, &maj_min, &mount_dir);
    assert!(!work_dir.exists(), "work dir {} left", work_dir.display());
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "server {pid} still running"
    );
    // Dropping the guards afterwards is harmless.
    drop(mnt);
    drop(lo);
    Ok(())
}

#[test]
fn ext4_file_on_partition_fails_exactly_where_fiemap_says() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let disk = start(128 * MIB)?;
    let lo = disk.attach_loop(true)?;
    let parts = fs::partition(&lo, &[48 * MIB, 0])?;
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0].name, format!("{}p1", lo.name()));
    assert_eq!(parts[0].start_bytes, MIB); // sfdisk's 1 MiB alignment
    assert_eq!(parts[0].size_bytes, 48 * MIB);
    assert_eq!(parts[1].start_bytes, 49 * MIB);
    assert_eq!(
        sys::block_maj_min(&parts[1].name)?,
        parts[1].maj_min,
        "partition device number"
    );

    let part = &parts[1];
    fs::mkfs_ext4(&part.path)?;
    let mut mnt = fs::Mount::new(&part.path, "ext4", "errors=remount-ro")?;
    let dir = mnt.path().join("dir");
    std::fs::create_dir(&dir)?;
    for i in 0..40 {
        std::fs::write(dir.join(format!("file-{i:03}")), b"x")?;
    }
    let victim = mnt.path().join("victim");
    let bystander = mnt.path().join("bystander");
    let payload: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    std::fs::write(&victim, &payload)?;
    std::fs::write(&bystander, &payload)?;
    std::fs::File::open(&victim)?.sync_all()?;
    std::fs::File::open(&bystander)?.sync_all()?;

    let extents = fs::file_extents(&victim)?;
    // A fresh filesystem places a 64 KiB file in one extent.
    assert_eq!(extents.len(), 1, "{extents:?}");
    assert!(extents.iter().all(|e| e.is_mapped()), "{extents:?}");
    assert_eq!(extents.iter().map(|e| e.len).sum::<u64>(), 64 * 1024);
    let ranges: Vec<(u64, u64)> = extents
        .iter()
        .map(|e| (e.disk_offset(part.start_bytes), e.len))
        .collect();

    // The file's bytes as the disk image holds them, read through the whole loop device.
    for (&(off, len), e) in ranges.iter().zip(&extents) {
        let raw = fs::o_direct_read(lo.path(), off, len as usize)?;
        let want = &payload[e.logical as usize..(e.logical + len) as usize];
        assert!(raw == want, "disk bytes at {off} differ from the file");
    }

    disk.reset_stats()?;
    for &(off, len) in &ranges {
        disk.add_rule(Rule::new(Op::Read, libc::EIO).range(off, len))?;
    }
    fs::drop_caches()?;
    let res = std::fs::read(&victim);
    assert_eq!(errno(&res), Some(libc::EIO), "cold read of victim: {res:?}");
    // The other file (and the metadata needed to find both) read fine.
    assert_eq!(std::fs::read(&bystander)?, payload);

    let stats = disk.stats()?;
    let log = disk.injections()?;
    eprintln!(
        "cold buffered read of a 64 KiB file: {} failed FUSE reads: {:?}",
        log.len(),
        log.iter().map(|i| (i.offset, i.len)).collect::<Vec<_>>()
    );
    // Readahead of the whole file fails, then the page-sized retry of the first page.
    let (off, _) = ranges[0];
    let got: Vec<(u64, u64)> = log.iter().map(|i| (i.offset, i.len)).collect();
    assert_eq!(got, vec![(off, 64 * 1024), (off, 4096)]);
    assert_eq!(stats.injected(Op::Read, libc::EIO), 2, "{stats:?}");
    assert_eq!(stats.total_injected, 2, "{stats:?}");

    // Metadata: the directory block stays pinned in memory through drop_caches; after a
    // remount its read goes to the disk and fails.
    disk.clear_rules()?;
    let dir_ext = fs::file_extents(&dir)?;
    assert_eq!(dir_ext.len(), 1, "{dir_ext:?}");
    mnt.cycle()?;
    let dir_off = dir_ext[0].disk_offset(part.start_bytes);
    disk.add_rule(Rule::new(Op::Read, libc::EIO).range(dir_off, dir_ext[0].len))?;
    let listing = std::fs::read_dir(&dir).and_then(|it| it.collect::<io::Result<Vec<_>>>());
    assert_eq!(
        listing.as_ref().err().and_then(|e| e.raw_os_error()),
        Some(libc::EIO),
        "listing after remount: {:?}",
        listing.map(|l| l.len())
    );
    let info = mnt.info()?;
    eprintln!(
        "after the directory read error: mount options {}, super options {}",
        info.mount_options, info.super_options
    );
    assert!(disk.stats()?.injected(Op::Read, libc::EIO) >= 3);
    Ok(())
}

#[test]
fn xfs_and_btrfs_helpers_work_on_a_fault_disk() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let disk = start(320 * MIB)?;
    let lo = disk.attach_loop(false)?;

    fs::mkfs_xfs(lo.path())?;
    {
        let mnt = fs::Mount::new(lo.path(), "xfs", "")?;
        fs::xfs_fail_fast(lo.name())?;
        let p = format!("/sys/fs/xfs/{}/error/metadata/EIO/max_retries", lo.name());
        assert_eq!(sys::read_sysfs(&p)?, "0");
        let info = mnt.info()?;
        assert_eq!(
            (info.fstype.as_str(), info.maj_min.as_str()),
            ("xfs", lo.maj_min())
        );
        std::fs::write(mnt.path().join("f"), vec![1u8; 8192])?;
        let ext = fs::file_extents(&mnt.path().join("f"))?;
        assert_eq!(ext.iter().map(|e| e.len).sum::<u64>(), 8192);
        mnt.unmount()?;
    }

    fs::mkfs_btrfs(lo.path())?;
    let mnt = fs::Mount::new(lo.path(), "btrfs", "")?;
    let info = mnt.info()?;
    assert_eq!(info.fstype, "btrfs");
    // btrfs reports an anonymous device number; the source still names the loop device.
    assert_eq!(info.source, lo.path().to_string_lossy());
    assert!(info.maj_min.starts_with("0:"), "{info:?}");
    // Left mounted on purpose: the loop device's Drop must unmount it by source.
    drop(lo);
    assert!(
        sys::mount_at(mnt.path())?.is_none(),
        "btrfs still mounted after the loop device was dropped"
    );
    Ok(())
}

#[test]
fn one_loop_request_is_one_fuse_request() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let disk = start(64 * MIB)?;
    let lo = disk.attach_loop(false)?;
    let fit = LoopDevice::fuse_fit_kb(disk.info().max_request_bytes);
    assert_eq!(lo.max_sectors_kb()?, fit, "loop max_sectors_kb not lowered");
    let dev = lo.path().to_string_lossy().into_owned();

    let before = lo.stat()?;
    fs::o_direct_write(lo.path(), 0, &vec![5u8; 8 * MIB as usize])?;
    fs::o_direct_read(lo.path(), 0, 8 * MIB as usize)?;
    cmd::run(
        "blkdiscard",
        &["-f", "-o", "0", "-l", &(8 * MIB).to_string(), dev.as_str()],
    )?;
    // Buffered I/O too: the block device's page cache writes back in its own sizes when
    // the last opener closes it. (No fsync here: blkdev_issue_flush sends an empty
    // PREFLUSH write, which /sys/block/*/stat counts as a write but never reaches FUSE
    // as one; the flush itself arrives as FSYNC.)
    // (OpenOptions without create: never make a regular file if the node were gone.)
    std::fs::OpenOptions::new()
        .write(true)
        .open(lo.path())?
        .write_all(&vec![6u8; 4 * MIB as usize])?;
    let after = lo.stat()?;
    let stats = disk.stats()?;

    let loop_reads = after.reads - before.reads;
    let loop_writes = after.writes - before.writes;
    let loop_discards = after.discards - before.discards;
    eprintln!(
        "loop requests r/w/d {loop_reads}/{loop_writes}/{loop_discards}, FUSE requests \
         {}/{}/{}, largest FUSE read {} write {} discard {}",
        stats.requests.read,
        stats.requests.write,
        stats.requests.discard,
        stats.max_len.read,
        stats.max_len.write,
        stats.max_len.discard
    );
    assert_eq!(stats.requests.read, loop_reads, "{stats:?}");
    assert_eq!(stats.requests.write, loop_writes, "{stats:?}");
    assert_eq!(
        stats.bytes.write,
        (after.write_sectors - before.write_sectors) * 512
    );
    assert_eq!(stats.requests.discard, loop_discards, "{stats:?}");
    assert!(stats.max_len.read <= u64::from(fit) * 1024);
    assert!(stats.max_len.write <= u64::from(fit) * 1024);
    Ok(())
}

#[test]
fn orphaned_server_cleans_up_after_its_client_dies() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    health_tests::require_env(&[])?;
    let exe = env!("CARGO_BIN_EXE_orphan-client");
    let out = std::process::Command::new(exe)
        .env("FAULTDISK_BIN", env!("CARGO_BIN_EXE_faultdisk"))
        .output()
        .with_context(|| format!("running {exe}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("ORPHAN ").map(|(_, rest)| rest))
        .with_context(|| {
            format!(
                "helper printed no ORPHAN line ({}): {stdout} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    assert!(!out.status.success(), "the helper must have aborted");
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f.len(), 6, "{line}");
    let (pid, name, maj_min) = (f[0], f[1], f[2]);
    let (image, mount_dir, work_dir) = (Path::new(f[3]), Path::new(f[4]), Path::new(f[5]));

    let proc_dir = format!("/proc/{pid}");
    let gone = sys::wait_for(Duration::from_secs(20), Duration::from_millis(50), || {
        !Path::new(&proc_dir).exists()
    });
    assert!(gone, "orphaned server {pid} still running");
    assert_nothing_left(image, name, maj_min, mount_dir);
    assert!(!work_dir.exists(), "work dir {} left", work_dir.display());
    Ok(())
}

/// `--no-stdin` (a daemon's stdin is /dev/null): the server stays up past stdin's EOF,
/// and SIGTERM makes it clean up what its client left (a mounted filesystem on a loop
/// device over its image, the loop device, its own mount, the work dir) and exit 0.
#[test]
fn daemon_ignores_stdin_and_cleans_up_on_sigterm() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    health_tests::require_env(&[])?;
    let work = tempfile::Builder::new().prefix("faultdisk-").tempdir()?;
    let work_dir = work.path().to_path_buf();
    let mut child = Command::new(env!("CARGO_BIN_EXE_faultdisk"))
        .arg("--dir")
        .arg(&work_dir)
        .args(["--size", &(64 * MIB).to_string(), "--no-stdin"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting faultdisk --no-stdin")?;
    let mut line = String::new();
    io::BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let info: health_tests::protocol::ServerInfo = serde_json::from_str(
        line.trim_end()
            .strip_prefix("ready ")
            .with_context(|| format!("no ready line: {line:?}"))?,
    )?;
    // Without --no-stdin, /dev/null's EOF would have ended it by now.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(child.try_wait()?, None, "the daemon exited at stdin's EOF");

    let dev = cmd::run(
        "losetup",
        &["-f", "--show", "--direct-io=on", &info.image_path],
    )?;
    let dev = dev.stdout.trim().to_string();
    let name = dev.trim_start_matches("/dev/").to_string();
    let maj_min = sys::block_maj_min(&name)?;
    fs::mkfs_ext4(Path::new(&dev))?;
    let mnt = tempfile::tempdir()?;
    cmd::run("mount", &[dev.as_str(), &mnt.path().to_string_lossy()])?;
    std::fs::write(mnt.path().join("data"), b"kept until SIGTERM")?;

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    let mut status = None;
    let exited = sys::wait_for(Duration::from_secs(20), Duration::from_millis(50), || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(exited, "the daemon did not exit within 20 s of SIGTERM");
    assert!(
        status.is_some_and(|s| s.success()),
        "exit status {status:?}"
    );
    assert_nothing_left(
        Path::new(&info.image_path),
        &name,
        &maj_min,
        Path::new(&info.mount_dir),
    );
    assert!(
        sys::mount_at(mnt.path())?.is_none(),
        "ext4 still mounted at {}",
        mnt.path().display()
    );
    assert!(!work_dir.exists(), "work dir {} left", work_dir.display());
    Ok(())
}
