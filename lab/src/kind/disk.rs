//! The fault disk on the node: the faultdisk server, a loop device over its
//! image and ext4 on it; and where the probe file's blocks lie.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use health_tests::protocol::{Op, Request, Response, Rule, ServerInfo};
use health_tests::LoopDevice;
use xtask::util::{run as run_cmd, say};

use super::cluster::node_sh;
use super::{NODE_MOUNT, NODE_SHARED};

const NODE_FAULTDISK: &str = "/usr/local/bin/faultdisk";
const DISK_BYTES: u64 = 256 << 20;

/// The faultdisk server on the node (through `docker exec`, whose stdin we
/// hold: the server cleans up by itself when it reaches EOF), a loop device
/// over its image and ext4 on it, mounted at NODE_MOUNT.
pub(super) struct NodeDisk {
    node: String,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    /// The control socket, as this host sees it.
    socket: PathBuf,
    info: ServerInfo,
    loop_dev: Option<String>,
}

impl NodeDisk {
    pub(super) fn start(node: &str, shared: &Path, faultdisk: &Path) -> anyhow::Result<NodeDisk> {
        let host_dir = shared.join("fd");
        if host_dir.exists() {
            std::fs::remove_dir_all(&host_dir)
                .with_context(|| format!("removing a previous run's {}", host_dir.display()))?;
        }
        std::fs::create_dir_all(&host_dir)?;
        run_cmd(
            Command::new("docker")
                .arg("cp")
                .arg(faultdisk)
                .arg(format!("{node}:{NODE_FAULTDISK}")),
        )?;
        let (child, stdin, info) = spawn_server(node, &host_dir)?;
        let mut disk = NodeDisk {
            node: node.to_string(),
            child: Some(child),
            stdin: Some(stdin),
            socket: host_dir.join("ctl.sock"),
            info,
            loop_dev: None,
        };
        disk.call(&Request::Ping)?;
        disk.attach_loop()?;
        disk.make_filesystem()?;
        Ok(disk)
    }

    fn attach_loop(&mut self) -> anyhow::Result<()> {
        // The node's /dev is a tmpfs filled when the container started: a
        // loop device the kernel adds later has no node there until made.
        let script = format!(
            "set -e
             dev=$(losetup -f)
             [ -b \"$dev\" ] || mknod \"$dev\" b 7 \"${{dev#/dev/loop}}\"
             losetup --direct-io=on \"$dev\" {image}
             echo \"$dev\"",
            image = self.info.image_path
        );
        let dev = node_sh(&self.node, &script)?.trim().to_string();
        let name = dev.strip_prefix("/dev/").unwrap_or(&dev).to_string();
        self.loop_dev = Some(dev.clone());
        let dio = node_sh(&self.node, &format!("cat /sys/block/{name}/loop/dio"))?;
        if dio.trim() != "1" {
            bail!(
                "{dev}: no direct I/O (dio={}); errors would hide in a page cache",
                dio.trim()
            );
        }
        // One loop request per FUSE request, as the test harness does.
        let fit = LoopDevice::fuse_fit_kb(self.info.max_request_bytes);
        node_sh(
            &self.node,
            &format!("echo {fit} > /sys/block/{name}/queue/max_sectors_kb"),
        )?;
        say(format!(
            "fault disk on the node: {dev} over {}",
            self.info.image_path
        ));
        Ok(())
    }

    fn make_filesystem(&self) -> anyhow::Result<()> {
        let dev = self.loop_dev.as_deref().context("no loop device")?;
        node_sh(
            &self.node,
            &format!(
                "set -e
                 mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,nodiscard {dev}
                 mkdir -p {NODE_MOUNT}
                 mount -t ext4 {dev} {NODE_MOUNT}
                 dd if=/dev/zero of={NODE_MOUNT}/probe bs=1M count=1 conv=fsync 2>/dev/null
                 chmod 0666 {NODE_MOUNT}/probe"
            ),
        )?;
        Ok(())
    }

    /// Byte ranges of the probe file on the disk image.
    pub(super) fn probe_file_extents(&self) -> anyhow::Result<Vec<(u64, u64)>> {
        let text = node_sh(&self.node, &format!("filefrag -v {NODE_MOUNT}/probe"))?;
        let extents = parse_filefrag(&text)?;
        if extents.is_empty() {
            bail!("filefrag found no extent of the probe file:\n{text}");
        }
        Ok(extents)
    }

    pub(super) fn add_rule(&self, rule: Rule) -> anyhow::Result<()> {
        self.call(&Request::AddRule { rule }).map(|_| ())
    }

    pub(super) fn clear_rules(&self) -> anyhow::Result<()> {
        self.call(&Request::ClearRules).map(|_| ())
    }

    pub(super) fn injected_writes(&self) -> anyhow::Result<u64> {
        let stats = self.call(&Request::Stats)?.stats.context("no stats")?;
        Ok(stats.injected(Op::Write, libc::EIO))
    }

    /// One request on a fresh connection to the control socket.
    fn call(&self, req: &Request) -> anyhow::Result<Response> {
        health_tests::faultdisk::call(&self.socket, req)
    }

    /// Filesystem, loop device, FUSE mount, server: in that order.
    fn stop(&mut self) -> anyhow::Result<()> {
        let _ = self.clear_rules();
        let mut script =
            format!("umount {NODE_MOUNT} 2>/dev/null || umount -l {NODE_MOUNT} || true\n");
        if let Some(dev) = self.loop_dev.take() {
            script.push_str(&format!("losetup -d {dev}\n"));
        }
        script.push_str(&format!(
            "umount {} || umount -l {}\n",
            self.info.mount_dir, self.info.mount_dir
        ));
        let result = node_sh(&self.node, &script).map(|_| ());
        if let Some(mut child) = self.child.take() {
            if !wait_exit(&mut child, Duration::from_secs(10)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Closed last: EOF starts the server's own cleanup, which must not
        // race with ours.
        drop(self.stdin.take());
        result
    }
}

impl Drop for NodeDisk {
    fn drop(&mut self) {
        say("removing the fault disk from the node");
        if let Err(e) = self.stop() {
            say(format!("fault disk cleanup: {e:#}"));
        }
    }
}

/// `docker exec -i NODE faultdisk ...`, up to its ready line.
fn spawn_server(node: &str, host_dir: &Path) -> anyhow::Result<(Child, ChildStdin, ServerInfo)> {
    let log = std::fs::File::create(host_dir.with_extension("log"))?;
    let mut child = Command::new("docker")
        .args(["exec", "-i", node, NODE_FAULTDISK, "--dir"])
        .arg(format!("{NODE_SHARED}/fd"))
        .args(["--size", &DISK_BYTES.to_string()])
        // Its own process group: a Ctrl-C here must not kill it before the
        // cleanup; it notices that we are gone by its stdin.
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("starting faultdisk on the node")?;
    let stdin = child.stdin.take().context("faultdisk's stdin")?;
    let stdout = child.stdout.take().context("faultdisk's stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = tx.send(BufReader::new(stdout).read_line(&mut line).map(|_| line));
    });
    let line = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(line)) => line,
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "faultdisk on the node did not become ready; its log: {}",
                host_dir.with_extension("log").display()
            );
        }
    };
    let json = line
        .trim_end()
        .strip_prefix("ready ")
        .with_context(|| format!("faultdisk said {line:?} instead of its ready line"))?;
    Ok((child, stdin, serde_json::from_str(json)?))
}

fn wait_exit(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Byte ranges `(offset, length)` of the extents in `filefrag -v` output,
/// whose extents are counted in blocks of the size its header names:
///
/// ```text
/// File size of /mnt/x/probe is 1048576 (1024 blocks of 1024 bytes)
///  ext:     logical_offset:        physical_offset: length:   expected: flags:
///    0:        0..    1023:      33024..     34047:   1024:             last,eof
/// ```
fn parse_filefrag(text: &str) -> anyhow::Result<Vec<(u64, u64)>> {
    let block: u64 = text
        .split_once("blocks of ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no block size in filefrag's output:\n{text}"))?;
    let mut extents = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(':').map(str::trim).collect();
        let is_extent = fields.len() >= 4 && fields[0].parse::<u64>().is_ok();
        if !is_extent {
            continue;
        }
        let (first, last) = fields[2]
            .split_once("..")
            .with_context(|| format!("filefrag extent line {line:?}"))?;
        let first: u64 = first.trim().parse()?;
        let last: u64 = last.trim().parse()?;
        extents.push((first * block, (last - first + 1) * block));
    }
    Ok(extents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filefrag_extents_become_byte_ranges() {
        let text = "Filesystem type is: ef53\n\
            File size of /mnt/volume-health-e2e/probe is 1048576 (1024 blocks of 1024 bytes)\n \
            ext:     logical_offset:        physical_offset: length:   expected: flags:\n   \
            0:        0..     511:      33024..     33535:    512:            \n   \
            1:      512..    1023:      40960..     41471:    512:      33536: last,eof\n\
            /mnt/volume-health-e2e/probe: 2 extents found\n";
        assert_eq!(
            parse_filefrag(text).unwrap(),
            vec![(33024 * 1024, 512 * 1024), (40960 * 1024, 512 * 1024)]
        );
        assert!(parse_filefrag("nothing here").is_err());
    }
}
