//! Whether an SMB volume's server answers: when the probe of an SMB (cifs)
//! mount hangs or fails, the client's connections
//! (`health_topology::smb_client`) say whether the connection its share
//! goes through is lost. The client marks a connection lost itself, when
//! the socket breaks or the server leaves its echo requests unanswered
//! (`echo_interval`, 60 s by default), and then reconnects: a lost
//! connection while the probe fails is `Inaccessible ServerNotResponding`
//! at once. A connection the client still holds good means the server
//! answers: the probe's `PathHung` or `PathUnreachable` stays.
//!
//! DebugData is read only while a probe of an SMB mount fails; a probe
//! that passes forgets the mount.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use health_core::conditions::{CheckFinding, ServerSilence};
use health_topology::smb_client::{read_smb_connections, share_of_source, SmbConnection};
use health_topology::MountEntry;

use super::server_state::{super_option, Failed, Recent};

/// Per failing SMB mount point: its share, and since when its connection
/// has been seen lost.
#[derive(Debug, Default)]
pub struct SmbConnections {
    lost: Mutex<HashMap<PathBuf, Lost>>,
    last_read: Recent<Vec<SmbConnection>>,
}

#[derive(Debug, Clone)]
struct Lost {
    share: String,
    since: SystemTime,
}

impl SmbConnections {
    /// Whether `mount` is an SMB mount, the only kind judged here.
    pub fn applies(mount: &MountEntry) -> bool {
        matches!(mount.fs_type.as_str(), "cifs" | "smb3")
    }

    /// Called when a probe of the SMB `mount` hung or failed: `Some` when
    /// every connection its share goes through is lost. `Err`: the
    /// client's state could not be read (the caller keeps the probe's
    /// finding).
    pub fn judge(
        &self,
        proc_root: &Path,
        mount: &MountEntry,
        failed: Failed<'_>,
        now: SystemTime,
    ) -> std::io::Result<Option<CheckFinding>> {
        let conns = self.last_read.get(now, || {
            read_smb_connections(&proc_root.join("fs/cifs/DebugData"))
        })?;
        let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        // Shares no connection serves any more were unmounted.
        lost.retain(|_, l| conns.iter().any(|c| c.serves(&l.share)));
        let Some(share) = share_of_source(&mount.source) else {
            return Ok(None);
        };
        // Several connections may carry one share (DFS, multichannel):
        // one still good answers.
        let through: Vec<&SmbConnection> = conns.iter().filter(|c| c.serves(&share)).collect();
        let status = match through.as_slice() {
            [first, ..] if through.iter().all(|c| c.status.is_some_and(|s| s.lost())) => {
                first.status.expect("checked above")
            }
            _ => {
                lost.remove(&mount.mount_point);
                return Ok(None);
            }
        };
        let since = lost
            .entry(mount.mount_point.clone())
            .or_insert_with(|| Lost {
                share: share.clone(),
                since: now,
            })
            .since;
        let hostname = &through[0].hostname;
        // Kernels before numbered connections print no host name.
        let server = match super_option(mount, "addr") {
            Some(addr) if hostname.is_empty() || addr == hostname => addr.to_string(),
            Some(addr) => format!("{hostname} ({addr})"),
            None if hostname.is_empty() => share.clone(),
            None => hostname.clone(),
        };
        Ok(Some(CheckFinding::ServerNotResponding {
            path: failed.path.to_path_buf(),
            server,
            op: failed.op,
            since,
            silence: ServerSilence::SmbConnectionLost {
                state: status.words(),
            },
            errno: failed.errno,
        }))
    }

    /// The probe of `mount_point` passed: its server answered.
    pub fn answered(&self, mount_point: &Path) {
        let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        if !lost.is_empty() {
            lost.remove(mount_point);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use health_core::dev::Dev;
    use std::time::Duration;

    fn smb_mount(at: &str, source: &str) -> MountEntry {
        MountEntry {
            mount_id: 74,
            parent_id: 27,
            dev: Dev::new(0, 59),
            root: "/".into(),
            mount_point: at.into(),
            mount_options: "rw,relatime".into(),
            fs_type: "cifs".into(),
            source: source.into(),
            super_options:
                "rw,vers=3.0,cache=strict,username=tester,addr=127.0.0.1,soft,echo_interval=1"
                    .into(),
        }
    }

    /// A /proc whose DebugData has one connection to `host` in TCP status
    /// `status`, carrying `\\host\share`.
    fn proc_with(dir: &Path, host: &str, status: u32) {
        std::fs::create_dir_all(dir.join("fs/cifs")).unwrap();
        std::fs::write(
            dir.join("fs/cifs/DebugData"),
            format!(
                "Servers: \n1) ConnectionId: 0x1 Hostname: {host} \nTCP status: {status} Instance: 1\n\
                 \tShares: \n\t0) IPC: \\\\{host}\\IPC$ Mounts: 1 DevInfo: 0x0\n\
                 \t1) \\\\{host}\\share Mounts: 1 DevInfo: 0x20 Attributes: 0x801004f\n"
            ),
        )
        .unwrap();
    }

    fn failed(errno: Option<i32>) -> Failed<'static> {
        Failed {
            path: Path::new("/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv-smb/mount"),
            op: "statvfs",
            errno,
        }
    }

    #[test]
    fn a_lost_connection_is_server_not_responding_until_the_probe_passes() {
        let proc = tempfile::tempdir().unwrap();
        let mount = smb_mount("/m", "//127.0.0.1/share");
        let conns = SmbConnections::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        // Connected: the probe's own finding stays.
        proc_with(proc.path(), "127.0.0.1", 1);
        assert_eq!(
            conns.judge(proc.path(), &mount, failed(None), t0).unwrap(),
            None
        );
        proc_with(proc.path(), "127.0.0.1", 3);
        let at = t0 + Duration::from_secs(1);
        let found = conns
            .judge(proc.path(), &mount, failed(Some(libc::EHOSTDOWN)), at)
            .unwrap()
            .expect("the connection is lost");
        assert_eq!(found.reason(), "ServerNotResponding");
        assert_eq!(
            found.message(),
            "SMB server 127.0.0.1: the client's connection is disconnected, reconnecting \
             since 1970-01-01T00:16:41Z; statvfs of \
             /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv-smb/mount failed: EHOSTDOWN"
        );
        // The same since while it stays lost: one message, one write.
        let later = at + Duration::from_secs(5);
        let again = conns
            .judge(proc.path(), &mount, failed(Some(libc::EHOSTDOWN)), later)
            .unwrap();
        assert_eq!(again, Some(found));
        conns.answered(Path::new("/m"));
        assert!(conns.lost.lock().unwrap().is_empty());
    }

    #[test]
    fn a_share_no_connection_carries_and_other_sources_are_not_judged() {
        let proc = tempfile::tempdir().unwrap();
        proc_with(proc.path(), "127.0.0.1", 3);
        let conns = SmbConnections::default();
        let t0 = SystemTime::UNIX_EPOCH;
        let other = smb_mount("/o", "//127.0.0.1/other");
        assert_eq!(
            conns.judge(proc.path(), &other, failed(None), t0).unwrap(),
            None
        );
        let odd = smb_mount("/x", "nonsense");
        assert_eq!(
            conns.judge(proc.path(), &odd, failed(None), t0).unwrap(),
            None
        );
        let unread = SmbConnections::default();
        assert!(unread
            .judge(Path::new("/nonexistent"), &other, failed(None), t0)
            .is_err());
    }

    #[test]
    fn a_name_differing_from_the_address_is_said_with_it_and_unmounted_shares_are_forgotten() {
        let proc = tempfile::tempdir().unwrap();
        proc_with(proc.path(), "files.example", 4);
        let mount = smb_mount("/m", "//files.example/share/sub");
        let conns = SmbConnections::default();
        let t0 = SystemTime::UNIX_EPOCH;
        let found = conns
            .judge(proc.path(), &mount, failed(None), t0)
            .unwrap()
            .unwrap();
        assert!(
            found.message().starts_with(
                "SMB server files.example (127.0.0.1): the client's connection is \
                 reconnected, not yet negotiated since"
            ),
            "{}",
            found.message()
        );
        assert!(found.message().ends_with("statvfs of /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv-smb/mount has not returned"));
        // The share unmounted: no connection carries it, its entry goes.
        std::fs::write(
            proc.path().join("fs/cifs/DebugData"),
            "Servers: \n\t[NONE]\n",
        )
        .unwrap();
        let next = t0 + Duration::from_secs(1);
        assert_eq!(
            conns
                .judge(proc.path(), &mount, failed(None), next)
                .unwrap(),
            None
        );
        assert!(conns.lost.lock().unwrap().is_empty());
    }
}
