//! A node's side of cluster mode: one CSI volume as kubelet leaves it, on a
//! fault disk that fails writes on demand, and the agent's HTTP endpoints.
//!
//! The volume is a fault disk with ext4, staged where kubelet stages a CSI
//! PV and bind-published into each pod's volume directory, as kubelet does
//! for a PVC used by several pods on one node. Failed O_DIRECT writes to the
//! disk are block I/O errors the kernel reports on that device. Used by the
//! cluster tests against the fake API server (`tests/host/cluster.rs`) and against
//! the real one (`tests/host/cluster_real_api.rs`).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::{fs, FaultDisk, LoopDevice, Mount, Op, Rule};

const MIB: u64 = 1 << 20;

/// A published CSI volume; unmounted and detached on drop.
pub struct CsiVolume {
    mounts: Vec<Mount>,
    lo: Option<LoopDevice>,
    disk: Option<FaultDisk>,
}

impl Drop for CsiVolume {
    fn drop(&mut self) {
        while let Some(m) = self.mounts.pop() {
            drop(m);
        }
        drop(self.lo.take());
        drop(self.disk.take());
    }
}

/// What kubelet writes beside a CSI volume's mount (`vol_data.json`).
fn vol_data(pv: &str, driver: &str, node: &str) -> String {
    json!({
        "attachmentID": "csi-e2e",
        "driverName": driver,
        "nodeName": node,
        "specVolID": pv,
        "volumeHandle": "handle-e2e",
        "volumeLifecycleMode": "Persistent",
    })
    .to_string()
}

impl CsiVolume {
    /// A 64 MiB disk with ext4 under kubelet root `root`: PV `pv` of
    /// `driver` staged for `node` and published into the pods `pod_uids`.
    pub fn publish(
        root: &Path,
        pv: &str,
        driver: &str,
        node: &str,
        pod_uids: &[&str],
    ) -> Result<CsiVolume> {
        let mut volume = CsiVolume {
            mounts: Vec::new(),
            lo: None,
            disk: None,
        };
        let disk = FaultDisk::start(64 * MIB)?;
        let lo = disk.attach_loop(false)?;
        fs::mkfs_ext4(lo.path())?;
        let dev = lo.path().to_path_buf();
        volume.disk = Some(disk);
        volume.lo = Some(lo);

        let data = vol_data(pv, driver, node);
        let staging_dir = root.join("plugins/kubernetes.io/csi/pv").join(pv);
        let staging = staging_dir.join("globalmount");
        std::fs::create_dir_all(&staging)?;
        std::fs::write(staging_dir.join("vol_data.json"), &data)?;
        volume.mounts.push(Mount::at(&dev, &staging, "ext4", "")?);
        for uid in pod_uids {
            let dir = root
                .join("pods")
                .join(uid)
                .join("volumes/kubernetes.io~csi")
                .join(pv);
            std::fs::create_dir_all(dir.join("mount"))?;
            std::fs::write(dir.join("vol_data.json"), &data)?;
            volume
                .mounts
                .push(Mount::at(&staging, dir.join("mount"), "none", "bind")?);
        }
        Ok(volume)
    }

    /// The fault disk under the volume: its rules, and when it failed what.
    pub fn disk(&self) -> &FaultDisk {
        self.disk.as_ref().expect("a disk")
    }

    /// The loop device over the fault disk.
    pub fn loop_device(&self) -> &LoopDevice {
        self.lo.as_ref().expect("a loop device")
    }

    /// The kernel's name of the volume's device (`loopN`).
    pub fn device_name(&self) -> String {
        let lo = self.lo.as_ref().expect("a loop device");
        lo.path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// `n` failed O_DIRECT writes to the disk: exactly `n` failed block
    /// requests (the loop device caps a request at one FUSE request).
    pub fn fail_writes(&self, n: u64) -> Result<()> {
        let disk = self.disk.as_ref().context("a disk")?;
        let lo = self.lo.as_ref().context("a loop device")?;
        let before = disk.stats()?.injected(Op::Write, libc::EIO);
        let rule = disk.add_rule(Rule::new(Op::Write, libc::EIO).range(48 * MIB, 8 * MIB))?;
        for i in 0..n {
            let err = fs::o_direct_write(lo.path(), 48 * MIB + (i % 2048) * 4096, &[0xab; 4096])
                .expect_err("the write must fail");
            assert_eq!(err.raw_os_error(), Some(libc::EIO), "write {i}");
        }
        disk.remove_rule(rule)?;
        let injected = disk.stats()?.injected(Op::Write, libc::EIO) - before;
        assert_eq!(injected, n, "the fault disk failed exactly the writes made");
        Ok(())
    }
}

/// A free loopback port, for the agent's `--metrics-addr`.
pub fn free_port() -> Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

/// A plain HTTP/1.1 GET on loopback: status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status line in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Waits until the agent serving `metrics` says it is ready (its first
/// lists are done).
pub fn wait_ready(metrics: SocketAddr) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((200, _)) = http_get(metrics, "/readyz") {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let r = http_get(metrics, "/readyz");
            bail!("the agent did not become ready: {r:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of the Prometheus sample `series` (name and labels exactly as
/// exposed) in `text`, if present.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}
