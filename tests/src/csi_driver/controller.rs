//! The Controller service: volumes made (a file of the driver's own, or a
//! stretch of an existing file), deleted, validated and listed, each with
//! its condition (abnormal while its file is gone).

use health_csi::proto;
use health_csi::proto::controller_server::Controller;
use health_csi::proto::controller_service_capability::rpc::Type as Capability;
use tonic::{Request, Response, Status};

use super::backing::Parameters;
use super::condition;
use super::error::{logged, DriverError, DriverResult};
use super::records::VolumeRecord;
use super::requests::{self, required};
use super::{Driver, Service};

impl Driver {
    fn create_volume(&self, r: proto::CreateVolumeRequest) -> DriverResult<proto::Volume> {
        let name = required("name", &r.name)?;
        requests::check_capabilities(&r.volume_capabilities)?;
        if r.volume_content_source.is_some() {
            return Err(DriverError::InvalidArgument(
                "volume_content_source: snapshots and clones are not served".into(),
            ));
        }
        let size = requests::volume_size(r.capacity_range.as_ref())?;
        let parameters = Parameters::parse(&r.parameters)?;
        let id = requests::volume_id(name);
        let _held = self.hold();
        if let Some(existing) = self.store.volume(&id)? {
            return same_volume(existing, name, &r, &parameters);
        }
        let mut backing = parameters.backing(&self.store.data_file(&id), size)?;
        let own_file = parameters.stretch.is_none();
        if own_file {
            make_file(&backing.file, size)?;
        } else {
            backing.file = self.check_stretch(&backing)?;
        }
        let record = VolumeRecord {
            id,
            name: name.to_string(),
            backing,
            own_file,
        };
        self.store.put_volume(&record)?;
        Ok(volume(&record))
    }

    /// The stretch of an existing file a new volume asks for: inside the
    /// file, and sharing no byte with another volume's (a fault of one
    /// volume's bytes must never touch another). Returns the file's
    /// canonical path, which the kernel reports loop devices by.
    fn check_stretch(&self, backing: &super::backing::Backing) -> DriverResult<std::path::PathBuf> {
        let file = backing.file.canonicalize().map_err(|e| {
            DriverError::InvalidArgument(format!("parameter file {}: {e}", backing.file.display()))
        })?;
        let len = std::fs::metadata(&file)
            .map_err(DriverError::io(format!("stat {}", file.display())))?
            .len();
        if backing.end() > len {
            return Err(DriverError::OutOfRange(format!(
                "bytes [{}, {}) are not inside {} ({len} bytes)",
                backing.offset,
                backing.end(),
                file.display()
            )));
        }
        let canonical = super::backing::Backing {
            file: file.clone(),
            ..backing.clone()
        };
        for other in self.store.volumes()? {
            if other.backing.overlaps(&canonical) {
                return Err(DriverError::AlreadyExists(format!(
                    "bytes [{}, {}) of {} overlap volume {} ({}, bytes [{}, {}))",
                    canonical.offset,
                    canonical.end(),
                    file.display(),
                    other.name,
                    other.id,
                    other.backing.offset,
                    other.backing.end()
                )));
            }
        }
        Ok(file)
    }

    fn delete_volume(&self, r: proto::DeleteVolumeRequest) -> DriverResult<()> {
        let id = required("volume_id", &r.volume_id)?;
        let _held = self.hold();
        let Some(record) = self.store.volume(id)? else {
            return Ok(());
        };
        if let Some(staged) = self.store.staged(id)? {
            return Err(DriverError::FailedPrecondition(format!(
                "volume {id} is staged at {} on this node",
                staged.staging_path.display()
            )));
        }
        if record.own_file {
            match std::fs::remove_file(&record.backing.file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(DriverError::io(format!(
                        "removing {}",
                        record.backing.file.display()
                    ))(e))
                }
            }
        }
        self.store.remove_volume(id)
    }

    fn validate(
        &self,
        r: proto::ValidateVolumeCapabilitiesRequest,
    ) -> DriverResult<proto::ValidateVolumeCapabilitiesResponse> {
        let id = required("volume_id", &r.volume_id)?;
        if r.volume_capabilities.is_empty() {
            return Err(DriverError::InvalidArgument(
                "volume_capabilities is empty".into(),
            ));
        }
        self.known(id)?;
        let refused: Vec<String> = r
            .volume_capabilities
            .iter()
            .filter_map(requests::unsupported)
            .collect();
        if !refused.is_empty() {
            return Ok(proto::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: refused.join("; "),
            });
        }
        Ok(proto::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(proto::validate_volume_capabilities_response::Confirmed {
                volume_context: r.volume_context,
                volume_capabilities: r.volume_capabilities,
                parameters: r.parameters,
            }),
            message: String::new(),
        })
    }

    fn list_volumes(
        &self,
        r: proto::ListVolumesRequest,
    ) -> DriverResult<proto::ListVolumesResponse> {
        let volumes = self.store.volumes()?;
        let ids: Vec<String> = volumes.iter().map(|v| v.id.clone()).collect();
        let (page, next_token) = requests::page(&ids, r.max_entries, &r.starting_token)?;
        let entries = volumes
            .iter()
            .filter(|v| page.contains(&v.id))
            .map(|v| proto::list_volumes_response::Entry {
                volume: Some(volume(v)),
                status: Some(proto::list_volumes_response::VolumeStatus {
                    published_node_ids: Vec::new(),
                    volume_condition: Some(condition::legacy(&condition::of_volume(v))),
                }),
            })
            .collect();
        Ok(proto::ListVolumesResponse {
            entries,
            next_token,
        })
    }

    fn get_volume(&self, id: &str) -> DriverResult<proto::ControllerGetVolumeResponse> {
        let record = self.known(required("volume_id", id)?)?;
        Ok(proto::ControllerGetVolumeResponse {
            volume: Some(volume(&record)),
            status: Some(proto::controller_get_volume_response::VolumeStatus {
                published_node_ids: Vec::new(),
                volume_condition: Some(condition::legacy(&condition::of_volume(&record))),
            }),
        })
    }

    fn controller_volume_health(&self, id: &str) -> DriverResult<proto::VolumeHealth> {
        self.health_served("ControllerGetVolumeHealth")?;
        let record = self.known(required("volume_id", id)?)?;
        Ok(condition::health(
            &record.id,
            &condition::of_volume(&record),
        ))
    }

    /// The abnormal volumes of a page (healthy ones are left out, as the
    /// spec asks).
    fn list_health(
        &self,
        r: proto::ControllerListVolumeHealthRequest,
    ) -> DriverResult<proto::ControllerListVolumeHealthResponse> {
        self.health_served("ControllerListVolumeHealth")?;
        let volumes = self.store.volumes()?;
        let ids: Vec<String> = volumes.iter().map(|v| v.id.clone()).collect();
        let (page, next_token) = requests::page(&ids, r.max_entries, &r.starting_token)?;
        let entries = volumes
            .iter()
            .filter(|v| page.contains(&v.id))
            .map(|v| condition::health(&v.id, &condition::of_volume(v)))
            .filter(|h| !h.health_statuses.is_empty())
            .collect();
        Ok(proto::ControllerListVolumeHealthResponse {
            entries,
            next_token,
        })
    }

    fn known(&self, id: &str) -> DriverResult<VolumeRecord> {
        self.store
            .volume(id)?
            .ok_or_else(|| DriverError::NotFound(format!("volume {id} does not exist")))
    }

    fn controller_capabilities(&self) -> Vec<Capability> {
        let mut out = vec![
            Capability::CreateDeleteVolume,
            Capability::ListVolumes,
            Capability::GetVolume,
            Capability::VolumeCondition,
        ];
        if self.config.volume_health {
            out.extend([Capability::GetVolumeHealth, Capability::ListVolumeHealth]);
        }
        out
    }
}

/// CreateVolume of a name that exists: the same volume when the request is
/// compatible with it, ALREADY_EXISTS otherwise.
fn same_volume(
    existing: VolumeRecord,
    name: &str,
    r: &proto::CreateVolumeRequest,
    parameters: &Parameters,
) -> DriverResult<proto::Volume> {
    let size = existing.backing.size;
    if !requests::size_fits(size, r.capacity_range.as_ref()) {
        return Err(DriverError::AlreadyExists(format!(
            "volume {name} exists with {size} bytes, outside the capacity_range asked for"
        )));
    }
    let same_stretch = match &parameters.stretch {
        None => existing.own_file,
        Some((file, offset)) => {
            !existing.own_file
                && *offset == existing.backing.offset
                && file.canonicalize().ok().as_deref() == Some(existing.backing.file.as_path())
        }
    };
    if !same_stretch
        || parameters.mkfs_options != existing.backing.mkfs_options
        || parameters.fs_options != existing.backing.fs_options
    {
        return Err(DriverError::AlreadyExists(format!(
            "volume {name} exists with other parameters: {:?}",
            existing.backing.to_context()
        )));
    }
    Ok(volume(&existing))
}

/// A new sparse file of `size` bytes (no data is written: a volume's
/// blocks are allocated as they are written).
fn make_file(path: &std::path::Path, size: u64) -> DriverResult<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(DriverError::io(format!("creating {}", path.display())))?;
    file.set_len(size).map_err(DriverError::io(format!(
        "sizing {} to {size} bytes",
        path.display()
    )))
}

fn volume(record: &VolumeRecord) -> proto::Volume {
    proto::Volume {
        capacity_bytes: i64::try_from(record.backing.size).unwrap_or(i64::MAX),
        volume_id: record.id.clone(),
        volume_context: record.backing.to_context(),
    }
}

fn capability(c: Capability) -> proto::ControllerServiceCapability {
    use proto::controller_service_capability::{Rpc, Type};
    proto::ControllerServiceCapability {
        r#type: Some(Type::Rpc(Rpc { r#type: c as i32 })),
    }
}

#[tonic::async_trait]
impl Controller for Service {
    async fn create_volume(
        &self,
        request: Request<proto::CreateVolumeRequest>,
    ) -> Result<Response<proto::CreateVolumeResponse>, Status> {
        let r = request.into_inner();
        let name = r.name.clone();
        logged(
            "CreateVolume",
            &name,
            self.blocking(move |d| {
                d.create_volume(r)
                    .map(|v| proto::CreateVolumeResponse { volume: Some(v) })
            }),
        )
        .await
    }

    async fn delete_volume(
        &self,
        request: Request<proto::DeleteVolumeRequest>,
    ) -> Result<Response<proto::DeleteVolumeResponse>, Status> {
        let r = request.into_inner();
        let id = r.volume_id.clone();
        logged(
            "DeleteVolume",
            &id,
            self.blocking(move |d| d.delete_volume(r).map(|()| proto::DeleteVolumeResponse {})),
        )
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<proto::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<proto::ValidateVolumeCapabilitiesResponse>, Status> {
        let r = request.into_inner();
        let id = r.volume_id.clone();
        logged(
            "ValidateVolumeCapabilities",
            &id,
            self.blocking(move |d| d.validate(r)),
        )
        .await
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<proto::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<proto::ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = self
            .0
            .controller_capabilities()
            .into_iter()
            .map(capability)
            .collect();
        logged("ControllerGetCapabilities", "", async move {
            Ok(proto::ControllerGetCapabilitiesResponse { capabilities })
        })
        .await
    }

    async fn list_volumes(
        &self,
        request: Request<proto::ListVolumesRequest>,
    ) -> Result<Response<proto::ListVolumesResponse>, Status> {
        let r = request.into_inner();
        logged("ListVolumes", "", self.blocking(move |d| d.list_volumes(r))).await
    }

    async fn controller_get_volume(
        &self,
        request: Request<proto::ControllerGetVolumeRequest>,
    ) -> Result<Response<proto::ControllerGetVolumeResponse>, Status> {
        let id = request.into_inner().volume_id;
        let asked = id.clone();
        logged(
            "ControllerGetVolume",
            &id,
            self.blocking(move |d| d.get_volume(&asked)),
        )
        .await
    }

    async fn controller_list_volume_health(
        &self,
        request: Request<proto::ControllerListVolumeHealthRequest>,
    ) -> Result<Response<proto::ControllerListVolumeHealthResponse>, Status> {
        let r = request.into_inner();
        logged(
            "ControllerListVolumeHealth",
            "",
            self.blocking(move |d| d.list_health(r)),
        )
        .await
    }

    async fn controller_get_volume_health(
        &self,
        request: Request<proto::ControllerGetVolumeHealthRequest>,
    ) -> Result<Response<proto::ControllerGetVolumeHealthResponse>, Status> {
        let id = request.into_inner().volume_id;
        let asked = id.clone();
        logged(
            "ControllerGetVolumeHealth",
            &id,
            self.blocking(move |d| {
                d.controller_volume_health(&asked).map(|h| {
                    proto::ControllerGetVolumeHealthResponse {
                        volume_health: Some(h),
                    }
                })
            }),
        )
        .await
    }
}
