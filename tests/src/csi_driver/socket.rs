//! Where the driver listens: `--endpoint` as CSI drivers take it
//! (`unix:///path`, or a bare path), and binding a unix socket there.

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

/// A listener on `socket`, as the agent's own sockets are made: its
/// directory made when missing, a stale socket of an earlier run replaced,
/// any other file there an error and kept, and the path there only once it
/// accepts (the kubelet dials a registration socket the moment it appears).
pub fn bind(socket: &Path) -> anyhow::Result<UnixListener> {
    health_node::conditions_socket::bind_fresh(socket)
        .with_context(|| format!("serving CSI on {}", socket.display()))
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
            format!("{:#}", bind(&file).unwrap_err()),
            format!(
                "serving CSI on {0}: {0} exists and is not a socket; not removing it",
                file.display()
            )
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    }
}
