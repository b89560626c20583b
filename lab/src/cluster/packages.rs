//! The Debian packages the cluster runs on, installed when missing (as
//! `cargo xtask build` installs its toolchain: apt-get, saying what it
//! installs).

/// containerd and runc run the containers; the CNI plugins (bridge,
/// host-local, loopback in /usr/lib/cni) give pods their network;
/// busybox-static is the test image's only binary; gcc and libc6-dev build
/// the static pause binary; iproute2, iptables and openssl set up the
/// node's network and certificates. etcd and Kubernetes itself are the
/// project's builds from Go modules (xtask::components).
pub(super) const PACKAGES: &[&str] = &[
    "containerd",
    "runc",
    "containernetworking-plugins",
    "busybox-static",
    "gcc",
    "libc6-dev",
    "iproute2",
    "iptables",
    "openssl",
];

pub(super) fn ensure() -> anyhow::Result<()> {
    xtask::bootstrap::ensure_packages(PACKAGES)
}
