//! Attaching every source this kernel has: plan each program against the
//! tracepoint formats, load the object once with the layouts found, attach,
//! and say for each source what became of it.

use aya::programs::{BtfTracePoint, FEntry, FExit, RawTracePoint, TracePoint};
use aya::{Btf, Ebpf, EbpfLoader};
use health_common::{bio, complete_mode, field, file, rq};

use super::errors::{error_chain, BpfRefusal};
use super::layout::{BLOCK_BIO_COMPLETE, BLOCK_RQ_COMPLETE, BLOCK_RQ_ERROR, FS_PROGRAMS};
use super::loader;
use super::memlock::{raise_memlock_limit, MemlockShortfall};
use super::pins::{self, PinError, PinSet};
use super::plan::{BlockCounting, Plan, Planned, NO_FLUSHES};
use super::preflight::{check_bpf, check_privileges, classify_load_error};
use super::requests::{self, BtfRequests, ReturnedErrors};
use super::waiting;
use super::{
    Attached, BlockAttach, KernelMaps, ProbeError, ProbeOptions, SourceState, SourceStatus,
};
use crate::tracefs::Tracefs;

/// Checks privileges, BPF, BTF and tracefs, loads the programs and attaches
/// every source this kernel has: plans each source against the tracepoint
/// formats (block requests, dm/md bios, filesystems), loads the object once
/// with the layouts found, attaches what was planned, and says for each
/// source what became of it.
pub fn attach(opts: &ProbeOptions) -> Result<(Attached, KernelMaps), ProbeError> {
    let mut kernel = preflight(opts)?;
    let mut plan = Plan::default();
    let block = plan.block_requests(&kernel.tracefs, &kernel.btf_requests, opts);
    let bio = plan.check(&kernel.tracefs, &BLOCK_BIO_COMPLETE);
    let filesystems: Vec<_> = FS_PROGRAMS
        .iter()
        .map(|spec| (spec, plan.check(&kernel.tracefs, spec)))
        .collect();
    // Every program is checked before this: the stamp covers every offset.
    let mut pin_set = open_pins(opts, &plan.layout, block, &kernel.request_facts())?;
    let bio_deferred = plan.block_bios(bio, opts.bio_errors, pin_set.as_ref());
    for (spec, found) in filesystems {
        plan.standalone(spec.program, found);
    }

    let mut ebpf = load(opts, &plan.layout, &kernel, block, pin_set.as_ref())?;
    if let Some(p) = &pin_set {
        p.pin_maps(&ebpf)?;
    }
    // Parsed only now: the loader's own full parse of the kernel BTF is
    // freed by this point, so the two never add up; the image goes at once.
    let load_btf = kernel
        .load_image
        .take()
        .and_then(|image| requests::load_btf(&image));
    let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
        Ok(l) => Some(l),
        // Release builds of the kernel side may compile every log call out.
        Err(e) => {
            tracing::debug!("kernel debug log unavailable: {e}");
            None
        }
    };
    let mut sources = plan.sources;
    let mut attacher = Attacher {
        ebpf: &mut ebpf,
        pins: pin_set.as_ref(),
        facts: &kernel.btf_requests,
        btf: load_btf.as_ref(),
        block,
        counted_early: false,
    };
    for p in plan.planned {
        sources.push(attacher.attach(p));
    }
    sources.push(match opts.returned_errors {
        true => attach_returned(
            &mut ebpf,
            pin_set.as_ref(),
            &kernel.returned,
            load_btf.as_ref(),
        ),
        false => SourceStatus {
            program: RETURNED_SOURCE,
            state: SourceState::Disabled {
                reason: "not asked for (--returned-errors)".into(),
            },
        },
    });
    let waiting = match &kernel.bio_layout {
        Ok(layout) => waiting::attach(
            &mut ebpf,
            pin_set.as_ref(),
            match opts.block_attach {
                BlockAttach::Auto => load_btf
                    .as_ref()
                    .ok_or_else(|| "no BTF for the load".into()),
                BlockAttach::Tracefs => Err("not tried: --block-attach tracefs".into()),
            },
            layout[bio::QUEUE_ARG],
        ),
        Err(why) => Err(why.clone()),
    };
    // Only the stalls read it, so it is mapped only when they run; a
    // mapping refused leaves them off, not the agent.
    let (waiting, waiting_slots) = match waiting {
        Ok(programs) => match waiting_slots(&mut ebpf) {
            Ok(slots) => (Ok(programs), Some(slots)),
            Err(e) => (Err(format!("mapping WAITING into the agent: {e}")), None),
        },
        Err(why) => (Err(why), None),
    };
    drop(load_btf);
    drop(kernel);
    release_freed_heap();
    sources.sort_by_key(|s| s.program);
    if !sources
        .iter()
        .any(|s| matches!(s.state, SourceState::Active { .. }))
    {
        let lines: Vec<String> = sources.iter().map(|s| format!("  {s}")).collect();
        return Err(nothing_attached(lines.join("\n"), &sources, opts));
    }
    if let Some(p) = &mut pin_set {
        p.commit()?;
    }
    let maps = KernelMaps {
        samples: take_map(&mut ebpf, "SAMPLES")?,
        counts: take_map(&mut ebpf, "COUNTS")?,
        times: take_map(&mut ebpf, "TIMES")?,
        accounted: take_map(&mut ebpf, "ACCOUNTED")?,
        stats: take_map(&mut ebpf, "STATS")?,
        partitions: take_map(&mut ebpf, "PARTITIONS")?,
        block_devs: take_map(&mut ebpf, "BLOCK_DEVS")?,
        bio_devs: take_map(&mut ebpf, "BIO_DEVS")?,
        stacked: take_map(&mut ebpf, "STACKED")?,
        disk_names: take_map(&mut ebpf, "DISK_NAMES")?,
        waiting: waiting_slots,
        latency: take_map(&mut ebpf, "LATENCY")?,
    };
    Ok((
        Attached {
            ebpf,
            pins: pin_set,
            logger,
            sources,
            bio_deferred,
            waiting,
        },
        maps,
    ))
}

/// No source attached: the memlock limit when programs were refused with
/// EPERM on a kernel that charges them to it (the maps fitted, the
/// programs did not), else the list of what became of each source.
fn nothing_attached(lines: String, sources: &[SourceStatus], opts: &ProbeOptions) -> ProbeError {
    let refused = sources.iter().any(|s| {
        matches!(&s.state, SourceState::Missing { reason } if reason.contains("Operation not permitted"))
    });
    match MemlockShortfall::of_this_process(&opts.proc_root) {
        Some(shortfall) if refused => ProbeError::MemlockLimit {
            shortfall,
            refused: BpfRefusal::Programs(lines),
        },
        _ => ProbeError::NothingAttached(lines),
    }
}

/// What the kernel offers the programs, checked before anything loads.
struct Kernel {
    tracefs: Tracefs,
    /// Offsets and status codes of the `tp_btf` block programs, or why they
    /// do not apply.
    btf_requests: Result<BtfRequests, String>,
    /// Offsets into `struct bio` for the `WAITING` programs, or why they
    /// are not attached.
    bio_layout: Result<[u32; bio::COUNT], String>,
    /// What the returned-error programs need, or why they are not
    /// attached.
    returned: Result<ReturnedErrors, String>,
    /// The slice of the kernel's BTF that program loads need.
    load_image: Option<Vec<u8>>,
}

impl Kernel {
    /// The `tp_btf` facts, as the pin stamp covers them.
    fn request_facts(&self) -> Vec<u8> {
        let mut facts = match &self.btf_requests {
            Ok(r) => r
                .layout
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .chain(r.statuses)
                .collect(),
            Err(_) => Vec::new(),
        };
        if let Ok(layout) = &self.bio_layout {
            facts.extend(layout.iter().flat_map(|v| v.to_le_bytes()));
        }
        if let Ok(returned) = &self.returned {
            facts.extend(returned.layout.iter().flat_map(|v| v.to_le_bytes()));
        }
        facts
    }
}

fn preflight(opts: &ProbeOptions) -> Result<Kernel, ProbeError> {
    if opts.object.is_empty() {
        return Err(ProbeError::NoObject);
    }
    check_privileges(&opts.proc_root)?;
    raise_memlock_limit();
    check_bpf(&opts.proc_root)?;
    let btf = opts.sys_root.join("kernel/btf/vmlinux");
    if !btf.exists() {
        return Err(ProbeError::BtfMissing(btf));
    }
    let tracefs = Tracefs::locate(&opts.sys_root)?;
    keep_large_allocations_mapped();
    let requests::BtfFacts {
        requests: btf_requests,
        bios: bio_layout,
        returned,
        image: load_image,
    } = requests::plan(&btf, &opts.proc_root);
    let returned = match opts.returned_errors {
        true => returned.map_err(|e| format!("the kernel's BTF lacks what it needs: {e}")),
        false => Err("not asked for (--returned-errors)".to_string()),
    };
    let bio_layout = match opts.follow_bios {
        true => bio_layout
            .map(|mut layout| {
                layout[bio::LATENCY] = u32::from(opts.latency);
                layout
            })
            .map_err(|e| format!("the kernel's BTF lacks what it needs: {e}")),
        false => Err("neither --follow-bios nor --latency-window".to_string()),
    };
    release_freed_heap();
    let btf_requests = match opts.block_attach {
        BlockAttach::Auto => btf_requests,
        BlockAttach::Tracefs => Err("--block-attach tracefs".to_string()),
    };
    if let Ok(r) = &btf_requests {
        if r.statuses_partial {
            tracing::warn!(
                "block status codes above 13 are not known for this kernel release; \
                 the tp_btf programs count them as EIO"
            );
        }
    }
    Ok(Kernel {
        tracefs,
        btf_requests,
        bio_layout,
        returned,
        load_image,
    })
}

/// Loads the object with the layouts and settings the programs read, onto
/// the adopted maps when there are pins to adopt.
fn load(
    opts: &ProbeOptions,
    layout: &[u32; field::COUNT],
    kernel: &Kernel,
    block: BlockCounting,
    pins: Option<&PinSet>,
) -> Result<Ebpf, ProbeError> {
    let (rq_layout, statuses) = match &kernel.btf_requests {
        Ok(r) => (r.layout, r.statuses),
        Err(_) => ([rq::ABSENT; rq::COUNT], [0; rq::STATUS_COUNT]),
    };
    let pinned_maps = match pins {
        Some(p) if p.adopted() => p.pinned_maps()?,
        _ => Vec::new(),
    };
    let early_flag = u32::from(block.early);
    // ENABLED stays 0 without a layout: the programs then return at once.
    let bio_layout = kernel.bio_layout.clone().unwrap_or([0; bio::COUNT]);
    let file_layout = kernel
        .returned
        .as_ref()
        .map_or([rq::ABSENT; file::COUNT], |r| r.layout);
    let mut loader = loader::loader_without_kernel_btf().unwrap_or_else(|e| {
        tracing::info!(
            "loading with aya's own parse of the kernel BTF (~20 MB more at start): {e}"
        );
        EbpfLoader::new()
    });
    loader
        // The object has no CO-RE relocations: no kernel BTF is needed
        // (and where the loader parsed it anyway, it is dropped here).
        .btf(None)
        .override_global("LAYOUT", layout, true)
        .override_global("RQ_LAYOUT", &rq_layout, true)
        .override_global("BIO_LAYOUT", &bio_layout, true)
        .override_global("FILE_LAYOUT", &file_layout, true)
        .override_global("STATUS_ERRNO", &statuses, true)
        .override_global("COMPLETE_MODE", &block.mode, true)
        .override_global("EARLY_ERRORS", &early_flag, true)
        .override_global("SAMPLES_PER_SEC", &opts.samples_per_sec, true);
    // Adopted maps are opened, not created: the programs still running
    // write them, and programs loaded now must share them.
    for (name, path) in &pinned_maps {
        loader.map_pin_path(name.as_str(), path.as_path());
    }
    loader
        .load(opts.object)
        .map_err(|e| classify_load_error(e, &opts.proc_root))
}

/// Attaches planned programs one by one to the loaded object.
struct Attacher<'a> {
    ebpf: &'a mut Ebpf,
    pins: Option<&'a PinSet>,
    facts: &'a Result<BtfRequests, String>,
    btf: Option<&'a Btf>,
    block: BlockCounting,
    /// `block_rq_complete`'s tp_btf program counts what `block_rq_error` would.
    counted_early: bool,
}

impl Attacher<'_> {
    fn attach(&mut self, p: Planned) -> SourceStatus {
        let early_complete = self.block.early && p.program == BLOCK_RQ_COMPLETE.program;
        if self.counted_early && p.program == BLOCK_RQ_ERROR.program {
            return SourceStatus {
                program: p.program,
                state: SourceState::Disabled {
                    reason: "its failed requests are counted at block_rq_complete (--early-block-errors)".into(),
                },
            };
        }
        let (outcome, mut note) = match attach_request_btf(
            self.ebpf, self.pins, &p, self.facts, self.btf,
        ) {
            Some(Ok(tracepoint)) => {
                self.counted_early |= early_complete;
                (Ok(tracepoint), join_notes(p.note, "tp_btf"))
            }
            Some(Err(why)) if early_complete => {
                // The tracefs program cannot read the request: block_rq_error
                // counts, and this one only for flushes, if asked; else it is
                // off, as without the option.
                tracing::warn!(
                    "--early-block-errors: the tp_btf block_rq_complete was refused ({why}); failed requests are counted at block_rq_error, after the kernel prints them"
                );
                if self.block.mode != complete_mode::FLUSH_ONLY {
                    return SourceStatus {
                        program: p.program,
                        state: SourceState::Disabled {
                            reason: NO_FLUSHES.into(),
                        },
                    };
                }
                (
                    attach_loaded(self.ebpf, self.pins, p.program, p.group, p.name),
                    Some(format!("flush errors only; tracefs; tp_btf refused: {why}")),
                )
            }
            Some(Err(why)) => {
                // The names first: a tracepoint runs its programs in the
                // order they were attached, so a failed request's disk is
                // named before the counting program's sample can reach the
                // agent (which looks the name up when the sample arrives).
                let names = (p.program == BLOCK_RQ_COMPLETE.program)
                    .then(|| attach_disk_names(self.ebpf, self.facts));
                let outcome = attach_loaded(self.ebpf, self.pins, p.program, p.group, p.name);
                let mut note = join_notes(p.note, &format!("tracefs; tp_btf refused: {why}"));
                if let Some(Err(e)) = names {
                    note = join_notes(
                        note,
                        &format!("disks without a number in sysfs stay unplaced: {e}"),
                    );
                }
                (outcome, note)
            }
            None => (
                attach_loaded(self.ebpf, self.pins, p.program, p.group, p.name),
                p.note,
            ),
        };
        if outcome.is_ok() && p.program == "filemap_set_wb_err" {
            if let Err(why) = attach_writeback_errno(self.ebpf, self.pins, self.btf) {
                note = Some(format!("errno only when the file already had one: {why}"));
            }
        }
        SourceStatus {
            program: p.program,
            state: match outcome {
                Ok(tracepoint) => SourceState::Active { tracepoint, note },
                Err(reason) => SourceState::Missing { reason },
            },
        }
    }
}

/// The pins of this layout, or `None` with `--no-pin` or where there is no
/// BPF filesystem (said once: the state will not outlive the process).
fn open_pins(
    opts: &ProbeOptions,
    layout: &[u32],
    block: BlockCounting,
    request_facts: &[u8],
) -> Result<Option<PinSet>, ProbeError> {
    let Some(root) = &opts.pin_root else {
        return Ok(None);
    };
    // Tracepoint attachments are bpf links, which can be pinned, only
    // since 5.15; before, a pinned program would sit detached.
    if !aya::features().bpf_perf_link() {
        tracing::warn!(
            "this kernel cannot pin tracepoint attachments (bpf perf links need Linux 5.15+): nothing is pinned, so the programs detach when this process exits and errors until the next start are not counted"
        );
        return Ok(None);
    }
    let layout_bytes: Vec<u8> = layout.iter().flat_map(|v| v.to_le_bytes()).collect();
    let stamp = pins::stamp(&[
        opts.object,
        &layout_bytes,
        &block.mode.to_le_bytes(),
        &opts.samples_per_sec.to_le_bytes(),
        &[
            opts.bio_errors as u8,
            opts.block_attach as u8,
            block.early as u8,
        ],
        // tp_btf offsets and status codes from the kernel's BTF.
        request_facts,
    ]);
    const UNPINNED: &str = "nothing is pinned, so the programs detach when this process exits and errors until the next start are not counted";
    match PinSet::open(root, &stamp) {
        Ok(p) => Ok(Some(p)),
        // The usual mount point with nothing mounted on it (a host that
        // never mounted bpffs): mounted here, as tracefs is.
        Err(PinError::NotBpffs(dir)) if dir == opts.sys_root.join("fs/bpf") => {
            match pins::mount_bpffs(&dir) {
                Ok(()) => {
                    tracing::info!(
                        "mounted a BPF filesystem at {} (nothing was mounted there) to pin the kernel state",
                        dir.display()
                    );
                    Ok(Some(PinSet::open(root, &stamp)?))
                }
                Err(e) => {
                    tracing::warn!(
                        "{} is not a BPF filesystem and mounting one there failed ({e}): {UNPINNED} (mount bpffs there, or pass --no-pin to silence this)",
                        dir.display()
                    );
                    Ok(None)
                }
            }
        }
        Err(PinError::NotBpffs(dir)) => {
            tracing::warn!(
                "{} is not on a BPF filesystem: {UNPINNED} (mount bpffs there, or pass --no-pin to silence this)",
                dir.display()
            );
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Loads one tracepoint program of the object and attaches it to
/// `group:name` (pinning program and link with `pins`; a program whose
/// link is pinned already runs, adopted); returns the tracepoint's name,
/// or why it failed.
pub(super) fn attach_loaded(
    ebpf: &mut Ebpf,
    pins: Option<&PinSet>,
    program: &'static str,
    group: &str,
    name: &str,
) -> Result<String, String> {
    let tracepoint = format!("{group}:{name}");
    if pins.is_some_and(|p| p.has_link(program)) {
        return Ok(tracepoint);
    }
    let prog: &mut TracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| format!("{program} is not in the kernel object"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| format!("{program}: {e}"))?;
    prog.load()
        .map_err(|e| format!("loading {program}: {}", error_chain(&e)))?;
    let link = prog
        .attach(group, name)
        .map_err(|e| format!("attaching {tracepoint}: {}", error_chain(&e)))?;
    if let Some(pins) = pins {
        let link = prog
            .take_link(link)
            .map_err(|e| format!("{program}: {}", error_chain(&e)))?;
        pins.keep_attached(ebpf, program, link)
            .map_err(|e| e.to_string())?;
    }
    Ok(tracepoint)
}

/// glibc raises its mmap threshold each time a large mapped block is freed,
/// so after the first BTF buffer is freed the next ones (the load image, or
/// aya's own parse where `loader` could not prevent it) come from the heap
/// and stay resident; a fixed threshold returns each of them to the kernel
/// when freed.
fn keep_large_allocations_mapped() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt has no preconditions.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}

/// Loading reads the kernel's BTF (our one-pass reader; aya's ~19 MB parse
/// too where `loader` could not prevent it); once freed, hand the memory
/// back so the resident size reflects the agent's steady state rather than
/// its start-up.
fn release_freed_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn join_notes(note: Option<String>, more: &str) -> Option<String> {
    Some(match note {
        Some(n) => format!("{n}; {more}"),
        None => more.to_string(),
    })
}

/// Attaches the `tp_btf` twin of a block request program where this kernel
/// allows it: `None` when it does not apply (another program, or no BTF
/// facts: the reason is then the tracefs program's note), otherwise the
/// attached tracepoint or why the kernel refused it.
fn attach_request_btf(
    ebpf: &mut Ebpf,
    pins: Option<&PinSet>,
    p: &Planned,
    facts: &Result<BtfRequests, String>,
    btf: Option<&Btf>,
) -> Option<Result<String, String>> {
    let (program, tracepoint, has) = match (p.program, facts) {
        (_, Err(_)) => return None,
        ("block_rq_error", Ok(f)) => ("block_rq_error_btf", "block_rq_error", f.has_error),
        ("block_rq_complete", Ok(f)) => {
            ("block_rq_complete_btf", "block_rq_complete", f.has_complete)
        }
        _ => return None,
    };
    if !has {
        return Some(Err(format!("no BTF raw tracepoint {tracepoint}")));
    }
    if let Ok(f) = facts {
        if !f.has_error {
            // Kernels without block_rq_error (before 5.16) are also the ones
            // whose verifier refuses these programs (measured on 5.10, after
            // a minute of retries under emulation): not worth trying there.
            return Some(Err("kernels without block_rq_error keep tracefs".into()));
        }
    }
    if pins.is_some_and(|pins| pins.has_link(program)) {
        return Some(Ok(format!("block:{tracepoint}")));
    }
    let Some(btf) = btf else {
        return Some(Err("no BTF for the load".into()));
    };
    let prog: &mut BtfTracePoint = match ebpf.program_mut(program).map(TryInto::try_into) {
        Some(Ok(p)) => p,
        Some(Err(e)) => return Some(Err(format!("{program}: {e}"))),
        None => return Some(Err(format!("{program} is not in the kernel object"))),
    };
    let link = match prog.load(tracepoint, btf).and_then(|()| prog.attach()) {
        Ok(link) => link,
        Err(e) => return Some(Err(error_chain(&e))),
    };
    if let Some(pins) = pins {
        let kept = prog
            .take_link(link)
            .map_err(|e| error_chain(&e))
            .and_then(|link| {
                pins.keep_attached(ebpf, program, link)
                    .map_err(|e| e.to_string())
            });
        if let Err(why) = kept {
            return Some(Err(why));
        }
    }
    Some(Ok(format!("block:{tracepoint}")))
}

/// Where the tracefs `block_rq_complete` program counts failed requests,
/// the raw tracepoint that records each failing disk's name with its
/// number (`DISK_NAMES`), as the `tp_btf` programs do on newer kernels:
/// 5.10 gives NVMe multipath's path disks no number anywhere else. Not
/// pinned: this runs with the agent only (its records are kept in the
/// pinned map; a disk failing while no agent runs is named at its next
/// failure).
fn attach_disk_names(ebpf: &mut Ebpf, facts: &Result<BtfRequests, String>) -> Result<(), String> {
    const PROGRAM: &str = "block_rq_complete_names";
    let facts = facts.as_ref().map_err(|e| e.clone())?;
    if facts.layout[rq::DISK_NAME] == rq::ABSENT {
        return Err("the kernel's BTF has no gendisk.disk_name".into());
    }
    let program: &mut RawTracePoint = ebpf
        .program_mut(PROGRAM)
        .ok_or("the raw tracepoint program is not in the object")?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    program
        .load()
        .map_err(|e| format!("{PROGRAM}: {}", error_chain(&e)))?;
    program
        .attach("block_rq_complete")
        .map_err(|e| format!("{PROGRAM}: {}", error_chain(&e)))?;
    Ok(())
}

/// Loads an fentry or fexit program against its kernel function and
/// attaches it, pinned with the others when there are pins. A macro: aya's
/// `FEntry` and `FExit` load and attach alike but share no trait.
macro_rules! attach_traced {
    ($kind:ty, $what:literal, $ebpf:expr, $pins:expr, $btf:expr, $function:expr, $program:expr) => {{
        let (function, program): (&str, &str) = ($function, $program);
        let btf = $btf.ok_or("no kernel BTF")?;
        let prog: &mut $kind = $ebpf
            .program_mut(program)
            .ok_or_else(|| format!("{program} is not in the kernel object"))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| format!("{program}: {e}"))?;
        prog.load(function, btf)
            .map_err(|e| format!("{} on {function}: {}", $what, error_chain(&e)))?;
        let link = prog
            .attach()
            .map_err(|e| format!("{} on {function}: {}", $what, error_chain(&e)))?;
        if let Some(pins) = $pins {
            let link = prog
                .take_link(link)
                .map_err(|e| format!("{program}: {}", error_chain(&e)))?;
            pins.keep_attached($ebpf, program, link)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }};
}

/// The writeback tracepoint shows errseq from before the update, so the
/// errno of a file's first error comes from an fentry program on the
/// function that records it (needs kernel BTF and fentry support).
fn attach_writeback_errno(
    ebpf: &mut Ebpf,
    pins: Option<&PinSet>,
    btf: Option<&Btf>,
) -> Result<(), String> {
    const FUNCTION: &str = "__filemap_set_wb_err";
    const PROGRAM: &str = "filemap_set_wb_err_entry";
    if pins.is_some_and(|p| p.has_link(PROGRAM)) {
        return Ok(());
    }
    attach_traced!(FEntry, "fentry", ebpf, pins, btf, FUNCTION, PROGRAM)
}

/// The name the returned-error programs go by in the sources' list.
pub const RETURNED_SOURCE: &str = "returned_errors";

/// Errors file operations returned to applications: an fexit program on
/// each VFS function this kernel's BTF names. Active when one attached;
/// the note names those that did not.
fn attach_returned(
    ebpf: &mut Ebpf,
    pins: Option<&PinSet>,
    facts: &Result<ReturnedErrors, String>,
    btf: Option<&Btf>,
) -> SourceStatus {
    let status = |state| SourceStatus {
        program: RETURNED_SOURCE,
        state,
    };
    let facts = match (facts, btf) {
        (Err(why), _) => {
            return status(SourceState::Missing {
                reason: why.clone(),
            })
        }
        (_, None) => {
            return status(SourceState::Missing {
                reason: "no kernel BTF for the fexit loads".into(),
            })
        }
        (Ok(facts), Some(_)) => facts,
    };
    let mut attached = Vec::new();
    let mut failed = Vec::new();
    for (function, program) in requests::RETURNED_FUNCTIONS {
        if !facts.functions.contains(&function) {
            failed.push(format!("{function}: not in the kernel's BTF"));
            continue;
        }
        match attach_fexit(ebpf, pins, btf, function, program) {
            Ok(()) => attached.push(function),
            Err(why) => failed.push(why),
        }
    }
    if attached.is_empty() {
        return status(SourceState::Missing {
            reason: failed.join("; "),
        });
    }
    status(SourceState::Active {
        tracepoint: format!("fexit:{}", attached.join(",")),
        note: (!failed.is_empty()).then(|| failed.join("; ")),
    })
}

/// Loads `program` against `function` and attaches it, pinned with the
/// others when there are pins (an adopted pin set keeps it attached).
fn attach_fexit(
    ebpf: &mut Ebpf,
    pins: Option<&PinSet>,
    btf: Option<&Btf>,
    function: &str,
    program: &'static str,
) -> Result<(), String> {
    if pins.is_some_and(|p| p.has_link(program)) {
        return Ok(());
    }
    attach_traced!(FExit, "fexit", ebpf, pins, btf, function, program)
}

/// `WAITING`, mapped into this process.
fn waiting_slots(ebpf: &mut Ebpf) -> std::io::Result<crate::waiting::WaitingSlots> {
    let map = ebpf
        .take_map("WAITING")
        .ok_or_else(|| std::io::Error::other("the kernel object has no WAITING map"))?;
    let aya::maps::Map::Array(data) = map else {
        return Err(std::io::Error::other(format!(
            "an array was expected, the object has {map:?}"
        )));
    };
    crate::waiting::WaitingSlots::new(data)
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
