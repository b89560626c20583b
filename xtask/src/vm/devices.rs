//! The disks QEMU gives every guest besides its root: the scratch disk, an
//! NVMe controller and a virtio-blk disk whose backing images fail chosen
//! sectors, and a serial port through which the guest reaches QEMU's own
//! monitor (QMP) to change the emulated hardware while it runs (a SMART
//! critical warning, I/O throttling: a slow or a stuck cloud disk).
//!
//! The failing disks are how the tests meet the guest's real `nvme` and
//! `virtio_blk` drivers completing requests with errors, as on a cloud VM
//! or a failing SSD: QEMU's `blkdebug` driver sits under each image and
//! fails every read that touches [`BAD_READ_SECTOR`] and every write that
//! touches [`BAD_WRITE_SECTOR`] with EIO. Its NVMe emulation turns those
//! into "Unrecovered Read Error" and "Write Fault" completions, virtio-blk
//! into VIRTIO_BLK_S_IOERR. Everything else on the disks works, so a test
//! puts a filesystem on the first 32 MiB and fails I/O when it chooses.
//!
//! The test suite (tests/tests/guest/qemu_devices.rs) holds the same numbers and
//! names; it checks them against the disks before relying on them.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::Context;

/// Serial numbers the guest finds each disk by (`/sys/block/*/serial`,
/// `/sys/class/nvme/*/serial`): the order of PCI slots is QEMU's to choose.
/// The binaries disk's serial number (`/sys/block/*/serial`), which the
/// guest script finds it by (`super::binaries`).
pub const BINARIES_SERIAL: &str = "vh-binaries";
pub const SCRATCH_SERIAL: &str = "vh-scratch";
const NVME_SERIAL: &str = "vh-nvme-faulty";
const VIRTIO_SERIAL: &str = "vh-virtio-faulty";
/// The drives (QEMU's block backends) under them, which QMP's
/// `block_set_io_throttle` names.
const NVME_DRIVE: &str = "vhnvmedisk";
const VIRTIO_DRIVE: &str = "vhvirtiodisk";
/// The QOM path of the NVMe controller, for `qom-set` of its
/// `smart_critical_warning`.
const NVME_ID: &str = "vhnvme";
/// The virtio-serial port's name (`/sys/class/virtio-ports/*/name`).
const QMP_PORT: &str = "org.volume-health.qmp";
/// Sectors (512 bytes) of the faulty disks: 48.8 and 53.7 MiB into 64 MiB.
const BAD_READ_SECTOR: u64 = 100_000;
const BAD_WRITE_SECTOR: u64 = 110_000;
/// The faulty disks' size: room for a 32 MiB filesystem and the bad sectors.
const FAULTY_BYTES: u64 = 64 << 20;

/// QEMU options for the guest's extra devices, their images made in `dir`.
/// `scratch` is the scratch disk's image, `binaries` the programs' disk
/// (read-only, shared by the guests: QEMU takes a shared lock on it).
pub fn qemu_opts(dir: &Path, scratch: &Path, binaries: Option<&Path>) -> anyhow::Result<String> {
    let rules = dir.join("blkdebug.conf");
    fs::write(&rules, blkdebug_rules()).context("writing the blkdebug rules")?;
    let mut opts = String::new();
    // werror/rerror=report everywhere: an error reaches the guest as an
    // I/O error; QEMU's default for writes (`enospc`) would pause the
    // whole guest when the host's disk fills up.
    let report = "werror=report,rerror=report";
    write!(
        opts,
        "-drive file={},if=none,id=vhscratch,format=raw,cache=unsafe,{report} \
         -device virtio-blk-pci,drive=vhscratch,serial={SCRATCH_SERIAL}",
        scratch.display()
    )?;
    if let Some(image) = binaries {
        write!(
            opts,
            " -drive file={},if=none,id=vhbin,format=raw,readonly=on \
             -device virtio-blk-pci,drive=vhbin,serial={}",
            image.display(),
            BINARIES_SERIAL
        )?;
    }
    for (id, serial, device) in [
        (NVME_DRIVE, NVME_SERIAL, "nvme"),
        (VIRTIO_DRIVE, VIRTIO_SERIAL, "virtio-blk-pci"),
    ] {
        let image = dir.join(format!("{id}.img"));
        fs::File::create(&image)
            .and_then(|f| f.set_len(FAULTY_BYTES))
            .with_context(|| format!("creating {}", image.display()))?;
        write!(
            opts,
            " -drive file=blkdebug:{}:{},if=none,id={id},format=raw,cache=unsafe,{report} \
             -device {device},drive={id},serial={serial}",
            rules.display(),
            image.display()
        )?;
        if device == "nvme" {
            write!(opts, ",id={NVME_ID}")?;
        }
    }
    // QEMU's monitor on a listening socket, and a guest serial port whose
    // backend connects to that same socket: what the guest writes to the
    // port is a QMP session. (The server exists before the client is made,
    // so the connect is accepted by the main loop once it runs.)
    let qmp = dir.join("qmp.sock");
    write!(
        opts,
        " -chardev socket,id=vhqmp,path={q},server=on,wait=off -mon chardev=vhqmp,mode=control \
         -chardev socket,id=vhqmpguest,path={q} -device virtio-serial-pci,id=vhserial \
         -device virtserialport,bus=vhserial.0,chardev=vhqmpguest,name={QMP_PORT}",
        q = qmp.display()
    )?;
    Ok(opts)
}

/// Shell lines that set `var` to the guest's virtio disk with serial
/// `serial` (`/dev/vdX`), or to nothing: the order of PCI slots is QEMU's.
pub fn find_by_serial(var: &str, serial: &str) -> String {
    format!(
        "{var}=; for b in /sys/block/vd*; do \
         [ \"$(cat $b/serial 2>/dev/null)\" = {serial} ] && {var}=/dev/${{b##*/}}; done; "
    )
}

/// Environment for the guest command: where the tests find these devices.
pub fn guest_env() -> Vec<(String, String)> {
    [
        ("HEALTH_VM_NVME_SERIAL", NVME_SERIAL.to_string()),
        ("HEALTH_VM_VIRTIO_SERIAL", VIRTIO_SERIAL.to_string()),
        ("HEALTH_VM_NVME_DRIVE", NVME_DRIVE.to_string()),
        ("HEALTH_VM_VIRTIO_DRIVE", VIRTIO_DRIVE.to_string()),
        (
            "HEALTH_VM_NVME_QOM",
            format!("/machine/peripheral/{NVME_ID}"),
        ),
        ("HEALTH_VM_QMP_PORT", QMP_PORT.to_string()),
        ("HEALTH_VM_BAD_READ_SECTOR", BAD_READ_SECTOR.to_string()),
        ("HEALTH_VM_BAD_WRITE_SECTOR", BAD_WRITE_SECTOR.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// blkdebug's rules (QEMU docs/devel/blkdebug.rst): each is armed by the
/// raw format driver's read or write event and fails that request when
/// it covers the sector; `once` is off, so every such request fails.
fn blkdebug_rules() -> String {
    let rule = |event: &str, iotype: &str, sector: u64| {
        format!(
            "[inject-error]\nevent = \"{event}\"\niotype = \"{iotype}\"\nerrno = \"5\"\nsector = \"{sector}\"\n\n"
        )
    };
    rule("read_aio", "read", BAD_READ_SECTOR) + &rule("write_aio", "write", BAD_WRITE_SECTOR)
}
