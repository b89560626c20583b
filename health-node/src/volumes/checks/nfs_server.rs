//! Whether an NFS volume's server answers: when the probe of an NFS mount
//! hangs or fails, the client's own counters for the mount
//! (`health_topology::mountstats`) say whether the server sent any reply
//! on its transport since. No reply for the mount's own timeout (`timeo`)
//! while the probe waits is `Inaccessible ServerNotResponding`; replies
//! still coming mean the server answers others (a slow export, a hung
//! local lock): the probe's `PathHung` or `PathUnreachable` stays.
//!
//! The counters are read only while a probe of an NFS mount fails, so the
//! silence is timed from the first look at them: the finding comes at most
//! `timeo` plus one check interval after the probe's own timeout. A probe
//! that passes forgets the mount: the server answered it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use health_core::conditions::{CheckFinding, ServerSilence};
use health_topology::mountstats::{read_nfs_stats, NfsMountStats};
use health_topology::MountEntry;

use super::server_state::{super_option, Failed, Recent};

/// The kernel's default `timeo` for NFS over TCP (nfs(5)): 60 s.
const DEFAULT_TIMEO: Duration = Duration::from_secs(60);

/// Per failing NFS mount point: the replies last seen and since when.
#[derive(Debug, Default)]
pub struct ServerReplies {
    silent: Mutex<HashMap<PathBuf, Silence>>,
    /// The counters, read once per round.
    last_read: Recent<Vec<NfsMountStats>>,
}

#[derive(Debug, Clone, Copy)]
struct Silence {
    replies: u64,
    since: SystemTime,
}

impl ServerReplies {
    /// Whether `mount` is an NFS mount, the only kind judged here.
    pub fn applies(mount: &MountEntry) -> bool {
        matches!(mount.fs_type.as_str(), "nfs" | "nfs4")
    }

    /// Called when a probe of the NFS `mount` hung or failed: `Some` when
    /// its server has been silent for the mount's timeout. `Err`: the
    /// counters could not be read (the caller keeps the probe's finding).
    pub fn judge(
        &self,
        proc_root: &Path,
        mount: &MountEntry,
        failed: Failed<'_>,
        now: SystemTime,
    ) -> std::io::Result<Option<CheckFinding>> {
        let stats = self.last_read.get(now, || read_stats(proc_root))?;
        {
            // Mounts gone since are forgotten: the map holds failing mounts only.
            let mut silent = self.silent.lock().unwrap_or_else(|e| e.into_inner());
            silent.retain(|at, _| stats.iter().any(|s| &s.mount_point == at));
        }
        let replies = stats
            .iter()
            .rev()
            .find(|s| s.mount_point == mount.mount_point)
            .and_then(|s| s.transport)
            .map(|t| t.replies);
        let Some(replies) = replies else {
            return Ok(None);
        };
        let silence = {
            let mut silent = self.silent.lock().unwrap_or_else(|e| e.into_inner());
            let entry = silent.entry(mount.mount_point.clone()).or_insert(Silence {
                replies,
                since: now,
            });
            if entry.replies != replies {
                *entry = Silence {
                    replies,
                    since: now,
                };
            }
            *entry
        };
        let timeout = timeo(mount);
        let silent_for = now.duration_since(silence.since).unwrap_or_default();
        if silent_for < timeout {
            return Ok(None);
        }
        Ok(Some(CheckFinding::ServerNotResponding {
            path: failed.path.to_path_buf(),
            server: server(mount),
            op: failed.op,
            since: silence.since,
            silence: ServerSilence::NfsNoReply { timeout },
            errno: failed.errno,
        }))
    }

    /// The probe of `mount_point` passed: its server answered.
    pub fn answered(&self, mount_point: &Path) {
        let mut silent = self.silent.lock().unwrap_or_else(|e| e.into_inner());
        if !silent.is_empty() {
            silent.remove(mount_point);
        }
    }
}

/// Pid 1's counters (the host's mounts, as the mount table is read), else
/// this process's.
fn read_stats(proc_root: &Path) -> std::io::Result<Vec<NfsMountStats>> {
    read_nfs_stats(&proc_root.join("1/mountstats"))
        .or_else(|_| read_nfs_stats(&proc_root.join("self/mountstats")))
}

/// The mount's `timeo` (tenths of a second), else the default.
fn timeo(mount: &MountEntry) -> Duration {
    super_option(mount, "timeo")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map_or(DEFAULT_TIMEO, |t| Duration::from_millis(t * 100))
}

/// The mount's `addr=` (the address the client connects to), else the
/// host part of its source (`server:/export`, `[v6]:/export`).
fn server(mount: &MountEntry) -> String {
    if let Some(addr) = super_option(mount, "addr") {
        return addr.to_string();
    }
    let source = &mount.source;
    match source.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6).to_string(),
        None => source.split(':').next().unwrap_or(source).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use health_core::dev::Dev;

    fn nfs_mount(at: &str, super_options: &str) -> MountEntry {
        MountEntry {
            mount_id: 75,
            parent_id: 54,
            dev: Dev::new(0, 59),
            root: "/".into(),
            mount_point: at.into(),
            mount_options: "rw,relatime".into(),
            fs_type: "nfs4".into(),
            source: "server.example:/".into(),
            super_options: super_options.into(),
        }
    }

    /// A /proc with pid 1's mountstats showing `replies` for `/v`.
    fn proc_with(dir: &Path, replies: u64) {
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::write(
            dir.join("1/mountstats"),
            format!(
                "device server.example:/ mounted on /v with fstype nfs4 statvers=1.1\n\
                 \txprt:\ttcp 0 0 14 0 0 {replies} {replies} 0 18 0 2 0 0\n"
            ),
        )
        .unwrap();
    }

    #[test]
    fn silent_for_the_mounts_timeout_is_server_not_responding() {
        let proc = tempfile::tempdir().unwrap();
        let mount = nfs_mount("/v", "rw,vers=4.2,hard,timeo=20,retrans=2,addr=10.0.0.7");
        let replies = ServerReplies::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let failed = || Failed {
            path: Path::new("/v"),
            op: "statvfs",
            errno: None,
        };
        proc_with(proc.path(), 18);
        let judge = |at: u64| {
            replies
                .judge(
                    proc.path(),
                    &mount,
                    failed(),
                    t0 + Duration::from_millis(at),
                )
                .unwrap()
        };
        // First look, then 1.9 s of silence: not yet the mount's 2 s.
        assert_eq!(judge(0), None);
        assert_eq!(judge(1_900), None);
        let found = judge(2_000).expect("2 s without a reply");
        assert_eq!(found.reason(), "ServerNotResponding");
        assert_eq!(
            found.message(),
            "NFS server 10.0.0.7 has sent no reply since 1970-01-01T00:16:40Z \
             (the mount's timeout is 2s); statvfs of /v has not returned"
        );
        // A reply: the silence starts again from there.
        proc_with(proc.path(), 19);
        assert_eq!(judge(3_000), None);
        assert!(judge(5_000).is_some());
        // The probe passed: forgotten, timed afresh next time.
        replies.answered(Path::new("/v"));
        assert_eq!(judge(6_000), None);
    }

    #[test]
    fn a_soft_mounts_error_is_said_and_the_default_timeout_applies() {
        let proc = tempfile::tempdir().unwrap();
        proc_with(proc.path(), 5);
        let mount = nfs_mount("/v", "rw,vers=4.2,soft");
        let replies = ServerReplies::default();
        let t0 = SystemTime::UNIX_EPOCH;
        let failed = || Failed {
            path: Path::new("/v"),
            op: "statvfs",
            errno: Some(libc::ETIMEDOUT),
        };
        assert_eq!(
            replies.judge(proc.path(), &mount, failed(), t0).unwrap(),
            None
        );
        let at = t0 + Duration::from_secs(59);
        assert_eq!(
            replies.judge(proc.path(), &mount, failed(), at).unwrap(),
            None
        );
        let at = t0 + Duration::from_secs(60);
        let found = replies
            .judge(proc.path(), &mount, failed(), at)
            .unwrap()
            .unwrap();
        assert_eq!(
            found.message(),
            "NFS server server.example has sent no reply since 1970-01-01T00:00:00Z \
             (the mount's timeout is 1m00s); statvfs of /v failed: ETIMEDOUT"
        );
    }

    #[test]
    fn a_mount_the_counters_do_not_list_is_not_judged() {
        let proc = tempfile::tempdir().unwrap();
        proc_with(proc.path(), 5);
        let mount = nfs_mount("/elsewhere", "timeo=1");
        let failed = Failed {
            path: Path::new("/elsewhere"),
            op: "statvfs",
            errno: None,
        };
        let late = SystemTime::UNIX_EPOCH + Duration::from_secs(3_600);
        let replies = ServerReplies::default();
        assert_eq!(
            replies.judge(proc.path(), &mount, failed, late).unwrap(),
            None
        );
        let unread = ServerReplies::default();
        let failed = Failed {
            path: Path::new("/x"),
            op: "statvfs",
            errno: None,
        };
        assert!(unread
            .judge(Path::new("/nonexistent"), &mount, failed, late)
            .is_err());
    }

    #[test]
    fn one_read_serves_a_round_and_mounts_gone_are_forgotten() {
        let proc = tempfile::tempdir().unwrap();
        proc_with(proc.path(), 5);
        let mount = nfs_mount("/v", "timeo=10");
        let replies = ServerReplies::default();
        let t0 = SystemTime::UNIX_EPOCH;
        let failed = || Failed {
            path: Path::new("/v"),
            op: "statvfs",
            errno: None,
        };
        assert_eq!(
            replies.judge(proc.path(), &mount, failed(), t0).unwrap(),
            None
        );
        // Within the same round the counters are not read again: a reply
        // that came meanwhile is not seen, so the silence still runs from
        // t0 when the next round finds the count back where it was.
        proc_with(proc.path(), 6);
        let soon = t0 + Duration::from_millis(400);
        assert_eq!(
            replies.judge(proc.path(), &mount, failed(), soon).unwrap(),
            None
        );
        proc_with(proc.path(), 5);
        let next = t0 + Duration::from_secs(1);
        let found = replies.judge(proc.path(), &mount, failed(), next).unwrap();
        assert!(
            matches!(found, Some(CheckFinding::ServerNotResponding { since, .. }) if since == t0),
            "{found:?}"
        );
        assert_eq!(replies.silent.lock().unwrap().len(), 1);
        // The mount gone from the counters: its entry goes.
        std::fs::write(
            proc.path().join("1/mountstats"),
            "device proc mounted on /proc with fstype proc\n",
        )
        .unwrap();
        let later = t0 + Duration::from_secs(2);
        assert_eq!(
            replies.judge(proc.path(), &mount, failed(), later).unwrap(),
            None
        );
        assert_eq!(replies.silent.lock().unwrap().len(), 0);
    }
}
