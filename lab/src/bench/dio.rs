//! O_DIRECT I/O on one open descriptor with one aligned buffer.
//!
//! `health_tests::fs::o_direct_write` opens the device for every call; the
//! benchmarks issue tens of thousands of requests and want to time the
//! requests, not open(2) and close(2).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{Context, Result};

/// A page: aligned for any logical block size.
const ALIGN: usize = 4096;

pub struct DirectIo {
    file: File,
    storage: Vec<u8>,
    offset: usize,
    len: usize,
}

impl DirectIo {
    /// Opens `path` read-write with O_DIRECT, with a `len`-byte buffer.
    pub fn open(path: &Path, len: usize) -> Result<DirectIo> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .with_context(|| format!("opening {} with O_DIRECT", path.display()))?;
        let mut storage = vec![0u8; len + ALIGN];
        let offset = storage.as_ptr().align_offset(ALIGN).min(ALIGN);
        // Not all zeros, so nothing along the way can take a shortcut.
        for (i, b) in storage.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        Ok(DirectIo {
            file,
            storage,
            offset,
            len,
        })
    }

    pub fn write_at(&self, at: u64) -> io::Result<usize> {
        self.file
            .write_at(&self.storage[self.offset..self.offset + self.len], at)
    }

    pub fn read_at(&mut self, at: u64) -> io::Result<usize> {
        self.file
            .read_at(&mut self.storage[self.offset..self.offset + self.len], at)
    }
}
