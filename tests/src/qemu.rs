//! The emulated hardware `cargo xtask vm` gives every guest
//! (xtask/src/vm/devices.rs): an NVMe controller and a virtio-blk disk
//! whose images fail every read of one sector and every write of another,
//! and a serial port to QEMU's own monitor (QMP), through which a test
//! changes that hardware while the guest runs (the NVMe controller's SMART
//! critical warning, the disks' I/O throttling).
//!
//! The guest's environment names them; outside `cargo xtask vm` every
//! function here fails saying so.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::devices::{self, BlockDev};
use crate::sys;

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| {
        format!("{name} is not set: this test runs in the guests of `cargo xtask vm`, which emulate its devices")
    })
}

/// The sector (512 bytes) every read of which fails with EIO below the
/// guest's drivers.
pub fn bad_read_sector() -> Result<u64> {
    env("HEALTH_VM_BAD_READ_SECTOR")?
        .parse()
        .context("HEALTH_VM_BAD_READ_SECTOR")
}

/// The sector every write of which fails.
pub fn bad_write_sector() -> Result<u64> {
    env("HEALTH_VM_BAD_WRITE_SECTOR")?
        .parse()
        .context("HEALTH_VM_BAD_WRITE_SECTOR")
}

/// The faulty NVMe controller (`nvme0`) and its namespace's disk.
pub fn nvme_disk() -> Result<(String, BlockDev)> {
    if !devices::module_loaded("nvme") {
        devices::modprobe("nvme", &[])?;
    }
    let serial = env("HEALTH_VM_NVME_SERIAL")?;
    let mut ctrl = None;
    sys::wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        ctrl = by_attr("/sys/class/nvme", "serial", &serial);
        ctrl.is_some()
    });
    let ctrl = ctrl.with_context(|| format!("no NVMe controller with serial {serial}"))?;
    // The namespace appears once the controller is live.
    let disk = format!("{ctrl}n1");
    let ready = sys::wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        std::path::Path::new("/sys/class/block")
            .join(&disk)
            .exists()
    });
    anyhow::ensure!(ready, "{ctrl} has no namespace disk {disk}");
    Ok((ctrl, BlockDev::of(&disk)?))
}

/// The faulty virtio-blk disk (`vdb`).
pub fn virtio_disk() -> Result<BlockDev> {
    let serial = env("HEALTH_VM_VIRTIO_SERIAL")?;
    let name = by_attr("/sys/class/block", "serial", &serial)
        .with_context(|| format!("no virtio disk with serial {serial}"))?;
    BlockDev::of(&name)
}

/// The entry of `class_dir` whose `attr` reads `value`.
fn by_attr(class_dir: &str, attr: &str, value: &str) -> Option<String> {
    std::fs::read_dir(class_dir)
        .ok()?
        .flatten()
        .find(|e| std::fs::read_to_string(e.path().join(attr)).is_ok_and(|s| s.trim() == value))
        .map(|e| e.file_name().to_string_lossy().into_owned())
}

/// A QMP session with the guest's own QEMU.
pub struct Qmp {
    port: File,
    buffered: Vec<u8>,
}

/// Longest wait for QEMU's answer.
const QMP_TIMEOUT: Duration = Duration::from_secs(10);

impl Qmp {
    /// Opens the port and leaves QMP's negotiation mode.
    pub fn open() -> Result<Qmp> {
        if !devices::module_loaded("virtio_console") {
            devices::modprobe("virtio_console", &[])?;
        }
        let name = env("HEALTH_VM_QMP_PORT")?;
        let mut port_name = None;
        sys::wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
            port_name = by_attr("/sys/class/virtio-ports", "name", &name);
            port_name.is_some()
        });
        let port_name = port_name.with_context(|| format!("no virtio port named {name}"))?;
        let path = PathBuf::from("/dev").join(&port_name);
        let port = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening the QMP port {}", path.display()))?;
        let mut qmp = Qmp {
            port,
            buffered: Vec::new(),
        };
        // A session that an earlier test left open is one QEMU still
        // serves: its greeting may not come again. Negotiating again is
        // refused there ("already in command mode"), which is as good.
        let _ = qmp.message(Duration::from_secs(2));
        match qmp.execute("qmp_capabilities", json!({})) {
            Ok(_) => {}
            Err(e) if format!("{e:#}").contains("CommandNotFound") => {}
            Err(e) => return Err(e),
        }
        Ok(qmp)
    }

    /// Runs `command` and returns its `return` value.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value> {
        let mut line = json!({ "execute": command, "arguments": arguments }).to_string();
        line.push('\n');
        self.port
            .write_all(line.as_bytes())
            .with_context(|| format!("sending QMP {command}"))?;
        let deadline = Instant::now() + QMP_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = self
                .message(left)?
                .with_context(|| format!("QEMU did not answer {command} within {QMP_TIMEOUT:?}"))?;
            if let Some(r) = msg.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = msg.get("error") {
                bail!("QMP {command} failed: {e}");
            }
            // Events and the greeting: not the answer.
        }
    }

    /// Sets the emulated NVMe controller's SMART critical warning byte
    /// (QEMU's `smart_critical_warning` property; the guest reads it in
    /// the SMART / health log).
    pub fn set_nvme_critical_warning(&mut self, warning: u8) -> Result<()> {
        let path = env("HEALTH_VM_NVME_QOM")?;
        self.execute(
            "qom-set",
            json!({ "path": path, "property": "smart_critical_warning", "value": warning }),
        )?;
        let now = self.execute(
            "qom-get",
            json!({ "path": path, "property": "smart_critical_warning" }),
        )?;
        anyhow::ensure!(
            now == json!(warning),
            "QEMU's smart_critical_warning reads {now} after setting {warning}"
        );
        Ok(())
    }

    /// The next JSON line, or `None` when none came within `timeout`.
    fn message(&mut self, timeout: Duration) -> Result<Option<Value>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(end) = self.buffered.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffered.drain(..=end).collect();
                let text = String::from_utf8_lossy(&line);
                if text.trim().is_empty() {
                    continue;
                }
                return serde_json::from_str(text.trim())
                    .map(Some)
                    .with_context(|| format!("QMP sent {text:?}"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [nix::poll::PollFd::new(
                self.port.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            if nix::poll::poll(&mut fds, ms).context("polling the QMP port")? == 0 {
                continue;
            }
            let mut chunk = [0u8; 4096];
            let n = self.port.read(&mut chunk).context("reading the QMP port")?;
            self.buffered.extend_from_slice(&chunk[..n]);
        }
    }
}

/// The emulated NVMe controller's critical warning, 0 when this is made
/// and again when it is dropped: a test that fails half-way leaves the
/// next one a healthy controller.
pub struct NvmeWarning {
    qmp: Qmp,
}

impl NvmeWarning {
    pub fn cleared() -> Result<NvmeWarning> {
        let mut qmp = Qmp::open()?;
        qmp.set_nvme_critical_warning(0)?;
        Ok(NvmeWarning { qmp })
    }

    pub fn set(&mut self, warning: u8) -> Result<()> {
        self.qmp.set_nvme_critical_warning(warning)
    }
}

impl Drop for NvmeWarning {
    fn drop(&mut self) {
        if let Err(e) = self.qmp.set_nvme_critical_warning(0) {
            eprintln!("clearing the NVMe controller's critical warning: {e:#}");
        }
    }
}

/// QEMU's limits on the writes of one of the guest's disks
/// (`block_set_io_throttle`, QEMU's qapi/block.json), lifted when this is
/// made and again when it is dropped: a test that fails half-way leaves
/// the next one a disk at full speed.
pub struct WriteThrottle {
    qmp: Qmp,
    drive: String,
}

impl WriteThrottle {
    /// The faulty NVMe controller's drive.
    pub fn nvme() -> Result<WriteThrottle> {
        WriteThrottle::lifted(env("HEALTH_VM_NVME_DRIVE")?)
    }

    /// The faulty virtio-blk disk's drive.
    pub fn virtio() -> Result<WriteThrottle> {
        WriteThrottle::lifted(env("HEALTH_VM_VIRTIO_DRIVE")?)
    }

    fn lifted(drive: String) -> Result<WriteThrottle> {
        let mut throttle = WriteThrottle {
            qmp: Qmp::open()?,
            drive,
        };
        throttle.lift()?;
        Ok(throttle)
    }

    /// Writes limited to `bps` bytes and `iops` requests a second (0: no
    /// limit of that kind). QEMU's bucket lets a request through while it
    /// holds less than a tenth of a second's worth and starts empty: at
    /// `iops` 10, steady writes wait about 100 ms each; at `bps` 1, the
    /// write after a 4 KiB one waits an hour.
    pub fn set(&mut self, bps: u64, iops: u64) -> Result<()> {
        self.qmp.execute(
            "block_set_io_throttle",
            json!({
                "device": self.drive,
                "bps": 0, "bps_rd": 0, "bps_wr": bps,
                "iops": 0, "iops_rd": 0, "iops_wr": iops,
            }),
        )?;
        // What QEMU now applies to the drive, as it reports it.
        let blocks = self.qmp.execute("query-block", json!({}))?;
        let inserted = blocks
            .as_array()
            .and_then(|b| b.iter().find(|b| b["device"] == self.drive.as_str()))
            .map(|b| &b["inserted"])
            .with_context(|| format!("query-block has no drive {}: {blocks}", self.drive))?;
        anyhow::ensure!(
            inserted["bps_wr"] == json!(bps) && inserted["iops_wr"] == json!(iops),
            "drive {} reports bps_wr {} and iops_wr {} after setting {bps} and {iops}",
            self.drive,
            inserted["bps_wr"],
            inserted["iops_wr"]
        );
        Ok(())
    }

    /// No limit: the writes QEMU holds go on at once.
    pub fn lift(&mut self) -> Result<()> {
        self.set(0, 0)
    }
}

impl Drop for WriteThrottle {
    fn drop(&mut self) {
        if let Err(e) = self.lift() {
            eprintln!("lifting QEMU's throttle on drive {}: {e:#}", self.drive);
        }
    }
}
