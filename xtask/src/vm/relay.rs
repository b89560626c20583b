//! The guest's output files relayed to this process's stdout and stderr
//! while it runs.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use anyhow::Context;

/// Copies what a file gained since the last call to `to`; with a label,
/// whole lines only, each starting with `[label] `, so that guests running
/// side by side can be told apart.
pub struct Relay {
    path: PathBuf,
    offset: u64,
    label: Option<String>,
    /// With a label: the last line's start, until its newline arrives.
    partial: Vec<u8>,
}

impl Relay {
    pub fn new(path: PathBuf, label: Option<&str>) -> Relay {
        Relay {
            path,
            offset: 0,
            label: label.map(str::to_string),
            partial: Vec::new(),
        }
    }

    /// `buf` as it goes out: unchanged, or its whole lines labelled.
    fn labelled(&mut self, buf: Vec<u8>) -> Vec<u8> {
        let Some(label) = &self.label else {
            return buf;
        };
        self.partial.extend(buf);
        let Some(end) = self.partial.iter().rposition(|&b| b == b'\n') else {
            return Vec::new();
        };
        let rest = self.partial.split_off(end + 1);
        let lines = std::mem::replace(&mut self.partial, rest);
        let mut out = Vec::with_capacity(lines.len());
        for line in lines.split_inclusive(|&b| b == b'\n') {
            out.extend(format!("[{label}] ").as_bytes());
            out.extend(line);
        }
        out
    }

    /// Copies what the file gained since the last call to `to`.
    pub fn pump(&mut self, to: &mut impl Write) -> anyhow::Result<()> {
        let Ok(mut file) = File::open(&self.path) else {
            return Ok(());
        };
        file.seek(SeekFrom::Start(self.offset))
            .with_context(|| format!("reading {}", self.path.display()))?;
        let mut buf = Vec::new();
        file.read_to_end(&mut buf)
            .with_context(|| format!("reading {}", self.path.display()))?;
        self.offset += buf.len() as u64;
        let buf = self.labelled(buf);
        emit(to, &buf);
        Ok(())
    }

    /// The last of it, once the guest is done: what the file gained, and
    /// its last line even when that never got its newline.
    pub fn drain(&mut self, to: &mut impl Write) -> anyhow::Result<()> {
        self.pump(to)?;
        if !self.partial.is_empty() {
            self.partial.push(b'\n');
            let line = std::mem::take(&mut self.partial);
            let out = self.labelled(line);
            emit(to, &out);
        }
        Ok(())
    }
}

fn emit(to: &mut impl Write, buf: &[u8]) {
    // A closed pipe on our side must not fail the run.
    let _ = to.write_all(buf);
    let _ = to.flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn a_labelled_relay_sends_whole_lines_each_labelled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout");
        let mut relay = Relay::new(path.clone(), Some("5.10"));
        let mut out = Vec::new();
        fs::write(&path, "test a ... ok\ntest b").unwrap();
        relay.pump(&mut out).unwrap();
        assert_eq!(String::from_utf8_lossy(&out), "[5.10] test a ... ok\n");
        fs::write(&path, "test a ... ok\ntest b ... ok\n\nend").unwrap();
        relay.drain(&mut out).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out),
            "[5.10] test a ... ok\n[5.10] test b ... ok\n[5.10] \n[5.10] end\n"
        );
        let mut plain = Relay::new(path, None);
        let mut out = Vec::new();
        plain.drain(&mut out).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out),
            "test a ... ok\ntest b ... ok\n\nend"
        );
    }
}
