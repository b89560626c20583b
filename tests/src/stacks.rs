//! Storage stacks with a state of their own, for the VM suite
//! tests/guest/storage_stacks.rs: dm-multipath over two scsi_debug paths to one
//! LUN, md raid1 arrays whose members are failed, removed and added back,
//! and dm-thin pools that fill up, queue writes and grow.
//!
//! Like [`crate::devices`], nothing here skips: a missing module or tool is
//! an error naming it, and every handle tears its devices down on drop
//! (fields are declared upper layer first, so they drop top down).
//! device-mapper's udev synchronisation does not work in the guests
//! (`dmsetup create` would wait for it forever): dm devices are made with
//! `--noudevsync` and their nodes with `dmsetup mknodes` ([`DmDevice`] does
//! both).

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::cmd;
use crate::devices::{self, BlockDev, DmDevice, MdArray, TmpfsLoop, SCSI_DEBUG_SYSFS};
use crate::sys;

// ---------------------------------------------------------------------------------------
// scsi_debug with several hosts: several paths to one LUN

/// scsi_debug loaded with `add_host=N vpd_use_hostno=0`: one sd disk per
/// host, all reporting the same LUN identity (the same wwid), as the paths
/// of a multipathed SAN LUN do. Every host has its own store unless
/// `per_host_store=1`, which these tests never set: with the shared store,
/// what is written over one path is read back over the other. Unloaded on
/// drop.
pub struct ScsiDebugPaths {
    /// One disk per host, in host order.
    pub disks: Vec<BlockDev>,
}

impl ScsiDebugPaths {
    /// Loads scsi_debug with `hosts` hosts (one target, one LUN each) and
    /// the extra `params`, and waits for every host's disk.
    pub fn load(hosts: usize, params: &[&str]) -> Result<ScsiDebugPaths> {
        if devices::module_loaded("scsi_debug") {
            bail!("scsi_debug is already loaded: another test's disk is still there");
        }
        devices::modprobe("sd_mod", &[])?;
        let add_host = format!("add_host={hosts}");
        let mut all = vec![
            add_host.as_str(),
            "vpd_use_hostno=0",
            "num_tgts=1",
            "max_luns=1",
        ];
        all.extend_from_slice(params);
        devices::modprobe("scsi_debug", &all)?;
        // From here on, drop unloads the module whatever happens.
        let mut me = ScsiDebugPaths { disks: Vec::new() };
        let mut names = Vec::new();
        let found = sys::wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
            names = scsi_debug_disks();
            names.len() >= hosts
        });
        if !found {
            bail!(
                "scsi_debug loaded ({all:?}) but {} of {hosts} sd disks appeared within 30 s: {names:?}",
                names.len()
            );
        }
        for n in &names {
            me.disks.push(BlockDev::of(n)?);
        }
        let wwids: Vec<String> = me
            .disks
            .iter()
            .map(|d| sys::read_sysfs(format!("/sys/block/{}/device/wwid", d.name)))
            .collect::<Result<_>>()?;
        ensure!(
            wwids.windows(2).all(|w| w[0] == w[1]),
            "the scsi_debug disks are not paths to one LUN (vpd_use_hostno=0 ignored?): {wwids:?}"
        );
        Ok(me)
    }

    /// Writes a live module parameter (`opts`, `every_nth`, ...).
    pub fn set(&self, param: &str, value: &str) -> Result<()> {
        let p = Path::new(SCSI_DEBUG_SYSFS).join(param);
        std::fs::write(&p, value).with_context(|| format!("writing {value} to {}", p.display()))
    }
}

impl Drop for ScsiDebugPaths {
    fn drop(&mut self) {
        // A disk left offline keeps its queue: bring each back before the
        // module goes so that its removal does not wait on it.
        for d in &self.disks {
            let _ = set_scsi_state(d, "running");
        }
        if let Err(e) = devices::rmmod("scsi_debug") {
            eprintln!("ScsiDebugPaths cleanup: {e:#}");
        }
    }
}

/// Every sd disk of the scsi_debug hosts, in adapter order:
/// `adapterN/hostH/targetH:C:T/H:C:T:L/block/sdX`.
fn scsi_debug_disks() -> Vec<String> {
    let mut adapters: Vec<(u32, PathBuf)> = read_dir_names(Path::new(SCSI_DEBUG_SYSFS))
        .into_iter()
        .filter_map(|(name, path)| {
            name.strip_prefix("adapter")
                .and_then(|n| n.parse().ok())
                .map(|n| (n, path))
        })
        .collect();
    adapters.sort();
    let mut out = Vec::new();
    for (_, adapter) in adapters {
        for (h, host) in read_dir_names(&adapter) {
            if !h.starts_with("host") {
                continue;
            }
            for (t, target) in read_dir_names(&host) {
                if !t.starts_with("target") {
                    continue;
                }
                for (l, lun) in read_dir_names(&target) {
                    if !l.contains(':') {
                        continue;
                    }
                    out.extend(
                        read_dir_names(&lun.join("block"))
                            .into_iter()
                            .map(|(n, _)| n),
                    );
                }
            }
        }
    }
    out
}

fn read_dir_names(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    v.sort();
    v
}

/// A SCSI disk's `device/state` (`running`, `offline`, ...).
pub fn scsi_state(disk: &BlockDev) -> Result<String> {
    sys::read_sysfs(format!("/sys/block/{}/device/state", disk.name))
}

/// Sets a SCSI disk's `device/state`: `offline` makes the SCSI midlayer
/// reject every request at dispatch, as a dead link would after the
/// transport gave up on it; `running` takes it back.
pub fn set_scsi_state(disk: &BlockDev, state: &str) -> Result<()> {
    let p = format!("/sys/block/{}/device/state", disk.name);
    // The kernel takes a state only with its newline (6.1 answers EINVAL
    // to a bare `offline`).
    std::fs::write(&p, format!("{state}\n")).with_context(|| format!("writing {state} to {p}"))
}

// ---------------------------------------------------------------------------------------
// dm-multipath

/// One path as `dmsetup status` of a multipath device reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpathPath {
    /// `MAJ:MIN` of the path's disk.
    pub dev: String,
    /// `A` (active) or `F` (failed) in the status line.
    pub active: bool,
    /// dm-multipath's count of this path's failures.
    pub fail_count: u32,
}

/// The paths of a `multipath` status line (`dmsetup status` output, with or
/// without its `start length multipath` prefix), in table order: feature
/// and hardware handler words (each a count, then that many), the group
/// count and next group, then per group its state, the selector's status
/// words (a count, then that many), its path count and words per path, and
/// per path `MAJ:MIN A|F <fail count>` and the selector's words.
pub fn parse_multipath_status(line: &str) -> Result<Vec<MpathPath>> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let start = words
        .iter()
        .position(|w| *w == "multipath")
        .map_or(0, |i| i + 1);
    let mut c = Words {
        line,
        words: &words[start..],
        at: 0,
    };
    let features = c.num("the feature count")?;
    c.skip(features);
    let handler = c.num("the hardware handler count")?;
    c.skip(handler);
    let groups = c.num("the group count")?;
    c.num("the next group")?;
    let mut paths = Vec::new();
    for _ in 0..groups {
        c.word("a group's state")?;
        let selector_status = c.num("the selector's status count")?;
        c.skip(selector_status);
        let n = c.num("the path count")?;
        let per_path = c.num("the selector's words per path")?;
        for _ in 0..n {
            let dev = c.word("a path's device")?.to_string();
            let active = match c.word("a path's state")? {
                "A" => true,
                "F" => false,
                other => bail!("path {dev}: state {other:?} in {line:?}"),
            };
            let fail_count = c.num("a path's fail count")? as u32;
            c.skip(per_path);
            paths.push(MpathPath {
                dev,
                active,
                fail_count,
            });
        }
    }
    Ok(paths)
}

/// A cursor over a status line's words.
struct Words<'a> {
    line: &'a str,
    words: &'a [&'a str],
    at: usize,
}

impl<'a> Words<'a> {
    fn word(&mut self, what: &str) -> Result<&'a str> {
        let w = self
            .words
            .get(self.at)
            .with_context(|| format!("status {:?} ends before {what}", self.line))?;
        self.at += 1;
        Ok(w)
    }

    fn num(&mut self, what: &str) -> Result<usize> {
        let w = self.word(what)?;
        w.parse()
            .with_context(|| format!("{what} {w:?} in status {:?}", self.line))
    }

    fn skip(&mut self, n: usize) {
        self.at += n;
    }
}

/// A request-based dm-multipath device over every disk of a scsi_debug
/// load (one round-robin path group, no `queue_if_no_path`: with no path
/// left, I/O fails at once, as multipathd's `no_path_retry fail` does).
pub struct Multipath {
    // Fields drop in declaration order: the dm device before its paths.
    pub dm: DmDevice,
    pub paths: ScsiDebugPaths,
}

impl Multipath {
    /// `name` over a scsi_debug load of two hosts with `params`.
    pub fn over_scsi_debug(name: &str, params: &[&str]) -> Result<Multipath> {
        cmd::require_tools(&["dmsetup"]).context("install the Debian package `dmsetup`")?;
        devices::modprobe("dm-mod", &[])?;
        devices::modprobe("dm-multipath", &[])?;
        devices::modprobe("dm-round-robin", &[])?;
        let paths = ScsiDebugPaths::load(2, params)?;
        let sectors = paths.disks[0].sectors()?;
        // The selector's per-path argument is its repeat count; 1 sends
        // consecutive requests down alternate paths.
        let per_path: Vec<String> = paths
            .disks
            .iter()
            .map(|d| format!("{} 1", d.path.display()))
            .collect();
        let table = format!(
            "0 {sectors} multipath 0 0 1 1 round-robin 0 {} 1 {}",
            paths.disks.len(),
            per_path.join(" ")
        );
        let dm = DmDevice::create(name, &table)?;
        Ok(Multipath { dm, paths })
    }

    /// The `i`th path's disk.
    pub fn path(&self, i: usize) -> &BlockDev {
        &self.paths.disks[i]
    }

    /// `dmsetup status NAME`.
    pub fn status(&self) -> Result<String> {
        Ok(cmd::run("dmsetup", &["status", &self.dm.name])?
            .stdout
            .trim()
            .to_string())
    }

    /// The paths as dm-multipath reports them.
    pub fn path_states(&self) -> Result<Vec<MpathPath>> {
        parse_multipath_status(&self.status()?)
    }

    /// Takes the `i`th path's disk offline at the SCSI level.
    pub fn offline(&self, i: usize) -> Result<()> {
        set_scsi_state(self.path(i), "offline")
    }

    /// Brings the `i`th path's disk back and tells dm-multipath to use it
    /// again (multipathd's path checker would; none runs here).
    pub fn restore(&self, i: usize) -> Result<()> {
        set_scsi_state(self.path(i), "running")?;
        let msg = format!("reinstate_path {}", self.path(i).maj_min);
        cmd::run("dmsetup", &["message", &self.dm.name, "0", &msg])
            .with_context(|| format!("{msg} on {}", self.dm.name))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// md raid1

/// An md raid1 of loop devices over tmpfs files, whose members the tests
/// fail, remove and add back with mdadm.
pub struct Raid1 {
    // Fields drop in declaration order: the array before its members.
    pub md: MdArray,
    pub members: Vec<TmpfsLoop>,
}

impl Raid1 {
    /// A raid1 at `path` (`/dev/mdN`) of `n` members of `member_mb` MiB.
    pub fn new(path: &str, n: usize, member_mb: u64) -> Result<Raid1> {
        let members: Vec<TmpfsLoop> = (0..n)
            .map(|_| TmpfsLoop::new(member_mb))
            .collect::<Result<_>>()?;
        let paths: Vec<&Path> = members.iter().map(|m| m.dev.path.as_path()).collect();
        let md = MdArray::raid1(path, &paths, &[])?;
        Ok(Raid1 { md, members })
    }

    fn mdadm_member(&self, action: &str, i: usize) -> Result<()> {
        let md = self.md.dev.path.display().to_string();
        let member = self.members[i].dev.path.display().to_string();
        cmd::run("mdadm", &[md.as_str(), action, member.as_str()])
            .with_context(|| format!("mdadm {md} {action} {member}"))?;
        Ok(())
    }

    /// `mdadm --fail`: md stops using the member (as after a write error).
    pub fn fail(&self, i: usize) -> Result<()> {
        self.mdadm_member("--fail", i)
    }

    /// `mdadm --remove` of a failed member.
    pub fn remove(&self, i: usize) -> Result<()> {
        self.mdadm_member("--remove", i)
    }

    /// `mdadm --add`: the member comes back as a spare and md recovers onto
    /// it (a full copy: arrays this small get no write-intent bitmap).
    pub fn add(&self, i: usize) -> Result<()> {
        self.mdadm_member("--add", i)
    }

    /// `/sys/block/mdN/md/<attr>`.
    pub fn attr(&self, attr: &str) -> Result<String> {
        self.md.attr(attr)
    }

    /// The `i`th member's `dev-<name>/state`, or `None` once it is no
    /// member.
    pub fn member_state(&self, i: usize) -> Option<String> {
        self.attr(&format!("dev-{}/state", self.members[i].dev.name))
            .ok()
    }

    /// Caps the array's resync/recovery speed (KiB/s), or gives it back to
    /// the system's limit with `None`.
    pub fn set_sync_speed_max(&self, kib_per_s: Option<u64>) -> Result<()> {
        let v = kib_per_s.map_or_else(|| "system".to_string(), |k| k.to_string());
        let p = format!("/sys/block/{}/md/sync_speed_max", self.md.dev.name);
        std::fs::write(&p, &v).with_context(|| format!("writing {v} to {p}"))
    }

    /// The attributes the tests report, on one line.
    pub fn describe(&self) -> String {
        let a = |k: &str| self.attr(k).unwrap_or_else(|e| format!("<{e}>"));
        let members: Vec<String> = (0..self.members.len())
            .map(|i| {
                format!(
                    "{}={}",
                    self.members[i].dev.name,
                    self.member_state(i).as_deref().unwrap_or("(not a member)")
                )
            })
            .collect();
        format!(
            "array_state={} degraded={} sync_action={} sync_completed={} members: {}",
            a("array_state"),
            a("degraded"),
            a("sync_action"),
            a("sync_completed"),
            members.join(" ")
        )
    }
}

// ---------------------------------------------------------------------------------------
// dm-thin

/// What a thin pool is made of.
#[derive(Clone, Copy, Debug)]
pub struct ThinConfig {
    /// The pool's data size at creation.
    pub data_mb: u64,
    /// Room to grow the pool's data device to ([`ThinStack::grow`]).
    pub max_data_mb: u64,
    pub meta_mb: u64,
    /// Pool block size in 512-byte sectors (64 KiB to 1 GiB).
    pub block_sectors: u64,
    /// The thin volume's virtual size: larger than the data, as thin
    /// provisioning allows.
    pub thin_mb: u64,
    /// The pool fails writes it cannot place at once (ENOSPC) instead of
    /// queueing them.
    pub error_if_no_space: bool,
}

/// A thin pool's `dmsetup status` line.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolStatus {
    pub line: String,
    pub used_meta: u64,
    pub total_meta: u64,
    pub used_data: u64,
    pub total_data: u64,
    /// `rw`, `ro` or `out_of_data_space`; `Fail` for a failed pool.
    pub mode: String,
    /// `error_if_no_space` or `queue_if_no_space`.
    pub no_space: String,
    pub needs_check: bool,
}

impl PoolStatus {
    pub fn parse(line: &str) -> Result<PoolStatus> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let i = words
            .iter()
            .position(|w| *w == "thin-pool")
            .map_or(0, |i| i + 1);
        let w = &words[i..];
        if w.first() == Some(&"Fail") {
            return Ok(PoolStatus {
                line: line.to_string(),
                used_meta: 0,
                total_meta: 0,
                used_data: 0,
                total_data: 0,
                mode: "Fail".into(),
                no_space: String::new(),
                needs_check: false,
            });
        }
        ensure!(w.len() >= 8, "thin-pool status {line:?}: too short");
        let frac = |s: &str| -> Result<(u64, u64)> {
            let (a, b) = s
                .split_once('/')
                .with_context(|| format!("{s:?} in thin-pool status {line:?}"))?;
            Ok((a.parse()?, b.parse()?))
        };
        let (used_meta, total_meta) = frac(w[1])?;
        let (used_data, total_data) = frac(w[2])?;
        Ok(PoolStatus {
            line: line.to_string(),
            used_meta,
            total_meta,
            used_data,
            total_data,
            mode: w[4].to_string(),
            no_space: w[6].to_string(),
            needs_check: w[7] == "needs_check",
        })
    }

    pub fn data_percent(&self) -> f64 {
        if self.total_data == 0 {
            return 0.0;
        }
        self.used_data as f64 * 100.0 / self.total_data as f64
    }

    pub fn meta_percent(&self) -> f64 {
        if self.total_meta == 0 {
            return 0.0;
        }
        self.used_meta as f64 * 100.0 / self.total_meta as f64
    }
}

/// A thin volume in a thin pool, TopoLVM-like: metadata and data on loop
/// devices over tmpfs files, the data behind a dm-linear so that the pool
/// can be grown as `lvextend` grows a thin pool's data LV.
pub struct ThinStack {
    // Fields drop in declaration order: the thin volume, its pool, then
    // what the pool is made of.
    pub thin: DmDevice,
    pub pool: DmDevice,
    pub data: DmDevice,
    data_loop: TmpfsLoop,
    meta_loop: TmpfsLoop,
    /// Changed by [`ThinStack::grow`] and
    /// [`ThinStack::set_error_if_no_space`], which take `&self` so that a
    /// guard holding the stack can unblock queued writers.
    config: Cell<ThinConfig>,
}

impl ThinStack {
    /// `<prefix>-pool`, `<prefix>-data` and the thin volume `<prefix>-thin`
    /// (thin id 0).
    pub fn new(prefix: &str, config: ThinConfig) -> Result<ThinStack> {
        cmd::require_tools(&["dmsetup"]).context("install the Debian package `dmsetup`")?;
        devices::modprobe("dm-mod", &[])?;
        devices::modprobe("dm-thin-pool", &[])?;
        ensure!(config.max_data_mb >= config.data_mb, "{config:?}");
        // A new tmpfs file reads as zeros: the pool formats fresh metadata.
        let meta_loop = TmpfsLoop::new(config.meta_mb)?;
        let data_loop = TmpfsLoop::new(config.max_data_mb)?;
        let data = DmDevice::create(
            &format!("{prefix}-data"),
            &Self::linear(&data_loop.dev, config.data_mb),
        )?;
        let pool_name = format!("{prefix}-pool");
        let pool = DmDevice::create(
            &pool_name,
            &Self::pool_table(&meta_loop.dev, &data, config.data_mb, &config),
        )?;
        cmd::run("dmsetup", &["message", &pool_name, "0", "create_thin 0"])
            .context("create_thin 0 in the new pool")?;
        let thin = DmDevice::create(
            &format!("{prefix}-thin"),
            &format!(
                "0 {} thin {} 0",
                config.thin_mb * 2048,
                pool.mapper_path().display()
            ),
        )?;
        Ok(ThinStack {
            thin,
            pool,
            data,
            data_loop,
            meta_loop,
            config: Cell::new(config),
        })
    }

    fn linear(lower: &BlockDev, mb: u64) -> String {
        format!("0 {} linear {} 0", mb * 2048, lower.path.display())
    }

    /// The pool's table: its length is its data size (the kernel sizes the
    /// pool by the table, not by the data device).
    fn pool_table(meta: &BlockDev, data: &DmDevice, data_mb: u64, c: &ThinConfig) -> String {
        let features = if c.error_if_no_space {
            " 1 error_if_no_space"
        } else {
            " 0"
        };
        format!(
            "0 {} thin-pool {} {} {} 0{features}",
            data_mb * 2048,
            meta.path.display(),
            data.mapper_path().display(),
            c.block_sectors
        )
    }

    pub fn config(&self) -> ThinConfig {
        self.config.get()
    }

    /// The pool's block size in bytes.
    pub fn block_bytes(&self) -> u64 {
        self.config.get().block_sectors * 512
    }

    /// The pool's `dmsetup status` line, parsed.
    pub fn status(&self) -> Result<PoolStatus> {
        let out = cmd::run("dmsetup", &["status", &self.pool.name])?;
        PoolStatus::parse(out.stdout.trim())
    }

    /// Grows the pool's data to `data_mb` (at most `max_data_mb`): the data
    /// linear first, then the pool's table. Writes queued on a full pool
    /// go on when it resumes.
    pub fn grow(&self, data_mb: u64) -> Result<()> {
        let mut c = self.config.get();
        ensure!(
            data_mb <= c.max_data_mb,
            "{data_mb} MiB is beyond the data loop device"
        );
        self.data
            .replace_table(&Self::linear(&self.data_loop.dev, data_mb))?;
        c.data_mb = data_mb;
        self.config.set(c);
        self.reload_pool()
    }

    /// Switches the pool between queueing and failing writes it has no
    /// space for (a table reload, as `lvchange --errorwhenfull` does).
    /// Writes queued on a full pool fail with ENOSPC when it resumes in
    /// error mode.
    pub fn set_error_if_no_space(&self, on: bool) -> Result<()> {
        let mut c = self.config.get();
        c.error_if_no_space = on;
        self.config.set(c);
        self.reload_pool()
    }

    fn reload_pool(&self) -> Result<()> {
        let c = self.config.get();
        let table = Self::pool_table(&self.meta_loop.dev, &self.data, c.data_mb, &c);
        self.pool.replace_table(&table)
    }
}

/// Sets dm-thin-pool's `no_space_timeout` (seconds a full pool in queue
/// mode holds writes before it fails them; 0 = forever) and restores the
/// old value on drop: it is global to the module and read when a pool runs
/// out of space.
pub struct NoSpaceTimeout {
    old: String,
}

/// Where the module parameter lives.
pub const NO_SPACE_TIMEOUT: &str = "/sys/module/dm_thin_pool/parameters/no_space_timeout";

impl NoSpaceTimeout {
    pub fn set(seconds: u32) -> Result<NoSpaceTimeout> {
        devices::modprobe("dm-thin-pool", &[])?;
        let old = sys::read_sysfs(NO_SPACE_TIMEOUT)?;
        std::fs::write(NO_SPACE_TIMEOUT, seconds.to_string())
            .with_context(|| format!("writing {seconds} to {NO_SPACE_TIMEOUT}"))?;
        Ok(NoSpaceTimeout { old })
    }

    pub fn old(&self) -> &str {
        &self.old
    }
}

impl Drop for NoSpaceTimeout {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(NO_SPACE_TIMEOUT, &self.old) {
            eprintln!("restoring {NO_SPACE_TIMEOUT} to {}: {e}", self.old);
        }
    }
}

/// Polls `probe` every 20 ms until it returns `Some`, or `timeout` passes;
/// returns the value and when it was first seen.
pub fn poll_until<T>(
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<(T, Instant)> {
    let start = Instant::now();
    loop {
        if let Some(v) = probe() {
            return Some((v, Instant::now()));
        }
        if start.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipath_status_lines_as_6_1_prints_them() {
        let healthy = "0 131072 multipath 2 0 0 0 1 1 A 0 2 0 8:0 A 0 8:16 A 0 ";
        assert_eq!(
            parse_multipath_status(healthy).unwrap(),
            [
                MpathPath {
                    dev: "8:0".into(),
                    active: true,
                    fail_count: 0
                },
                MpathPath {
                    dev: "8:16".into(),
                    active: true,
                    fail_count: 0
                }
            ]
        );
        let one_failed = "0 131072 multipath 2 0 0 0 1 1 E 0 2 0 8:0 F 2 8:16 A 1";
        let p = parse_multipath_status(one_failed).unwrap();
        assert!(!p[0].active && p[0].fail_count == 2);
        assert!(p[1].active && p[1].fail_count == 1);
        // A selector with per-path words and a hardware handler.
        let st = "0 10 multipath 2 0 0 1 alua 2 1 A 0 1 2 8:32 A 0 3 7 E 0 1 2 8:48 F 1 0 0";
        let p = parse_multipath_status(st).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].dev, "8:48");
        assert!(!p[1].active);
        assert!(parse_multipath_status("0 10 multipath 2 0").is_err());
    }

    #[test]
    fn thin_pool_status_lines_as_6_1_prints_them() {
        let s = PoolStatus::parse(
            "0 131072 thin-pool 0 117/1024 1024/1024 - out_of_data_space discard_passdown queue_if_no_space - 256",
        )
        .unwrap();
        assert_eq!((s.used_data, s.total_data), (1024, 1024));
        assert_eq!((s.used_meta, s.total_meta), (117, 1024));
        assert_eq!(s.mode, "out_of_data_space");
        assert_eq!(s.no_space, "queue_if_no_space");
        assert!(!s.needs_check);
        assert_eq!(s.data_percent(), 100.0);
        let f = PoolStatus::parse("0 131072 thin-pool Fail").unwrap();
        assert_eq!(f.mode, "Fail");
        assert!(PoolStatus::parse("0 131072 thin-pool 0 1/2").is_err());
    }
}
