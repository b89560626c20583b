//! The image's arm64 agent on Debian's arm64 kernels: each guest is
//! qemu-system-aarch64 (TCG, a Neoverse N1 as in Graviton2 and Ampere
//! Altra nodes) booting one of Debian's arm64 kernels with an initramfs
//! made of the image's arm64 files (exactly those of `ROOTFS_ARM64`),
//! Debian's static arm64 busybox and the kernel's own modules. In it the
//! agent watches a pod volume (a local PV: ext4 on a memory-backed
//! null_blk disk, bind-mounted where the kubelet has it) while `dd`
//! reads one bad block of a file there and writes another, with O_DIRECT.
//! Each failed request must be counted once, on that disk, for that pod
//! volume, and raise its condition; where fexit attaches (6.12, not 5.10
//! or 6.1 on arm64) each failed call is also counted as returned to `dd`.
//! Every source the kernel offers must attach, and each it lacks be said
//! as on amd64 (`cargo xtask vm` on the same series), but for fentry and
//! fexit.
//!
//! `cargo xtask test` fetches the kernels and busybox (`cargo xtask
//! arm64-guests`, which prints the variable this reads). The guest's
//! output comes back on a disk of its own (a tar of `/out`), not on its
//! console, where the kernel's lines interleave.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use health_tests::cmd;
use serde_json::Value;

use super::built;

/// Set by `cargo xtask test` (`xtask::vm::arm64_guests::ENV`).
const GUESTS_ENV: &str = "HEALTH_ARM64_GUESTS";
/// A guest boots and runs its scenario in about 10 s here; TCG on a busy
/// host (the other image tests, two other guests) takes longer.
const GUEST_TIMEOUT: Duration = Duration::from_secs(300);
const POD: &str = "6f1c2a9e-0c7b-4e55-9d3a-7a1e0b2c3d4e";
const PV: &str = "pv-arm64";
/// The modules the scenario uses: the output disk (a PCI virtio disk:
/// 6.12 has virtio_pci built in, 6.1 as a module), the fault disk, the
/// filesystems whose tracepoints the agent attaches when their modules
/// are loaded, ext4's checksums. Each is loaded with what modules.dep says
/// it needs; one the kernel has built in is skipped.
const MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_blk",
    "configfs",
    "null_blk",
    "crc32c_generic",
    "ext4",
    "xfs",
];

/// What one kernel series offers, as the agent says at start: its sources'
/// lines, in the order printed.
struct Series {
    name: &'static str,
    sources: fn() -> Vec<String>,
    /// fexit attaches: the failed calls are counted as returned to `dd`
    /// too. arm64 has BPF trampolines from 6.0, and attaches them to kernel
    /// functions through ftrace direct calls, which 6.1 lacks (ENOTSUPP,
    /// error 524, where amd64's 5.10 and 6.1 attach).
    returned: bool,
    /// Where failed requests are counted: `block_rq_error`, which 5.10 does
    /// not have (it counts them at `block_rq_complete`).
    request_source: &'static str,
    /// The programs are pinned (bpf perf links: Linux 5.15+).
    pins: bool,
}

/// What the agent says where it cannot pin.
const NO_PINS: &str = "this kernel cannot pin tracepoint attachments";

/// How this kernel refuses fentry and fexit (ENOTSUPP).
const NO_TRAMPOLINE: &str = "`bpf_raw_tracepoint_open` failed: Unknown error 524 (os error 524)";

/// ext4's sources, alike on every series.
fn ext4() -> Vec<String> {
    vec![
        "active   ext4:ext4_error".into(),
        "active   ext4:ext4_shutdown".into(),
    ]
}

/// The xfs corruption markers 5.10 and 6.1 lack (with xfs loaded).
fn no_xfs_markers() -> Vec<String> {
    vec![
        "missing  xfs_fs_mark_corrupt: this kernel has no xfs:xfs_fs_mark_corrupt".into(),
        "missing  xfs_group_mark_corrupt: this kernel has no xfs:xfs_group_mark_corrupt \
         or xfs:xfs_ag_mark_corrupt"
            .into(),
        "missing  xfs_inode_mark_corrupt: this kernel has no xfs:xfs_inode_mark_corrupt".into(),
    ]
}

fn writeback_errno_without_fentry() -> String {
    format!(
        "active   filemap:filemap_set_wb_err (errno only when the file already had one: \
         fentry on __filemap_set_wb_err: {NO_TRAMPOLINE})"
    )
}

const V5_10: Series = Series {
    name: "5.10",
    sources: || {
        let mut s = vec![
            "active   block:block_bio_complete".to_string(),
            "active   block:block_rq_complete (all failed requests: fallback; tracefs; \
             tp_btf refused: kernels without block_rq_error keep tracefs)"
                .into(),
            "missing  block_rq_error: this kernel has no block:block_rq_error; \
             using block_rq_complete"
                .into(),
        ];
        s.extend(ext4());
        s.push(writeback_errno_without_fentry());
        s.push(format!(
            "missing  returned_errors: fexit on vfs_read: {NO_TRAMPOLINE}; \
             fexit on vfs_write: {NO_TRAMPOLINE}; vfs_readv: not in the kernel's BTF; \
             vfs_writev: not in the kernel's BTF; fexit on vfs_fsync: {NO_TRAMPOLINE}"
        ));
        s.push("missing  xfs_force_shutdown: this kernel has no xfs:xfs_force_shutdown".into());
        s.extend(no_xfs_markers());
        s
    },
    returned: false,
    request_source: "block_rq_complete",
    pins: false,
};

const V6_1: Series = Series {
    name: "6.1",
    sources: || {
        let mut s = vec![
            "active   block:block_bio_complete".to_string(),
            "active   block:block_rq_complete (flush errors only; tp_btf)".into(),
            "active   block:block_rq_error (tp_btf)".into(),
        ];
        s.extend(ext4());
        s.push(writeback_errno_without_fentry());
        let fexit: Vec<String> = [
            "vfs_read",
            "vfs_write",
            "vfs_readv",
            "vfs_writev",
            "vfs_fsync",
        ]
        .iter()
        .map(|f| format!("fexit on {f}: {NO_TRAMPOLINE}"))
        .collect();
        s.push(format!("missing  returned_errors: {}", fexit.join("; ")));
        s.push("active   xfs:xfs_force_shutdown".into());
        s.extend(no_xfs_markers());
        s
    },
    returned: false,
    request_source: "block_rq_error",
    pins: true,
};

/// Every source, as on amd64's 6.12.
const V6_12: Series = Series {
    name: "6.12",
    sources: || {
        let mut s = vec![
            "active   block:block_bio_complete".to_string(),
            "active   block:block_rq_complete (flush errors only; tp_btf)".into(),
            "active   block:block_rq_error (tp_btf)".into(),
        ];
        s.extend(ext4());
        s.extend([
            "active   filemap:filemap_set_wb_err".into(),
            "active   fexit:vfs_read,vfs_write,vfs_readv,vfs_writev,vfs_fsync".into(),
            "active   xfs:xfs_force_shutdown".into(),
            "active   xfs:xfs_fs_mark_corrupt".into(),
            "active   xfs:xfs_ag_mark_corrupt".into(),
            "active   xfs:xfs_inode_mark_corrupt".into(),
        ]);
        s
    },
    returned: true,
    request_source: "block_rq_error",
    pins: true,
};

#[test]
fn the_arm64_agent_counts_a_failed_read_and_write_on_its_volume_on_5_10() -> Result<()> {
    scenario(&V5_10)
}

#[test]
fn the_arm64_agent_counts_a_failed_read_and_write_on_its_volume_on_6_1() -> Result<()> {
    scenario(&V6_1)
}

#[test]
fn the_arm64_agent_counts_a_failed_read_and_write_on_its_volume_on_6_12() -> Result<()> {
    scenario(&V6_12)
}

/// One kernel's guest: boot, then every count, name and line checked.
fn scenario(series: &Series) -> Result<()> {
    let built = built()?;
    let guests = std::env::var_os(GUESTS_ENV)
        .map(PathBuf::from)
        .with_context(|| {
            format!(
                "{GUESTS_ENV} is not set: `cargo xtask test` sets it; alone, run \
             `cargo xtask arm64-guests` and export what it prints"
            )
        })?;
    let kernel = guests.join(series.name);
    let dir = super::scratch().join(format!("guest-{}", series.name));
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(&dir)?;
    let release = release_of(&kernel)?;
    let volume = Volume::make(&dir)?;
    let initrd = initramfs(&dir, &built.arm64, &guests, &kernel, &release, &volume)?;
    let started = std::time::Instant::now();
    let out = boot(&dir, &kernel.join("vmlinuz"), &initrd)?;
    // The guest's cost, for docs/benchmarks.md ("CI").
    eprintln!(
        "arm64 guest {release}: booted, ran and powered off in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    check(series, &release, &volume, &out)
}

/// The only release under the kernel's module root.
fn release_of(kernel: &Path) -> Result<String> {
    let modules = kernel.join("root/lib/modules");
    let names: Vec<String> = fs::read_dir(&modules)
        .with_context(|| format!("listing {}", modules.display()))?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    match names.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!("{} holds {names:?}, not one release", modules.display()),
    }
}

/// The volume's filesystem, made here (mkfs.ext4 writes the same bytes for
/// any architecture): one 64 KiB file, `data`, whose first block the
/// guest's read fails on and whose second its write does.
struct Volume {
    image: PathBuf,
    /// The 512-byte sectors of those two blocks.
    read_sector: u64,
    write_sector: u64,
}

const BLOCK: u64 = 4096;
const SECTORS_PER_BLOCK: u64 = BLOCK / 512;

impl Volume {
    fn make(dir: &Path) -> Result<Volume> {
        let content = dir.join("content");
        fs::create_dir_all(&content)?;
        let data: Vec<u8> = (0..16 * BLOCK).map(|i| (i * 7 % 251) as u8).collect();
        fs::write(content.join("data"), data)?;
        let image = dir.join("volume.img");
        cmd::run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-b",
                &BLOCK.to_string(),
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
                "-d",
                &content.to_string_lossy(),
                &image.to_string_lossy(),
                "32M",
            ],
        )?;
        let block = |n: u32| -> Result<u64> {
            let out = cmd::run(
                "debugfs",
                &["-R", &format!("bmap /data {n}"), &image.to_string_lossy()],
            )?;
            out.stdout
                .trim()
                .parse()
                .with_context(|| format!("debugfs bmap /data {n}: {:?}", out.stdout))
        };
        Ok(Volume {
            read_sector: block(0)? * SECTORS_PER_BLOCK,
            write_sector: block(1)? * SECTORS_PER_BLOCK,
            image,
        })
    }
}

/// The guest's initramfs: the image's arm64 files, busybox, the modules
/// (decompressed: busybox's insmod reads plain ELF), the volume image and
/// `/init`, archived by cpio.
fn initramfs(
    dir: &Path,
    image: &super::Unpacked,
    guests: &Path,
    kernel: &Path,
    release: &str,
    volume: &Volume,
) -> Result<PathBuf> {
    let root = dir.join("initramfs");
    copy_listed(&image.rootfs, &image.listing, &root)?;
    fs::create_dir_all(root.join("bin"))?;
    fs::copy(guests.join("busybox"), root.join("bin/busybox"))
        .context("copying the arm64 busybox")?;
    let modules = kernel.join("root/lib/modules").join(release);
    let order = load_order(&modules, MODULES)?;
    let mut loaded = Vec::new();
    for module in &order {
        let from = modules.join(module);
        let plain = module.strip_suffix(".xz").unwrap_or(module);
        let to = root.join("lib/modules").join(release).join(plain);
        fs::create_dir_all(to.parent().context("a module path has a parent")?)?;
        if module.ends_with(".xz") {
            let status = std::process::Command::new(cmd::find_tool("xz")?)
                .arg("-dc")
                .arg(&from)
                .stdout(fs::File::create(&to)?)
                .status()?;
            ensure!(
                status.success(),
                "xz -dc {} failed: {status}",
                from.display()
            );
        } else {
            fs::copy(&from, &to).with_context(|| format!("copying {module}"))?;
        }
        loaded.push(format!("/lib/modules/{release}/{plain}"));
    }
    fs::copy(&volume.image, root.join("volume.img"))?;
    let init = root.join("init");
    fs::write(&init, init_script(&loaded, volume))?;
    fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let initrd = dir.join("initrd.cpio");
    let list: String = walk(&root)?
        .iter()
        .map(|p| format!("{}\n", p.display()))
        .collect();
    let out = std::process::Command::new(cmd::find_tool("cpio")?)
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(&root)
        .stdin(std::process::Stdio::piped())
        .stdout(fs::File::create(&initrd)?)
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin is piped")
                .write_all(list.as_bytes())?;
            child.wait()
        })?;
    ensure!(out.success(), "cpio failed: {out}");
    Ok(initrd)
}

/// The entries of `listing` (as `super::list` writes them: type, mode,
/// path, link) copied from `from` to `to`.
fn copy_listed(from: &Path, listing: &[String], to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for line in listing {
        let mut words = line.splitn(3, ' ');
        let (kind, path) = match (words.next(), words.next(), words.next()) {
            (Some(kind), Some(_mode), Some(path)) => (kind, path),
            _ => bail!("not a listing line: {line:?}"),
        };
        match kind {
            "d" => fs::create_dir_all(to.join(path))?,
            "f" => {
                fs::copy(from.join(path), to.join(path))
                    .with_context(|| format!("copying {path}"))?;
            }
            "l" => {
                let (link, target) = path
                    .split_once(" -> ")
                    .with_context(|| format!("a link without its target: {line:?}"))?;
                symlink(target, to.join(link))?;
            }
            _ => bail!("unknown entry type in {line:?}"),
        }
    }
    Ok(())
}

/// Every path under `root`, relative (`.` first), parents before children.
fn walk(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = vec![PathBuf::from(".")];
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut entries: Vec<_> = fs::read_dir(root.join(&rel))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()?;
        entries.sort();
        for name in entries {
            let path = rel.join(name);
            if fs::symlink_metadata(root.join(&path))?.is_dir() {
                stack.push(path.clone());
            }
            out.push(Path::new(".").join(path));
        }
    }
    Ok(out)
}

/// The module files (relative to `modules`) to load for `wanted`, each
/// after what it needs, from modules.dep; modules.builtin's are left out.
fn load_order(modules: &Path, wanted: &[&str]) -> Result<Vec<String>> {
    let name_of = |path: &str| {
        let file = path.rsplit('/').next().unwrap_or(path);
        let stem = file.split(".ko").next().unwrap_or(file);
        stem.replace('-', "_")
    };
    let dep_text = fs::read_to_string(modules.join("modules.dep"))
        .with_context(|| format!("reading {}/modules.dep", modules.display()))?;
    let mut deps: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for line in dep_text.lines() {
        let Some((path, needs)) = line.split_once(':') else {
            continue;
        };
        let needs = needs.split_whitespace().map(str::to_string).collect();
        deps.insert(name_of(path), (path.to_string(), needs));
    }
    let builtin: BTreeSet<String> = fs::read_to_string(modules.join("modules.builtin"))
        .with_context(|| format!("reading {}/modules.builtin", modules.display()))?
        .lines()
        .map(name_of)
        .collect();
    fn visit(
        name: &str,
        deps: &BTreeMap<String, (String, Vec<String>)>,
        builtin: &BTreeSet<String>,
        order: &mut Vec<String>,
    ) -> Result<()> {
        if builtin.contains(name) {
            return Ok(());
        }
        let (path, needs) = deps
            .get(name)
            .with_context(|| format!("module {name} is neither in modules.dep nor built in"))?;
        if order.contains(path) {
            return Ok(());
        }
        for need in needs {
            let file = need.rsplit('/').next().unwrap_or(need);
            let stem = file.split(".ko").next().unwrap_or(file).replace('-', "_");
            visit(&stem, deps, builtin, order)?;
        }
        order.push(path.clone());
        Ok(())
    }
    let mut order = Vec::new();
    for name in wanted {
        visit(name, &deps, &builtin, &mut order)?;
    }
    Ok(order)
}

/// The guest's `/init`: mounts, modules, the fault disk and the pod
/// volume on it, the agent, the failed read and write, the agent stopped;
/// then `/out` onto the output disk and power off. Each step's status goes
/// to `/out/steps`; nothing stops the script before the output is saved.
fn init_script(modules: &[String], volume: &Volume) -> String {
    let mut insmod = String::new();
    for m in modules {
        let args = if m.ends_with("/null_blk.ko") {
            " nr_devices=0"
        } else {
            ""
        };
        writeln!(insmod, "step insmod insmod {m}{args}").expect("writing to a String");
    }
    let bad = |sector: u64| format!("+{sector}-{}", sector + SECTORS_PER_BLOCK - 1);
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/usr/local/bin
mkdir -p /proc /sys /dev /tmp /out
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
exec >/out/init.log 2>&1
step() {{ name=$1; shift; "$@"; echo "$name $?" >>/out/steps; }}
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
{insmod}mount -t configfs configfs /sys/kernel/config
uname -m -r >/out/uname
N=/sys/kernel/config/nullb/nullb0
mkdir $N
echo 32 >$N/size
echo 1 >$N/memory_backed
echo 4096 >$N/blocksize
echo 1 >$N/power
cat /sys/block/nullb0/dev >/out/nullb0.dev
step fill dd if=/volume.img of=/dev/nullb0 bs=1M
K=/var/lib/kubelet
L=$K/local/{PV}
P=$K/pods/{POD}/volumes/kubernetes.io~local-volume/{PV}
mkdir -p $L $P
step mount mount -t ext4 -o errors=continue /dev/nullb0 $L
step bind mount --bind $L $P
echo "{read}" >$N/badblocks
echo "{write}" >$N/badblocks
health-agent watch --json --kubelet-root $K --check-interval 1 --flush-errors --returned-errors --bio-errors always >/out/stdout 2>/out/stderr &
agent=$!
i=0
while ! grep -q "volume-health: ready" /out/stderr && [ $i -lt 240 ]; do sleep 1; i=$((i+1)); done
step read dd if=$P/data of=/dev/null bs=4096 count=1 iflag=direct
step write dd if=/dev/zero of=$P/data bs=4096 count=1 seek=1 conv=notrunc oflag=direct
sleep 3
kill -INT $agent
wait $agent
echo "agent $?" >>/out/steps
dmesg >/out/dmesg
# A missing disk must not become a file of that name in /dev.
test -b /dev/vda && tar -cf /dev/vda -C /out .
sync
poweroff -f
"#,
        read = bad(volume.read_sector),
        write = bad(volume.write_sector),
    )
}

/// What the guest left in `/out`.
struct Out {
    files: BTreeMap<String, String>,
    console: String,
}

impl Out {
    fn file(&self, name: &str) -> Result<&str> {
        self.files.get(name).map(String::as_str).with_context(|| {
            format!(
                "the guest wrote no {name}; init.log:\n{}\nconsole:\n{}",
                self.files.get("init.log").map_or("(none)", String::as_str),
                tail(&self.console)
            )
        })
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Boots the guest and reads its output disk.
fn boot(dir: &Path, vmlinuz: &Path, initrd: &Path) -> Result<Out> {
    let disk = dir.join("out.img");
    fs::write(&disk, vec![0u8; 8 << 20])?;
    let run = cmd::run_timeout(
        "qemu-system-aarch64",
        &[
            "-machine",
            "virt",
            "-cpu",
            "neoverse-n1",
            "-smp",
            "2",
            "-m",
            "1024",
            "-nographic",
            "-no-reboot",
            "-kernel",
            &vmlinuz.to_string_lossy(),
            "-initrd",
            &initrd.to_string_lossy(),
            "-append",
            "console=ttyAMA0 rdinit=/init panic=-1 loglevel=4",
            "-drive",
            &format!("file={},format=raw,if=none,id=out", disk.display()),
            "-device",
            "virtio-blk-pci,drive=out",
        ],
        GUEST_TIMEOUT,
    )?;
    let console = run.stdout;
    let unpacked = dir.join("out");
    fs::create_dir_all(&unpacked)?;
    cmd::run(
        "tar",
        &[
            "-xf",
            &disk.to_string_lossy(),
            "-C",
            &unpacked.to_string_lossy(),
        ],
    )
    .with_context(|| format!("the guest saved no output; console:\n{}", tail(&console)))?;
    let mut files = BTreeMap::new();
    for entry in fs::read_dir(&unpacked)? {
        let path = entry?.path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        files.insert(name, fs::read_to_string(&path)?);
    }
    ensure!(
        !files.is_empty(),
        "the guest saved no output (its disk holds no archive); console:\n{}",
        tail(&console)
    );
    Ok(Out { files, console })
}

/// Every figure the guest left, against what this kernel must give.
fn check(series: &Series, release: &str, volume: &Volume, out: &Out) -> Result<()> {
    let context = || {
        format!(
            "on {release}\nagent's stderr:\n{}\ninit.log:\n{}",
            out.files.get("stderr").map_or("(none)", String::as_str),
            out.files.get("init.log").map_or("(none)", String::as_str),
        )
    };
    assert_eq!(out.file("uname")?, format!("{release} aarch64\n"));
    // Each step's exit status: both dd runs fail (EIO), the agent stops
    // cleanly on SIGINT.
    assert_eq!(
        out.file("steps")?
            .lines()
            .filter(|l| !l.starts_with("insmod "))
            .collect::<Vec<_>>(),
        ["fill 0", "mount 0", "bind 0", "read 1", "write 1", "agent 0"],
        "{}",
        context()
    );
    for line in out
        .file("steps")?
        .lines()
        .filter(|l| l.starts_with("insmod "))
    {
        assert_eq!(line, "insmod 0", "{}", context());
    }
    let stderr = out.file("stderr")?;
    let sources: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.split_once("health_node::agent::state: ").map(|(_, s)| s))
        .filter(|s| {
            ["active ", "missing ", "off "]
                .iter()
                .any(|p| s.starts_with(p))
        })
        .collect();
    assert_eq!(sources, (series.sources)(), "{}", context());
    assert_eq!(stderr.contains(NO_PINS), !series.pins, "{}", context());
    let active = sources.iter().filter(|s| s.starts_with("active ")).count();
    assert!(
        stderr.contains(&format!(
            "volume-health: ready, {active} error sources attached"
        )),
        "{}",
        context()
    );
    let dev = out.file("nullb0.dev")?.trim();
    let mount = format!("/var/lib/kubelet/local/{PV}");
    let pod_path = format!("/var/lib/kubelet/pods/{POD}/volumes/kubernetes.io~local-volume/{PV}");
    // Raised once, at the first error or with both (the agent reports what
    // its collector has read by then), and says both in the end.
    let volume_lines: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("volume pod {POD} pv {PV}: ")))
        .collect();
    let raised: Vec<&&str> = volume_lines
        .iter()
        .filter(|l| l.starts_with("raised "))
        .collect();
    assert_eq!(raised.len(), 1, "{}", context());
    assert!(
        raised[0].starts_with("raised Degraded BlockIOErrors [kernel]: "),
        "{}",
        context()
    );
    let both = format!("2 block I/O errors (read, write, EIO) on nullb0 ({dev}) at {pod_path}");
    let last_condition = volume_lines
        .iter()
        .rfind(|l| l.starts_with("raised ") || l.starts_with("updated "));
    assert!(
        last_condition
            .is_some_and(|l| l.contains("Degraded BlockIOErrors [kernel]: ") && l.contains(&both)),
        "{}",
        context()
    );
    let source = series.request_source;
    let mut totals =
        format!("block_io_error read EIO ({source}) 1, block_io_error write EIO ({source}) 1");
    if series.returned {
        totals.push_str(
            ", returned_error read EIO (vfs_return) 1, returned_error write EIO (vfs_return) 1",
        );
    }
    assert!(
        stderr.contains(&format!("  {dev} nullb0 on {mount}: {totals}\n")),
        "{}",
        context()
    );
    // The JSON lines: exactly one per failed request and per failed call,
    // each for the pod volume.
    let mut seen = Vec::new();
    for line in out.file("stdout")?.lines() {
        let v: Value = serde_json::from_str(line).with_context(|| format!("not JSON: {line}"))?;
        for (key, want) in [
            ("device", dev),
            ("disk", "nullb0"),
            ("errno_name", "EIO"),
            ("mount", mount.as_str()),
            ("fs_type", "ext4"),
            ("pod_uid", POD),
            ("pv", PV),
            ("volume_mode", "Filesystem"),
        ] {
            assert_eq!(v[key], want, "{key} of {line}");
        }
        assert_eq!(v["count"], 1, "{line}");
        let task = v["task"].as_str().unwrap_or_default();
        seen.push(match v["kind"].as_str() {
            Some("block_io_error") => format!(
                "{} {} {} {} {}",
                v["source"].as_str().unwrap_or_default(),
                v["op"].as_str().unwrap_or_default(),
                v["sector"],
                v["sectors"],
                v["detail"].as_str().unwrap_or_default(),
            ),
            Some("returned_error") => format!(
                "{} {} {} by {}",
                v["source"].as_str().unwrap_or_default(),
                v["op"].as_str().unwrap_or_default(),
                v["detail"].as_str().unwrap_or_default(),
                task.split('[').next().unwrap_or_default(),
            ),
            other => bail!("unexpected event kind {other:?}: {line}"),
        });
    }
    let mut expected = vec![
        format!("{source} read {} 8 rwbs R", volume.read_sector),
        format!("{source} write {} 8 rwbs WS", volume.write_sector),
    ];
    if series.returned {
        expected.push("vfs_return read vfs_read by dd".into());
        expected.push("vfs_return write vfs_write by dd".into());
    }
    seen.sort();
    expected.sort();
    assert_eq!(seen, expected, "{}", context());
    Ok(())
}
