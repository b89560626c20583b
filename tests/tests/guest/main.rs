//! The suites only a guest runs (`cargo xtask vm --tests storage_stacks`;
//! docs/development.md, "Running a kernel in a VM"): drivers and stacks
//! the host lacks (scsi_debug, dm, md, nvmet, LIO, QEMU's devices). One
//! binary, `test = false` so that `cargo test` on the host leaves it out;
//! `xtask vm` runs one module (suite) at a time, by its tests' names.
//! Every test here holds the kernel (`kernel_alone`), so two never overlap
//! whatever runs them.

mod device_faults;
mod iscsi;
mod nfs;
mod nvme_multipath;
mod qemu_devices;
mod returned_errors;
mod smb;
mod storage_stacks;
