//! Loop devices over stretches of files: finding the one already attached
//! over a stretch, attaching one with direct I/O, detaching only our own.
//!
//! The ioctls are made here with nix: the `loopdev` crate has not been
//! released since 2022, and its fork `loopdev-3` generates its bindings
//! with bindgen at build time (libclang on every build machine) and turns
//! direct I/O on with a second ioctl after attaching; LOOP_CONFIGURE
//! (Linux 5.8) attaches with offset, size limit and direct I/O in one call,
//! and the harness already has loop_info64 (`crate::sys`).

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::backing::Backing;
use super::error::{DriverError, DriverResult};
use super::records::FileIdentity;
use crate::sys::{self, FileId, LoopInfo64};

/// struct loop_config from <linux/loop.h> (LOOP_CONFIGURE).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// <linux/loop.h>: LO_FLAGS_READ_ONLY, LO_FLAGS_DIRECT_IO.
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_DIRECT_IO: u32 = 16;

nix::ioctl_write_ptr_bad!(loop_configure, 0x4C0A, LoopConfig);
nix::ioctl_none_bad!(loop_ctl_get_free, 0x4C82);

/// How often a free device is asked for when another process takes the
/// one the kernel offered before we configure it.
const ATTACH_TRIES: u32 = 16;

/// The device node of loop device `name`.
pub fn node(name: &str) -> PathBuf {
    PathBuf::from(format!("/dev/{name}"))
}

/// The loop device already bound to exactly `backing`'s stretch of its
/// file (the same file, offset and size limit), if one is.
pub fn find(backing: &Backing, file: FileId) -> DriverResult<Option<String>> {
    let listing = |e| DriverError::io("listing /sys/block")(e);
    let mut names: Vec<String> = Vec::new();
    for entry in std::fs::read_dir("/sys/block").map_err(listing)? {
        let name = entry.map_err(listing)?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("loop") {
            names.push(name.into_owned());
        }
    }
    names.sort_by_key(|n| n[4..].parse::<u64>().unwrap_or(u64::MAX));
    for name in names {
        // sysfs first (no device opened): the stretch must match...
        let attr = |a: &str| sys::read_sysfs(format!("/sys/block/{name}/loop/{a}")).ok();
        let stretch = (attr("offset"), attr("sizelimit"));
        if stretch
            != (
                Some(backing.offset.to_string()),
                Some(backing.size.to_string()),
            )
        {
            continue;
        }
        // ...then the kernel's own identity of the file: a path can have
        // been renamed or replaced since.
        let binding =
            sys::loop_binding(&name).map_err(DriverError::host(format!("reading /dev/{name}")))?;
        if binding.is_some_and(|b| b.file == file) {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// The identity of `backing`'s file now; NOT_FOUND when it is gone.
pub fn file_identity(file: &Path) -> DriverResult<FileId> {
    match std::fs::metadata(file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(DriverError::NotFound(format!(
            "the volume's file {} does not exist",
            file.display()
        ))),
        Err(e) => Err(DriverError::io(format!("stat {}", file.display()))(e)),
        Ok(_) => FileId::of(file).map_err(DriverError::host(format!("stat {}", file.display()))),
    }
}

/// Attaches a new loop device over `backing` with direct I/O (errors of the
/// file's storage reach the device's users as they happen, not at a later
/// flush of a second page cache); fails, detaching it again, when the
/// kernel refuses direct I/O. Returns its name.
pub fn attach(backing: &Backing, readonly: bool) -> DriverResult<String> {
    let file = OpenOptions::new()
        .read(true)
        .write(!readonly)
        .open(&backing.file)
        .map_err(DriverError::io(format!(
            "opening {}",
            backing.file.display()
        )))?;
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(DriverError::io("opening /dev/loop-control"))?;
    for _ in 0..ATTACH_TRIES {
        // SAFETY: an argument-less ioctl on a file we own.
        let number = unsafe { loop_ctl_get_free(control.as_raw_fd()) }
            .map_err(DriverError::sys("LOOP_CTL_GET_FREE"))?;
        let name = format!("loop{number}");
        let device = OpenOptions::new()
            .read(true)
            .write(!readonly)
            .open(node(&name))
            .map_err(DriverError::io(format!("opening /dev/{name}")))?;
        let config = config(backing, &file, readonly);
        // SAFETY: `config` is a complete loop_config that outlives the call.
        match unsafe { loop_configure(device.as_raw_fd(), &config) } {
            Ok(_) => return with_direct_io(name, backing),
            // Taken by another process since it was offered: ask again.
            Err(Errno::EBUSY) => continue,
            Err(e) => {
                return Err(DriverError::sys(format!(
                    "LOOP_CONFIGURE of /dev/{name} over {}",
                    backing.file.display()
                ))(e))
            }
        }
    }
    Err(DriverError::ResourceExhausted(format!(
        "no free loop device after {ATTACH_TRIES} tries (others took each one offered)"
    )))
}

fn config(backing: &Backing, file: &std::fs::File, readonly: bool) -> LoopConfig {
    // SAFETY: LoopInfo64 is plain old data; all-zero is a valid value.
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    info.lo_offset = backing.offset;
    info.lo_sizelimit = backing.size;
    info.lo_flags = LO_FLAGS_DIRECT_IO | if readonly { LO_FLAGS_READ_ONLY } else { 0 };
    let name = backing.file.as_os_str().as_encoded_bytes();
    let n = name.len().min(info.lo_file_name.len() - 1);
    info.lo_file_name[..n].copy_from_slice(&name[..n]);
    LoopConfig {
        // A file descriptor is never negative.
        fd: u32::try_from(file.as_raw_fd()).unwrap_or(u32::MAX),
        block_size: 0,
        info,
        reserved: [0; 8],
    }
}

fn with_direct_io(name: String, backing: &Backing) -> DriverResult<String> {
    let dio = sys::read_sysfs(format!("/sys/block/{name}/loop/dio"))
        .map_err(DriverError::host(format!("reading /dev/{name}'s dio")))?;
    if dio == "1" {
        return Ok(name);
    }
    let id = FileId::of(&backing.file).ok();
    let detached = sys::detach_loop_device(&name, id);
    Err(DriverError::FailedPrecondition(format!(
        "the kernel refused direct I/O on /dev/{name} over {} (its filesystem lacks O_DIRECT?){}",
        backing.file.display(),
        match detached {
            Ok(_) => String::new(),
            Err(e) => format!("; detaching it again failed: {e:#}"),
        }
    )))
}

/// Detaches `name` if it is still bound to the file `file` (a device freed
/// and reused by someone else since is left alone). Whatever is still
/// mounted from it is unmounted first (`sys::detach_loop_device`).
pub fn detach(name: &str, file: FileIdentity) -> DriverResult<()> {
    sys::detach_loop_device(name, Some(file.into()))
        .map(|_| ())
        .map_err(DriverError::host(format!("detaching /dev/{name}")))
}

/// What has become of a staged volume's device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceState {
    /// Bound to the same file, at the same stretch.
    Bound,
    /// Bound to nothing, or to something else.
    Lost,
}

pub fn state(name: &str, file: FileIdentity, backing: &Backing) -> DriverResult<DeviceState> {
    let binding =
        sys::loop_binding(name).map_err(DriverError::host(format!("reading /dev/{name}")))?;
    Ok(match binding {
        Some(b)
            if b.file == FileId::from(file)
                && b.offset == backing.offset
                && b.sizelimit == backing.size =>
        {
            DeviceState::Bound
        }
        _ => DeviceState::Lost,
    })
}

/// The device's size in bytes (sysfs counts 512-byte sectors).
pub fn size_bytes(name: &str) -> DriverResult<u64> {
    let text = sys::read_sysfs(format!("/sys/block/{name}/size"))
        .map_err(DriverError::host(format!("reading /dev/{name}'s size")))?;
    text.parse::<u64>()
        .map(|sectors| sectors * 512)
        .map_err(|_| DriverError::Record(format!("/sys/block/{name}/size: {text:?}")))
}

/// "MAJ:MIN" of loop device `name`, as mountinfo names it.
pub fn maj_min(name: &str) -> DriverResult<String> {
    sys::block_maj_min(name).map_err(DriverError::host(format!("reading /dev/{name}'s number")))
}
