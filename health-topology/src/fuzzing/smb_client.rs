//! The SMB client's connections (`smb_client::parse_smb_connections`): the
//! input is a `/proc/fs/cifs/DebugData` file.
//!
//! Properties: no panic; at most one connection per `ConnectionId:` or
//! `TCP status:` line (the older layout begins a connection at its
//! status); every share is a `\\` name; and parsing is line by line: the
//! text cut just before the last `N) ConnectionId:` line parses to the
//! connections before it, unchanged.

use crate::smb_client::parse_smb_connections;

pub fn run(data: &[u8]) {
    let conns = parse_smb_connections(data);
    let starts = data
        .split(|b| *b == b'\n')
        .filter(|l| contains(l, b"ConnectionId:") || contains(l, b"TCP status:"))
        .count();
    assert!(conns.len() <= starts, "{} of {starts}", conns.len());
    for c in &conns {
        for s in &c.shares {
            assert!(s.starts_with("\\\\"), "{s:?}");
        }
    }
    let Some(last) = data
        .split(|b| *b == b'\n')
        .scan(0usize, |at, line| {
            let start = *at;
            *at += line.len() + 1;
            Some((start, line))
        })
        .filter(|(_, l)| begins_connection(l))
        .map(|(start, _)| start)
        .last()
    else {
        return;
    };
    let before = parse_smb_connections(&data[..last]);
    assert!(before.len() <= conns.len());
    assert_eq!(before[..], conns[..before.len()]);
}

/// `N) ConnectionId: ...`: the line that begins a connection in the
/// numbered layout, whatever came before it.
fn begins_connection(line: &[u8]) -> bool {
    let Ok(line) = std::str::from_utf8(line) else {
        return false;
    };
    line.trim().split_once(") ").is_some_and(|(n, rest)| {
        n.parse::<u32>().is_ok() && rest.trim_start().starts_with("ConnectionId:")
    })
}

fn contains(line: &[u8], needle: &[u8]) -> bool {
    line.windows(needle.len()).any(|w| w == needle)
}
