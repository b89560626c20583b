//! The project's CSI driver (`csi-loop-driver`) on this kernel, as the
//! kubelet drives it: volumes created, staged (a real loop device, direct
//! I/O on; ext4 made and mounted), published (filesystem and block),
//! written through, measured, found abnormal when their file goes,
//! unpublished and unstaged leaving no loop device and no mount; a
//! restarted driver knows its volumes and what it staged; a volume over a
//! stretch of an existing file reuses a loop device already attached over
//! exactly that stretch and leaves it attached.
//!
//! Root (loop devices, mounts). Everything lives on a tmpfs of the test's
//! own.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use health_csi::proto;
use health_csi::proto::controller_client::ControllerClient;
use health_csi::proto::node_client::NodeClient;
use health_tests::csi_driver::client::{capability, create_volume, unix_channel, DriverProcess};
use health_tests::csi_driver::requests::{volume_id, Access};
use health_tests::{cmd, fs, sys, Mount};
use tonic::transport::Channel;
use tonic::Code;

const MIB: u64 = 1 << 20;
const BIN: &str = env!("CARGO_BIN_EXE_csi-loop-driver");

fn tmpfs() -> Mount {
    health_tests::require_root().unwrap_or_else(|e| panic!("{e:#}"));
    Mount::new("tmpfs", "tmpfs", "size=256m,mode=0755").unwrap_or_else(|e| panic!("{e:#}"))
}

struct Clients {
    node: NodeClient<Channel>,
    controller: ControllerClient<Channel>,
}

async fn clients(driver: &DriverProcess) -> Clients {
    let channel = unix_channel(driver.socket()).await.unwrap();
    Clients {
        node: NodeClient::new(channel.clone()),
        controller: ControllerClient::new(channel),
    }
}

fn stage_request(
    id: &str,
    staging: &Path,
    access: Access,
    context: &BTreeMap<String, String>,
) -> proto::NodeStageVolumeRequest {
    proto::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability(access)),
        volume_context: context.clone().into_iter().collect::<HashMap<_, _>>(),
        ..Default::default()
    }
}

fn publish_request(
    id: &str,
    staging: &Path,
    target: &Path,
    access: Access,
    readonly: bool,
) -> proto::NodePublishVolumeRequest {
    proto::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability(access)),
        readonly,
        ..Default::default()
    }
}

async fn stats(
    c: &mut Clients,
    id: &str,
    path: &Path,
) -> Result<proto::NodeGetVolumeStatsResponse, tonic::Status> {
    c.node
        .node_get_volume_stats(proto::NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: path.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn unpublish(c: &mut Clients, id: &str, target: &Path) {
    c.node
        .node_unpublish_volume(proto::NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
}

async fn unstage(c: &mut Clients, id: &str, staging: &Path) {
    c.node
        .node_unstage_volume(proto::NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap();
}

fn condition(abnormal: bool, message: &str) -> Option<proto::VolumeCondition> {
    Some(proto::VolumeCondition {
        abnormal,
        message: message.into(),
    })
}

/// Loop devices whose backing file is under `dir` (as sysfs names it, a
/// removed file's name ending in " (deleted)").
fn loops_under(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/block").unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(file) = sys::loop_backing_file(&name) {
            if file.starts_with(dir) {
                out.push((name, file.display().to_string()));
            }
        }
    }
    out.sort();
    out
}

/// Mount points under `dir` (the tmpfs itself excluded).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    sys::mountinfo()
        .unwrap()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir) && p != dir)
        .collect()
}

fn attr(name: &str, a: &str) -> String {
    sys::read_sysfs(format!("/sys/block/{name}/loop/{a}")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_live_and_die_as_the_kubelet_drives_them_and_survive_a_restart() {
    let fs = tmpfs();
    let root = fs.path().canonicalize().unwrap();
    let mut driver =
        DriverProcess::start(Path::new(BIN), &root.join("driver"), "node-1", &[]).unwrap();
    let mut c = clients(&driver).await;
    let data = root.join("driver/state/data");

    // A filesystem volume in a file of the driver's own.
    let created = driver
        .create_volume("fs-1", 64 << 20, Access::Mount)
        .await
        .unwrap();
    let fs_id = volume_id("fs-1");
    let fs_file = data.join(format!("{fs_id}.img"));
    assert_eq!(created.id, fs_id);
    assert_eq!(created.capacity_bytes, 64 << 20);
    assert_eq!(
        created.context,
        BTreeMap::from([
            ("file".to_string(), fs_file.display().to_string()),
            ("offset".to_string(), "0".to_string()),
            ("size".to_string(), (64 * MIB).to_string()),
        ])
    );
    assert_eq!(std::fs::metadata(&fs_file).unwrap().len(), 64 * MIB);

    let staging = root.join("kubelet/stage-fs");
    let target = root.join("kubelet/pods/p1/mount");
    std::fs::create_dir_all(&staging).unwrap();
    for _ in 0..2 {
        c.node
            .node_stage_volume(stage_request(
                &fs_id,
                &staging,
                Access::Mount,
                &created.context,
            ))
            .await
            .unwrap();
    }
    let loops = loops_under(&root);
    assert_eq!(loops.len(), 1, "{loops:?}");
    let (dev, backing) = loops[0].clone();
    assert_eq!(backing, fs_file.display().to_string());
    assert_eq!(
        (
            attr(&dev, "dio"),
            attr(&dev, "offset"),
            attr(&dev, "sizelimit")
        ),
        ("1".to_string(), "0".to_string(), (64 * MIB).to_string())
    );
    let staged = sys::mount_at(&staging).unwrap().unwrap();
    assert_eq!(
        (staged.fstype.as_str(), staged.source.clone()),
        ("ext4", format!("/dev/{dev}"))
    );

    c.node
        .node_publish_volume(publish_request(
            &fs_id,
            &staging,
            &target,
            Access::Mount,
            false,
        ))
        .await
        .unwrap();
    std::fs::write(target.join("hello"), b"through the pod's mount").unwrap();
    assert_eq!(
        std::fs::read(staging.join("hello")).unwrap(),
        b"through the pod's mount"
    );
    fs::sync_fs(&target).unwrap();

    // Usage as statvfs says it, and healthy.
    let answer = stats(&mut c, &fs_id, &target).await.unwrap();
    let s = nix::sys::statvfs::statvfs(&target).unwrap();
    let f = s.fragment_size() as i64;
    let bytes = proto::VolumeUsage {
        available: s.blocks_available() as i64 * f,
        total: s.blocks() as i64 * f,
        used: (s.blocks() - s.blocks_free()) as i64 * f,
        unit: proto::volume_usage::Unit::Bytes as i32,
    };
    let inodes = proto::VolumeUsage {
        available: s.files_available() as i64,
        total: s.files() as i64,
        used: (s.files() - s.files_free()) as i64,
        unit: proto::volume_usage::Unit::Inodes as i32,
    };
    assert_eq!(answer.usage, vec![bytes, inodes]);
    assert_eq!(answer.volume_condition, condition(false, "healthy"));
    // A path the volume is not at, and a volume never staged: NOT_FOUND.
    let e = stats(&mut c, &fs_id, Path::new("some/path"))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::NotFound,
            format!("volume {fs_id} is neither staged nor published at some/path").as_str()
        )
    );
    let e = stats(&mut c, "loop-0000000000000000", &target)
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::NotFound,
            "volume loop-0000000000000000 is not staged on this node"
        )
    );

    // The file goes: the node and the controller say so; the device still
    // holds it open, so the mount still answers.
    std::fs::remove_file(&fs_file).unwrap();
    let gone = format!("the volume's backing file {} is gone", fs_file.display());
    let answer = stats(&mut c, &fs_id, &target).await.unwrap();
    assert_eq!(answer.volume_condition, condition(true, &gone));
    assert_eq!(answer.usage.len(), 2);
    let listed = c
        .controller
        .list_volumes(proto::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let status = listed.entries[0].status.clone().unwrap();
    assert_eq!(status.volume_condition, condition(true, &gone));
    assert_eq!(
        std::fs::read(target.join("hello")).unwrap(),
        b"through the pod's mount"
    );

    unpublish(&mut c, &fs_id, &target).await;
    unpublish(&mut c, &fs_id, &target).await;
    assert!(!target.exists());
    unstage(&mut c, &fs_id, &staging).await;
    unstage(&mut c, &fs_id, &staging).await;
    assert_eq!(loops_under(&root), vec![]);
    assert_eq!(mounts_under(&root), Vec::<PathBuf>::new());

    // A block volume, written through the device the pod sees.
    let block = driver
        .create_volume("block-1", 16 << 20, Access::Block)
        .await
        .unwrap();
    let block_id = block.id.clone();
    let block_file = block.file().unwrap();
    let staging = root.join("kubelet/stage-block");
    let target = root.join("kubelet/pods/p2/dev/block-1");
    std::fs::create_dir_all(&staging).unwrap();
    c.node
        .node_stage_volume(stage_request(
            &block_id,
            &staging,
            Access::Block,
            &block.context,
        ))
        .await
        .unwrap();
    c.node
        .node_publish_volume(publish_request(
            &block_id,
            &staging,
            &target,
            Access::Block,
            false,
        ))
        .await
        .unwrap();
    let data_block = vec![0x5au8; 4096];
    assert_eq!(
        fs::o_direct_write(&target, 8192, &data_block).unwrap(),
        4096
    );
    let mut written = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(&block_file).unwrap(),
        &mut written,
        8192,
    )
    .unwrap();
    assert_eq!(written, data_block);
    let answer = stats(&mut c, &block_id, &target).await.unwrap();
    assert_eq!(
        answer.usage,
        vec![proto::VolumeUsage {
            available: 0,
            total: 16 << 20,
            used: 0,
            unit: proto::volume_usage::Unit::Bytes as i32,
        }]
    );
    assert_eq!(answer.volume_condition, condition(false, "healthy"));

    // A restart: the volumes, and what is staged and published, are known.
    assert!(driver.terminate().unwrap().success());
    assert!(!driver.socket().exists());
    drop(driver);
    let driver = DriverProcess::start(Path::new(BIN), &root.join("driver"), "node-1", &[]).unwrap();
    let mut c = clients(&driver).await;
    let listed = c
        .controller
        .list_volumes(proto::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut ids: Vec<String> = listed
        .entries
        .iter()
        .map(|e| e.volume.clone().unwrap().volume_id)
        .collect();
    ids.sort();
    let mut expected = vec![fs_id.clone(), block_id.clone()];
    expected.sort();
    assert_eq!(ids, expected);
    let again = driver
        .create_volume("block-1", 16 << 20, Access::Block)
        .await
        .unwrap();
    assert_eq!(again, block);
    let e = driver
        .create_volume("block-1", 32 << 20, Access::Block)
        .await
        .unwrap_err();
    let status = e.downcast_ref::<tonic::Status>().unwrap();
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::AlreadyExists,
            "volume block-1 exists with 16777216 bytes, outside the capacity_range asked for"
        )
    );
    assert_eq!(
        stats(&mut c, &block_id, &target)
            .await
            .unwrap()
            .volume_condition,
        condition(false, "healthy")
    );
    unpublish(&mut c, &block_id, &target).await;
    assert!(!target.exists());
    unstage(&mut c, &block_id, &staging).await;
    assert_eq!(loops_under(&root), vec![]);
    assert_eq!(mounts_under(&root), Vec::<PathBuf>::new());

    for id in [&fs_id, &block_id] {
        c.controller
            .delete_volume(proto::DeleteVolumeRequest {
                volume_id: id.to_string(),
            })
            .await
            .unwrap();
    }
    assert!(!block_file.exists());
    let listed = c
        .controller
        .list_volumes(proto::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries, vec![]);
    // The restarted driver's own calls: it staged nothing itself.
    assert_eq!(driver.calls("NodeStageVolume"), 0);
    assert_eq!(driver.calls("NodeUnstageVolume"), 1);
    assert_eq!(driver.calls("ListVolumes"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stretch_of_a_disk_image_is_a_volume_of_its_own_on_the_loop_device_already_there() {
    let fs = tmpfs();
    let root = fs.path().canonicalize().unwrap();
    let image = root.join("disk.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(32 * MIB)
        .unwrap();
    let driver = DriverProcess::start(Path::new(BIN), &root.join("driver"), "node-1", &[]).unwrap();
    let mut c = clients(&driver).await;
    let parameters = |offset: u64| {
        BTreeMap::from([
            ("file".to_string(), image.display().to_string()),
            ("offset".to_string(), offset.to_string()),
            ("mkfsOptions".to_string(), "-O ^has_journal".to_string()),
            (
                "fsOptions".to_string(),
                "errors=continue,nodelalloc".to_string(),
            ),
        ])
    };
    let created = create_volume(
        driver.socket(),
        "vh-fs-1",
        8 << 20,
        Access::Mount,
        &parameters(8 * MIB),
    )
    .await
    .unwrap();
    assert_eq!(
        created.context,
        BTreeMap::from([
            ("file".to_string(), image.display().to_string()),
            ("offset".to_string(), (8 * MIB).to_string()),
            ("size".to_string(), (8 * MIB).to_string()),
            ("mkfsOptions".to_string(), "-O ^has_journal".to_string()),
            (
                "fsOptions".to_string(),
                "errors=continue,nodelalloc".to_string()
            ),
        ])
    );
    let e = create_volume(
        driver.socket(),
        "vh-fs-2",
        8 << 20,
        Access::Mount,
        &parameters(12 * MIB),
    )
    .await
    .unwrap_err();
    let status = e.downcast_ref::<tonic::Status>().unwrap();
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::AlreadyExists,
            format!(
                "bytes [12582912, 20971520) of {} overlap volume vh-fs-1 ({}, bytes [8388608, 16777216))",
                image.display(),
                created.id
            )
            .as_str()
        )
    );
    let e = create_volume(
        driver.socket(),
        "vh-fs-3",
        8 << 20,
        Access::Mount,
        &parameters(28 * MIB),
    )
    .await
    .unwrap_err();
    assert_eq!(
        e.downcast_ref::<tonic::Status>().unwrap().code(),
        Code::OutOfRange
    );

    // The loop device over exactly that stretch, attached as the local
    // cluster attaches it, is the one the driver stages.
    let out = cmd::run(
        "losetup",
        &[
            "-f",
            "--show",
            "--direct-io=on",
            "--offset",
            &(8 * MIB).to_string(),
            "--sizelimit",
            &(8 * MIB).to_string(),
            &image.display().to_string(),
        ],
    )
    .unwrap();
    let dev = out.stdout.trim().trim_start_matches("/dev/").to_string();
    let attached = Attached(dev.clone());
    let staging = root.join("stage");
    std::fs::create_dir_all(&staging).unwrap();
    c.node
        .node_stage_volume(stage_request(
            &created.id,
            &staging,
            Access::Mount,
            &created.context,
        ))
        .await
        .unwrap();
    let staged = sys::mount_at(&staging).unwrap().unwrap();
    assert_eq!(staged.source, format!("/dev/{dev}"));
    // The volume's mount options reach the mount (ext4 shows those that
    // differ from its superblock's defaults: errors=continue is mkfs's).
    assert!(staged.has_super_option("nodelalloc"), "{staged:?}");
    let features = cmd::run("dumpe2fs", &["-h", &format!("/dev/{dev}")])
        .unwrap()
        .stdout;
    let features = features
        .lines()
        .find(|l| l.starts_with("Filesystem features:"))
        .unwrap()
        .to_string();
    assert!(!features.contains("has_journal"), "{features}");
    // ext4's superblock is 1024 bytes into the volume: 8 MiB into the image.
    let mut magic = [0u8; 2];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(&image).unwrap(),
        &mut magic,
        8 * MIB + 1024 + 56,
    )
    .unwrap();
    assert_eq!(u16::from_le_bytes(magic), 0xEF53);

    unstage(&mut c, &created.id, &staging).await;
    assert_eq!(sys::mount_at(&staging).unwrap(), None);
    // Not the driver's device: it stays attached.
    assert_eq!(
        loops_under(&root),
        vec![(dev.clone(), image.display().to_string())]
    );
    drop(attached);
    assert_eq!(loops_under(&root), vec![]);
    assert_eq!(driver.calls("NodeUnstageVolume"), 1);
}

/// A loop device the test attached, detached when dropped (a failing test
/// too leaves none behind).
struct Attached(String);

impl Drop for Attached {
    fn drop(&mut self) {
        if let Err(e) = sys::detach_loop_device(&self.0, None) {
            eprintln!("detaching /dev/{}: {e:#}", self.0);
        }
    }
}
