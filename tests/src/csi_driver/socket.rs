//! Where the driver listens: `--endpoint` as CSI drivers take it
//! (`unix:///path`, or a bare path), and binding a unix socket there.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use tokio::net::UnixListener;

/// The socket path of an endpoint: `unix:///abs/path`, `unix:/abs/path`,
/// `unix://rel/path` or a bare path; any other scheme is refused (this
/// driver serves unix sockets only).
pub fn endpoint_path(endpoint: &str) -> anyhow::Result<PathBuf> {
    let path = match endpoint.split_once("://") {
        Some(("unix", rest)) => rest,
        Some((scheme, _)) => {
            bail!("endpoint {endpoint:?}: scheme {scheme:?} is not served, only unix sockets (unix:///path)")
        }
        None => endpoint.strip_prefix("unix:").unwrap_or(endpoint),
    };
    if path.is_empty() {
        bail!("endpoint {endpoint:?} names no socket path");
    }
    Ok(PathBuf::from(path))
}

/// A listener on `socket`: its directory made when missing, a stale socket
/// of an earlier run replaced; any other file there is an error, never
/// removed.
pub fn bind(socket: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(socket)
            .with_context(|| format!("removing the stale socket {}", socket.display()))?,
        Ok(_) => bail!(
            "{} exists and is not a socket: not removing it to listen there",
            socket.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("stat {}", socket.display())),
    }
    UnixListener::bind(socket).with_context(|| format!("listening on {}", socket.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_urls_or_paths() {
        let p = |e: &str| endpoint_path(e).unwrap();
        assert_eq!(p("unix:///run/csi.sock"), PathBuf::from("/run/csi.sock"));
        assert_eq!(p("unix:/run/csi.sock"), PathBuf::from("/run/csi.sock"));
        assert_eq!(p("unix://csi.sock"), PathBuf::from("csi.sock"));
        assert_eq!(p("/run/csi.sock"), PathBuf::from("/run/csi.sock"));
        assert_eq!(
            endpoint_path("tcp://127.0.0.1:10000").unwrap_err().to_string(),
            "endpoint \"tcp://127.0.0.1:10000\": scheme \"tcp\" is not served, only unix sockets (unix:///path)"
        );
        assert_eq!(
            endpoint_path("unix://").unwrap_err().to_string(),
            "endpoint \"unix://\" names no socket path"
        );
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_plain_file_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sub/csi.sock");
        drop(bind(&socket).unwrap());
        assert!(socket.exists());
        drop(bind(&socket).unwrap());
        let file = dir.path().join("file");
        std::fs::write(&file, b"keep").unwrap();
        assert_eq!(
            bind(&file).unwrap_err().to_string(),
            format!(
                "{} exists and is not a socket: not removing it to listen there",
                file.display()
            )
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    }
}
