//! What a call of the driver can fail with, and the gRPC status each
//! becomes; and [`logged`], the one place every call is logged.

use std::future::Future;

use tonic::{Code, Response, Status};

/// A failed call. The variants named for a gRPC code are the spec's
/// answers to a request (a missing field, an unknown volume...); the others
/// are the host failing under the driver and answer INTERNAL.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    Unimplemented(String),
    /// Loop devices and mounts need root; said before trying.
    #[error("{what} needs root (loop devices and mounts), and the driver runs as uid {uid}")]
    NotRoot { what: &'static str, uid: u32 },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Sys {
        what: String,
        #[source]
        source: nix::errno::Errno,
    },
    /// A failure the harness's helpers (mkfs, mount, sysfs) reported, with
    /// their whole chain of causes.
    #[error("{what}: {detail}")]
    Host { what: String, detail: String },
    #[error("the driver's records: {0}")]
    Record(String),
}

impl DriverError {
    pub fn code(&self) -> Code {
        match self {
            DriverError::InvalidArgument(_) => Code::InvalidArgument,
            DriverError::NotFound(_) => Code::NotFound,
            DriverError::AlreadyExists(_) => Code::AlreadyExists,
            DriverError::FailedPrecondition(_) | DriverError::NotRoot { .. } => {
                Code::FailedPrecondition
            }
            DriverError::OutOfRange(_) => Code::OutOfRange,
            DriverError::Aborted(_) => Code::Aborted,
            DriverError::ResourceExhausted(_) => Code::ResourceExhausted,
            DriverError::Unimplemented(_) => Code::Unimplemented,
            DriverError::Io { .. }
            | DriverError::Sys { .. }
            | DriverError::Host { .. }
            | DriverError::Record(_) => Code::Internal,
        }
    }

    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DriverError {
        let what = what.into();
        move |source| DriverError::Io { what, source }
    }

    pub fn sys(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> DriverError {
        let what = what.into();
        move |source| DriverError::Sys { what, source }
    }

    pub fn host(what: impl Into<String>) -> impl FnOnce(anyhow::Error) -> DriverError {
        let what = what.into();
        move |error| DriverError::Host {
            what,
            detail: format!("{error:#}"),
        }
    }
}

impl From<DriverError> for Status {
    fn from(e: DriverError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

pub type DriverResult<T> = Result<T, DriverError>;

/// Fails unless the driver runs as root: `what` (a call) attaches loop
/// devices or mounts.
pub fn require_root(what: &'static str) -> DriverResult<()> {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        Ok(())
    } else {
        Err(DriverError::NotRoot {
            what,
            uid: uid.as_raw(),
        })
    }
}

/// The marker of the log line each call ends with: tests count calls by it
/// (as they counted a Go driver's `-v=5` lines), through [`calls_in_log`].
pub const CALL_MARKER: &str = "csi call";

/// Runs one call and logs it on one line, `csi call method=<Rpc>
/// volume_id=<id> status=<code>` (and the error's text when it failed).
pub async fn logged<T>(
    method: &'static str,
    volume_id: &str,
    work: impl Future<Output = DriverResult<T>>,
) -> Result<Response<T>, Status> {
    match work.await {
        Ok(answer) => {
            tracing::info!(%method, %volume_id, status = %"OK", "{CALL_MARKER}");
            Ok(Response::new(answer))
        }
        Err(e) => {
            let status = format!("{:?}", e.code());
            tracing::warn!(%method, %volume_id, %status, error = %e, "{CALL_MARKER}");
            Err(e.into())
        }
    }
}

/// How many calls of `method` (`ListVolumes`) a log written by [`logged`]
/// holds.
pub fn calls_in_log(log: &str, method: &str) -> usize {
    let field = format!(" method={method} ");
    log.lines()
        .filter(|l| l.contains(CALL_MARKER) && l.contains(&field))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_answers_its_code_with_its_text() {
        let status = Status::from(DriverError::NotFound("volume v is unknown".into()));
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(status.message(), "volume v is unknown");
        let status = Status::from(DriverError::NotRoot {
            what: "NodeStageVolume",
            uid: 1000,
        });
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(
            status.message(),
            "NodeStageVolume needs root (loop devices and mounts), and the driver runs as uid 1000"
        );
        let status = Status::from(DriverError::host("mounting /dev/loop3")(
            anyhow::anyhow!("wrong fs type").context("mount failed"),
        ));
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(
            status.message(),
            "mounting /dev/loop3: mount failed: wrong fs type"
        );
    }

    #[test]
    fn calls_are_counted_by_method_from_the_log_lines() {
        let log = "\
2026-01-01T00:00:00Z  INFO csi_loop_driver: csi call method=ListVolumes volume_id= status=OK
2026-01-01T00:00:01Z  INFO csi_loop_driver: csi call method=ListVolumesX volume_id= status=OK
2026-01-01T00:00:02Z  WARN csi_loop_driver: csi call method=ListVolumes volume_id= status=Aborted error=bad token
2026-01-01T00:00:03Z  INFO csi_loop_driver: serving method=ListVolumes \n";
        assert_eq!(calls_in_log(log, "ListVolumes"), 2);
        assert_eq!(calls_in_log(log, "ListVolumesX"), 1);
        assert_eq!(calls_in_log(log, "CreateVolume"), 0);
    }
}
