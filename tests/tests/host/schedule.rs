//! Each volume on its own schedule (`health_node::volumes::LiveVolumes`),
//! against the real kernel: a volume on a FUSE mount whose server never
//! answers beside a healthy tmpfs volume. Needs root (mount); fails (not
//! skips) without it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use health_core::conditions::{CheckFinding, CheckKind, CheckResult, ConditionConfig};
use health_node::volumes::checks::{CheckConfig, CheckReport};
use health_node::volumes::{kubelet, next_wake, LiveVolumes, LiveVolumesConfig, VolumeKey, Wake};
use health_tests::sys::require_root;
use health_tests::HungFuse;
use health_topology::{read_mounts, HostPaths, Topology};

const HEALTHY_POD: &str = "0a0a0a0a-0000-4000-8000-00000000000a";
const HUNG_POD: &str = "0b0b0b0b-0000-4000-8000-00000000000b";

fn local_volume_dir(root: &Path, pod: &str, name: &str) -> PathBuf {
    root.join("pods")
        .join(pod)
        .join("volumes/kubernetes.io~local-volume")
        .join(name)
}

/// A tmpfs mounted for the test's lifetime.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        nix::mount::mount(
            Some("schedule-test"),
            path,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=1m"),
        )
        .unwrap_or_else(|e| panic!("mount tmpfs (these tests need root): {e}"));
        Tmpfs(path.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = health_tests::sys::unmount(&self.0, true);
    }
}

/// Handles one wake; returns the check that ended (if that was it) and how
/// many checks run and probes are stuck after it.
async fn step(
    live: &mut Option<LiveVolumes>,
    topo: &Topology,
) -> (Option<(VolumeKey, Option<CheckReport>)>, usize, usize) {
    let wake = tokio::time::timeout(Duration::from_secs(30), next_wake(live))
        .await
        .expect("a wake within 30 s");
    let checked = match &wake {
        Wake::Checked(c) => Some((c.key.clone(), c.report.as_ref().ok().cloned())),
        _ => None,
    };
    let lv = live.as_mut().expect("volumes are watched");
    lv.handle(wake, topo);
    (checked, lv.checks_running(), lv.stuck_probes())
}

/// While one volume's probe is stuck in the kernel (a timeout far beyond
/// the test, so it stays outstanding), the other volume is checked again
/// and again; the stuck one reports when its probe ends, and only then.
#[test]
fn a_hung_volume_holds_back_only_its_own_checks() -> Result<()> {
    require_root()?;
    let rt = health_tests::multi_thread_runtime().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let _healthy = Tmpfs::mount(&local_volume_dir(&root, HEALTHY_POD, "healthy"));
    let mut hung = HungFuse::mount(&local_volume_dir(&root, HUNG_POD, "hung")).unwrap();
    let healthy_key = VolumeKey {
        pod_uid: HEALTHY_POD.into(),
        name: "healthy".into(),
        mode: kubelet::VolumeMode::Filesystem,
    };
    let hung_key = VolumeKey {
        pod_uid: HUNG_POD.into(),
        name: "hung".into(),
        ..healthy_key.clone()
    };
    let topo = Topology::from_parts(
        Vec::new(),
        read_mounts(&HostPaths::default()).expect("read the mount table"),
    );
    let cfg = LiveVolumesConfig {
        kubelet_root: root.clone(),
        check: CheckConfig {
            timeout: Duration::from_secs(3600),
            ..CheckConfig::default()
        },
        check_interval: Duration::from_millis(50),
        csi_interval: Duration::from_secs(3600),
        stack_interval: Duration::from_secs(3600),
        csi_overrides: vec![],
        conditions: ConditionConfig::default(),
    };
    const HEALTHY_CHECKS: usize = 5;
    rt.block_on(async {
        let mut live = Some(LiveVolumes::new(cfg, &topo));
        let (mut healthy_checks, mut hung_checks) = (0, 0);
        while healthy_checks < HEALTHY_CHECKS {
            let (checked, running, stuck) = step(&mut live, &topo).await;
            match checked {
                Some((key, report)) if key == healthy_key => {
                    healthy_checks += 1;
                    let report = report.expect("the healthy volume's check completed");
                    assert_eq!(
                        report.result(CheckKind::Reachability),
                        Some(&CheckResult::Pass)
                    );
                }
                Some((key, _)) => panic!("only the healthy volume reports, not {key:?}"),
                None => {}
            }
            // Once both are started, the hung probe stays outstanding.
            assert!(running <= 2 && stuck <= 2, "{running} {stuck}");
        }
        let lv = live.as_ref().unwrap();
        assert_eq!(lv.stuck_probes(), 1, "the hung probe is outstanding");
        assert!(lv.health(&healthy_key).unwrap().conditions().is_empty());
        assert!(lv.health(&hung_key).unwrap().conditions().is_empty());

        // The FUSE server dies: the stuck probe returns ENOTCONN, and the
        // hung volume's first report comes.
        hung.abort();
        let report = loop {
            match step(&mut live, &topo).await.0 {
                Some((key, report)) if key == hung_key => {
                    hung_checks += 1;
                    break report.expect("the hung volume's check completed");
                }
                Some((key, _)) => assert_eq!(key, healthy_key),
                None => {}
            }
        };
        assert_eq!(hung_checks, 1);
        assert_eq!(
            report.result(CheckKind::Reachability),
            Some(&CheckResult::Found(vec![CheckFinding::PathUnreachable {
                path: local_volume_dir(&root, HUNG_POD, "hung"),
                op: "statvfs",
                errno: libc::ENOTCONN,
            }]))
        );
        let reasons: Vec<String> = live
            .as_ref()
            .unwrap()
            .health(&hung_key)
            .unwrap()
            .conditions()
            .iter()
            .map(|c| c.reason.clone())
            .collect();
        assert_eq!(reasons, ["PathUnreachable"]);
    });
    drop(hung);
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
