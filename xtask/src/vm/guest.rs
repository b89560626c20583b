//! Booting a kernel under QEMU (TCG) with virtme-ng and running a script in
//! it, with the script's output and exit code brought back to the host.
//!
//! virtme-ng boots the kernel with the host's root filesystem shared
//! read-only (writable overlays on /etc, /tmp, /var, ...), so the host's
//! binaries, test executables and tools run inside unchanged. Its console
//! and exit code are not a reliable channel for the guest command's output
//! (its serial channels did not show up here and `vng` exits 255 whatever
//! the command did), so the script writes stdout, stderr, a start marker
//! and its exit status into a `--rwdir` directory, which the host follows
//! while the guest runs.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::devices;
use super::kernels::Kernel;
use super::queue::Queue;
use super::relay::Relay;
use super::script::{quote, Env, Step};
use super::tools::Tools;
use crate::util::{run, say};

/// A Debian kernel reaches the script in 20-60 s under TCG on this machine
/// kind (measured; more on a busy host); far beyond that it is stuck, and
/// the console tail says where.
const BOOT_LIMIT: Duration = Duration::from_secs(300);
/// How long the guest may take to power off once the script is done.
const POWEROFF_LIMIT: Duration = Duration::from_secs(60);
/// Loaded before the command, as on a host that has used them: the agent
/// attaches ext4 and xfs tracepoints only if their modules are loaded when
/// it starts, and the tests' loop devices and FUSE servers expect
/// /dev/loop-control and /dev/fuse. (udev runs in the guest, but only loads
/// drivers for devices it finds.) btrfs autoloads at its first mount.
const PRELOAD_MODULES: &[&str] = &["loop", "fuse", "ext4", "xfs"];
/// Drivers udev would load at boot for QEMU's machine (q35: the AHCI
/// controller and its CD drive, the watchdogs, the PC speaker, PS/2, KVM
/// for nested guests, the CPU's crypto instructions) that no test uses.
/// Each is read over 9p at about 3 MB/s under TCG: kvm_amd alone took 36 s
/// of a 6.12 guest's boot (2026-12-01). `modprobe.blacklist=` keeps
/// udev's kmod and modprobe from loading them by alias; a test may still
/// load one by name. The crypto algorithms keep their generic modules.
const UNUSED_MODULES: &[&str] = &[
    "kvm",
    "kvm_amd",
    "kvm_intel",
    "ccp",
    "iTCO_wdt",
    "iTCO_vendor_support",
    "i6300esb",
    "lpc_ich",
    "intel_pmc_bxt",
    "i2c_i801",
    "pcspkr",
    "psmouse",
    "serio_raw",
    "evdev",
    "button",
    "ahci",
    "sr_mod",
    "aesni_intel",
    "ghash_clmulni_intel",
    "crc32_pclmul",
    "crct10dif_pclmul",
    "sha1_ssse3",
    "sha256_ssse3",
    "sha512_ssse3",
    "qemu_fw_cfg",
];
/// A sparse ext4 disk for TMPDIR (see `scratch_disk`).
const SCRATCH_SIZE: &str = "8G";
/// The scratch disk is sparse; what the tests write to it must fit on the
/// host's disk: at most 137 MiB of it for every suite CI runs (5.10,
/// 2026-11-29; each guest prints its figure), two guests at a time.
const MIN_HOST_FREE: u64 = 1 << 30;
/// Where the guest mounts it: a tmpfs there already, so nothing of the
/// host's is hidden (the host's /tmp stays visible in the guest).
const SCRATCH_MOUNT: &str = "/var/tmp";

/// Fails when one of `paths` (the checkout, the target directory, the tools
/// cache: what the guest reads over the host's root) lies under
/// [`SCRATCH_MOUNT`], which the guest's scratch disk hides: every step
/// would fail with `can't cd` after the guests' boots (seen with a checkout
/// under /var/tmp).
pub fn check_visible(paths: &[(&str, &Path)]) -> anyhow::Result<()> {
    for (what, path) in paths {
        if path.starts_with(SCRATCH_MOUNT) {
            bail!(
                "{what} {} is under {SCRATCH_MOUNT}, where the guests mount their scratch disk: \
                 they would not see it; use one elsewhere",
                path.display()
            );
        }
    }
    Ok(())
}

pub struct Machine {
    pub memory: String,
    pub cpus: u32,
    pub timeout: Duration,
    /// Set when guests run side by side: every line of this guest's output
    /// and every message about it starts with `[label]`.
    pub label: Option<String>,
}

impl Machine {
    fn say(&self, msg: impl AsRef<str>) {
        match &self.label {
            Some(label) => say(format!("[{label}] {}", msg.as_ref())),
            None => say(msg),
        }
    }

    /// What names this guest in its kernel's queue: its label, or the
    /// kernel's release where it has none.
    pub fn queue_name(&self, kernel: &Kernel) -> String {
        self.label.clone().unwrap_or_else(|| kernel.release.clone())
    }
}

/// How long before the run's timeout the guest records what every task is
/// waiting on (`hang.txt`): a run that hangs then says where.
const HANG_REPORT_BEFORE_TIMEOUT: Duration = Duration::from_secs(60);

/// The shell script guest `guest` runs: load modules, run each step of
/// `queue` no other guest has taken with its output in files, write the
/// exit status last. After `hang_report`, a background shell writes each
/// user task's state and kernel stack to `hang.txt` and asks the kernel
/// for its blocked tasks (console).
fn script(
    dir: &Path,
    (queue, guest): (&Queue, &str),
    (steps, binaries): (&[Step], bool),
    env: &Env,
    hang_report: Option<Duration>,
) -> String {
    let d = quote(&dir.to_string_lossy());
    let mut s = String::from("#!/bin/sh\n# written by `cargo xtask vm`\n");
    s.push_str(&format!("exec > {d}/stdout 2> {d}/stderr\n"));
    // virtme-ng-init starts the host's systemd-udevd, which the host itself
    // does not run: it probes every block device a writer closes, so a test
    // that fails a disk saw reads it never made (a_vanished_disk: 6 failed
    // reads instead of 2). Stopped, the guest is like the host the suite
    // is written for; devtmpfs still creates the device nodes. The init
    // starts it on a thread of its own, beside this script: on a busy host
    // (guests side by side) it appeared only after a check here had found
    // none. So where the init finds a udevd (its own search: the two
    // systemd paths, then `udevd` on PATH), wait for the process, for up
    // to 60 s, then ask it to exit until it is gone (its control socket
    // may not answer yet), for up to 10 s more.
    s.push_str(
        "udevd=; for c in /usr/lib/systemd/systemd-udevd /lib/systemd/systemd-udevd $(command -v udevd); do \
         [ -x \"$c\" ] && udevd=$c && break; done\n\
         if [ -n \"$udevd\" ]; then \
         n=0; while [ $n -lt 600 ] && ! grep -qsx -e systemd-udevd -e udevd /proc/[0-9]*/comm; do n=$((n+1)); sleep 0.1; done; \
         n=0; while [ $n -lt 100 ] && grep -qsx -e systemd-udevd -e udevd /proc/[0-9]*/comm; do \
         udevadm control --exit 2>/dev/null; n=$((n+1)); sleep 0.1; done; \
         if grep -qsx -e systemd-udevd -e udevd /proc/[0-9]*/comm; then \
         echo 'xtask vm: udevd would not stop; it probes the disks the tests fail' >&2; fi; fi\n",
    );
    // The scratch disk is the virtio disk with its serial (the others are
    // the tests', see `devices`).
    s.push_str(&format!(
        "modprobe -q virtio_blk; {find}\
         if [ -n \"$scratch\" ] && mount -t ext4 $scratch {m}; then chmod 1777 {m}; export TMPDIR={m}; \
         else echo 'xtask vm: no scratch disk; temporary files stay in memory' >&2; fi\n",
        find = devices::find_by_serial("scratch", devices::SCRATCH_SERIAL),
        m = SCRATCH_MOUNT
    ));
    if binaries {
        s.push_str(&super::binaries::mount_lines(&d));
    }
    // A node has its cgroups mounted (the stall tests name the writer's
    // cgroup); where the init mounted none, cgroup v2 as systemd mounts it.
    s.push_str(
        "mountpoint -q /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup \
         || echo 'xtask vm: could not mount cgroup2 at /sys/fs/cgroup' >&2\n",
    );
    s.push_str(&format!(
        "for m in {}; do modprobe -q \"$m\" || echo \"xtask vm: modprobe $m failed\" >&2; done\n",
        PRELOAD_MODULES.join(" ")
    ));
    // The guest counts as up once it is ready for the command; `started`
    // says what shares the host's root (tools.rs: virtiofs, not 9p).
    s.push_str(&format!(
        "awk '$2 == \"/\" {{ t = $3 }} END {{ print t }}' /proc/mounts > {d}/started.tmp \
         && mv {d}/started.tmp {d}/started\n"
    ));
    if let Some(after) = hang_report {
        s.push_str(&format!(
            "(sleep {secs}; {{ echo \"xtask vm: still running after {secs} s; every user task:\"; \
             for t in /proc/[0-9]*/task/[0-9]*; do \
             [ -n \"$(tr -d '\\000' < $t/cmdline 2>/dev/null | head -c 1)\" ] || continue; \
             echo \"== $t $(cat $t/comm 2>/dev/null) $(grep '^State:' $t/status 2>/dev/null) wchan=$(cat $t/wchan 2>/dev/null)\"; \
             cat $t/stack 2>/dev/null; done; }} > {d}/hang.txt 2>&1; \
             echo w > /proc/sysrq-trigger 2>/dev/null) &\n",
            secs = after.as_secs()
        ));
    }
    for (key, value) in env {
        s.push_str(&format!("export {key}={}\n", quote(value)));
    }
    s.push_str("status=0\n");
    s.push_str(&code_patching_guard());
    let announce = steps.len() > 1;
    for (i, step) in steps.iter().enumerate() {
        let argv: Vec<String> = step.argv.iter().map(|a| quote(a)).collect();
        let label = quote(&step.label);
        let mut body = String::new();
        if announce {
            body.push_str(&format!("echo \"xtask vm: running \"{label} >&2\n"));
        }
        body.push_str("t0=$(date +%s.%N)\n");
        body.push_str(&format!(
            "(cd {} && exec {})\nrc=$?\n",
            quote(&step.cwd.to_string_lossy()),
            argv.join(" ")
        ));
        body.push_str("[ $rc -eq 0 ] || status=$rc\n");
        if announce {
            body.push_str(&format!(
                "echo \"xtask vm: \"{label}\" exited with $rc after $(echo \"$t0 $(date +%s.%N)\" | awk '{{printf \"%.1f\", $2 - $1}}') s\" >&2\n"
            ));
        }
        s.push_str(&queue.take_and_run(i, guest, &body));
    }
    // Renamed into place, so the host never reads a half-written status.
    s.push_str(&format!(
        "echo $status > {d}/status.tmp && mv {d}/status.tmp {d}/status\n"
    ));
    s
}

/// Where the guest mounts tracefs for a moment, to set it up.
const GUEST_TRACEFS: &str = "/run/xtask-vm-tracefs";

/// The block layer's tracepoints the agent attaches to, on every I/O's path
/// (`health_kernel::probes::block_tracepoints`, checked below), as tracefs
/// names them under `events/`.
const HOT_AGENT_EVENTS: &[&str] = &[
    "block/block_rq_error",
    "block/block_rq_complete",
    "block/block_bio_complete",
];

/// Shell lines that keep the kernel from rewriting hot code while the
/// suites run, or fail the run.
///
/// Enabling a tracepoint's first probe, or going from one probe to two,
/// makes the kernel patch the tracepoint's sites (its static key and static
/// call) with an int3 while the other vCPU may be running them. QEMU TCG
/// does not always execute that as the kernel means, and the guest dies
/// with "Oops: int3": the CI run of stop 34 in ttwu_do_activate (6.12).
/// Here in a 6.12 guest, toggling one event of a tracefs instance under a
/// pipe load killed the guest within 42 s (in __schedule), and toggling
/// [`HOT_AGENT_EVENTS`] under direct I/O within 15 s (in
/// blk_update_request); with this guard, 1,500 and 5,000 such toggles
/// passed. Real hardware is not affected, so the product does nothing about
/// it.
/// * `record-cmd` off: with it on (the default), enabling any trace event,
///   as the agent's witness does, also hooks sched_switch and sched_wakeup,
///   whose sites run all the time. New instances copy the top-level flag.
/// * Two tracefs instances, not tracing, with those events enabled: the
///   agent's programs and witness then take those tracepoints from two
///   probes to more and back, which the kernel does without patching code.
///
/// Nothing the suites assert depends on recorded command names or on other
/// instances.
fn code_patching_guard() -> String {
    let t = GUEST_TRACEFS;
    let events = HOT_AGENT_EVENTS.join(" ");
    format!(
        "if (mkdir -p {t} && mount -t tracefs tracefs {t} && echo 0 > {t}/options/record-cmd || exit 1; \
         for i in a b; do p={t}/instances/xtask-vm-pin-$i; mkdir $p && echo 0 > $p/tracing_on || exit 1; \
         for e in {events}; do f=$p/events/$e/enable; [ ! -e $f ] || echo 1 > $f || exit 1; done; done; \
         umount {t}); then :; \
         else echo 'xtask vm: could not keep the kernel from patching hot code (tracefs)' >&2; status=1; fi\n"
    )
}

/// What happened in the guest.
pub struct Outcome {
    pub exit_code: i32,
    pub boot: Duration,
    pub command: Duration,
    /// What the sparse scratch disk took of the host's disk at the end:
    /// the most the guest's files ever needed (its ext4 reuses freed
    /// blocks, and nothing is discarded), against [`MIN_HOST_FREE`].
    pub scratch_bytes: Option<u64>,
    /// Each failed test's name and message ([`super::failures::digest`]).
    pub failures: Vec<String>,
}

/// Boots `kernel`, runs the steps of `queue` no other guest takes first in
/// it and relays their output live. `machine.label` names the guest in the
/// queue (the kernel's series where it has no label). `binaries`: the
/// image of the steps' programs ([`super::binaries`]), attached read-only.
pub fn run_in_guest(
    tools: &Tools,
    kernel: &Kernel,
    machine: &Machine,
    (queue, steps): (&Queue, &[Step]),
    (env, binaries): (&Env, Option<&Path>),
) -> anyhow::Result<Outcome> {
    // Inside the queue's directory, which is what the guest may write.
    let dir = tempfile::Builder::new()
        .prefix("guest-")
        .tempdir_in(queue.path())
        .context("creating the guest's own directory")?;
    let guest = machine.queue_name(kernel);
    let scratch = scratch_disk(dir.path())?;
    let script_path = dir.path().join("run.sh");
    let hang_report = machine
        .timeout
        .checked_sub(HANG_REPORT_BEFORE_TIMEOUT)
        .filter(|d| *d >= HANG_REPORT_BEFORE_TIMEOUT);
    // The tests find the guest's faulty disks and QMP port by these.
    let mut env = env.clone();
    env.extend(devices::guest_env());
    fs::write(
        &script_path,
        script(
            dir.path(),
            (queue, &guest),
            (steps, binaries.is_some()),
            &env,
            hang_report,
        ),
    )
    .with_context(|| format!("writing {}", script_path.display()))?;
    let console = dir.path().join("console.log");
    let console_file =
        File::create(&console).with_context(|| format!("creating {}", console.display()))?;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![tools.venv_bin.clone(), tools.virtiofsd_bin.clone()];
    paths.extend(std::env::split_paths(&path));
    let mut cmd = Command::new(&tools.vng);
    cmd.arg("--run")
        .arg(&kernel.vmlinuz)
        // KVM guests hang on this machine kind (no working nested
        // virtualization); TCG is slower but boots.
        .arg("--disable-kvm")
        .args(["--memory", &machine.memory])
        .args(["--cpus", &machine.cpus.to_string()])
        .arg("--rwdir")
        .arg(queue.path())
        .arg(format!(
            "--append=modprobe.blacklist={}",
            UNUSED_MODULES.join(",")
        ))
        // The kernel log goes to the console: what we show when the guest
        // does not come up.
        .arg("--verbose")
        // One word with `=`: argparse would take a separate "-drive..."
        // for an option of its own.
        .arg(format!(
            "--qemu-opts={}",
            devices::qemu_opts(dir.path(), &scratch, binaries)?
        ))
        // Ours, not whichever busybox virtme-ng would find (tools.rs).
        .arg("--busybox")
        .arg(&tools.busybox)
        .arg("--exec")
        .arg(format!("sh {}", quote(&script_path.to_string_lossy())))
        // vng starts virtme-run from PATH.
        .env(
            "PATH",
            std::env::join_paths(paths).context("building PATH for vng")?,
        )
        .stdin(Stdio::null())
        .stdout(
            console_file
                .try_clone()
                .context("duplicating the console log")?,
        )
        .stderr(console_file);
    machine.say(format!(
        "booting {} ({} {}) under QEMU TCG, {} vCPUs, {} memory, no network",
        kernel.release, kernel.package, kernel.version, machine.cpus, machine.memory
    ));
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", tools.vng.display()))?;
    match follow(&mut child, dir.path(), machine, start) {
        Ok(outcome) => Ok(Outcome {
            scratch_bytes: Some(
                fs::metadata(&scratch)
                    .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
                    .with_context(|| format!("reading {}", scratch.display()))?,
            ),
            ..outcome
        }),
        Err(e) => {
            kill_tree(child.id());
            let _ = child.wait();
            // Keep the evidence: the script, the console and the output files.
            let _ = fs::remove_file(&scratch);
            let kept = dir.keep();
            let hang = kept.join("hang.txt");
            let stacks = if hang.exists() {
                format!(
                    "\nwhat each user task waited on {} s before the timeout ({}):\n{}",
                    HANG_REPORT_BEFORE_TIMEOUT.as_secs(),
                    hang.display(),
                    tail(&hang, 150)
                )
            } else {
                String::new()
            };
            // Context, not a new error: the caller tells a stall apart.
            Err(e.context(format!(
                "the guest's files are kept in {}; the last 40 lines of its console:\n{}{stacks}",
                kept.display(),
                tail(&kept.join("console.log"), 40)
            )))
        }
    }
}

/// A sparse ext4 image for the guest's temporary files. virtme-ng's /tmp is
/// an overlay whose upper layer is a tmpfs: it holds everything in guest
/// memory, and a loop device over a file there fails write-zeroes requests
/// (no FALLOC_FL_ZERO_RANGE), which the kernel tests would see as I/O errors
/// the host never makes. ext4 behaves as the host's root does.
fn scratch_disk(dir: &Path) -> anyhow::Result<PathBuf> {
    let free = nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available() * s.fragment_size())
        .with_context(|| format!("statvfs {}", dir.display()))?;
    if free < MIN_HOST_FREE {
        bail!(
            "only {} MiB free under {}: the guest's scratch disk and the tests' images need {} MiB (free some space, e.g. old target directories)",
            free >> 20,
            dir.display(),
            MIN_HOST_FREE >> 20
        );
    }
    let image = dir.join("scratch.img");
    run(Command::new("truncate")
        .args(["-s", SCRATCH_SIZE])
        .arg(&image))
    .context("creating the scratch disk image")?;
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-E", "nodiscard"])
        .arg(&image))
    .context("formatting the scratch disk (package e2fsprogs)")?;
    Ok(image)
}

/// Relays the guest's output files until its status appears, watching the
/// boot limit, the overall timeout and an early exit of QEMU.
fn follow(
    child: &mut Child,
    dir: &Path,
    machine: &Machine,
    start: Instant,
) -> anyhow::Result<Outcome> {
    let timeout = machine.timeout;
    let label = machine.label.as_deref();
    let mut out = Relay::new(dir.join("stdout"), label);
    let mut err = Relay::new(dir.join("stderr"), label);
    let mut booted: Option<Duration> = None;
    let mut turns: u64 = 0;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        turns += 1;
        if turns.is_multiple_of(25) {
            if let Some(line) = soft_lockup(&dir.join("console.log")) {
                return Err(GuestStalled { line }.into());
            }
        }
        out.pump(&mut std::io::stdout())?;
        err.pump(&mut std::io::stderr())?;
        let elapsed = start.elapsed();
        if booted.is_none() && dir.join("started").exists() {
            booted = Some(elapsed);
            machine.say(format!("guest up after {:.1} s", elapsed.as_secs_f64()));
            let root = fs::read_to_string(dir.join("started")).unwrap_or_default();
            check_root_share(root.trim())?;
        }
        if let Ok(text) = fs::read_to_string(dir.join("status")) {
            let exit_code: i32 = text
                .trim()
                .parse()
                .with_context(|| format!("bad status file from the guest: {text:?}"))?;
            let boot = booted.unwrap_or(elapsed);
            let command = elapsed.saturating_sub(boot);
            wait_poweroff(child, machine);
            out.drain(&mut std::io::stdout())?;
            err.drain(&mut std::io::stderr())?;
            // No file: the guest printed nothing.
            let stdout = match fs::read(dir.join("stdout")) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                read => read.context("reading the guest's stdout again for its failures")?,
            };
            return Ok(Outcome {
                exit_code,
                boot,
                command,
                scratch_bytes: None,
                failures: super::failures::digest(&String::from_utf8_lossy(&stdout)),
            });
        }
        if let Some(status) = child.try_wait().context("waiting for QEMU")? {
            if dir.join("status").exists() {
                continue; // written just before power-off: the next turn reads it
            }
            out.drain(&mut std::io::stdout())?;
            err.drain(&mut std::io::stderr())?;
            match booted {
                None => match kernel_oops(&dir.join("console.log")) {
                    Some(line) => return Err(BootCrashed { line }.into()),
                    None => bail!("QEMU exited ({status}) before the guest came up"),
                },
                Some(_) => bail!(
                    "QEMU exited ({status}) before the command finished: the guest crashed, \
                     panicked or ran out of memory"
                ),
            }
        }
        if booted.is_none() && elapsed > BOOT_LIMIT.min(timeout) {
            bail!(
                "the guest did not come up within {} s",
                BOOT_LIMIT.min(timeout).as_secs()
            );
        }
        if elapsed > timeout {
            bail!(
                "timed out after {} s (--timeout); the command was still running",
                timeout.as_secs()
            );
        }
    }
}

/// The guest's kernel saw a CPU stuck in the kernel for tens of seconds.
/// Under TCG on this machine kind that is QEMU's stall, not a test's: a
/// CPU spinning on a code-patching breakpoint (text_poke_bp) while the
/// other waits for it in an IPI (seen on 6.1 when a tracepoint is
/// switched). The caller runs the steps again in a fresh guest, once.
#[derive(Debug, thiserror::Error)]
#[error("the guest's kernel reported a soft lockup: {line}")]
pub struct GuestStalled {
    pub line: String,
}

/// The guest's kernel died before the guest came up, before any command:
/// under TCG that is QEMU's fault (seen on 6.12, 2026-11-30: `Oops: int3`
/// in `sched_clock_cpu` during the kernel's own initcalls, the same
/// mis-executed live patching as [`GuestStalled`]'s). Nothing of the
/// steps ran, so the caller boots a fresh guest for them, once.
#[derive(Debug, thiserror::Error)]
#[error("the guest's kernel crashed before it came up: {line}")]
pub struct BootCrashed {
    pub line: String,
}

/// The console's first kernel oops or panic line, if any.
fn kernel_oops(console: &Path) -> Option<String> {
    first_console_line(console, &["Oops:", "Kernel panic"])
}

/// The console's first soft lockup report, if any.
fn soft_lockup(console: &Path) -> Option<String> {
    first_console_line(console, &["BUG: soft lockup"])
}

/// The first line of the console holding one of `marks`, trimmed.
fn first_console_line(console: &Path, marks: &[&str]) -> Option<String> {
    let text = fs::read(console).ok()?;
    String::from_utf8_lossy(&text)
        .lines()
        .find(|l| marks.iter().any(|m| l.contains(m)))
        .map(|l| l.trim().to_string())
}

fn wait_poweroff(child: &mut Child, machine: &Machine) {
    let deadline = Instant::now() + POWEROFF_LIMIT;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    machine.say("the guest did not power off; stopping QEMU");
    kill_tree(child.id());
    let _ = child.wait();
}

/// What the guest's root must be shared over: virtio-fs. Over 9p (what
/// virtme-ng falls back to when virtiofsd does not start) every suite
/// passes at a third of the speed, which CI's time cannot afford: said at
/// once instead.
fn check_root_share(fs_type: &str) -> anyhow::Result<()> {
    if fs_type != "virtiofs" {
        bail!(
            "the guest's root is shared over {fs_type:?}, not virtiofs: virtme-ng did not \
             start virtiofsd from xtask's tools cache (the console below says why)"
        );
    }
    Ok(())
}

/// SIGKILLs `pid` and everything it started (vng runs QEMU through a
/// shell and virtme-run, so killing vng alone would leave QEMU running).
pub fn kill_tree(pid: u32) {
    let mut pids = vec![pid];
    let mut i = 0;
    while i < pids.len() {
        let p = pids[i];
        if let Ok(tasks) = fs::read_dir(format!("/proc/{p}/task")) {
            for task in tasks.flatten() {
                let children = fs::read_to_string(task.path().join("children")).unwrap_or_default();
                pids.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
        i += 1;
    }
    for p in pids {
        // SAFETY: kill(2) with a pid we started or one of its descendants.
        unsafe {
            libc::kill(p as libc::pid_t, libc::SIGKILL);
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_shared_over_9p_is_refused() {
        assert!(check_root_share("virtiofs").is_ok());
        let err = check_root_share("9p").unwrap_err().to_string();
        assert!(
            err.starts_with("the guest's root is shared over \"9p\", not virtiofs"),
            "{err}"
        );
        assert!(check_root_share("").is_err());
    }

    #[test]
    fn paths_under_the_scratch_mount_are_refused() {
        let err = check_visible(&[
            ("the checkout", Path::new("/work/main")),
            (
                "the tools cache",
                Path::new("/var/tmp/cache/volume-health/tools"),
            ),
        ])
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the tools cache /var/tmp/cache/volume-health/tools is under /var/tmp, where the guests \
             mount their scratch disk: they would not see it; use one elsewhere"
        );
        // A name that only begins the same way is elsewhere.
        check_visible(&[("the checkout", Path::new("/var/tmpx/main"))]).unwrap();
    }

    #[test]
    fn a_soft_lockup_on_the_console_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let console = dir.path().join("console.log");
        fs::write(
            &console,
            "[  1.0] booting\n[ 352.6] rcu: INFO: rcu_preempt self-detected stall on CPU\n",
        )
        .unwrap();
        assert_eq!(
            soft_lockup(&console),
            None,
            "an RCU stall report alone is not it"
        );
        fs::write(
            &console,
            "[  1.0] booting\n[ 380.530462] watchdog: BUG: soft lockup - CPU#0 stuck for 49s! [health-events:1516]\n[ 408.5] watchdog: BUG: soft lockup - CPU#0 stuck for 75s!\n",
        )
        .unwrap();
        assert_eq!(
            soft_lockup(&console).as_deref(),
            Some("[ 380.530462] watchdog: BUG: soft lockup - CPU#0 stuck for 49s! [health-events:1516]")
        );
        assert_eq!(soft_lockup(&dir.path().join("missing")), None);
    }

    #[test]
    fn a_kernel_that_died_while_booting_is_told_by_its_oops() {
        let dir = tempfile::tempdir().unwrap();
        let console = dir.path().join("console.log");
        fs::write(
            &console,
            "[    0.0] Linux version 6.12.118\n[    5.4] Call Trace:\n",
        )
        .unwrap();
        assert_eq!(kernel_oops(&console), None);
        fs::write(
            &console,
            "[    5.48] RIP: 0010:sched_clock_cpu+0x9/0x1d0\n[    5.490593] Oops: int3: 0000 [#2] PREEMPT SMP NOPTI\n[    5.491835] Kernel panic - not syncing: Fatal exception in interrupt\n",
        )
        .unwrap();
        assert_eq!(
            kernel_oops(&console).as_deref(),
            Some("[    5.490593] Oops: int3: 0000 [#2] PREEMPT SMP NOPTI")
        );
        assert_eq!(kernel_oops(&dir.path().join("missing")), None);
    }

    #[test]
    fn the_hot_events_are_the_agents_block_tracepoints() {
        let agent: Vec<String> = health_kernel::probes::block_tracepoints()
            .map(|(group, name)| format!("{group}/{name}"))
            .collect();
        assert_eq!(HOT_AGENT_EVENTS, agent);
    }

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn script_writes_status_last() {
        let steps = [Step {
            label: "x".into(),
            cwd: "/".into(),
            argv: vec!["echo".into(), "a b".into()],
            only: None,
        }];
        let queue = Queue::new(1).unwrap();
        let q = quote(&queue.path().to_string_lossy());
        let s = script(
            Path::new("/tmp/d"),
            (&queue, "6.1"),
            (&steps, true),
            &vec![("K".into(), "v".into())],
            Some(Duration::from_secs(540)),
        );
        assert!(s.contains("(sleep 540; "), "{s}");
        assert!(s.contains("> '/tmp/d'/hang.txt 2>&1"), "{s}");
        assert!(s.contains("(cd '/' && exec 'echo' 'a b')"), "{s}");
        // Taken from the queue first, its exit code left there.
        let taken = s.find(&format!("if mkdir {q}/0 2>/dev/null; then"));
        assert!(taken.is_some() && taken < s.find("exec 'echo'"), "{s}");
        assert!(s.contains(&format!("echo '6.1' > {q}/0/by")), "{s}");
        assert!(s.contains(&format!("mv {q}/0/rc.tmp {q}/0/rc")), "{s}");
        assert!(
            s.trim_end()
                .ends_with("mv '/tmp/d'/status.tmp '/tmp/d'/status"),
            "{s}"
        );
        assert!(s.contains("export K='v'"));
        // The scheduler's tracepoints stay unpatched before the command runs.
        let off = s.find("echo 0 > /run/xtask-vm-tracefs/options/record-cmd");
        assert!(
            s.contains(
                "for e in block/block_rq_error block/block_rq_complete block/block_bio_complete;"
            ),
            "{s}"
        );
        let command = s.find("exec 'echo'");
        assert!(off.is_some() && off < command, "{s}");
        // udevd is waited for and stopped before the guest counts as up.
        let udevd = s.find("udevadm control --exit");
        // `started` names the root's filesystem, written whole.
        let started = s.find("mv '/tmp/d'/started.tmp '/tmp/d'/started");
        assert!(udevd.is_some() && udevd < started, "{s}");
        // The programs' disk is mounted before the guest counts as up, or
        // the run ends with a status.
        let mounted = s.find("mount -t ext4 -o ro,noload $bin /run/xtask-vm-bin");
        assert!(mounted.is_some() && mounted < started, "{s}");
        assert!(s.contains("echo 1 > '/tmp/d'/status.tmp"), "{s}");
        // And the whole is valid sh.
        let checked = Command::new("sh")
            .arg("-n")
            .arg("-c")
            .arg(&s)
            .status()
            .unwrap();
        assert!(checked.success(), "sh -n refused the script:\n{s}");
    }
}
