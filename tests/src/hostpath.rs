//! The real csi-driver-host-path and its node-driver-registrar (built from
//! upstream's source: `shared/csi/README.md`): where their binaries are, and
//! CSI CreateVolume on the driver's socket, which is how volumes come to
//! exist without an external-provisioner (the controller tests, and the
//! static PVs of `cargo xtask cluster`).
//!
//! The binaries are in `$HEALTH_CSI_ASSETS`, else in `shared/csi/bin/`
//! beside the checkout or in a directory above it (where `cargo xtask test`
//! finds the API server's binaries).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Endpoint, Uri};

pub const ASSETS_ENV: &str = "HEALTH_CSI_ASSETS";
/// The name the driver registers under (its `--drivername` default).
pub const DRIVER: &str = "hostpath.csi.k8s.io";
/// The driver: controller, node and identity services on one socket.
pub const PLUGIN: &str = "hostpathplugin";
/// Registers a driver's socket with the kubelet (`plugins_registry/`).
pub const REGISTRAR: &str = "csi-node-driver-registrar";

/// Where the driver's binary is; `Err` says where it was looked for.
pub fn binary() -> Result<PathBuf, String> {
    asset(PLUGIN)
}

/// Where the CSI program `name` is; `Err` says where it was looked for.
pub fn asset(name: &str) -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(ASSETS_ENV) {
        let path = Path::new(&dir).join(name);
        return match path.is_file() {
            true => Ok(path),
            false => Err(format!("{ASSETS_ENV}={} has no {name}", path.display())),
        };
    }
    let root = crate::manifests::repo_root();
    root.ancestors()
        .map(|d| d.join("shared/csi/bin").join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "no {name}: {ASSETS_ENV} is unset and no shared/csi/bin/{name} is beside {} or above it",
                root.display()
            )
        })
}

/// How a volume is consumed: a filesystem the driver mounts, or a raw
/// block device (csi-driver-host-path backs it with a loop device over a
/// file in its state dir).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Mount,
    Block,
}

/// What CreateVolume answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedVolume {
    /// The volume handle of a PV.
    pub id: String,
    pub capacity_bytes: i64,
    /// `volume_context`: a PV's `volumeAttributes`.
    pub context: BTreeMap<String, String>,
    /// `accessible_topology`: each entry's segments (topology key -> value).
    pub topology: Vec<BTreeMap<String, String>>,
}

/// CSI CreateVolume `name` of `bytes` with one SINGLE_NODE_WRITER
/// capability of `access`, on the driver listening on `socket`. The driver
/// answers the same volume again for the same name and size.
pub async fn create_volume(
    socket: &Path,
    name: &str,
    bytes: i64,
    access: Access,
) -> Result<CreatedVolume> {
    let path = socket.to_path_buf();
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .with_context(|| format!("connecting to the CSI driver at {}", socket.display()))?;
    let (block, mount) = match access {
        Access::Mount => (None, Some(wire::MountVolume {})),
        Access::Block => (Some(wire::BlockVolume {}), None),
    };
    let request = wire::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(wire::CapacityRange {
            required_bytes: bytes,
        }),
        volume_capabilities: vec![wire::VolumeCapability {
            block,
            mount,
            access_mode: Some(wire::AccessMode {
                mode: wire::SINGLE_NODE_WRITER,
            }),
        }],
    };
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.context("the driver's channel")?;
    let answer: tonic::Response<wire::CreateVolumeResponse> = grpc
        .unary(
            tonic::Request::new(request),
            http::uri::PathAndQuery::from_static("/csi.v1.Controller/CreateVolume"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .with_context(|| format!("CreateVolume {name}"))?;
    match answer.into_inner().volume {
        Some(v) if !v.volume_id.is_empty() => Ok(CreatedVolume {
            id: v.volume_id,
            capacity_bytes: v.capacity_bytes,
            context: v.volume_context.into_iter().collect(),
            topology: v
                .accessible_topology
                .into_iter()
                .map(|t| t.segments.into_iter().collect())
                .collect(),
        }),
        other => bail!("CreateVolume {name} answered without a volume: {other:?}"),
    }
}

/// The messages of CSI's CreateVolume sent and read here, with the spec's
/// field numbers (container-storage-interface/spec `csi.proto`, as vendored
/// by csi-driver-host-path v1.18.0); fields left out are empty on the wire
/// or skipped when read.
mod wire {
    use std::collections::HashMap;

    /// `VolumeCapability.AccessMode.Mode.SINGLE_NODE_WRITER`.
    pub const SINGLE_NODE_WRITER: i32 = 1;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateVolumeRequest {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub capacity_range: Option<CapacityRange>,
        #[prost(message, repeated, tag = "3")]
        pub volume_capabilities: Vec<VolumeCapability>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CapacityRange {
        #[prost(int64, tag = "1")]
        pub required_bytes: i64,
    }

    /// `access_type` is a oneof of `block` (1) and `mount` (2): exactly one
    /// of the two is set.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct VolumeCapability {
        #[prost(message, optional, tag = "1")]
        pub block: Option<BlockVolume>,
        #[prost(message, optional, tag = "2")]
        pub mount: Option<MountVolume>,
        #[prost(message, optional, tag = "3")]
        pub access_mode: Option<AccessMode>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct BlockVolume {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MountVolume {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AccessMode {
        #[prost(int32, tag = "1")]
        pub mode: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateVolumeResponse {
        #[prost(message, optional, tag = "1")]
        pub volume: Option<Volume>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Volume {
        #[prost(int64, tag = "1")]
        pub capacity_bytes: i64,
        #[prost(string, tag = "2")]
        pub volume_id: String,
        #[prost(map = "string, string", tag = "3")]
        pub volume_context: HashMap<String, String>,
        #[prost(message, repeated, tag = "5")]
        pub accessible_topology: Vec<Topology>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Topology {
        #[prost(map = "string, string", tag = "1")]
        pub segments: HashMap<String, String>,
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::wire;

    /// The block and mount capabilities are the oneof's fields 1 and 2, as
    /// csi.proto numbers them: `0a 00` is field 1 (length 0), `12 00` field 2.
    #[test]
    fn capability_oneof_is_encoded_with_the_spec_numbers() {
        let block = wire::VolumeCapability {
            block: Some(wire::BlockVolume {}),
            mount: None,
            access_mode: Some(wire::AccessMode { mode: 1 }),
        };
        assert_eq!(
            block.encode_to_vec(),
            vec![0x0a, 0x00, 0x1a, 0x02, 0x08, 0x01]
        );
        let mount = wire::VolumeCapability {
            block: None,
            mount: Some(wire::MountVolume {}),
            access_mode: None,
        };
        assert_eq!(mount.encode_to_vec(), vec![0x12, 0x00]);
    }
}
