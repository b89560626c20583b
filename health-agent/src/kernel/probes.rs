//! Loading and attaching the kernel programs.
//!
//! Order of work: check privileges, BPF, BTF and tracefs (each failure has
//! its own error and exit code); read every tracepoint's format and check
//! the fields each program reads; load the object with those offsets; attach
//! what this kernel has and say what is missing and why.

use std::fmt;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf};
use aya::programs::{FEntry, TracePoint};
use aya::{Ebpf, EbpfLoader};
use health_common::{complete_mode, field, CounterKey, PartTable};

use crate::kernel::tracefs::{EventFormat, Tracefs, TracefsError};

/// The kernel object, built by `cargo xtask build` and embedded here so the
/// agent binary alone is enough to run.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/health-ebpf.o"));

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    NotPermitted(String),
    #[error("BPF is unavailable: {0}")]
    BpfUnavailable(String),
    #[error(
        "kernel BTF is missing ({0} does not exist): the kernel was built without \
         CONFIG_DEBUG_INFO_BTF, and volume-health supports only kernels with BTF"
    )]
    BtfMissing(PathBuf),
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error(
        "this health-agent was built without its kernel programs; build it with `cargo xtask build`"
    )]
    NoObject,
    #[error("tracepoint {tracepoint}: {problem}")]
    Layout { tracepoint: String, problem: String },
    #[error("loading the kernel programs: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("kernel program {program}: {detail}")]
    Program {
        program: &'static str,
        detail: String,
    },
    #[error("kernel map {0} is missing from the object")]
    MissingMap(&'static str),
    #[error("kernel map {name}: {source}")]
    Map {
        name: &'static str,
        source: Box<aya::maps::MapError>,
    },
    #[error("none of the error tracepoints could be attached:\n{0}")]
    NothingAttached(String),
}

impl ProbeError {
    /// Process exit codes, documented in the README.
    pub fn exit_code(&self) -> i32 {
        match self {
            ProbeError::NotPermitted(_) => 3,
            ProbeError::BpfUnavailable(_) => 4,
            ProbeError::BtfMissing(_) => 5,
            ProbeError::Tracefs(TracefsError::Missing { .. }) => 6,
            _ => 1,
        }
    }
}

/// What the agent was asked to attach.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    pub sys_root: PathBuf,
    pub proc_root: PathBuf,
    /// Also count failed flushes, which only `block_rq_complete` shows. It
    /// runs on every block completion, so it is off by default; see
    /// BENCHMARKS.md for its cost on the healthy path.
    pub flush_errors: bool,
    /// Samples per device per second per CPU; counting is never limited.
    pub samples_per_sec: u32,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            sys_root: PathBuf::from("/sys"),
            proc_root: PathBuf::from("/proc"),
            flush_errors: false,
            samples_per_sec: 100,
        }
    }
}

/// Whether one error source is attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceStatus {
    pub program: &'static str,
    pub state: SourceState,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceState {
    Active {
        tracepoint: String,
        note: Option<String>,
    },
    Missing {
        reason: String,
    },
    Disabled {
        reason: String,
    },
}

impl fmt::Display for SourceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            SourceState::Active {
                tracepoint,
                note: None,
            } => write!(f, "active   {tracepoint}"),
            SourceState::Active {
                tracepoint,
                note: Some(n),
            } => write!(f, "active   {tracepoint} ({n})"),
            SourceState::Missing { reason } => write!(f, "missing  {}: {reason}", self.program),
            SourceState::Disabled { reason } => write!(f, "off      {}: {reason}", self.program),
        }
    }
}

/// The kernel maps userspace reads and keeps current.
pub struct KernelMaps {
    pub samples: RingBuf<MapData>,
    pub counts: PerCpuHashMap<MapData, CounterKey, u64>,
    pub stats: PerCpuArray<MapData, u64>,
    pub partitions: BpfHashMap<MapData, u32, PartTable>,
    pub block_devs: BpfHashMap<MapData, u32, u8>,
}

/// Loaded and attached programs. Dropping `Attached` detaches them; the maps
/// stay readable afterwards so the last counts can be collected.
pub struct Attached {
    ebpf: Ebpf,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    pub sources: Vec<SourceStatus>,
}

impl Attached {
    /// Forwards kernel debug log records (aya-log) to the tracing output.
    pub fn flush_kernel_log(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }

    pub fn kernel_log_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.logger.as_ref().map(|l| l.as_fd())
    }

    /// Runs of our programs the kernel skipped, summed over programs.
    ///
    /// Tracepoint programs run under one per-CPU guard: when an interrupt
    /// fails a request while any BPF tracing program (ours or another
    /// tool's) runs on that CPU, the kernel skips every program on the
    /// tracepoint and counts a `recursion_misses` for each. Every skip on an
    /// error tracepoint is an error no counter saw, so it is reported, never
    /// hidden. aya does not expose the field; the kernel shows it in the
    /// program fd's fdinfo (Linux 5.12+; `None` where it is absent).
    pub fn program_misses(&self) -> Option<u64> {
        use std::os::fd::{AsFd, AsRawFd};
        let mut total = None;
        for (_, program) in self.ebpf.programs() {
            let Ok(fd) = program.fd() else { continue };
            let path = format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd());
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            if let Some(n) = recursion_misses(&text) {
                total = Some(total.unwrap_or(0) + n);
            }
        }
        total
    }
}

/// The `recursion_misses:` value of a BPF program's fdinfo text.
fn recursion_misses(fdinfo: &str) -> Option<u64> {
    fdinfo.lines().find_map(|l| {
        l.strip_prefix("recursion_misses:")
            .and_then(|v| v.trim().parse().ok())
    })
}

/// One field a program reads: its `LAYOUT` slot, name, and accepted sizes.
struct FieldSpec {
    slot: usize,
    name: &'static str,
    /// Accepted sizes; a `__data_loc` field is always 4.
    sizes: &'static [u32],
    /// At least this many bytes (for `rwbs`, whose array grew from 8 to 10).
    min_size: Option<u32>,
}

const fn exact(slot: usize, name: &'static str, sizes: &'static [u32]) -> FieldSpec {
    FieldSpec {
        slot,
        name,
        sizes,
        min_size: None,
    }
}

struct ProgramSpec {
    program: &'static str,
    /// Tracepoints to try in order; the first this kernel has is used.
    tracepoints: &'static [(&'static str, &'static str)],
    fields: &'static [FieldSpec],
}

const BLOCK_RQ_ERROR: ProgramSpec = ProgramSpec {
    program: "block_rq_error",
    tracepoints: &[("block", "block_rq_error")],
    fields: &[
        exact(field::RQ_ERROR_DEV, "dev", &[4]),
        exact(field::RQ_ERROR_SECTOR, "sector", &[8]),
        exact(field::RQ_ERROR_NR_SECTOR, "nr_sector", &[4]),
        exact(field::RQ_ERROR_ERROR, "error", &[4]),
        FieldSpec {
            slot: field::RQ_ERROR_RWBS,
            name: "rwbs",
            sizes: &[],
            min_size: Some(8),
        },
    ],
};

const BLOCK_RQ_COMPLETE: ProgramSpec = ProgramSpec {
    program: "block_rq_complete",
    tracepoints: &[("block", "block_rq_complete")],
    fields: &[
        exact(field::RQ_COMPLETE_DEV, "dev", &[4]),
        exact(field::RQ_COMPLETE_SECTOR, "sector", &[8]),
        exact(field::RQ_COMPLETE_NR_SECTOR, "nr_sector", &[4]),
        exact(field::RQ_COMPLETE_ERROR, "error", &[4]),
        FieldSpec {
            slot: field::RQ_COMPLETE_RWBS,
            name: "rwbs",
            sizes: &[],
            min_size: Some(8),
        },
    ],
};

const FS_PROGRAMS: &[ProgramSpec] = &[
    ProgramSpec {
        program: "ext4_error",
        tracepoints: &[("ext4", "ext4_error")],
        fields: &[
            exact(field::EXT4_ERROR_DEV, "dev", &[4]),
            exact(field::EXT4_ERROR_FUNCTION, "function", &[8]),
            exact(field::EXT4_ERROR_LINE, "line", &[4]),
        ],
    },
    ProgramSpec {
        program: "ext4_shutdown",
        tracepoints: &[("ext4", "ext4_shutdown")],
        fields: &[
            exact(field::EXT4_SHUTDOWN_DEV, "dev", &[4]),
            exact(field::EXT4_SHUTDOWN_FLAGS, "flags", &[4]),
        ],
    },
    ProgramSpec {
        program: "xfs_force_shutdown",
        tracepoints: &[("xfs", "xfs_force_shutdown")],
        fields: &[
            exact(field::XFS_SHUTDOWN_DEV, "dev", &[4]),
            exact(field::XFS_SHUTDOWN_FLAGS, "flags", &[4]),
            exact(field::XFS_SHUTDOWN_FNAME, "fname", &[4]),
            exact(field::XFS_SHUTDOWN_LINE, "line_num", &[4]),
        ],
    },
    ProgramSpec {
        program: "xfs_fs_mark_corrupt",
        tracepoints: &[("xfs", "xfs_fs_mark_corrupt")],
        fields: &[
            exact(field::XFS_FS_CORRUPT_DEV, "dev", &[4]),
            exact(field::XFS_FS_CORRUPT_FLAGS, "flags", &[4]),
        ],
    },
    ProgramSpec {
        program: "xfs_group_mark_corrupt",
        // Renamed from the per-AG marker when xfs grew realtime groups.
        tracepoints: &[
            ("xfs", "xfs_group_mark_corrupt"),
            ("xfs", "xfs_ag_mark_corrupt"),
        ],
        fields: &[
            exact(field::XFS_GROUP_CORRUPT_DEV, "dev", &[4]),
            exact(field::XFS_GROUP_CORRUPT_FLAGS, "flags", &[4]),
        ],
    },
    ProgramSpec {
        program: "xfs_inode_mark_corrupt",
        tracepoints: &[("xfs", "xfs_inode_mark_corrupt")],
        fields: &[
            exact(field::XFS_INODE_CORRUPT_DEV, "dev", &[4]),
            exact(field::XFS_INODE_CORRUPT_INO, "ino", &[8]),
            exact(field::XFS_INODE_CORRUPT_FLAGS, "flags", &[4]),
        ],
    },
    ProgramSpec {
        program: "filemap_set_wb_err",
        tracepoints: &[("filemap", "filemap_set_wb_err")],
        fields: &[
            exact(field::WB_ERR_INO, "i_ino", &[8]),
            exact(field::WB_ERR_DEV, "s_dev", &[4]),
            exact(field::WB_ERR_ERRSEQ, "errseq", &[4]),
        ],
    },
];

/// A program whose tracepoint exists and whose fields check out.
struct Planned {
    program: &'static str,
    group: &'static str,
    name: &'static str,
    note: Option<String>,
}

/// Checks the fields `spec` reads against the kernel's format and writes
/// their offsets into `layout`. `Err` is the reason the source cannot be
/// used on this kernel (no such tracepoint, or a layout it does not know);
/// the other sources still attach.
fn plan(
    tracefs: &Tracefs,
    spec: &ProgramSpec,
    layout: &mut [u32; field::COUNT],
) -> Result<(&'static str, &'static str), String> {
    for &(group, name) in spec.tracepoints {
        let format = match tracefs.event_format(group, name) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => return Err(e.to_string()),
        };
        check_fields(group, name, &format, spec.fields, layout).map_err(|e| e.to_string())?;
        return Ok((group, name));
    }
    Err(missing_reason(spec))
}

fn check_fields(
    group: &str,
    name: &str,
    format: &EventFormat,
    fields: &[FieldSpec],
    layout: &mut [u32; field::COUNT],
) -> Result<(), ProbeError> {
    let layout_error = |problem: String| ProbeError::Layout {
        tracepoint: format!("{group}:{name}"),
        problem,
    };
    for spec in fields {
        let f = format.field(spec.name).ok_or_else(|| {
            layout_error(format!("has no field `{}`; refusing to read it", spec.name))
        })?;
        let size_ok = match spec.min_size {
            Some(min) => f.size >= min,
            None => spec.sizes.contains(&f.size),
        };
        if !size_ok {
            return Err(layout_error(format!(
                "field `{}` ({}) is {} bytes, expected {}; refusing to read it",
                spec.name,
                f.decl,
                f.size,
                match spec.min_size {
                    Some(min) => format!("at least {min}"),
                    None => format!("{:?}", spec.sizes),
                }
            )));
        }
        layout[spec.slot] = f.offset;
    }
    Ok(())
}

fn missing_reason(spec: &ProgramSpec) -> String {
    let names: Vec<String> = spec
        .tracepoints
        .iter()
        .map(|(g, n)| format!("{g}:{n}"))
        .collect();
    let group = spec.tracepoints[0].0;
    let hint = match group {
        "xfs" | "ext4" => {
            format!(" (the {group} module is not loaded; it is attached at the next start)")
        }
        _ => String::new(),
    };
    format!("this kernel has no {}{hint}", names.join(" or "))
}

/// Checks privileges, BPF, BTF and tracefs, loads the programs and attaches
/// every source this kernel has.
pub fn attach(opts: &ProbeOptions) -> Result<(Attached, KernelMaps), ProbeError> {
    if EBPF_OBJECT.is_empty() {
        return Err(ProbeError::NoObject);
    }
    check_privileges(&opts.proc_root)?;
    check_bpf()?;
    let btf = opts.sys_root.join("kernel/btf/vmlinux");
    if !btf.exists() {
        return Err(ProbeError::BtfMissing(btf));
    }
    let tracefs = Tracefs::locate(&opts.sys_root)?;

    let mut layout = [0u32; field::COUNT];
    let mut planned = Vec::new();
    let mut sources = Vec::new();

    let rq_error = plan(&tracefs, &BLOCK_RQ_ERROR, &mut layout);
    let rq_complete = plan(&tracefs, &BLOCK_RQ_COMPLETE, &mut layout);
    let mode = match (&rq_error, opts.flush_errors) {
        (Ok(_), true) => complete_mode::FLUSH_ONLY,
        (Ok(_), false) => complete_mode::OFF,
        (Err(_), _) => complete_mode::ALL_ERRORS,
    };
    match rq_error {
        Ok((group, name)) => planned.push(Planned {
            program: BLOCK_RQ_ERROR.program,
            group,
            name,
            note: None,
        }),
        Err(reason) => sources.push(SourceStatus {
            program: BLOCK_RQ_ERROR.program,
            state: SourceState::Missing {
                reason: reason + "; using block_rq_complete",
            },
        }),
    }
    match (rq_complete, mode) {
        (Ok((group, name)), complete_mode::FLUSH_ONLY) => planned.push(Planned {
            program: BLOCK_RQ_COMPLETE.program,
            group,
            name,
            note: Some("flush errors only".into()),
        }),
        (Ok((group, name)), complete_mode::ALL_ERRORS) => planned.push(Planned {
            program: BLOCK_RQ_COMPLETE.program,
            group,
            name,
            note: Some("all failed requests: fallback".into()),
        }),
        (Ok(_), _) => sources.push(SourceStatus {
            program: BLOCK_RQ_COMPLETE.program,
            state: SourceState::Disabled {
                reason: "flush errors not requested (--flush-errors)".into(),
            },
        }),
        (Err(reason), _) => sources.push(SourceStatus {
            program: BLOCK_RQ_COMPLETE.program,
            state: SourceState::Missing { reason },
        }),
    }
    for spec in FS_PROGRAMS {
        match plan(&tracefs, spec, &mut layout) {
            Ok((group, name)) => planned.push(Planned {
                program: spec.program,
                group,
                name,
                note: None,
            }),
            Err(reason) => sources.push(SourceStatus {
                program: spec.program,
                state: SourceState::Missing { reason },
            }),
        }
    }

    let mut ebpf = EbpfLoader::new()
        .override_global("LAYOUT", &layout, true)
        .override_global("COMPLETE_MODE", &mode, true)
        .override_global("SAMPLES_PER_SEC", &opts.samples_per_sec, true)
        .load(EBPF_OBJECT)
        .map_err(|e| classify_load_error(e, &opts.proc_root))?;
    let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
        Ok(l) => Some(l),
        // Release builds of the kernel side may compile every log call out.
        Err(e) => {
            tracing::debug!("kernel debug log unavailable: {e}");
            None
        }
    };

    for p in planned {
        let program: &mut TracePoint = ebpf
            .program_mut(p.program)
            .ok_or_else(|| ProbeError::Program {
                program: p.program,
                detail: "not in the object".into(),
            })?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| ProbeError::Program {
                program: p.program,
                detail: e.to_string(),
            })?;
        let tracepoint = format!("{}:{}", p.group, p.name);
        let outcome = program
            .load()
            .and_then(|()| program.attach(p.group, p.name).map(|_| ()));
        let mut note = p.note;
        if outcome.is_ok() && p.program == "filemap_set_wb_err" {
            if let Err(why) = attach_writeback_errno(&mut ebpf) {
                note = Some(format!("errno only when the file already had one: {why}"));
            }
        }
        sources.push(SourceStatus {
            program: p.program,
            state: match outcome {
                Ok(()) => SourceState::Active { tracepoint, note },
                Err(e) => SourceState::Missing {
                    reason: format!("attaching {tracepoint}: {}", error_chain(&e)),
                },
            },
        });
    }
    sources.sort_by_key(|s| s.program);
    if !sources
        .iter()
        .any(|s| matches!(s.state, SourceState::Active { .. }))
    {
        let lines: Vec<String> = sources.iter().map(|s| format!("  {s}")).collect();
        return Err(ProbeError::NothingAttached(lines.join("\n")));
    }

    let maps = KernelMaps {
        samples: take_map(&mut ebpf, "SAMPLES")?,
        counts: take_map(&mut ebpf, "COUNTS")?,
        stats: take_map(&mut ebpf, "STATS")?,
        partitions: take_map(&mut ebpf, "PARTITIONS")?,
        block_devs: take_map(&mut ebpf, "BLOCK_DEVS")?,
    };
    Ok((
        Attached {
            ebpf,
            logger,
            sources,
        },
        maps,
    ))
}

/// The writeback tracepoint shows errseq from before the update, so the
/// errno of a file's first error comes from an fentry program on the
/// function that records it (needs kernel BTF and fentry support).
fn attach_writeback_errno(ebpf: &mut Ebpf) -> Result<(), String> {
    const FUNCTION: &str = "__filemap_set_wb_err";
    let btf = aya::Btf::from_sys_fs().map_err(|e| format!("reading kernel BTF: {e}"))?;
    let program: &mut FEntry = ebpf
        .program_mut("filemap_set_wb_err_entry")
        .ok_or("the fentry program is not in the object")?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    program
        .load(FUNCTION, &btf)
        .map_err(|e| format!("fentry on {FUNCTION}: {}", error_chain(&e)))?;
    program
        .attach()
        .map_err(|e| format!("fentry on {FUNCTION}: {}", error_chain(&e)))?;
    Ok(())
}

fn take_map<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, ProbeError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(ProbeError::MissingMap(name))?;
    T::try_from(map).map_err(|e| ProbeError::Map {
        name,
        source: Box::new(e),
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

fn classify_load_error(e: aya::EbpfError, proc_root: &Path) -> ProbeError {
    let text = error_chain(&e);
    if text.contains("Operation not permitted") {
        if let Err(not_permitted) = check_privileges(proc_root) {
            return not_permitted;
        }
        return ProbeError::BpfUnavailable(format!(
            "the kernel refused to load programs despite the needed capabilities (lockdown or a security policy?): {text}"
        ));
    }
    ProbeError::Load(Box::new(e))
}

// Capability numbers from include/uapi/linux/capability.h.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Loading tracing programs needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN
/// on kernels before 5.8; reading tracefs needs root's file access.
fn check_privileges(proc_root: &Path) -> Result<(), ProbeError> {
    let status_path = proc_root.join("self/status");
    // When the host's /proc is mounted elsewhere, `self` there is still us.
    let status = std::fs::read_to_string(&status_path)
        .or_else(|_| std::fs::read_to_string("/proc/self/status"))
        .map_err(|e| {
            ProbeError::NotPermitted(format!("cannot read {}: {e}", status_path.display()))
        })?;
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| cap_eff & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let uid = nix::unistd::geteuid();
    Err(ProbeError::NotPermitted(format!(
        "not permitted to load kernel programs: running as uid {uid} with effective capabilities {cap_eff:#x}; \
         run as root, or grant CAP_BPF and CAP_PERFMON (plus CAP_SYS_ADMIN on kernels before 5.8)"
    )))
}

/// Creates and closes a one-entry array map: the cheapest question that
/// tells "no BPF in this kernel" (ENOSYS) from "BPF forbidden" (EPERM).
/// Written here because no crate offers this probe on its own.
fn check_bpf() -> Result<(), ProbeError> {
    #[repr(C)]
    struct MapCreate {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    let attr = MapCreate {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        map_flags: 0,
    };
    // SAFETY: bpf(2) reads `size` bytes of `attr`, which lives across the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            &attr as *const MapCreate,
            std::mem::size_of::<MapCreate>() as libc::c_uint,
        )
    };
    if fd >= 0 {
        // SAFETY: the kernel just returned this descriptor to us.
        drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        return Ok(());
    }
    let err = io::Error::last_os_error();
    Err(match err.raw_os_error() {
        Some(libc::ENOSYS) => ProbeError::BpfUnavailable("the kernel has no bpf() system call (CONFIG_BPF_SYSCALL is off)".into()),
        Some(libc::EPERM) => ProbeError::BpfUnavailable(format!(
            "bpf() was refused ({err}): kernel lockdown, a seccomp profile or an LSM policy forbids it"
        )),
        _ => ProbeError::BpfUnavailable(format!("creating a test map failed: {err}")),
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn recursion_misses_come_from_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2061\nprog_type:\t5\nprog_jited:\t1\nprog_tag:\t3b185187f1855c4c\nmemlock:\t4096\nprog_id:\t1429\nrun_time_ns:\t0\nrun_cnt:\t0\nrecursion_misses:\t3\nverified_insns:\t212\n";
        assert_eq!(super::recursion_misses(text), Some(3));
        assert_eq!(super::recursion_misses("prog_id:\t7\nrun_cnt:\t0\n"), None);
    }

    use super::*;
    use crate::kernel::tracefs::parse_format;

    fn format(text: &str) -> EventFormat {
        parse_format(Path::new("t"), text).unwrap()
    }

    #[test]
    fn layout_check_takes_offsets_from_the_format() {
        let f = format(
            "\tfield:dev_t dev;\toffset:12;\tsize:4;\tsigned:0;\n\
             \tfield:sector_t sector;\toffset:24;\tsize:8;\tsigned:0;\n\
             \tfield:unsigned int nr_sector;\toffset:32;\tsize:4;\tsigned:0;\n\
             \tfield:int error;\toffset:36;\tsize:4;\tsigned:1;\n\
             \tfield:char rwbs[8];\toffset:40;\tsize:8;\tsigned:0;\n",
        );
        let mut layout = [0; field::COUNT];
        check_fields(
            "block",
            "block_rq_error",
            &f,
            BLOCK_RQ_ERROR.fields,
            &mut layout,
        )
        .unwrap();
        assert_eq!(layout[field::RQ_ERROR_DEV], 12);
        assert_eq!(layout[field::RQ_ERROR_SECTOR], 24);
        assert_eq!(layout[field::RQ_ERROR_NR_SECTOR], 32);
        assert_eq!(layout[field::RQ_ERROR_ERROR], 36);
        assert_eq!(layout[field::RQ_ERROR_RWBS], 40);
    }

    #[test]
    fn layout_check_refuses_missing_or_resized_fields() {
        let mut layout = [0; field::COUNT];
        let f = format("\tfield:dev_t dev;\toffset:8;\tsize:8;\tsigned:0;\n");
        let err = check_fields(
            "ext4",
            "ext4_shutdown",
            &f,
            FS_PROGRAMS[1].fields,
            &mut layout,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "tracepoint ext4:ext4_shutdown: field `dev` (dev_t dev) is 8 bytes, expected [4]; refusing to read it"
        );
        let f = format("\tfield:dev_t dev;\toffset:8;\tsize:4;\tsigned:0;\n");
        let err = check_fields(
            "ext4",
            "ext4_shutdown",
            &f,
            FS_PROGRAMS[1].fields,
            &mut layout,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "tracepoint ext4:ext4_shutdown: has no field `flags`; refusing to read it"
        );
        let f = format("\tfield:char rwbs[6];\toffset:8;\tsize:6;\tsigned:0;\n");
        let rwbs_only = &BLOCK_RQ_ERROR.fields[4..];
        let err = check_fields("block", "block_rq_error", &f, rwbs_only, &mut layout).unwrap_err();
        assert!(
            err.to_string().contains("is 6 bytes, expected at least 8"),
            "{err}"
        );
    }

    #[test]
    fn exit_codes_are_distinct_per_failure_class() {
        let codes = [
            ProbeError::NotPermitted(String::new()).exit_code(),
            ProbeError::BpfUnavailable(String::new()).exit_code(),
            ProbeError::BtfMissing(PathBuf::new()).exit_code(),
            ProbeError::Tracefs(TracefsError::Missing {
                tried: String::new(),
            })
            .exit_code(),
        ];
        assert_eq!(codes, [3, 4, 5, 6]);
    }
}
