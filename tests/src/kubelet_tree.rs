//! A kubelet-like directory tree of local PVs for the VM suites
//! (device_faults, storage_stacks, nvme_multipath, iscsi): the agent finds pod
//! volumes in it as it finds them under a real kubelet's root.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tempfile::TempDir;

use crate::agent::Agent;
use crate::devices::{self, BlockDev};
use crate::{cmd, fs, Mount};

/// Size of the filesystems [`Kubelet::fs_volume`] makes: small enough for
/// the test devices (64 MiB scsi_debug disks) to keep a region beyond it
/// that only the tests' own reads touch.
pub const FS_SIZE: &str = "32M";

/// A kubelet-like tree with local PVs: filesystem volumes at
/// `pods/<uid>/volumes/kubernetes.io~local-volume/<pv>` (a bind mount of
/// the device's mount, as kubelet makes it) and block volumes at
/// `pods/<uid>/volumeDevices/kubernetes.io~local-volume/<pv>` (a device
/// node). Unmounted on drop, before the devices (declare it after them).
pub struct Kubelet {
    pub root: TempDir,
    mounts: Vec<Mount>,
}

impl Kubelet {
    pub fn new() -> Result<Kubelet> {
        Ok(Kubelet {
            root: tempfile::Builder::new().prefix("kubelet-").tempdir()?,
            mounts: Vec::new(),
        })
    }

    pub fn root_arg(&self) -> &str {
        self.root.path().to_str().expect("temp paths are UTF-8")
    }

    /// ext4 of [`FS_SIZE`] on `dev`, mounted at the PV's local path and bind
    /// mounted into the pod's volume directory; returns the pod's path.
    pub fn fs_volume(&mut self, pod: &str, pv: &str, dev: &Path) -> Result<PathBuf> {
        cmd::run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
                &dev.to_string_lossy(),
                FS_SIZE,
            ],
        )?;
        let local = self.root.path().join("local").join(pv);
        std::fs::create_dir_all(&local)?;
        // No block bitmap prefetch (ext4's lazyinit thread reads every group's
        // bitmap after mount, by default since 5.11): a test that takes the
        // device's paths away must see its own reads fail, not a background
        // read racing them. 5.10 prefetches only when asked and has no
        // option to say no.
        let options = if ext4_prefetches_by_default()? {
            "errors=continue,no_prefetch_block_bitmaps"
        } else {
            "errors=continue"
        };
        self.mounts.push(Mount::at(dev, &local, "ext4", options)?);
        let target = self.pod_volume_dir(pod, pv)?;
        self.mounts
            .push(Mount::at(&local, &target, "none", "bind")?);
        // Nothing left to write back once the agent watches.
        fs::sync_fs(&target)?;
        Ok(target)
    }

    /// A filesystem-mode local PV of a directory on a filesystem without a
    /// block device (a FUSE or NFS mount): bind mounted into the pod's
    /// volume directory; returns the pod's path.
    pub fn dir_volume(&mut self, pod: &str, pv: &str, dir: &Path) -> Result<PathBuf> {
        let target = self.pod_volume_dir(pod, pv)?;
        self.mounts.push(Mount::at(dir, &target, "none", "bind")?);
        Ok(target)
    }

    /// The directory of a pod's in-tree `nfs` volume (`name`: the PV's, or
    /// the pod's volume's for an inline one), made: where kubelet mounts
    /// the export.
    pub fn nfs_volume_dir(&self, pod: &str, name: &str) -> Result<PathBuf> {
        self.pod_dir(pod, "volumes/kubernetes.io~nfs", name)
    }

    /// The `mount` directory of a pod's CSI volume of PV `pv` and driver
    /// `driver`, made, with its `vol_data.json`: where kubelet has a CSI
    /// driver (csi-driver-smb, csi-driver-nfs) publish the volume.
    pub fn csi_volume_dir(&self, pod: &str, pv: &str, driver: &str) -> Result<PathBuf> {
        let dir = self.pod_dir(pod, "volumes/kubernetes.io~csi", pv)?;
        let data = serde_json::json!({
            "driverName": driver,
            "specVolID": pv,
            "volumeHandle": format!("{driver}#{pv}"),
            "volumeLifecycleMode": "Persistent",
        });
        std::fs::write(dir.join("vol_data.json"), data.to_string())?;
        let mount = dir.join("mount");
        std::fs::create_dir_all(&mount)?;
        Ok(mount)
    }

    /// The pod's directory of a filesystem-mode local PV, made.
    fn pod_volume_dir(&self, pod: &str, pv: &str) -> Result<PathBuf> {
        self.pod_dir(pod, "volumes/kubernetes.io~local-volume", pv)
    }

    /// `pods/<pod>/<plugin>/<name>` under the root, made.
    fn pod_dir(&self, pod: &str, plugin: &str, name: &str) -> Result<PathBuf> {
        let target = self
            .root
            .path()
            .join("pods")
            .join(pod)
            .join(plugin)
            .join(name);
        std::fs::create_dir_all(&target)?;
        Ok(target)
    }

    /// A block-mode local PV: the device node in the pod's directory.
    pub fn block_volume(&self, pod: &str, pv: &str, dev: &BlockDev) -> Result<PathBuf> {
        let node = self
            .root
            .path()
            .join("pods")
            .join(pod)
            .join("volumeDevices/kubernetes.io~local-volume")
            .join(pv);
        std::fs::create_dir_all(node.parent().context("node has a parent")?)?;
        let (major, minor) = dev.numbers()?;
        nix::sys::stat::mknod(
            &node,
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            libc::makedev(major, minor),
        )
        .with_context(|| format!("mknod {}", node.display()))?;
        Ok(node)
    }

    /// The agent, watching this tree, with checks every second.
    pub fn agent(&self, extra: &[&str]) -> Result<Agent> {
        let mut args = vec!["--kubelet-root", self.root_arg(), "--check-interval", "1"];
        args.extend_from_slice(extra);
        // udev's probes of the devices just made are over before it counts.
        devices::settle();
        Agent::start(&args)
    }

    /// [`Kubelet::agent`] with `--returned-errors`; fails unless the fexit
    /// programs attached (at least on `vfs_read`).
    pub fn agent_counting_returned_errors(&self) -> Result<Agent> {
        let agent = self.agent(&["--returned-errors"])?;
        if !agent.wait_for_log("active   fexit:vfs_read,", std::time::Duration::ZERO) {
            let run = agent.stop()?;
            anyhow::bail!(
                "the returned-error programs did not attach on {}:\n{}",
                crate::vm_report::kernel_release(),
                run.stderr
            );
        }
        Ok(agent)
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        while let Some(m) = self.mounts.pop() {
            drop(m);
        }
    }
}

/// Whether the running kernel's ext4 prefetches block bitmaps unless told
/// `no_prefetch_block_bitmaps` (5.11 and later).
fn ext4_prefetches_by_default() -> Result<bool> {
    use health_kernel::probes::release::{parse_version, running_release};
    let release = running_release(Path::new("/proc")).context("reading the kernel release")?;
    let (major, minor) = parse_version(&release)
        .with_context(|| format!("no version in kernel release {release:?}"))?;
    Ok((major, minor) >= (5, 11))
}
