//! `cargo xtask fuzz [TARGET] [--seconds N]`: coverage-guided fuzzing of the
//! agent's parsers of outside input with afl.
//!
//! Targets are the binaries `fuzz/src/bin/*.rs` (each calls
//! `health_node::fuzz_targets::<name>::run`), seeded from
//! `fuzz/corpus/<name>/`. The fuzzer and its runtime come from Debian's
//! `afl++` package (installed on demand), the `fuzz!` harness from the
//! `afl` crate pinned in fuzz/Cargo.toml. We instrument the build the way
//! `cargo afl build` does (LLVM's SanitizerCoverage, which needs no
//! compiler plugin and works on stable Rust) but link Debian's
//! `afl-compiler-rt.o`: the runtime must speak the fork-server protocol of
//! the `afl-fuzz` that drives it, and cargo-afl would compile another AFL++
//! from source for itself.
//!
//! The build has its own target directory (`target/fuzz`) so that its
//! flags never invalidate the normal builds. Each target runs for the
//! given time; a crash or hang fails the command and its inputs are kept
//! and listed. Otherwise the output folder is removed (`--keep` keeps it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context};

use crate::bootstrap::ensure_commands;
use crate::util::target_dir;
use crate::util::{cargo, output, run, say, workspace_root};

/// Debian's afl++ runtime, linked into every target.
const AFL_RUNTIME: &str = "/usr/lib/afl/afl-compiler-rt.o";

/// An input that takes longer than this is a hang (milliseconds). Generous:
/// the machine may be shared with builds; the parsers take microseconds.
const HANG_MS: u32 = 2000;

/// Address-space limit of a target run (MiB): an input that makes a parser
/// allocate without bound fails its allocation and shows up as a crash.
const MEMORY_LIMIT_MB: u32 = 512;

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// One target (a file name in fuzz/src/bin without `.rs`); all when omitted.
    target: Option<String>,
    /// How long each target runs.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Keep afl's output folders (queue, stats) under target/fuzz/afl.
    #[arg(long)]
    keep: bool,
}

/// What one target's run did, from afl's `fuzzer_stats`.
#[derive(Debug, PartialEq)]
pub struct RunStats {
    pub seconds: u64,
    pub execs: u64,
    pub corpus: u64,
    pub edges: u64,
    pub crashes: u64,
    pub hangs: u64,
}

pub fn run_fuzz(args: &FuzzArgs) -> anyhow::Result<()> {
    let root = workspace_root();
    let fuzz_dir = root.join("fuzz");
    let all = discover_targets(&fuzz_dir.join("src/bin"))?;
    let targets: Vec<String> = match &args.target {
        Some(t) if all.contains(t) => vec![t.clone()],
        Some(t) => bail!("no fuzz target {t:?}; there are: {}", all.join(", ")),
        None => all,
    };
    for t in &targets {
        corpus_files(&fuzz_dir.join("corpus").join(t))?;
    }

    ensure_commands(&[("afl-fuzz", "afl++")])?;
    ensure!(
        Path::new(AFL_RUNTIME).is_file(),
        "{AFL_RUNTIME} is missing although afl++ is installed"
    );
    let bins = build(&fuzz_dir, &targets)?;

    let mut findings = Vec::new();
    let mut table = Vec::new();
    for t in &targets {
        let out = target_dir().join("fuzz/afl").join(t);
        let stats = fuzz_one(
            &bins.join(t),
            &fuzz_dir.join("corpus").join(t),
            &out,
            args.seconds,
        )
        .with_context(|| format!("fuzz target {t}"))?;
        let found = inputs_in(&out.join("default/crashes"))?
            .into_iter()
            .chain(inputs_in(&out.join("default/hangs"))?)
            .collect::<Vec<_>>();
        if found.is_empty() && !args.keep {
            std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
        }
        findings.extend(found);
        table.push((t.clone(), stats));
    }

    println!("target      seconds      execs  corpus  edges  crashes  hangs");
    for (t, s) in &table {
        println!(
            "{t:<10} {:>8} {:>10} {:>7} {:>6} {:>8} {:>6}",
            s.seconds, s.execs, s.corpus, s.edges, s.crashes, s.hangs
        );
    }
    if !findings.is_empty() {
        for f in &findings {
            println!("finding: {}", f.display());
        }
        bail!(
            "{} crashing or hanging inputs (listed above); reproduce one with `{}/<target> < FILE`",
            findings.len(),
            bins.display()
        );
    }
    Ok(())
}

/// The names of `dir/*.rs`, sorted.
pub fn discover_targets(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("listing fuzz targets in {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    ensure!(!names.is_empty(), "no fuzz targets in {}", dir.display());
    Ok(names)
}

/// The seed files of one corpus; an empty or missing corpus is an error
/// (afl cannot start without a seed).
fn corpus_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let files = inputs_in(dir)?;
    ensure!(!files.is_empty(), "no seed corpus in {}", dir.display());
    Ok(files)
}

/// The files directly in `dir` (none when it does not exist), except afl's
/// README.txt.
fn inputs_in(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != "README.txt"))
        .collect();
    files.sort();
    Ok(files)
}

/// Builds the instrumented targets; returns the folder holding them.
fn build(fuzz_dir: &Path, targets: &[String]) -> anyhow::Result<PathBuf> {
    // An explicit --target keeps RUSTFLAGS off build scripts and proc
    // macros: only the code that runs under afl is instrumented.
    let host = output(Command::new("rustc").arg("-vV"))?
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .context("no host triple in `rustc -vV`")?;
    let target_root = target_dir().join("fuzz");
    say(format!(
        "building {} instrumented fuzz target(s) into {}",
        targets.len(),
        target_root.display()
    ));
    let mut build = cargo();
    build
        .current_dir(fuzz_dir)
        .args(["build", "--release", "--locked", "--target", &host])
        .env("CARGO_TARGET_DIR", &target_root)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("RUSTFLAGS", rustflags());
    for t in targets {
        build.args(["--bin", t]);
    }
    run(&mut build)?;
    Ok(target_root.join(host).join("release"))
}

/// What `cargo afl build` passes without compiler plugins, with Debian's
/// runtime: SanitizerCoverage edge guards and comparison hooks, which
/// afl's runtime implements; `--cfg fuzzing` as every fuzzing harness sets.
fn rustflags() -> String {
    [
        "-C debug-assertions",
        "-C overflow-checks",
        "-C opt-level=3",
        "-C passes=sancov-module",
        "-C llvm-args=-sanitizer-coverage-level=3",
        "-C llvm-args=-sanitizer-coverage-trace-pc-guard",
        "-C llvm-args=-sanitizer-coverage-prune-blocks=0",
        "-C llvm-args=-sanitizer-coverage-trace-compares",
        "--cfg fuzzing",
        &format!("-C link-arg={AFL_RUNTIME}"),
    ]
    .join(" ")
}

/// Runs afl-fuzz on one target for `seconds`; output in `out` (replaced).
fn fuzz_one(bin: &Path, corpus: &Path, out: &Path, seconds: u64) -> anyhow::Result<RunStats> {
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("removing {}", out.display()))?;
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let log = out.join("afl-fuzz.log");
    say(format!(
        "fuzzing {} for {seconds} s (log: {})",
        bin.display(),
        log.display()
    ));
    let status = Command::new("afl-fuzz")
        .arg("-i")
        .arg(corpus)
        .arg("-o")
        .arg(out)
        .args(["-V", &seconds.to_string()])
        .args(["-t", &HANG_MS.to_string()])
        .args(["-m", &MEMORY_LIMIT_MB.to_string()])
        .arg("--")
        .arg(bin)
        .envs(afl_env())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(Stdio::inherit())
        .status()
        .context("starting afl-fuzz")?;
    let stats_file = out.join("default/fuzzer_stats");
    if !status.success() || !stats_file.is_file() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "afl-fuzz failed with {status}; the end of {}:\n{}",
            log.display(),
            tail.join("\n")
        );
    }
    let text = std::fs::read_to_string(&stats_file)
        .with_context(|| format!("reading {}", stats_file.display()))?;
    parse_stats(&text).with_context(|| format!("in {}", stats_file.display()))
}

/// Environment for afl-fuzz on a shared VM, as root, without a terminal.
fn afl_env() -> [(&'static str, &'static str); 4] {
    [
        // Crashes are recorded by afl itself; a core_pattern that pipes to
        // a crash handler only slows their detection.
        ("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1"),
        // VMs have no cpufreq governor to check.
        ("AFL_SKIP_CPUFREQ", "1"),
        // Other builds use the cores: do not insist on one of our own.
        ("AFL_NO_AFFINITY", "1"),
        // Plain status lines instead of the curses screen.
        ("AFL_NO_UI", "1"),
    ]
}

/// The fields of afl's `fuzzer_stats` that the summary prints.
pub fn parse_stats(text: &str) -> anyhow::Result<RunStats> {
    let fields: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    let num = |key: &str| -> anyhow::Result<u64> {
        let v = fields
            .get(key)
            .with_context(|| format!("no {key} in fuzzer_stats"))?;
        v.parse()
            .with_context(|| format!("{key} is {v:?}, not a number"))
    };
    Ok(RunStats {
        seconds: num("run_time")?,
        execs: num("execs_done")?,
        corpus: num("corpus_count")?,
        edges: num("edges_found")?,
        crashes: num("saved_crashes")?,
        hangs: num("saved_hangs")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_the_binaries_of_the_fuzz_crate() {
        let names = discover_targets(&workspace_root().join("fuzz/src/bin")).unwrap();
        for expected in ["btf", "mountinfo", "ringbuf", "sysfs", "tracefs"] {
            assert!(names.iter().any(|n| n == expected), "{names:?}");
        }
        for name in &names {
            let seeds = corpus_files(&workspace_root().join("fuzz/corpus").join(name)).unwrap();
            assert!(!seeds.is_empty(), "{name}");
        }
        let empty = tempfile::tempdir().unwrap();
        let err = discover_targets(empty.path()).unwrap_err().to_string();
        assert!(err.starts_with("no fuzz targets in "), "{err}");
    }

    #[test]
    fn stats_are_read_from_fuzzer_stats() {
        let text =
            "start_time        : 1700000000\nrun_time          : 61\nexecs_done        : 123456\n\
                    corpus_count      : 42\nedges_found       : 310\nsaved_crashes     : 1\n\
                    saved_hangs       : 0\nafl_version       : ++4.04c\n";
        assert_eq!(
            parse_stats(text).unwrap(),
            RunStats {
                seconds: 61,
                execs: 123456,
                corpus: 42,
                edges: 310,
                crashes: 1,
                hangs: 0
            }
        );
        let err = parse_stats("run_time : x\n").unwrap_err().to_string();
        assert_eq!(err, "run_time is \"x\", not a number");
    }
}
