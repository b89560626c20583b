//! BPF memory and RLIMIT_MEMLOCK.
//!
//! Kernels before 5.11 charge every BPF map and program to the loading
//! process's RLIMIT_MEMLOCK, whose default (64 KiB on many distributions)
//! is far below what the agent's maps take, and bpf() then fails with
//! EPERM as if forbidden. From 5.11 on the kernel accounts BPF memory to
//! the memory cgroup and ignores the limit. The agent raises the limit at
//! start, which past the hard limit needs CAP_SYS_RESOURCE; the DaemonSet
//! grants that only on request (some nodes cannot grant it at all), so
//! where the raise fails and BPF then refuses, [`MemlockShortfall`] names
//! the limit and the fix instead of a generic EPERM.

use std::fmt;
use std::io;
use std::path::Path;

use super::release::{parse_version, running_release};

/// The first kernel release that no longer charges BPF memory to
/// RLIMIT_MEMLOCK.
const CGROUP_ACCOUNTED: (u32, u32) = (5, 11);

/// Raises RLIMIT_MEMLOCK for this process: to unlimited where allowed
/// (CAP_SYS_RESOURCE), else the soft limit up to the hard one, which needs
/// no privilege. On 5.11+ the limit does not matter and a failure is
/// harmless; before, the load error that may follow says so
/// ([`MemlockShortfall`]).
pub(super) fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct, which lives across the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } == 0 {
        return;
    }
    let refused = io::Error::last_os_error();
    let raised = match memlock_limit() {
        Ok(mut limit) if limit.rlim_cur < limit.rlim_max => {
            limit.rlim_cur = limit.rlim_max;
            // SAFETY: as above.
            if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) } == 0 {
                "raised to its hard limit".to_string()
            } else {
                format!("left as it was ({})", io::Error::last_os_error())
            }
        }
        Ok(_) => "already at its hard limit".to_string(),
        Err(e) => format!("unreadable ({e})"),
    };
    tracing::debug!(
        "raising RLIMIT_MEMLOCK to unlimited failed ({refused}); {raised}. Only kernels before 5.11 charge BPF memory to it"
    );
}

/// This process's RLIMIT_MEMLOCK.
fn memlock_limit() -> io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct, which lives across the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(limit)
}

/// A kernel that charges BPF memory to RLIMIT_MEMLOCK, and the finite limit
/// this process was left with: the reason, on such a kernel, that bpf()
/// answers EPERM. Its text is the message users see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemlockShortfall {
    release: String,
    limit_bytes: u64,
}

impl MemlockShortfall {
    /// `Some` when `release` is a kernel before 5.11 and the limit is finite
    /// (`None`: unlimited); never for 5.11+, where an EPERM means something
    /// else (lockdown, seccomp, an LSM).
    pub fn judge(release: &str, limit_bytes: Option<u64>) -> Option<Self> {
        let version = parse_version(release)?;
        if version >= CGROUP_ACCOUNTED {
            return None;
        }
        Some(MemlockShortfall {
            release: release.to_string(),
            limit_bytes: limit_bytes?,
        })
    }

    /// [`MemlockShortfall::judge`] for the running kernel and this process's
    /// current limit; `None` too when either cannot be read (said in the
    /// log: the caller's generic message then stands).
    pub(super) fn of_this_process(proc_root: &Path) -> Option<Self> {
        let release = running_release(proc_root)
            .or_else(|_| running_release(Path::new("/proc")))
            .map_err(|e| {
                tracing::warn!(
                    "cannot read the kernel release to tell whether RLIMIT_MEMLOCK applies: {e}"
                )
            })
            .ok()?;
        let limit = memlock_limit()
            .map_err(|e| tracing::warn!("cannot read RLIMIT_MEMLOCK: {e}"))
            .ok()?;
        let bytes = (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur);
        Self::judge(&release, bytes)
    }
}

impl fmt::Display for MemlockShortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel {} charges BPF memory to RLIMIT_MEMLOCK (every kernel before 5.11 does) \
             and this process's limit is {} KiB, too little to load the agent; raising it \
             needs CAP_SYS_RESOURCE, which this process does not have: grant it with the \
             Helm value `--set memlockCapability=true` or the kustomize component \
             deploy/components/memlock",
            self.release,
            self.limit_bytes / 1024
        )
    }
}

#[cfg(test)]
mod tests {
    use super::MemlockShortfall;

    #[test]
    fn a_kernel_before_5_11_with_a_64_kib_limit_is_named_with_the_fix() {
        let shortfall = MemlockShortfall::judge("5.10.0-34-amd64", Some(64 * 1024))
            .expect("5.10 charges RLIMIT_MEMLOCK");
        assert_eq!(
            shortfall.to_string(),
            "kernel 5.10.0-34-amd64 charges BPF memory to RLIMIT_MEMLOCK (every kernel before \
             5.11 does) and this process's limit is 64 KiB, too little to load the agent; \
             raising it needs CAP_SYS_RESOURCE, which this process does not have: grant it \
             with the Helm value `--set memlockCapability=true` or the kustomize component \
             deploy/components/memlock"
        );
        let older = MemlockShortfall::judge("4.19.0-27-amd64", Some(8 << 20)).unwrap();
        assert!(older
            .to_string()
            .starts_with("kernel 4.19.0-27-amd64 charges BPF memory to RLIMIT_MEMLOCK (every kernel before 5.11 does) and this process's limit is 8192 KiB,"));
    }

    #[test]
    fn kernels_from_5_11_on_never_get_the_message() {
        for release in [
            "5.11.0",
            "5.15.0-126-generic",
            "6.1.0-56-amd64",
            "6.18.44-fc-v657",
        ] {
            assert_eq!(
                MemlockShortfall::judge(release, Some(64 * 1024)),
                None,
                "{release}"
            );
        }
    }

    #[test]
    fn an_unlimited_limit_or_an_unknown_release_is_no_shortfall() {
        assert_eq!(MemlockShortfall::judge("5.10.0-34-amd64", None), None);
        assert_eq!(MemlockShortfall::judge("weird", Some(64 * 1024)), None);
    }
}
