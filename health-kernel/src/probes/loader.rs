//! An aya loader that never reads the kernel's BTF.
//!
//! aya 0.14's `EbpfLoader::new()` reads and parses `/sys/kernel/btf/vmlinux`
//! (~19 MB of heap on 6.18) before the caller can say it wants none; there
//! is no constructor without it and the fields are private. The agent needs
//! none of it: the object has no CO-RE relocations, the block programs take
//! their offsets from our own one-pass reader (`btf.rs`), and the `tp_btf`
//! and fentry loads get a small image of their own (`requests.rs`). That
//! parse alone was most of the agent's peak memory (issue 10 item 6).
//!
//! So the loader is built on a short-lived thread whose file opens fail
//! with ENOENT, which aya takes as "no kernel BTF". The refusal is a seccomp
//! filter on that one thread (a filter without TSYNC stays with the thread
//! it was installed on, and so does the no-new-privileges bit it needs), so
//! the rest of the agent is untouched and the filter ends with the thread.
//! Where seccomp is unavailable (a kernel without it, a runtime profile that
//! refuses it) the caller falls back to the plain loader and only memory
//! differs.

use std::collections::BTreeMap;

use aya::EbpfLoader;
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// Why a closure could not be run with file opens refused.
#[derive(Debug, thiserror::Error)]
pub enum NoOpensError {
    #[error("no seccomp filter for this architecture ({arch}): {reason}")]
    Filter { arch: &'static str, reason: String },
    #[error("cannot install the seccomp filter on the loader thread: {0}")]
    Install(String),
    #[error("the loader thread panicked")]
    Panicked,
}

/// `EbpfLoader::new()` without its parse of the kernel BTF, or the reason
/// that could not be arranged (then the caller builds a plain one).
pub fn loader_without_kernel_btf<'a>() -> Result<EbpfLoader<'a>, NoOpensError> {
    with_file_opens_refused(EbpfLoader::new)
}

/// Runs `f` on a new thread where every `open`/`openat`/`openat2` fails
/// with ENOENT, and returns what it returned.
pub fn with_file_opens_refused<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, NoOpensError> {
    let filter = refuse_opens()?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                seccompiler::apply_filter(&filter)
                    .map_err(|e| NoOpensError::Install(e.to_string()))?;
                Ok(f())
            })
            .join()
            .map_err(|_| NoOpensError::Panicked)?
    })
}

/// The filter: the open calls get ENOENT, everything else is allowed.
fn refuse_opens() -> Result<BpfProgram, NoOpensError> {
    let arch = std::env::consts::ARCH;
    let fail = |reason: String| NoOpensError::Filter { arch, reason };
    let target = TargetArch::try_from(arch).map_err(|e| fail(e.to_string()))?;
    let mut rules = BTreeMap::new();
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_open, Vec::new());
    rules.insert(libc::SYS_openat, Vec::new());
    rules.insert(libc::SYS_openat2, Vec::new());
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOENT as u32),
        target,
    )
    .map_err(|e| fail(e.to_string()))?;
    BpfProgram::try_from(filter).map_err(|e| fail(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `Seccomp:` mode of the calling thread (0: none, 2: filter).
    fn seccomp_mode() -> String {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .expect("a Seccomp line")
            .trim()
            .to_string()
    }

    #[test]
    fn opens_fail_with_enoent_inside_and_work_again_outside() {
        let before = seccomp_mode();
        let inside = with_file_opens_refused(|| {
            (
                std::fs::File::open("/proc/self/status").map_err(|e| e.raw_os_error()),
                std::fs::read("/sys/kernel/btf/vmlinux").map_err(|e| e.raw_os_error()),
                // Anything else still runs: a pid, the time.
                std::process::id(),
            )
        })
        .expect("seccomp filters are available on this machine");
        assert_eq!(inside.0.unwrap_err(), Some(libc::ENOENT));
        assert_eq!(inside.1.unwrap_err(), Some(libc::ENOENT));
        assert_eq!(inside.2, std::process::id());
        // The caller's thread is as it was: no filter, files open.
        assert_eq!(seccomp_mode(), before);
        assert!(std::fs::read("/proc/self/status").is_ok());
    }

    #[test]
    fn another_thread_of_the_process_is_not_filtered() {
        let before = seccomp_mode();
        with_file_opens_refused(|| ()).unwrap();
        let other = std::thread::spawn(|| (seccomp_mode(), std::fs::read("/proc/self/stat")))
            .join()
            .unwrap();
        assert_eq!(other.0, before, "a filter leaked to a new thread");
        assert!(other.1.is_ok());
    }
}
