//! Where the cluster's parts are reached: the node's address, the pod and
//! Service ranges, the CNI bridge and network name, and containerd's socket.
//!
//! These are facts, not files: pki puts the addresses in the API server's
//! certificate, images reach containerd on its socket, config writes them
//! into the daemons' files, and host, preflight and teardown look for what
//! they name. They sit below all of those so that each can read them without
//! reaching into another's module.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use anyhow::Context;

use super::{State, APISERVER_PORT};

/// The CNI bridge (the host's side of every pod's veth).
pub(super) const BRIDGE: &str = "cni0";
/// The CNI network's name (containerd's and libcni's cache files carry it).
pub(super) const NETWORK_NAME: &str = "volume-health-cluster";
/// Pod addresses (host-local IPAM on the bridge).
pub(super) const POD_CIDR: &str = "10.244.0.0/24";
/// Service addresses; the first is the `kubernetes` Service's.
pub(super) const SERVICE_CIDR: &str = "10.96.0.0/12";
pub(super) const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);

/// The node's addresses.
pub(super) struct Network {
    /// The host's primary IPv4 address (the kubelet refuses a loopback
    /// node IP): the source address of its default route.
    pub node_ip: Ipv4Addr,
}

impl Network {
    pub(super) fn detect() -> anyhow::Result<Network> {
        // A UDP "connect" sends nothing; it only picks the route and so
        // the source address.
        let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
        let node_ip = socket
            .connect("192.0.2.254:9")
            .and_then(|()| socket.local_addr())
            .ok()
            .and_then(|a| match a.ip() {
                std::net::IpAddr::V4(ip) if !ip.is_loopback() && !ip.is_unspecified() => Some(ip),
                _ => None,
            })
            .context(
                "this host has no IPv4 route with a non-loopback source address; the kubelet \
                 needs one as its node IP",
            )?;
        Ok(Network { node_ip })
    }

    /// The URL the kubeconfigs use.
    pub(super) fn apiserver_url(&self) -> String {
        format!("https://127.0.0.1:{APISERVER_PORT}")
    }
}

pub(super) fn containerd_socket(state: &State) -> PathBuf {
    state.path("containerd/containerd.sock")
}
