//! `cargo xtask demo`: the agent catching real I/O errors, narrated.
//!
//! A fault disk (FUSE-served image behind a loop device) carries an ext4
//! filesystem; the agent watches that one device in its human format while
//! the demo makes the disk fail four kinds of requests and shows what the
//! application saw next to what the agent printed. At the end the agent is
//! stopped and its exact totals are set against what the disk injected.
//!
//! Everything set up here (agent, mount, loop device, FUSE server, temp
//! dirs) is owned by a Drop guard; Ctrl-C only sets a flag (see
//! `bench::interrupt`), so an interrupted demo unwinds through the guards
//! and then checks that nothing was left behind.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_tests::{fs, FaultDisk, Mount, Op, Rule};

use crate::bench::dio::DirectIo;
use crate::bench::{self, interrupt, AgentProc};

const MIB: u64 = 1 << 20;
const EIO: i32 = libc::EIO;
/// How long to wait for the agent's line after each fault.
const SHOW_WAIT: Duration = Duration::from_secs(5);
/// Pause between steps: the demo is meant to be watched.
const STEP_PAUSE: Duration = Duration::from_millis(1500);
/// Prefix of the agent's own output in the narration.
const AGENT_PREFIX: &str = "   agent | ";

/// Where the demo put things, to check after the guards ran that they are gone.
#[derive(Default)]
struct Footprint {
    loop_name: Option<String>,
    mount_point: Option<PathBuf>,
    work_dir: Option<PathBuf>,
    agent_pid: Option<i32>,
}

pub fn run() -> Result<()> {
    interrupt::install()?;
    let tools = bench::prepare()?;
    let mut footprint = Footprint::default();
    let started = Instant::now();
    let result = demo(&tools, &mut footprint);
    // Every guard of `demo` has run by now, whether it finished, failed or
    // was interrupted.
    let leftovers = footprint.leftovers();
    if leftovers.is_empty() {
        println!(
            "\ncleaned up: no agent, mount, loop device or fault disk left behind (the demo took {:.0} s)",
            started.elapsed().as_secs_f64()
        );
    } else {
        println!("\nleft behind: {}", leftovers.join("; "));
    }
    result?;
    if !leftovers.is_empty() {
        bail!(
            "the demo did not clean up after itself: {}",
            leftovers.join("; ")
        );
    }
    Ok(())
}

/// Heads a step, after a pause that lets a reader follow the previous one.
fn step(n: u32, title: &str) -> Result<()> {
    interrupt::sleep(STEP_PAUSE)?;
    println!("\n== {n}. {title}");
    Ok(())
}

fn say(text: impl AsRef<str>) {
    println!("   {}", text.as_ref());
}

/// Waits (briefly) until the agent printed a line containing `needle` since
/// line `from`, so its output lands under the step that caused it.
fn show(agent: &AgentProc, from: usize, needle: &str) -> Result<()> {
    if !agent.wait_until(SHOW_WAIT, |lines| {
        lines.iter().skip(from).any(|l| l.text.contains(needle))
    })? {
        say(format!(
            "(no `{needle}` line from the agent within {SHOW_WAIT:?})"
        ));
    }
    // Let the rest of the burst (the other failed requests) print too.
    interrupt::sleep(Duration::from_millis(300))
}

/// First extent of `path` with a real on-disk location.
fn first_extent(path: &Path) -> Result<fs::Extent> {
    fs::file_extents(path)?
        .into_iter()
        .find(fs::Extent::is_mapped)
        .with_context(|| format!("{} has no mapped extent", path.display()))
}

fn errno_of(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!("{:?}", nix::errno::Errno::from_raw(n)),
        None => e.to_string(),
    }
}

fn demo(tools: &bench::Tools, footprint: &mut Footprint) -> Result<()> {
    println!("\nvolume-health demo: real I/O errors from a fault disk, caught by the agent\n");
    let disk = interrupt::spawn_shielded(|| FaultDisk::start_with(&tools.faultdisk, 128 * MIB))?;
    footprint.work_dir = Some(disk.work_dir().to_path_buf());
    let lo = disk.attach_loop(false)?;
    footprint.loop_name = Some(lo.name().to_string());
    fs::mkfs_ext4(lo.path())?;
    let mut mnt = Mount::new(lo.path(), "ext4", "errors=remount-ro")?;
    footprint.mount_point = Some(mnt.path().to_path_buf());
    say(format!(
        "fault disk {} (FUSE, fails requests on command)",
        disk.image_path().display()
    ));
    say(format!(
        "  -> loop device {} ({})",
        lo.path().display(),
        lo.maj_min()
    ));
    say(format!(
        "  -> ext4 mounted on {} with errors=remount-ro",
        mnt.path().display()
    ));

    // Everything the application will touch exists on disk before the agent
    // starts, so each fault below hits known blocks.
    let root = mnt.path().to_path_buf();
    let db = root.join("db.bin");
    let photo = root.join("photo.jpg");
    let log = root.join("app.log");
    let inbox = root.join("inbox");
    std::fs::write(&db, vec![0x11; MIB as usize]).context("writing db.bin")?;
    std::fs::write(&photo, vec![0x22; 256 * 1024]).context("writing photo.jpg")?;
    std::fs::write(&log, vec![0x33; 64 * 1024]).context("writing app.log")?;
    std::fs::create_dir(&inbox).context("creating inbox/")?;
    for i in 0..40 {
        std::fs::write(inbox.join(format!("mail-{i:03}")), b"hello").context("filling inbox/")?;
    }
    fs::sync_fs(&root)?;
    let (db_ext, photo_ext, log_ext, inbox_ext) = (
        first_extent(&db)?,
        first_extent(&photo)?,
        first_extent(&log)?,
        first_extent(&inbox)?,
    );
    // A cold start: dropping caches cannot evict metadata blocks ext4 still
    // pins for its journal (the inbox directory block among them); an
    // unmount does.
    mnt.cycle()?;
    interrupt::check()?;

    let args: Vec<String> = ["--device", lo.maj_min(), "--totals-interval", "3600"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    say(format!(
        "starting: health-agent watch {}  (periodic totals off for the demo)",
        args.join(" ")
    ));
    let agent = AgentProc::start(&tools.agent, &args, Some(AGENT_PREFIX))?;
    footprint.agent_pid = Some(agent.pid());
    let ready = agent.stderr_so_far();
    say(ready
        .lines()
        .find(|l| l.contains("volume-health: ready"))
        .unwrap_or("agent ready")
        .trim());

    // 1. O_DIRECT writes: the application gets EIO right away.
    step(
        1,
        "a database writes db.bin with O_DIRECT into a bad region",
    )?;
    let from = agent.line_count();
    let rule = disk.add_rule(Rule::new(Op::Write, EIO).range(db_ext.physical, 32 * 1024))?;
    let io = DirectIo::open(&db, 4096)?;
    let mut failed = 0;
    for i in 0..8u64 {
        match io.write_at(i * 4096) {
            Err(e) if e.raw_os_error() == Some(EIO) => failed += 1,
            other => say(format!("(unexpected: pwrite {i} -> {other:?})")),
        }
    }
    drop(io);
    say(format!(
        "application: 8 x pwrite(O_DIRECT, 4 KiB) -> EIO {failed} times"
    ));
    disk.remove_rule(rule)?;
    show(&agent, from, "block_io_error")?;

    // 2. A cold-cache read: the error hides behind the page cache until the
    // cache is dropped.
    step(
        2,
        "someone opens photo.jpg, which is no longer in the page cache",
    )?;
    let from = agent.line_count();
    fs::drop_caches()?;
    let before = disk.stats()?.injected(Op::Read, EIO);
    let rule = disk.add_rule(Rule::new(Op::Read, EIO).range(photo_ext.physical, photo_ext.len))?;
    let res = std::fs::read(&photo);
    let reads = disk.stats()?.injected(Op::Read, EIO) - before;
    disk.remove_rule(rule)?;
    match res {
        Err(e) => say(format!("application: read(photo.jpg) -> {} ({reads} read requests failed: readahead, then retries)", errno_of(&e))),
        Ok(_) => say("application: read(photo.jpg) succeeded (unexpected: was it still cached?)"),
    }
    show(&agent, from, " read ")?;

    // 3. Failed writeback: write() succeeds, only fsync tells, and only once.
    step(
        3,
        "a service appends to app.log; the disk fails the writeback",
    )?;
    let from = agent.line_count();
    let rule = disk.add_rule(Rule::new(Op::Write, EIO).range(log_ext.physical, 64 * 1024))?;
    let mut f = OpenOptions::new()
        .write(true)
        .open(&log)
        .context("opening app.log")?;
    let wrote = f.write_all(&[0x44; 64 * 1024]);
    say(format!(
        "application: write(64 KiB) -> {}  (the data only went to the page cache)",
        wrote.as_ref().map_or_else(errno_of, |_| "OK".into())
    ));
    let first = f.sync_all();
    say(format!(
        "application: fsync() -> {}",
        first.as_ref().map_or_else(errno_of, |_| "OK".into())
    ));
    let second = f.sync_all();
    say(format!(
        "application: fsync() again -> {}  (the error is reported once; a writer that never calls fsync never learns of it)",
        second.as_ref().map_or_else(errno_of, |_| "OK".into())
    ));
    drop(f);
    disk.remove_rule(rule)?;
    show(&agent, from, "writeback_error")?;

    // 4. A metadata read error: ext4 gives up on the filesystem. (A name
    // lookup reports it as a filesystem error; readdir of a one-block
    // directory would only log a warning.)
    step(
        4,
        "a mail server opens inbox/mail-007; the inbox directory block cannot be read",
    )?;
    let from = agent.line_count();
    let rule = disk.add_rule(Rule::new(Op::Read, EIO).range(inbox_ext.physical, inbox_ext.len))?;
    let opened = std::fs::read(inbox.join("mail-007"));
    disk.remove_rule(rule)?;
    say(format!(
        "application: open(inbox/mail-007) -> {}",
        opened.as_ref().map_or_else(errno_of, |_| "OK".into())
    ));
    show(&agent, from, "fs_error")?;
    let info = mnt.info()?;
    let ro = info.has_super_option("emergency_ro") || info.has_super_option("ro");
    say(format!(
        "ext4 remounted read-only: {}  (superblock options: {})",
        if ro { "yes" } else { "no" },
        info.super_options
    ));
    let probe = std::fs::write(root.join("new-mail"), b"x");
    say(format!(
        "application: creating a file now -> {}",
        probe.as_ref().map_or_else(errno_of, |_| "OK".into())
    ));

    // The end: the agent's exact totals against the disk's own count.
    disk.clear_rules()?;
    step(
        5,
        "stopping the agent (SIGTERM): it detaches and prints its exact totals",
    )?;
    let stopped = agent.stop_ok()?;
    compare(
        &disk.stats()?,
        &stopped
            .lines
            .iter()
            .map(|l| l.text.clone())
            .collect::<Vec<_>>(),
        lo.maj_min(),
    );
    println!(
        "\ncleaning up: unmounting, detaching {}, stopping the fault disk",
        lo.path().display()
    );
    Ok(())
}

/// Items of the device's line in the agent's final `totals:` block:
/// "block_io_error write EIO (block_rq_error)" -> count.
fn agent_totals(lines: &[String], dev: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Some(start) = lines.iter().rposition(|l| l.trim_end() == "totals:") else {
        return out;
    };
    let prefix = format!("{dev} ");
    let Some(line) = lines[start + 1..]
        .iter()
        .map(|l| l.trim_start())
        .find(|l| l.starts_with(&prefix))
    else {
        return out;
    };
    // "7:0 loop0 on /tmp/x: item, item": the mount point is a temp dir
    // without ": " in it.
    let Some((_, items)) = line.split_once(": ") else {
        return out;
    };
    for item in items.split(", ") {
        if let Some((what, n)) = item.rsplit_once(' ') {
            if let Ok(n) = n.parse() {
                out.insert(what.to_string(), n);
            }
        }
    }
    out
}

fn compare(stats: &health_tests::Stats, lines: &[String], dev: &str) {
    let agent = agent_totals(lines, dev);
    // (what, injected by the disk, counted by the agent, verdict)
    let mut rows: Vec<(String, String, String, &str)> = Vec::new();
    let mut all_match = !agent.is_empty();
    for c in &stats.injected {
        let errno = format!("{:?}", nix::errno::Errno::from_raw(c.errno));
        let key = format!("block_io_error {} {errno} (block_rq_error)", c.op);
        let counted = agent.get(&key).copied();
        let ok = counted == Some(c.count);
        all_match &= ok;
        rows.push((
            format!("failed {} requests, {errno}", c.op),
            c.count.to_string(),
            counted.map_or("-".to_string(), |n| n.to_string()),
            if ok { "match" } else { "MISMATCH" },
        ));
    }
    for (what, n) in agent
        .iter()
        .filter(|(k, _)| !k.starts_with("block_io_error"))
    {
        rows.push((
            what.clone(),
            String::new(),
            n.to_string(),
            "what the kernel made of them",
        ));
    }
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    println!(
        "\n   {:<width$}  {:>13}  {:>13}",
        "", "disk injected", "agent counted"
    );
    for (what, injected, counted, verdict) in &rows {
        println!("   {what:<width$}  {injected:>13}  {counted:>13}  {verdict}");
    }
    if all_match {
        println!("\n   every request the disk failed is in the agent's exact totals");
    } else if agent.is_empty() {
        println!("\n   (could not read the agent's totals from its output)");
    } else {
        println!("\n   the agent's totals differ from what the disk injected");
    }
}

impl Footprint {
    /// What is still there after the guards ran.
    fn leftovers(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(pid) = self.agent_pid {
            // A zombie would be ours to reap; the guard waits, so any /proc
            // entry here is a live process (or an unrelated reuse of the pid,
            // ruled out by the name).
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "health-agent" {
                out.push(format!("agent pid {pid} still running"));
            }
        }
        if let Some(point) = &self.mount_point {
            if let Ok(Some(_)) = health_tests::sys::mount_at(point) {
                out.push(format!("{} still mounted", point.display()));
            }
        }
        if let (Some(name), Some(dir)) = (&self.loop_name, &self.work_dir) {
            let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
                .unwrap_or_default();
            if backing.trim().starts_with(&*dir.to_string_lossy()) {
                out.push(format!("/dev/{name} still attached to {}", backing.trim()));
            }
        }
        if let Some(dir) = &self.work_dir {
            if dir.exists() {
                out.push(format!(
                    "fault disk work dir {} still exists",
                    dir.display()
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_agents_final_totals() {
        let lines: Vec<String> = [
            "2025-01-01T00:00:00Z block_io_error  7:0 loop0 write EIO sector 8+8",
            "totals:",
            "  7:0 loop0 on /tmp/health-mnt-Ab12: block_io_error read EIO (block_rq_error) 6, block_io_error write EIO (block_rq_error) 24, fs_error (ext4_error) 1",
            "kernel side: 0 samples rate-limited, 0 lost to a full ring buffer",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let t = agent_totals(&lines, "7:0");
        assert_eq!(
            t.get("block_io_error write EIO (block_rq_error)"),
            Some(&24)
        );
        assert_eq!(t.get("block_io_error read EIO (block_rq_error)"), Some(&6));
        assert_eq!(t.get("fs_error (ext4_error)"), Some(&1));
        assert!(agent_totals(&lines, "7:1").is_empty());
    }
}
