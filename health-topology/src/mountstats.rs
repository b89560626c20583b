//! The NFS client's own counters per mount (`/proc/<pid>/mountstats`,
//! written by the kernel's `nfs_show_stats` and the transport's
//! `print_stats`): the RPC transport's connects, sends and replies, and per
//! operation how many calls, transmissions, major timeouts and errors.
//! Every kernel has them (5.10, 6.1, 6.12, 6.18), with no BPF. The volume
//! checks read them to tell a server that stopped answering from a path
//! that hangs for another reason (`ServerNotResponding`).
//!
//! The transport's counters (`xprt:`) change while requests wait: a reply
//! counts at once; the per-operation ones only when a call ends. Several
//! mounts of one server share one client and transport, so they show the
//! same transport counters.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::mountinfo::unescape;

/// At most this much of the file is read: about 4 KiB per NFS mount, so
/// a thousand NFS mounts fit; the mounts past it are left out (and their
/// volumes keep what the other checks say).
pub const MAX_BYTES: u64 = 8 << 20;

/// One NFS mount's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NfsMountStats {
    /// Where it is mounted, in the reading process's mount namespace.
    pub mount_point: PathBuf,
    /// The mount's source: `server:/export`.
    pub source: String,
    /// `nfs` or `nfs4`.
    pub fs_type: String,
    /// The RPC transports' counters, summed (several with `nconnect`);
    /// `None` when the kernel printed none this parser knows.
    pub transport: Option<Transport>,
    pub calls: Calls,
}

/// An RPC transport's counters since it was made (`xprt:` lines).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transport {
    /// Connection attempts (0 for UDP, which has none).
    pub connects: u64,
    pub sends: u64,
    /// Replies received: a server that answers anything moves it.
    pub replies: u64,
}

/// The per-operation counters, summed over the operations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    pub calls: u64,
    pub transmissions: u64,
    /// Calls that reached a major timeout (the kernel then says "server
    /// not responding"), counted when the call ended.
    pub major_timeouts: u64,
    /// Calls that ended in an error (kernels since 5.3 print it).
    pub errors: u64,
}

impl Calls {
    /// Transmissions beyond each call's first.
    pub fn retransmissions(&self) -> u64 {
        self.transmissions.saturating_sub(self.calls)
    }
}

/// Reads `path` (a `mountstats` file) and keeps its NFS mounts.
pub fn read_nfs_stats(path: &Path) -> io::Result<Vec<NfsMountStats>> {
    let file = std::fs::File::open(path)?;
    let mut text = Vec::new();
    file.take(MAX_BYTES).read_to_end(&mut text)?;
    Ok(parse_nfs_stats(&text))
}

/// The NFS mounts of mountstats text. Lines it does not know are skipped:
/// the file's layout grew over the kernel versions.
pub fn parse_nfs_stats(text: &[u8]) -> Vec<NfsMountStats> {
    let mut mounts = Vec::new();
    let mut current: Option<NfsMountStats> = None;
    let mut per_op = false;
    for line in text.split(|b| *b == b'\n') {
        if let Some(rest) = line.strip_prefix(b"device ") {
            mounts.extend(current.take());
            current = parse_device_line(rest);
            per_op = false;
            continue;
        }
        let Some(mount) = current.as_mut() else {
            continue;
        };
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        let line = line.trim();
        if let Some(xprt) = line.strip_prefix("xprt:") {
            if let Some(t) = parse_xprt(xprt) {
                let sum = mount.transport.get_or_insert_with(Transport::default);
                sum.connects += t.connects;
                sum.sends += t.sends;
                sum.replies += t.replies;
            }
        } else if line == "per-op statistics" {
            per_op = true;
        } else if per_op {
            if let Some(op) = parse_op(line) {
                let c = &mut mount.calls;
                c.calls += op.calls;
                c.transmissions += op.transmissions;
                c.major_timeouts += op.major_timeouts;
                c.errors += op.errors;
            }
        }
    }
    mounts.extend(current);
    mounts
}

/// `SOURCE mounted on PATH with fstype TYPE statvers=1.1`, for nfs and nfs4.
fn parse_device_line(rest: &[u8]) -> Option<NfsMountStats> {
    let fields: Vec<&[u8]> = rest.split(|b| *b == b' ').collect();
    // The source and path are escaped: neither holds a plain space.
    let [source, b"mounted", b"on", path, b"with", b"fstype", fs_type, ..] = fields[..] else {
        return None;
    };
    let fs_type = std::str::from_utf8(fs_type).ok()?;
    if fs_type != "nfs" && fs_type != "nfs4" {
        return None;
    }
    use std::os::unix::ffi::OsStringExt as _;
    Some(NfsMountStats {
        mount_point: PathBuf::from(std::ffi::OsString::from_vec(unescape(path))),
        source: String::from_utf8_lossy(&unescape(source)).into_owned(),
        fs_type: fs_type.to_string(),
        transport: None,
        calls: Calls::default(),
    })
}

/// An `xprt:` line's protocol and counters (net/sunrpc/xprtsock.c and
/// xprtrdma: tcp and rdma print srcport, bind count, connect count,
/// connect time, idle time, sends, recvs...; udp has no connect fields).
fn parse_xprt(rest: &str) -> Option<Transport> {
    let mut fields = rest.split_whitespace();
    let proto = fields.next()?;
    let numbers: Vec<u64> = fields.map_while(|f| f.parse().ok()).collect();
    let at = |i: usize| numbers.get(i).copied();
    match proto {
        "tcp" | "rdma" => Some(Transport {
            connects: at(2)?,
            sends: at(5)?,
            replies: at(6)?,
        }),
        "udp" => Some(Transport {
            connects: 0,
            sends: at(2)?,
            replies: at(3)?,
        }),
        _ => None,
    }
}

struct Op {
    calls: u64,
    transmissions: u64,
    major_timeouts: u64,
    errors: u64,
}

/// `NAME: ops trans timeouts bytes_sent bytes_recv queue rtt execute [errors]`.
fn parse_op(line: &str) -> Option<Op> {
    let (_, counts) = line.split_once(':')?;
    let n: Vec<u64> = counts
        .split_whitespace()
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if n.len() < 8 {
        return None;
    }
    Some(Op {
        calls: n[0],
        transmissions: n[1],
        major_timeouts: n[2],
        errors: n.get(8).copied().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two NFS mounts as a 6.1 guest printed them (trimmed), around other
    /// mounts; the second's path holds an escaped space.
    const TEXT: &str = "device proc mounted on /proc with fstype proc
device 127.0.0.1:/ mounted on /tmp/v4 with fstype nfs4 statvers=1.1
\topts:\trw,vers=4.2,rsize=262144,hard,proto=tcp,timeo=20,retrans=2
\tage:\t12
\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)
\txprt:\ttcp 0 0 14 0 0 18 18 0 18 0 2 0 0
\tper-op statistics
\t        NULL: 1 1 0 44 24 6 11 18 0
\t        READ: 3 5 1 180 4200 1 8 10 2
\t     GETATTR: 2 2 0 176 224 0 3 5
device 127.0.0.1:/srv/export mounted on /tmp/with\\040space with fstype nfs statvers=1.1
\txprt:\tudp 724 1 7 6 0 7 0 2 0 0
\txprt:\ttcp 724 1 3 0 0 10 9 0 7 0 2 0 0
\tper-op statistics
\t        READ: 0 0 0 0 0 0 0 0 0
device /dev/vda mounted on / with fstype ext4
";

    #[test]
    fn nfs_mounts_with_their_transport_and_calls() {
        let mounts = parse_nfs_stats(TEXT.as_bytes());
        assert_eq!(
            mounts,
            vec![
                NfsMountStats {
                    mount_point: "/tmp/v4".into(),
                    source: "127.0.0.1:/".into(),
                    fs_type: "nfs4".into(),
                    transport: Some(Transport {
                        connects: 14,
                        sends: 18,
                        replies: 18
                    }),
                    calls: Calls {
                        calls: 6,
                        transmissions: 8,
                        major_timeouts: 1,
                        errors: 2
                    },
                },
                NfsMountStats {
                    mount_point: "/tmp/with space".into(),
                    source: "127.0.0.1:/srv/export".into(),
                    fs_type: "nfs".into(),
                    transport: Some(Transport {
                        connects: 3,
                        sends: 17,
                        replies: 15
                    }),
                    calls: Calls::default(),
                },
            ]
        );
        assert_eq!(mounts[0].calls.retransmissions(), 2);
    }

    #[test]
    fn odd_lines_are_skipped_not_fatal() {
        let text = b"device 10.0.0.1:/x mounted on /m with fstype nfs4 statvers=1.1
\txprt:\tlocal 1 2
\txprt:\ttcp 1 2
\tper-op statistics
\t        READ: 1 2 x 4 5 6 7 8
\t        WRITE: 1 2
\xff\xfe
device broken
";
        let mounts = parse_nfs_stats(text);
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].transport, None);
        assert_eq!(mounts[0].calls, Calls::default());
    }
}
