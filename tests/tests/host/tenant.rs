//! Tenants cannot steer the agent, and one hung volume delays nothing: a
//! kubelet-like tree planted with what a hostile party (or a broken driver)
//! could leave there, a volume with hostile content below its mount point,
//! and a volume on a hung FUSE mount, read by the real agent binary.
//!
//! Cases (all in one tree; each skipped volume is asserted by its message):
//! - `vol_data.json` a symlink to /etc/shadow; a `mount` dir a symlink to /;
//! - `vol_data.json` a FIFO (an open would wait forever), a unix socket, a
//!   character device, a 1 TB sparse file;
//! - a local volume that is a FIFO;
//! - a pod's `volumes` dir a symlink to a tree outside with a valid-looking
//!   volume; a pod dir that is a symlink;
//! - pod dir names with a newline and with invalid UTF-8;
//! - below the healthy volume's mount point (the tenant's): a symlink to
//!   /etc/shadow, a FIFO, 200 nested dirs, a 1 TB sparse file;
//! - a local volume on a FUSE mount whose server never answers.
//!
//! Needs root; fails without it.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use health_tests::agent::{volumes_json, Agent};
use health_tests::{require_env, HungFuse, Mount};
use serde_json::{json, Value};
use tempfile::TempDir;

const GOOD: &str = "0a0a0a0a-0000-4000-8000-00000000000a";
const HOSTILE: &str = "0b0b0b0b-0000-4000-8000-00000000000b";
const LINKED_VOLUMES: &str = "0c0c0c0c-0000-4000-8000-00000000000c";
const LINKED_POD: &str = "0d0d0d0d-0000-4000-8000-00000000000d";
const HUNG: &str = "0f0f0f0f-0000-4000-8000-00000000000f";
const TB: u64 = 1 << 40;

fn vol_data(pv: &str) -> String {
    json!({
        "driverName": "disk.csi.volume-health.test",
        "nodeName": "node-1",
        "specVolID": pv,
        "volumeHandle": format!("handle-{pv}"),
        "volumeLifecycleMode": "Persistent",
    })
    .to_string()
}

fn mkfifo(path: &Path) -> Result<()> {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o644))
        .with_context(|| format!("mkfifo {}", path.display()))
}

/// A unix socket file at `path`, however long: bound at a short path, then
/// moved (the file stays when the listener goes).
fn unix_socket_at(path: &Path) -> Result<()> {
    let short = tempfile::Builder::new().prefix("s").tempdir_in("/tmp")?;
    let bound = short.path().join("s");
    drop(std::os::unix::net::UnixListener::bind(&bound)?);
    std::fs::rename(&bound, path)?;
    Ok(())
}

fn sparse(path: &Path, len: u64) -> Result<()> {
    std::fs::File::create(path)?.set_len(len)?;
    Ok(())
}

/// The tree; dropped in reverse (the hung mount first, then the tmpfs).
struct Hostile {
    hung: Option<HungFuse>,
    mounts: Vec<Mount>,
    root: TempDir,
    _outside: TempDir,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.hung = None;
        self.mounts.clear();
    }
}

impl Hostile {
    fn csi_dir(&self, pod: &str, pv: &str) -> PathBuf {
        self.root
            .path()
            .join("pods")
            .join(pod)
            .join("volumes/kubernetes.io~csi")
            .join(pv)
    }

    fn root_arg(&self) -> &str {
        self.root.path().to_str().expect("temp paths are UTF-8")
    }

    fn build() -> Result<Hostile> {
        let root = tempfile::Builder::new().prefix("kubelet-").tempdir()?;
        let outside = tempfile::Builder::new().prefix("outside-").tempdir()?;
        let mut me = Hostile {
            hung: None,
            mounts: Vec::new(),
            root,
            _outside: outside,
        };
        let pods = me.root.path().join("pods");

        // The healthy volume, with the tenant's hostile content inside.
        let good = me.csi_dir(GOOD, "pv-good");
        std::fs::create_dir_all(good.join("mount"))?;
        std::fs::write(good.join("vol_data.json"), vol_data("pv-good"))?;
        me.mounts
            .push(Mount::at("tmpfs", good.join("mount"), "tmpfs", "size=4m")?);
        let inside = good.join("mount");
        symlink("/etc/shadow", inside.join("vol_data.json"))?;
        mkfifo(&inside.join("fifo"))?;
        sparse(&inside.join("huge"), TB)?;
        let mut deep = inside.join("deep");
        for _ in 0..200 {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep)?;

        // Hostile volume directories of one pod.
        let shadow = me.csi_dir(HOSTILE, "pv-shadow");
        std::fs::create_dir_all(shadow.join("mount"))?;
        symlink("/etc/shadow", shadow.join("vol_data.json"))?;
        let to_root = me.csi_dir(HOSTILE, "pv-root");
        std::fs::create_dir_all(&to_root)?;
        std::fs::write(to_root.join("vol_data.json"), vol_data("pv-root"))?;
        symlink("/", to_root.join("mount"))?;
        for (pv, make) in [
            ("pv-fifo", "fifo"),
            ("pv-sock", "socket"),
            ("pv-chr", "chr"),
            ("pv-huge", "huge"),
        ] {
            let dir = me.csi_dir(HOSTILE, pv);
            std::fs::create_dir_all(dir.join("mount"))?;
            let file = dir.join("vol_data.json");
            match make {
                "fifo" => mkfifo(&file)?,
                "socket" => unix_socket_at(&file)?,
                // 1:3 is /dev/null's number: harmless even if opened.
                "chr" => nix::sys::stat::mknod(
                    &file,
                    nix::sys::stat::SFlag::S_IFCHR,
                    nix::sys::stat::Mode::from_bits_truncate(0o644),
                    libc::makedev(1, 3),
                )?,
                _ => sparse(&file, TB)?,
            }
        }
        let local = pods
            .join(HOSTILE)
            .join("volumes/kubernetes.io~local-volume");
        std::fs::create_dir_all(&local)?;
        mkfifo(&local.join("local-fifo"))?;

        // A pod whose `volumes` leads out of the tree, to a valid-looking
        // volume; a pod directory that is a link.
        let out = me._outside.path();
        let outside_vol = out.join("volumes/kubernetes.io~csi/pv-outside");
        std::fs::create_dir_all(outside_vol.join("mount"))?;
        std::fs::write(outside_vol.join("vol_data.json"), vol_data("pv-outside"))?;
        std::fs::create_dir_all(pods.join(LINKED_VOLUMES))?;
        symlink(
            out.join("volumes"),
            pods.join(LINKED_VOLUMES).join("volumes"),
        )?;
        symlink(out, pods.join(LINKED_POD))?;

        // Pod names kubelet never makes, each with a valid-looking volume.
        for name in [&b"bad\nname"[..], &b"\xff\xfe"[..]] {
            let pod = pods.join(std::ffi::OsStr::from_bytes(name));
            let dir = pod.join("volumes/kubernetes.io~csi/pv-named");
            std::fs::create_dir_all(dir.join("mount"))?;
            std::fs::write(dir.join("vol_data.json"), vol_data("pv-named"))?;
        }

        // The hung volume.
        let hung = pods
            .join(HUNG)
            .join("volumes/kubernetes.io~local-volume/local-hung");
        me.hung = Some(HungFuse::mount(&hung)?);
        Ok(me)
    }

    /// Every skip one walk must log, with how often (the linked `volumes`
    /// once per plugin directory read through it); the paths are this
    /// tree's.
    fn expected_skips(&self) -> Vec<(String, usize)> {
        let root = self.root.path();
        let d = |pv: &str| self.csi_dir(HOSTILE, pv).display().to_string();
        let once = [
            format!("skipping CSI volume: {}/vol_data.json: not a regular file (a symbolic link): not opened", d("pv-shadow")),
            format!("skipping CSI volume: {}/mount: not a directory (a symbolic link)", d("pv-root")),
            format!("skipping CSI volume: {}/vol_data.json: not a regular file (a FIFO): not opened", d("pv-fifo")),
            format!("skipping CSI volume: {}/vol_data.json: not a regular file (a socket): not opened", d("pv-sock")),
            format!("skipping CSI volume: {}/vol_data.json: not a regular file (a character device): not opened", d("pv-chr")),
            format!("skipping CSI volume: {}/vol_data.json: 1099511627776 bytes, more than kubelet ever writes (65536): not read", d("pv-huge")),
            "skipping local volume: not a directory (a FIFO)".to_string(),
            "skipping: not a pod directory (a symbolic link)".to_string(),
            "ignoring entries whose names kubelet does not make".to_string(),
        ];
        let mut out: Vec<(String, usize)> = once.into_iter().map(|m| (m, 1)).collect();
        out.push((
            format!(
                "skipping directory: {}/pods/{LINKED_VOLUMES}/volumes: not a directory (or a link to one: not followed)",
                root.display()
            ),
            // Once per plugin directory looked for under it: CSI, local, NFS.
            3,
        ));
        out
    }
}

fn key(v: &Value) -> (String, String) {
    (
        v["pod_uid"].as_str().unwrap_or("?").to_string(),
        v["pv"].as_str().unwrap_or("?").to_string(),
    )
}

fn reasons(v: &Value) -> Vec<String> {
    v["conditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| c["reason"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether anything of /etc/shadow (its first line) appears in `text`.
fn leaks_shadow(text: &str) -> bool {
    let shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    shadow
        .lines()
        .next()
        .is_some_and(|first| !first.is_empty() && text.contains(first))
}

#[test]
fn a_hostile_tree_is_walked_without_following_opening_or_waiting() -> Result<()> {
    require_env(&[])?;
    let tree = Hostile::build()?;
    let (vols, _took, stderr) = volumes_json(tree.root_arg(), &["--check-timeout", "1"])?;
    // Exactly the healthy volume and the hung one; nothing from outside,
    // nothing under a name kubelet never makes.
    let found: Vec<(String, String)> = vols.iter().map(key).collect();
    assert_eq!(
        found,
        [
            (GOOD.to_string(), "pv-good".to_string()),
            (HUNG.to_string(), "local-hung".to_string()),
        ],
        "{vols:#?}\n{stderr}"
    );
    assert_eq!(reasons(&vols[0]), Vec::<String>::new(), "{:#}", vols[0]);
    assert_eq!(reasons(&vols[1]), ["PathHung"], "{:#}", vols[1]);
    let skips = tree.expected_skips();
    for (skip, times) in &skips {
        assert_eq!(
            stderr.matches(skip.as_str()).count(),
            *times,
            "{skip:?} {times} times in:\n{stderr}"
        );
    }
    // One warning per skip and the one about the stuck probe; no other.
    let warnings: usize = skips.iter().map(|(_, n)| n).sum::<usize>() + 1;
    assert_eq!(
        stderr.lines().filter(|l| l.contains("WARN")).count(),
        warnings,
        "{stderr}"
    );
    assert_eq!(
        stderr
            .matches("some volume probes are still blocked in the kernel")
            .count(),
        1
    );
    // The odd names are counted and shown escaped (the first in byte order).
    assert!(stderr.contains(r#"count=2 first="bad\nname""#), "{stderr}");
    assert!(
        !stderr.contains("bad\nname"),
        "a raw newline reached the log:\n{stderr}"
    );
    let stdout = serde_json::to_string(&vols)?;
    assert!(!leaks_shadow(&stdout) && !leaks_shadow(&stderr));
    Ok(())
}

#[test]
fn the_watch_raises_path_hung_and_nothing_for_the_rest() -> Result<()> {
    require_env(&[])?;
    // Its agent attaches programs: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let tree = Hostile::build()?;
    let agent = Agent::start(&[
        "--kubelet-root",
        tree.root_arg(),
        "--check-interval",
        "1",
        "--check-timeout",
        "1",
    ])?;
    let hung_line = format!(
        "volume pod {HUNG} pv local-hung: raised Inaccessible PathHung [check/reachability]"
    );
    let raised = agent.wait_for_log(&hung_line, Duration::from_secs(20));
    let run = agent.stop_cleanly()?;
    assert!(raised, "{hung_line:?} not in:\n{}", run.stderr);
    let raised_lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains(": raised "))
        .collect();
    assert_eq!(raised_lines.len(), 1, "{}", run.stderr);
    for (skip, _) in tree.expected_skips() {
        assert!(
            run.stderr.contains(&skip),
            "{skip:?} not in:\n{}",
            run.stderr
        );
    }
    assert!(!leaks_shadow(&run.stderr));
    assert!(!run.events.iter().any(|e| leaks_shadow(&e.to_string())));
    Ok(())
}
