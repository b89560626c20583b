//! The Node service: a volume staged is its loop device (found attached
//! already, or attached) with ext4 mounted at the staging path (block:
//! the device alone); published, a bind mount of that (block: of the
//! device node) at each target. Every step is undone, idempotently, and
//! what was staged is recorded, so that a restarted driver undoes it too.

use std::collections::HashMap;
use std::path::Path;

use health_csi::proto;
use health_csi::proto::node_server::Node;
use health_csi::proto::node_service_capability::rpc::Type as Capability;
use health_csi::proto::volume_capability::access_mode::Mode;
use tonic::{Request, Response, Status};

use super::backing::Backing;
use super::condition::{self, Problem};
use super::error::{logged, require_root, DriverError, DriverResult};
use super::loops;
use super::mounts;
use super::records::{StagedRecord, Target};
use super::requests::{self, required, Access};
use super::{Driver, Service};

impl Driver {
    fn stage(&self, r: proto::NodeStageVolumeRequest) -> DriverResult<()> {
        let id = required("volume_id", &r.volume_id)?;
        let staging = Path::new(required("staging_target_path", &r.staging_target_path)?);
        let access = requests::access_of(r.volume_capability.as_ref())?;
        let flags = requests::mount_flags(r.volume_capability.as_ref());
        let backing = self.backing_of(id, &r.volume_context)?;
        require_root("NodeStageVolume")?;
        let _held = self.hold();
        if let Some(staged) = self.store.staged(id)? {
            return self.stage_again(&staged, staging, access, &flags);
        }
        self.check_room()?;
        let file = loops::file_identity(&backing.file)?;
        let (device, attached) = match loops::find(&backing, file)? {
            Some(name) => (name, false),
            None => (loops::attach(&backing, false)?, true),
        };
        let record = StagedRecord {
            volume_id: id.to_string(),
            staging_path: staging.to_path_buf(),
            access,
            backing,
            device,
            file: file.into(),
            attached,
            targets: Vec::new(),
        };
        // Recorded before the mount: a driver that dies now still knows
        // which device to detach.
        self.store.put_staged(&record)?;
        if let Err(e) = mount_staged(&record, &flags) {
            return Err(
                match undo_stage(&record).and_then(|()| self.store.remove_staged(id)) {
                    Ok(()) => e,
                    Err(undo) => DriverError::Host {
                        what: e.to_string(),
                        detail: format!("undoing the stage failed too: {undo}"),
                    },
                },
            );
        }
        Ok(())
    }

    /// NodeStageVolume of a staged volume: done already at the same path
    /// with the same access (its mount made again if it went); refused
    /// anywhere else.
    fn stage_again(
        &self,
        staged: &StagedRecord,
        staging: &Path,
        access: Access,
        flags: &[String],
    ) -> DriverResult<()> {
        if staged.staging_path != staging {
            return Err(DriverError::FailedPrecondition(format!(
                "volume {} is staged at {} already",
                staged.volume_id,
                staged.staging_path.display()
            )));
        }
        if staged.access != access {
            return Err(DriverError::AlreadyExists(format!(
                "volume {} is staged for {:?} access, not {access:?}",
                staged.volume_id, staged.access
            )));
        }
        let problems = condition::of_staged(staged, staging)?;
        if problems.contains(&Problem::NotMounted {
            path: staging.to_path_buf(),
        }) {
            return mount_staged(staged, flags);
        }
        Ok(())
    }

    fn unstage(&self, r: proto::NodeUnstageVolumeRequest) -> DriverResult<()> {
        let id = required("volume_id", &r.volume_id)?;
        let staging = Path::new(required("staging_target_path", &r.staging_target_path)?);
        let _held = self.hold();
        // Not staged there: nothing to undo.
        let Some(staged) = self.store.staged(id)?.filter(|s| s.staging_path == staging) else {
            return Ok(());
        };
        if !staged.targets.is_empty() {
            let targets: Vec<String> = staged
                .targets
                .iter()
                .map(|t| t.path.display().to_string())
                .collect();
            return Err(DriverError::FailedPrecondition(format!(
                "volume {id} is still published at {}",
                targets.join(", ")
            )));
        }
        require_root("NodeUnstageVolume")?;
        undo_stage(&staged)?;
        self.store.remove_staged(id)
    }

    fn publish(&self, r: proto::NodePublishVolumeRequest) -> DriverResult<()> {
        let id = required("volume_id", &r.volume_id)?;
        let target = Path::new(required("target_path", &r.target_path)?);
        let access = requests::access_of(r.volume_capability.as_ref())?;
        let staging = Path::new(required("staging_target_path", &r.staging_target_path)?);
        let reader_only = r
            .volume_capability
            .as_ref()
            .and_then(|c| c.access_mode.as_ref())
            .is_some_and(|m| m.mode == Mode::SingleNodeReaderOnly as i32);
        let readonly = r.readonly || reader_only;
        require_root("NodePublishVolume")?;
        let _held = self.hold();
        let mut staged = self.store.staged(id)?.ok_or_else(|| {
            DriverError::FailedPrecondition(format!(
                "volume {id} is not staged on this node: NodeStageVolume comes first"
            ))
        })?;
        if staged.staging_path != staging {
            return Err(DriverError::FailedPrecondition(format!(
                "volume {id} is staged at {}, not {}",
                staged.staging_path.display(),
                staging.display()
            )));
        }
        if staged.access != access {
            return Err(DriverError::InvalidArgument(format!(
                "volume {id} is staged for {:?} access, not {access:?}",
                staged.access
            )));
        }
        if let Some(known) = staged.targets.iter().find(|t| t.path == target) {
            if known.readonly != readonly {
                return Err(DriverError::AlreadyExists(format!(
                    "volume {id} is published at {} with readonly {}",
                    target.display(),
                    known.readonly
                )));
            }
            if condition::of_staged(&staged, target)?.is_empty() {
                return Ok(());
            }
        }
        if let Some(m) = mounts::mounted_at(target)? {
            return Err(DriverError::AlreadyExists(format!(
                "{} has {} mounted already",
                target.display(),
                m.source
            )));
        }
        bind_target(&staged, target, readonly)?;
        staged.targets.retain(|t| t.path != target);
        staged.targets.push(Target {
            path: target.to_path_buf(),
            readonly,
        });
        self.store.put_staged(&staged)
    }

    fn unpublish(&self, r: proto::NodeUnpublishVolumeRequest) -> DriverResult<()> {
        let id = required("volume_id", &r.volume_id)?;
        let target = Path::new(required("target_path", &r.target_path)?);
        let _held = self.hold();
        // Not published there: nothing to undo (whatever else is mounted
        // at that path is someone else's).
        let Some(mut staged) = self
            .store
            .staged(id)?
            .filter(|s| s.targets.iter().any(|t| t.path == target))
        else {
            return Ok(());
        };
        require_root("NodeUnpublishVolume")?;
        mounts::unmount(target)?;
        // The spec: the driver removes what it made at the target.
        let removed = match staged.access {
            Access::Mount => std::fs::remove_dir(target),
            Access::Block => std::fs::remove_file(target),
        };
        match removed {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(DriverError::io(format!("removing {}", target.display()))(e)),
        }
        staged.targets.retain(|t| t.path != target);
        self.store.put_staged(&staged)
    }

    fn stats(
        &self,
        r: proto::NodeGetVolumeStatsRequest,
    ) -> DriverResult<proto::NodeGetVolumeStatsResponse> {
        let id = required("volume_id", &r.volume_id)?;
        let path = Path::new(required("volume_path", &r.volume_path)?);
        let staged = self.staged_at(id, path)?;
        let problems = condition::of_staged(&staged, path)?;
        // The device answers as long as it is bound and mounted where asked
        // (a removed file stays open under it): only then is there usage.
        let measurable = problems
            .iter()
            .all(|p| matches!(p, Problem::FileGone { .. }));
        let usage = match (measurable, staged.access) {
            (false, _) => Vec::new(),
            (true, Access::Mount) => mount_usage(path)?,
            (true, Access::Block) => vec![proto::VolumeUsage {
                total: i64::try_from(loops::size_bytes(&staged.device)?).unwrap_or(i64::MAX),
                unit: proto::volume_usage::Unit::Bytes as i32,
                ..Default::default()
            }],
        };
        let condition = condition::legacy(&problems);
        tracing::info!(
            volume_id = %id,
            abnormal = condition.abnormal,
            message = ?condition.message,
            "volume condition"
        );
        Ok(proto::NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition),
        })
    }

    fn node_volume_health(
        &self,
        r: proto::NodeGetVolumeHealthRequest,
    ) -> DriverResult<proto::NodeGetVolumeHealthResponse> {
        self.health_served("NodeGetVolumeHealth")?;
        let id = required("volume_id", &r.volume_id)?;
        let asked = [&r.volume_publish_path, &r.staging_target_path]
            .into_iter()
            .find(|p| !p.is_empty());
        let staged = match asked {
            Some(path) => self.staged_at(id, Path::new(path))?,
            None => self.staged_at_all(id)?,
        };
        let path = asked.map_or(staged.staging_path.clone(), Into::into);
        let problems = condition::of_staged(&staged, &path)?;
        Ok(proto::NodeGetVolumeHealthResponse {
            volume_health: Some(condition::health(id, &problems)),
        })
    }

    /// The staged volume `id`, which must be staged or published at `path`:
    /// NOT_FOUND otherwise, as the spec says. A block volume's device bound
    /// at `path` counts as published there: the kubelet asks
    /// NodeGetVolumeStats of a block volume at its own per-pod bind of the
    /// device (`volumeDevices/<pv>/dev/<pod uid>`, Kubernetes 1.37
    /// pkg/volume/csi/csi_plugin.go, `NewMetricsCsi`), which is neither.
    fn staged_at(&self, id: &str, path: &Path) -> DriverResult<StagedRecord> {
        let staged = self.staged_at_all(id)?;
        let device_bound = || -> DriverResult<bool> {
            Ok(staged.access == Access::Block
                && mounts::mounted_at(path)?
                    .is_some_and(|m| mounts::is_device_bind(&m, &staged.device)))
        };
        if staged.staging_path != path
            && !staged.targets.iter().any(|t| t.path == path)
            && !device_bound()?
        {
            return Err(DriverError::NotFound(format!(
                "volume {id} is neither staged nor published at {}",
                path.display()
            )));
        }
        Ok(staged)
    }

    fn staged_at_all(&self, id: &str) -> DriverResult<StagedRecord> {
        self.store
            .staged(id)?
            .ok_or_else(|| DriverError::NotFound(format!("volume {id} is not staged on this node")))
    }

    /// What the volume is: the `volume_context` the CO passed, else this
    /// driver's own record of the volume.
    fn backing_of(&self, id: &str, context: &HashMap<String, String>) -> DriverResult<Backing> {
        if !context.is_empty() {
            return Backing::from_context(context);
        }
        match self.store.volume(id)? {
            Some(record) => Ok(record.backing),
            None => Err(DriverError::NotFound(format!(
                "volume {id}: no volume_context, and this driver made no such volume"
            ))),
        }
    }

    /// `--max-volumes-per-node`: no more volumes staged at once.
    fn check_room(&self) -> DriverResult<()> {
        let max = self.config.max_volumes_per_node;
        if max <= 0 {
            return Ok(());
        }
        let staged = self.store.all_staged()?.len();
        if i64::try_from(staged).unwrap_or(i64::MAX) >= max {
            return Err(DriverError::ResourceExhausted(format!(
                "{staged} volumes are staged on this node, its maximum"
            )));
        }
        Ok(())
    }

    fn node_capabilities(&self) -> Vec<Capability> {
        let mut out = vec![
            Capability::StageUnstageVolume,
            Capability::GetVolumeStats,
            Capability::VolumeCondition,
        ];
        if self.config.volume_health {
            out.push(Capability::GetVolumeHealth);
        }
        out
    }
}

/// ext4 (made when the device has no filesystem) mounted at the staging
/// path, with the volume's mount options and the capability's flags; a
/// block volume needs nothing.
fn mount_staged(staged: &StagedRecord, flags: &[String]) -> DriverResult<()> {
    if staged.access == Access::Block {
        return Ok(());
    }
    let device = loops::node(&staged.device);
    mounts::ensure_ext4(&device, &staged.backing.mkfs_options)?;
    let mut options = vec![staged.backing.fs_options.clone()];
    options.extend(flags.iter().cloned());
    mounts::mount_ext4(&device, &staged.staging_path, &options)
}

/// The staging mount unmounted (when it is the volume's), and the device
/// detached when this driver attached it.
fn undo_stage(staged: &StagedRecord) -> DriverResult<()> {
    if staged.access == Access::Mount {
        if let Some(m) = mounts::mounted_at(&staged.staging_path)? {
            if m.maj_min == loops::maj_min(&staged.device)? {
                mounts::unmount(&staged.staging_path)?;
            }
        }
    }
    if staged.attached {
        loops::detach(&staged.device, staged.file)?;
    }
    Ok(())
}

/// The bind mount of a published target: the staging mount on a directory,
/// or the device node on a file.
fn bind_target(staged: &StagedRecord, target: &Path, readonly: bool) -> DriverResult<()> {
    let made = |e| DriverError::io(format!("making {}", target.display()))(e);
    match staged.access {
        Access::Mount => {
            std::fs::create_dir_all(target).map_err(made)?;
            mounts::bind(&staged.staging_path, target, readonly)
        }
        Access::Block => {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(made)?;
            }
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(target)
                .map_err(made)?;
            mounts::bind(&loops::node(&staged.device), target, readonly)
        }
    }
}

fn mount_usage(path: &Path) -> DriverResult<Vec<proto::VolumeUsage>> {
    use proto::volume_usage::Unit;
    let u = mounts::usage(path)?;
    let one = |(available, total, used): (i64, i64, i64), unit: Unit| proto::VolumeUsage {
        available,
        total,
        used,
        unit: unit as i32,
    };
    Ok(vec![one(u.bytes, Unit::Bytes), one(u.inodes, Unit::Inodes)])
}

fn capability(c: Capability) -> proto::NodeServiceCapability {
    use proto::node_service_capability::{Rpc, Type};
    proto::NodeServiceCapability {
        r#type: Some(Type::Rpc(Rpc { r#type: c as i32 })),
    }
}

#[tonic::async_trait]
impl Node for Service {
    async fn node_stage_volume(
        &self,
        request: Request<proto::NodeStageVolumeRequest>,
    ) -> Result<Response<proto::NodeStageVolumeResponse>, Status> {
        let r = request.into_inner();
        let id = r.volume_id.clone();
        logged(
            "NodeStageVolume",
            &id,
            self.blocking(move |d| d.stage(r).map(|()| proto::NodeStageVolumeResponse {})),
        )
        .await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<proto::NodeUnstageVolumeRequest>,
    ) -> Result<Response<proto::NodeUnstageVolumeResponse>, Status> {
        let r = request.into_inner();
        let id = r.volume_id.clone();
        logged(
            "NodeUnstageVolume",
            &id,
            self.blocking(move |d| d.unstage(r).map(|()| proto::NodeUnstageVolumeResponse {})),
        )
        .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<proto::NodePublishVolumeRequest>,
    ) -> Result<Response<proto::NodePublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let id = r.volume_id.clone();
        logged(
            "NodePublishVolume",
            &id,
            self.blocking(move |d| d.publish(r).map(|()| proto::NodePublishVolumeResponse {})),
        )
        .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<proto::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<proto::NodeUnpublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let id = r.volume_id.clone();
        logged(
            "NodeUnpublishVolume",
            &id,
            self.blocking(move |d| {
                d.unpublish(r)
                    .map(|()| proto::NodeUnpublishVolumeResponse {})
            }),
        )
        .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<proto::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<proto::NodeGetVolumeStatsResponse>, Status> {
        let r = request.into_inner();
        let id = r.volume_id.clone();
        logged(
            "NodeGetVolumeStats",
            &id,
            self.blocking(move |d| d.stats(r)),
        )
        .await
    }

    async fn node_get_volume_health(
        &self,
        request: Request<proto::NodeGetVolumeHealthRequest>,
    ) -> Result<Response<proto::NodeGetVolumeHealthResponse>, Status> {
        let r = request.into_inner();
        let id = r.volume_id.clone();
        logged(
            "NodeGetVolumeHealth",
            &id,
            self.blocking(move |d| d.node_volume_health(r)),
        )
        .await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<proto::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<proto::NodeGetCapabilitiesResponse>, Status> {
        let capabilities = self
            .0
            .node_capabilities()
            .into_iter()
            .map(capability)
            .collect();
        logged("NodeGetCapabilities", "", async move {
            Ok(proto::NodeGetCapabilitiesResponse { capabilities })
        })
        .await
    }

    async fn node_get_info(
        &self,
        _: Request<proto::NodeGetInfoRequest>,
    ) -> Result<Response<proto::NodeGetInfoResponse>, Status> {
        let answer = proto::NodeGetInfoResponse {
            node_id: self.0.config.node_id.clone(),
            max_volumes_per_node: self.0.config.max_volumes_per_node,
        };
        logged("NodeGetInfo", "", async move { Ok(answer) }).await
    }
}
