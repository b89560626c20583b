//! The checks made before loading anything, so that a missing privilege
//! or a kernel without BPF is named as such rather than as a load failure.
//! A load the kernel refuses all the same is named the same way
//! ([`classify_load_error`]).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

use super::errors::{error_chain, is_eperm, BpfRefusal};
use super::memlock::MemlockShortfall;
use super::ProbeError;

// Capability numbers from include/uapi/linux/capability.h.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Loading tracing programs needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN
/// on kernels before 5.8; reading tracefs needs root's file access.
pub(super) fn check_privileges(proc_root: &Path) -> Result<(), ProbeError> {
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

/// The error for a failed load. A refusal (EPERM) is named as the checks
/// above name it (a missing privilege, the memlock limit, else a policy),
/// not as a load failure; anything else is one.
pub(super) fn classify_load_error(e: aya::EbpfError, proc_root: &Path) -> ProbeError {
    let text = error_chain(&e);
    if is_eperm(&e) || text.contains("Operation not permitted") {
        if let Err(not_permitted) = check_privileges(proc_root) {
            return not_permitted;
        }
        if let Some(shortfall) = MemlockShortfall::of_this_process(proc_root) {
            return ProbeError::MemlockLimit {
                shortfall,
                refused: BpfRefusal::Load(Box::new(e)),
            };
        }
        return ProbeError::BpfUnavailable(format!(
            "the kernel refused to load programs despite the needed capabilities (lockdown or a security policy?): {text}"
        ));
    }
    ProbeError::Load(Box::new(e))
}

/// Creates and closes a one-entry array map: the cheapest question that
/// tells "no BPF in this kernel" (ENOSYS) from "BPF forbidden" (EPERM),
/// and, on kernels before 5.11, from a memlock limit too low for even this.
pub(super) fn check_bpf(proc_root: &Path) -> Result<(), ProbeError> {
    let err = match tiny_array_map() {
        Ok(_) => return Ok(()),
        Err(err) => err,
    };
    if err.raw_os_error() == Some(libc::EPERM) {
        if let Some(shortfall) = MemlockShortfall::of_this_process(proc_root) {
            return Err(ProbeError::MemlockLimit {
                shortfall,
                refused: BpfRefusal::CheckMap(err),
            });
        }
    }
    Err(match err.raw_os_error() {
        Some(libc::ENOSYS) => ProbeError::BpfUnavailable("the kernel has no bpf() system call (CONFIG_BPF_SYSCALL is off)".into()),
        Some(libc::EPERM) => ProbeError::BpfUnavailable(format!(
            "bpf() was refused ({err}): kernel lockdown, a seccomp profile or an LSM policy forbids it"
        )),
        _ => ProbeError::BpfUnavailable(format!("creating a test map failed: {err}")),
    })
}

/// A one-entry array map of our own, freed when the descriptor closes.
/// Written here because no crate offers a map without an object to load.
// Public for tests/tests/host/tracefs.rs (a live map id for a pinned witness).
#[doc(hidden)]
pub fn tiny_array_map() -> io::Result<OwnedFd> {
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
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
