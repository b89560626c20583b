//! When an ext4 filesystem was mounted, which nothing in /proc or /sys says
//! directly. Its journal thread (`jbd2/<dev>-<journal inode>`) starts while
//! the filesystem mounts and lives until it is unmounted, so that thread's
//! start time (field 22 of /proc/<pid>/stat, clock ticks after boot) is the
//! mount's.
//!
//! `/sys/fs/ext4/<dev>/journal_task` names the thread, but as a pid of the
//! reader's pid namespace: an agent in a pod without hostPID reads 0. Then
//! the thread is looked up by name among the processes of the host's /proc
//! (a few hundred to a few thousand entries); callers only ask for
//! filesystems that have recorded errors.
//!
//! Reading these files never touches the filesystem itself.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::probe::ProbeError;

/// Longest name /proc shows for a task before 6.0 (TASK_COMM_LEN - 1);
/// later kernels show a kernel thread's full name.
const COMM_LEN: usize = 15;

/// When the ext4 filesystem on block device `name` (`loop0`, `dm-3`) was
/// mounted, to the second; `None` when it has no journal (no thread).
pub fn ext4_mount_time(
    sys_root: &Path,
    proc_root: &Path,
    name: &str,
) -> Result<Option<SystemTime>, ProbeError> {
    let task = sys_root.join("fs/ext4").join(name).join("journal_task");
    let text = read(&task)?;
    let text = text.trim();
    if text == "<none>" {
        return Ok(None);
    }
    let pid: u32 = text.parse().map_err(|_| ProbeError::Parse {
        path: task.clone(),
        content: text.to_string(),
    })?;
    let pid = match pid {
        // Ours to read only when that pid is the journal thread in the
        // proc we read (same pid namespace).
        pid if pid > 0 && is_journal_thread(&comm(proc_root, pid), name) => pid,
        _ => journal_thread_by_name(proc_root, name)?,
    };
    start_time(proc_root, pid).map(Some)
}

/// The pid of the journal thread of ext4 on `name`, found by name among
/// the processes under `proc_root`. Exactly one must match: before 6.0 a
/// long name is cut to 15 characters, and two devices can then share it.
pub fn journal_thread_by_name(proc_root: &Path, name: &str) -> Result<u32, ProbeError> {
    let entries = fs::read_dir(proc_root).map_err(|error| ProbeError::Read {
        path: proc_root.to_path_buf(),
        error,
    })?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        // A process that exits meanwhile has no comm: not ours either.
        if is_journal_thread(&comm(proc_root, pid), name) {
            found.push(pid);
        }
    }
    match found[..] {
        [pid] => Ok(pid),
        _ => Err(ProbeError::JournalThread {
            name: name.to_string(),
            proc_root: proc_root.to_path_buf(),
            found: found.len(),
        }),
    }
}

/// Whether `comm` names the journal thread of `name`: `jbd2/<name>-<ino>`,
/// or its first 15 characters where the kernel cut it.
fn is_journal_thread(comm: &str, name: &str) -> bool {
    let prefix = format!("jbd2/{name}-");
    let whole = comm
        .strip_prefix(&prefix)
        .is_some_and(|ino| !ino.is_empty() && ino.bytes().all(|b| b.is_ascii_digit()));
    // Cut where even the prefix does not fit: all that shows of the name.
    let cut = prefix.len() >= COMM_LEN && comm.len() == COMM_LEN && prefix.starts_with(comm);
    whole || cut
}

/// `<proc>/<pid>/comm` without its newline; empty when unreadable.
fn comm(proc_root: &Path, pid: u32) -> String {
    fs::read_to_string(proc_root.join(pid.to_string()).join("comm"))
        .map(|c| c.trim_end_matches('\n').to_string())
        .unwrap_or_default()
}

/// Wall-clock start of process `pid`: boot time (`btime` of <proc>/stat)
/// plus its start in clock ticks, rounded down to the second as both are.
fn start_time(proc_root: &Path, pid: u32) -> Result<SystemTime, ProbeError> {
    let stat = proc_root.join(pid.to_string()).join("stat");
    let text = read(&stat)?;
    let parse_error = || ProbeError::Parse {
        path: stat.clone(),
        content: text.clone(),
    };
    // The name in parentheses may hold spaces and parentheses: count the
    // fields after the last ')', where field 3 (state) is the first.
    let after_name = text.rsplit_once(')').ok_or_else(parse_error)?.1;
    let ticks: u64 = after_name
        .split_whitespace()
        .nth(22 - 3)
        .and_then(|f| f.parse().ok())
        .ok_or_else(parse_error)?;
    let boot = boot_time(proc_root)?;
    Ok(UNIX_EPOCH + Duration::from_secs(boot + ticks / clock_ticks_per_second()))
}

/// `btime` of <proc>/stat: when the host booted, in seconds since the epoch.
fn boot_time(proc_root: &Path) -> Result<u64, ProbeError> {
    let path = proc_root.join("stat");
    let text = read(&path)?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| ProbeError::Parse {
            path: path.clone(),
            content: "no btime line".to_string(),
        })
}

/// USER_HZ, the unit of /proc/<pid>/stat times (100 on every Linux
/// architecture this runs on; asked all the same).
fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a constant of the C library.
    match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        n if n > 0 => n as u64,
        _ => 100,
    }
}

fn read(path: &Path) -> Result<String, ProbeError> {
    fs::read_to_string(path).map_err(|error| ProbeError::Read {
        path: PathBuf::from(path),
        error,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A /proc with a boot time and the given (pid, comm, start ticks).
    pub(in crate::volumes::checks) fn fake_proc(root: &Path, tasks: &[(u32, &str, u64)]) {
        fs::write(
            root.join("stat"),
            "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n",
        )
        .unwrap();
        for &(pid, comm, ticks) in tasks {
            let dir = root.join(pid.to_string());
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
            let mut fields = vec!["0".to_string(); 50];
            fields[0] = "S".into();
            fields[22 - 3] = ticks.to_string();
            fs::write(
                dir.join("stat"),
                format!("{pid} ({comm}) {}\n", fields.join(" ")),
            )
            .unwrap();
        }
    }

    #[test]
    fn journal_thread_names_full_and_cut() {
        assert!(is_journal_thread("jbd2/loop0-8", "loop0"));
        assert!(is_journal_thread("jbd2/dm-12-8", "dm-12"));
        assert!(!is_journal_thread("jbd2/loop0-8", "loop"));
        assert!(!is_journal_thread("jbd2/loop10-8", "loop1"));
        assert!(!is_journal_thread("jbd2/loop0-", "loop0"));
        assert!(!is_journal_thread("kworker/loop0-8", "loop0"));
        // 6.0+ shows the whole name; older kernels its first 15 characters.
        assert!(is_journal_thread("jbd2/nvme0n1p12-8", "nvme0n1p12"));
        assert!(is_journal_thread("jbd2/nvme0n1p12", "nvme0n1p12"));
        assert!(is_journal_thread("jbd2/nvme0n1p1-", "nvme0n1p1"));
        assert!(!is_journal_thread("jbd2/nvme0n1p1-", "nvme0n1p10"));
    }

    #[test]
    fn mount_time_from_journal_task_or_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let (sys, proc_root) = (tmp.path().join("sys"), tmp.path().join("proc"));
        let ext4 = sys.join("fs/ext4");
        for dev in ["loop0", "loop3", "vda"] {
            fs::create_dir_all(ext4.join(dev)).unwrap();
        }
        fs::create_dir_all(&proc_root).unwrap();
        // A comm with a space and a parenthesis does not shift the fields.
        fake_proc(
            &proc_root,
            &[
                (1, "init (x) y", 1),
                (290, "jbd2/loop0-8", 1250),
                (300, "jbd2/vda-8", 7),
            ],
        );
        let at = |secs| Some(UNIX_EPOCH + Duration::from_secs(secs));

        // Same pid namespace: journal_task names the thread.
        fs::write(ext4.join("loop0/journal_task"), "290\n").unwrap();
        let t = ext4_mount_time(&sys, &proc_root, "loop0").unwrap();
        assert_eq!(t, at(1_700_000_012));
        // Another namespace (0), or a pid that is another process here:
        // found by name.
        for other in ["0\n", "1\n"] {
            fs::write(ext4.join("loop0/journal_task"), other).unwrap();
            let t = ext4_mount_time(&sys, &proc_root, "loop0").unwrap();
            assert_eq!(t, at(1_700_000_012), "journal_task {other:?}");
        }
        // No journal, no thread.
        fs::write(ext4.join("vda/journal_task"), "<none>\n").unwrap();
        assert_eq!(ext4_mount_time(&sys, &proc_root, "vda").unwrap(), None);
        // A journal whose thread is nowhere to be found.
        fs::write(ext4.join("loop3/journal_task"), "0\n").unwrap();
        let err = ext4_mount_time(&sys, &proc_root, "loop3").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "no single journal thread of loop3 under {}: 0 processes named jbd2/loop3-*",
                proc_root.display()
            )
        );
    }

    #[test]
    fn two_threads_of_one_cut_name_are_no_answer() {
        let tmp = tempfile::tempdir().unwrap();
        fake_proc(
            tmp.path(),
            &[(10, "jbd2/nvme10n1p1", 5), (11, "jbd2/nvme10n1p1", 6)],
        );
        let err = journal_thread_by_name(tmp.path(), "nvme10n1p1").unwrap_err();
        assert!(err.to_string().contains(": 2 processes named"), "{err}");
    }
}
