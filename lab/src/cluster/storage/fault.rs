//! `cargo xtask cluster fault`: rules on the fault disk's server, aimed at
//! what a user can name: a PV, a file or directory on any of the disk's
//! filesystems (through any mount, a pod's too), a block volume's device,
//! or the raw image. The module docs of `storage` have examples.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use health_tests::fs::file_extents;
use health_tests::protocol::{ByteRange, Op, Request, Rule};

use xtask::lab_cli::cluster::{errno_name, AddArgs, FaultArgs, FaultCommand, OpArg};

use super::super::State;
use super::extents::{self, Range};
use super::{disk, Description, Mode, Volume};

/// The fault disk's name for the requests `arg` selects.
fn op(arg: OpArg) -> Op {
    match arg {
        OpArg::Read => Op::Read,
        OpArg::Write => Op::Write,
        OpArg::Discard => Op::Discard,
        OpArg::Flush => Op::Flush,
        OpArg::Any => Op::Any,
    }
}

pub(in super::super) fn fault(state: &State, args: &FaultArgs) -> anyhow::Result<()> {
    let d = Description::read(state)?
        .context("the cluster has no storage: run `cargo xtask cluster up` first")?;
    match &args.command {
        FaultCommand::Add(add) => add_rules(&d, add),
        FaultCommand::Clear => {
            disk::request(&d.control_socket, &Request::ClearRules)?;
            println!("fault disk: every rule removed; requests succeed again");
            Ok(())
        }
        FaultCommand::Stats { json } => {
            let stats = disk::request(&d.control_socket, &Request::Stats)?
                .stats
                .context("the fault disk answered stats without stats")?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&stats)?);
                return Ok(());
            }
            println!("failures injected: {}", stats.total_injected);
            for c in &stats.injected {
                println!("  {} {}: {}", c.op, errno_name(c.errno), c.count);
            }
            let r = &stats.requests;
            println!(
                "requests served: read {}, write {}, discard {}, flush {}",
                r.read, r.write, r.discard, r.flush
            );
            Ok(())
        }
    }
}

fn add_rules(d: &Description, args: &AddArgs) -> anyhow::Result<()> {
    let (what, ranges) = target(d, args)?;
    let op = op(args.op);
    let ranges: Vec<Option<Range>> = match (op, ranges) {
        (Op::Flush, None) => vec![None],
        (Op::Flush, Some(_)) => {
            bail!("flushes carry no byte range: `--op flush` takes no --path, --volume, --offset or --len")
        }
        (_, None) => vec![None],
        (_, Some(ranges)) => ranges.into_iter().map(Some).collect(),
    };
    let mut ids = Vec::new();
    for range in &ranges {
        let rule = Rule {
            op,
            range: range.map(|(start, end)| ByteRange { start, end }),
            errno: args.errno,
            limit: args.limit,
        };
        rule.validate().map_err(anyhow::Error::msg)?;
        let answer = disk::request(&d.control_socket, &Request::AddRule { rule })?;
        ids.push(
            answer
                .rule_id
                .context("the fault disk answered add_rule without an id")?,
        );
    }
    let bytes: u64 = ranges.iter().flatten().map(|(s, e)| e - s).sum();
    let detail = match ranges.as_slice() {
        [None] => "every request".to_string(),
        [Some((start, end))] => format!("image bytes [{start}, {end})"),
        more => format!("{bytes} bytes of the image in {} ranges", more.len()),
    };
    println!(
        "{} to {what} now fail with {} ({detail}; rule ids {ids:?}); undo: cargo xtask cluster fault clear",
        args.op.requests(),
        errno_name(args.errno),
    );
    Ok(())
}

/// What the rules cover, in words and as image ranges (`None`: everything).
fn target(d: &Description, args: &AddArgs) -> anyhow::Result<(String, Option<Vec<Range>>)> {
    let window = extents::window(args.offset, args.len)?;
    let (what, ranges) = match (&args.path, &args.volume) {
        (None, None) if window.is_none() => return Ok(("the whole fault disk".into(), None)),
        (None, None) => (
            format!("{} (the image)", d.image.display()),
            vec![extents::region_range(0, d.image_bytes, window)?],
        ),
        (None, Some(pv)) => volume_ranges(d.volume(pv)?, window)?,
        (Some(path), _) => path_ranges(d, path, window)?,
    };
    if ranges.is_empty() {
        bail!("{what} has no data on the fault disk yet (write it, and sync, first)");
    }
    Ok((what, Some(ranges)))
}

fn volume_ranges(v: &Volume, window: Option<Range>) -> anyhow::Result<(String, Vec<Range>)> {
    let what = match v.mode {
        Mode::Filesystem => format!("volume {} (its ext4 on {})", v.pv, v.device.display()),
        Mode::Block => format!("volume {} ({})", v.pv, v.device.display()),
    };
    Ok((
        what,
        vec![extents::region_range(
            v.region.offset,
            v.region.bytes,
            window,
        )?],
    ))
}

fn path_ranges(
    d: &Description,
    path: &Path,
    window: Option<Range>,
) -> anyhow::Result<(String, Vec<Range>)> {
    let meta = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
    if meta.file_type().is_block_device() {
        let maj_min = maj_min(meta.rdev());
        let v = d
            .volumes
            .iter()
            .find(|v| v.maj_min == maj_min)
            .with_context(|| {
                format!(
                    "{} ({maj_min}) is no volume of the fault disk",
                    path.display()
                )
            })?;
        return volume_ranges(v, window);
    }
    let dev = maj_min(meta.dev());
    let base = d
        .volumes
        .iter()
        .find(|v| v.maj_min == dev && v.mode == Mode::Filesystem)
        .map(|v| v.region.offset)
        .with_context(|| {
            format!(
                "{} is on device {dev}, not on the fault disk (its filesystems: {})",
                path.display(),
                d.volumes
                    .iter()
                    .filter(|v| v.mode == Mode::Filesystem)
                    .map(|v| format!("{} {}", v.pv, v.maj_min))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    let files = if meta.is_dir() {
        if window.is_some() {
            bail!(
                "--offset/--len need a file, and {} is a directory",
                path.display()
            );
        }
        regular_files(path)?
    } else {
        vec![path.to_path_buf()]
    };
    let mut ranges = Vec::new();
    for file in &files {
        ranges.extend(extents::file_ranges(&file_extents(file)?, base, window));
    }
    let what = match files.len() {
        1 => format!("{} extents of {}", ranges.len(), path.display()),
        n => format!(
            "{} extents of {n} files under {}",
            ranges.len(),
            path.display()
        ),
    };
    Ok((what, ranges))
}

fn maj_min(dev: u64) -> String {
    format!("{}:{}", libc::major(dev), libc::minor(dev))
}

/// The regular files at or below `dir` (symlinks not followed).
fn regular_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                todo.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    Ok(out)
}
