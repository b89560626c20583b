//! The SMB client's connections to its servers (`/proc/fs/cifs/DebugData`,
//! written by the kernel's `cifs_debug_data_proc_show`): per server
//! connection its host and TCP status, and the shares (tree connects)
//! mounted through it. The volume checks read it, while a probe of an SMB
//! mount fails, to tell a server the client lost from a path that fails
//! for another reason (`ServerNotResponding`).
//!
//! The file is the client's debugging view, not an ABI: its layout moved
//! between kernels, so only a few kinds of lines are read and everything
//! else is skipped: a server's (`N) ConnectionId: ... Hostname: H` on 6.1
//! and 6.12; on 5.10 a session's `N) Name: H ...`), `TCP status: S`, and a
//! share's `N) \\host\share Mounts: ...` (`IPC: ` before the IPC share).
//! The format strings were read from Debian's 5.10.262, 6.1 and 6.12.118
//! `cifs.ko`; the 6.12 layout was also seen live (the seeds). It is one
//! file for the whole node: the client has no per-mount-namespace view of
//! it.

use std::io::{self, Read};
use std::path::Path;

/// At most this much is read: a server's block is under 2 KiB, and a node
/// with more connections than fit keeps the checks' own findings for the
/// rest.
pub const MAX_BYTES: u64 = 4 << 20;

/// One connection of the client to a server (`struct TCP_Server_Info`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SmbConnection {
    /// The server's name as the mount gave it (`Hostname:`); empty on
    /// kernels that do not print it.
    pub hostname: String,
    /// The connection's state (`TCP status:`); `None` when not printed.
    pub status: Option<ConnectionStatus>,
    /// The shares mounted through it, as `\\host\share` (IPC$ included).
    pub shares: Vec<String>,
}

/// `enum statusEnum` of the client (fs/smb/client/cifsglob.h, formerly
/// fs/cifs/cifsglob.h): the same numbers on 5.10 through 6.12.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionStatus {
    New,
    Good,
    Exiting,
    NeedReconnect,
    NeedNegotiate,
    InNegotiate,
    Other(u32),
}

impl ConnectionStatus {
    fn from_number(n: u32) -> Self {
        match n {
            0 => ConnectionStatus::New,
            1 => ConnectionStatus::Good,
            2 => ConnectionStatus::Exiting,
            3 => ConnectionStatus::NeedReconnect,
            4 => ConnectionStatus::NeedNegotiate,
            5 => ConnectionStatus::InNegotiate,
            n => ConnectionStatus::Other(n),
        }
    }

    /// Whether the client has lost the server: it must reconnect (or
    /// negotiate again) before any request of the mount can be sent. A new
    /// connection and one being torn down at unmount are neither.
    pub fn lost(self) -> bool {
        matches!(
            self,
            ConnectionStatus::NeedReconnect
                | ConnectionStatus::NeedNegotiate
                | ConnectionStatus::InNegotiate
        )
    }

    /// Words for a message.
    pub fn words(self) -> String {
        match self {
            ConnectionStatus::New => "new".into(),
            ConnectionStatus::Good => "connected".into(),
            ConnectionStatus::Exiting => "closing".into(),
            ConnectionStatus::NeedReconnect => "disconnected, reconnecting".into(),
            ConnectionStatus::NeedNegotiate => "reconnected, not yet negotiated".into(),
            ConnectionStatus::InNegotiate => "negotiating".into(),
            ConnectionStatus::Other(n) => format!("TCP status {n}"),
        }
    }
}

impl SmbConnection {
    /// Whether share `unc` (`\\host\share`, any case) is mounted through it.
    pub fn serves(&self, unc: &str) -> bool {
        self.shares.iter().any(|s| s.eq_ignore_ascii_case(unc))
    }
}

/// The share a mount's source names, as DebugData spells it: the source
/// `//host/share[/sub/path]` (or with backslashes) gives `\\host\share`.
pub fn share_of_source(source: &str) -> Option<String> {
    let rest = source
        .strip_prefix("//")
        .or_else(|| source.strip_prefix("\\\\"))?;
    let mut parts = rest.split(['/', '\\']).filter(|p| !p.is_empty());
    let host = parts.next()?;
    let share = parts.next()?;
    Some(format!("\\\\{host}\\{share}"))
}

/// Reads `path` (the client's DebugData).
pub fn read_smb_connections(path: &Path) -> io::Result<Vec<SmbConnection>> {
    let file = std::fs::File::open(path)?;
    let mut text = Vec::new();
    file.take(MAX_BYTES).read_to_end(&mut text)?;
    Ok(parse_smb_connections(&text))
}

/// The connections of DebugData text. Lines before the first connection
/// and lines this parser does not know are skipped.
///
/// Two layouts: since the client numbers its connections (`N)
/// ConnectionId: ... Hostname: H`, then the connection's `TCP status`,
/// then its sessions and shares; a multichannel session's extra channels
/// print a `TCP status` of their own, after the connection's), and before
/// (each session's `N) Name: H` or `N) Address: H` line, then its
/// server's `TCP status`, then its shares). In the second, a status line
/// after the connection already has one begins the next session's.
pub fn parse_smb_connections(text: &[u8]) -> Vec<SmbConnection> {
    let mut connections: Vec<SmbConnection> = Vec::new();
    let mut numbered_connections = false;
    // The host of the last session line, for the layout without ids.
    let mut session_host = String::new();
    for line in text.split(|b| *b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        let line = line.trim();
        if let Some((_, item)) = numbered(line) {
            if let Some(rest) = item.strip_prefix("ConnectionId:") {
                numbered_connections = true;
                connections.push(SmbConnection {
                    hostname: word_after(rest, "Hostname:").to_string(),
                    ..SmbConnection::default()
                });
            } else if let Some(rest) = item
                .strip_prefix("Name:")
                .or_else(|| item.strip_prefix("Address:"))
            {
                session_host = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string();
            } else {
                let item = item.strip_prefix("IPC: ").unwrap_or(item);
                if item.starts_with("\\\\") {
                    let unc = item.split_whitespace().next().unwrap_or(item);
                    if let Some(conn) = connections.last_mut() {
                        conn.shares.push(unc.to_string());
                    }
                }
            }
        }
        // The status ends the session's line in the older layout; an
        // extra channel's line has one of its own.
        let Some((_, status)) = line.split_once("TCP status:") else {
            continue;
        };
        if line.contains("Channel") {
            continue;
        }
        let Some(n) = status
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
        else {
            continue;
        };
        let status = Some(ConnectionStatus::from_number(n));
        match connections.last_mut() {
            Some(conn) if conn.status.is_none() => conn.status = status,
            // The layout with ids prints one status per connection.
            _ if numbered_connections => {}
            _ => connections.push(SmbConnection {
                hostname: std::mem::take(&mut session_host),
                status,
                shares: Vec::new(),
            }),
        }
    }
    connections
}

/// The word after `key` in `text`, or "".
fn word_after<'a>(text: &'a str, key: &str) -> &'a str {
    text.split_whitespace()
        .skip_while(|w| *w != key)
        .nth(1)
        .unwrap_or_default()
}

/// `N) rest` with N a number: the lines that begin a server, a session or
/// a share.
fn numbered(line: &str) -> Option<(u32, &str)> {
    let (number, rest) = line.split_once(") ")?;
    Some((number.parse().ok()?, rest.trim_start()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As 6.12 printed it in CI's guest, a share mounted from ksmbd, just
    /// after the server was stopped (abridged: lines the parser skips).
    const DOWN_612: &str = "Display Internal CIFS Data Structures for Debugging
---------------------------------------------------
CIFS Version 2.51
Features: DFS,FSCACHE,STATS2,DEBUG,ALLOW_INSECURE_LEGACY,CIFS_POSIX,UPCALL(SPNEGO),XATTR,ACL
CIFSMaxBufSize: 16384
Active VFS Requests: 0

Servers: 
1) ConnectionId: 0x1 Hostname: 127.0.0.1 
ClientGUID: 461F3EB1-2E19-AE4D-AEAF-1E12E33D2E96
Server capabilities: 0x300044
TCP status: 3 Instance: 1
Local Users To Server: 1 SecMode: 0x1 Req On Wire: 0 Net namespace: 4026531840 
In Send: 0 In MaxReq Wait: 0

\tSessions: 
\t1) Address: 127.0.0.1 Uses: 1 Capability: 0x300044\tSession Status: 3 
\tSecurity type: RawNTLMSSP  SessionId: 0x1
\tUser: 0 Cred User: 0\tPrimary channel: DISCONNECTED 

\tShares: 
\t0) IPC: \\\\127.0.0.1\\IPC$ Mounts: 1 DevInfo: 0x0 Attributes: 0x0
\tPathComponentMax: 0 Status: 3 type: 0 Serial Number: 0x0
\ttid: 0x1\tMaximal Access: 0x1f00a9\tDISCONNECTED 

\t1) \\\\127.0.0.1\\share Mounts: 1 DevInfo: 0x20 Attributes: 0x801004f
\tPathComponentMax: 255 Status: 3 type: DISK Serial Number: 0x6965bd1a
\ttid: 0x2\tOptimal sector size: 0x1000\tMaximal Access: 0x1f01ff\tDISCONNECTED 


\tMIDs: 
--
";

    #[test]
    fn a_lost_connection_and_its_shares() {
        let conns = parse_smb_connections(DOWN_612.as_bytes());
        assert_eq!(
            conns,
            [SmbConnection {
                hostname: "127.0.0.1".into(),
                status: Some(ConnectionStatus::NeedReconnect),
                shares: vec!["\\\\127.0.0.1\\IPC$".into(), "\\\\127.0.0.1\\share".into()],
            }]
        );
        assert!(conns[0].status.unwrap().lost());
        assert!(conns[0].serves("\\\\127.0.0.1\\SHARE"));
        assert!(!conns[0].serves("\\\\127.0.0.1\\other"));
    }

    #[test]
    fn two_servers_each_with_its_own_status() {
        let text = "Servers: \n\
            1) ConnectionId: 0x1 Hostname: files-a \nTCP status: 1 Instance: 1\n\
            \tShares: \n\t1) \\\\files-a\\data Mounts: 2 DevInfo: 0x20\n\
            2) ConnectionId: 0x2 Hostname: files-b \nTCP status: 4 Instance: 3\n\
            \tShares: \n\t1) \\\\files-b\\home Mounts: 1 DevInfo: 0x20\n";
        let conns = parse_smb_connections(text.as_bytes());
        assert_eq!(conns.len(), 2);
        assert_eq!(conns[0].status, Some(ConnectionStatus::Good));
        assert!(!conns[0].status.unwrap().lost());
        assert_eq!(conns[1].hostname, "files-b");
        assert_eq!(conns[1].shares, ["\\\\files-b\\home"]);
        assert!(conns[1].status.unwrap().lost());
        assert_eq!(
            conns[1].status.unwrap().words(),
            "reconnected, not yet negotiated"
        );
    }

    /// The layout before connections were numbered (5.10's client): a
    /// session line, its server's status, its shares; a second session of
    /// another server after.
    #[test]
    fn sessions_without_connection_ids() {
        let text = "Servers:\n\
            Number of credits: 512 Dialect 0x300\n\
            1) Name: 10.0.0.5 Uses: 1 Capability: 0x300047\tSession Status: 1 TCP status: 3 Instance: 2\n\
            \tLocal Users To Server: 1 SecMode: 0x1 Req On Wire: 0\n\
            \tShares:\n\t0) IPC: \\\\10.0.0.5\\IPC$ Mounts: 1 DevInfo: 0x0\n\
            \t1) \\\\10.0.0.5\\data Mounts: 1 DevInfo: 0x20\n\
            2) Name: 10.0.0.6 Uses: 1 Capability: 0x300047\tSession Status: 1 \n\
            TCP status: 1 Instance: 1\n\
            \tShares:\n\t1) \\\\10.0.0.6\\home Mounts: 1 DevInfo: 0x20\n";
        let conns = parse_smb_connections(text.as_bytes());
        assert_eq!(conns.len(), 2, "{conns:?}");
        assert_eq!(conns[0].hostname, "10.0.0.5");
        assert_eq!(conns[0].status, Some(ConnectionStatus::NeedReconnect));
        assert!(conns[0].serves("\\\\10.0.0.5\\data"));
        assert_eq!(conns[1].hostname, "10.0.0.6");
        assert_eq!(conns[1].status, Some(ConnectionStatus::Good));
        assert_eq!(conns[1].shares, ["\\\\10.0.0.6\\home"]);
    }

    /// A multichannel session's extra channel prints its own status after
    /// its connection's: the connection's is kept.
    #[test]
    fn a_channels_status_is_not_its_connections() {
        let text = "1) ConnectionId: 0x1 Hostname: h \nTCP status: 3 Instance: 1\n\
            \t1) Address: h Uses: 1\n\
            \t\tChannel: 2 ConnectionId: 0x2\n\t\tTCP status: 1 Instance: 1\n\
            \tShares: \n\t1) \\\\h\\s Mounts: 1\n";
        let conns = parse_smb_connections(text.as_bytes());
        assert_eq!(conns.len(), 1, "{conns:?}");
        assert_eq!(conns[0].status, Some(ConnectionStatus::NeedReconnect));
        assert_eq!(conns[0].shares, ["\\\\h\\s"]);
    }

    #[test]
    fn no_servers_and_odd_lines() {
        let none = "Servers: \n\t[NONE]\n";
        assert_eq!(parse_smb_connections(none.as_bytes()), []);
        // A status before any connection line begins one (the layout
        // without ids); a status that is no number is skipped.
        let odd = "TCP status: 1\n1) \\\\h\\s Mounts: 1\n1) ConnectionId: 0x9 \nTCP status: x\n";
        assert_eq!(
            parse_smb_connections(odd.as_bytes()),
            [
                SmbConnection {
                    hostname: String::new(),
                    status: Some(ConnectionStatus::Good),
                    shares: vec!["\\\\h\\s".into()],
                },
                SmbConnection::default()
            ]
        );
        assert_eq!(ConnectionStatus::from_number(9).words(), "TCP status 9");
    }

    #[test]
    fn the_share_a_source_names() {
        assert_eq!(
            share_of_source("//127.0.0.1/share").as_deref(),
            Some("\\\\127.0.0.1\\share")
        );
        assert_eq!(
            share_of_source("//files.example/data/sub/dir").as_deref(),
            Some("\\\\files.example\\data")
        );
        assert_eq!(share_of_source("\\\\h\\s").as_deref(), Some("\\\\h\\s"));
        assert_eq!(share_of_source("//host"), None);
        assert_eq!(share_of_source("server:/export"), None);
    }
}
