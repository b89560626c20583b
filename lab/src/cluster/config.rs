//! Every file the daemons read: containerd's config.toml, the CNI network,
//! the kubelet's KubeletConfiguration and the kubeconfigs. The rendering is
//! pure (tested below); [`write_all`] puts the files in the state directory.
//!
//! The settings are those measured on this machine kind
//! (../shared/notes/real-cluster.md): containerd with its own root, state
//! and socket, no OOM score below its own (no CAP_SYS_RESOURCE here), no
//! AppArmor, cgroupfs; the kubelet on cgroupfs with its eviction and image
//! GC thresholds lowered for a small disk and no iptables chains of its own.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::assets::Assets;
use super::network::{containerd_socket, Network, BRIDGE, NETWORK_NAME, POD_CIDR};
use super::{images, pki, State, KUBELET_HEALTHZ_PORT, KUBELET_PORT};

pub(super) fn containerd_config(state: &State) -> PathBuf {
    state.path("containerd/config.toml")
}

pub(super) fn kubelet_config(state: &State) -> PathBuf {
    state.path("kubelet/config.yaml")
}

pub(super) fn kubelet_kubeconfig(state: &State) -> PathBuf {
    state.path("kubelet/kubeconfig")
}

pub(super) fn write_all(state: &State, net: &Network, _assets: &Assets) -> anyhow::Result<()> {
    let tokens = pki::Tokens::read(state)?;
    let ca = pki::ca_cert(state);
    write(
        &containerd_config(state),
        &render_containerd(&state.dir, images::PAUSE_IMAGE),
    )?;
    write(
        &state.path("cni/net.d/10-volume-health.conflist"),
        &render_cni(&state.path("cni/ipam")),
    )?;
    write(
        &state.kubeconfig(),
        &render_kubeconfig(&net.apiserver_url(), &ca, "admin", &tokens.admin),
    )?;
    write(
        &kubelet_kubeconfig(state),
        &render_kubeconfig(
            &net.apiserver_url(),
            &ca,
            &format!("system:node:{}", state.node_name()),
            &tokens.node,
        ),
    )?;
    write(
        &kubelet_config(state),
        &render_kubelet(
            net.node_ip,
            &ca,
            &state.path("kubelet/volume-plugins"),
            &containerd_socket(state),
        ),
    )?;
    std::fs::create_dir_all(state.path("kubelet/volume-plugins"))?;
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// containerd's config.toml (version 2) for a state directory `dir`.
pub(super) fn render_containerd(dir: &Path, sandbox_image: &str) -> String {
    let d = dir.display();
    format!(
        r#"# Written by `cargo xtask cluster up`; everything of this containerd lives under {d}.
version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"

[grpc]
  address = "{d}/containerd/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  # This machine kind has no CAP_SYS_RESOURCE: no OOM score below containerd's own.
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/containerd/runc"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni/net.d"
"#
    )
}

/// The pods' network: a bridge with host-local addresses (kept under
/// `ipam_dir`), no masquerading (pods need no way out; the API server is on
/// this host). containerd adds the loopback plugin itself.
pub(super) fn render_cni(ipam_dir: &Path) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "cniVersion": "0.4.0",
        "name": NETWORK_NAME,
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": POD_CIDR}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": ipam_dir,
            },
        }],
    }))
    .expect("a JSON value serializes")
        + "\n"
}

/// A kubeconfig with a bearer token, trusting the cluster's CA.
pub(super) fn render_kubeconfig(server: &str, ca: &Path, user: &str, token: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Config
clusters:
- name: volume-health
  cluster:
    server: "{server}"
    certificate-authority: "{ca}"
users:
- name: "{user}"
  user:
    token: "{token}"
contexts:
- name: volume-health
  context:
    cluster: volume-health
    user: "{user}"
    namespace: default
current-context: volume-health
"#,
        ca = ca.display()
    )
}

/// The KubeletConfiguration (see the module's comment for why each setting).
pub(super) fn render_kubelet(
    node_ip: Ipv4Addr,
    client_ca: &Path,
    plugin_dir: &Path,
    runtime_socket: &Path,
) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: "unix://{runtime}"
# This machine kind mounts cgroup v1; from 1.35 the kubelet refuses it unless told.
failCgroupV1: false
# How often the kubelet asks the CSI drivers for volume and storage health
# (CSIVolumeHealth) and volume statistics: the default minute, shortened so
# that the end-to-end suite sees a condition come and go within seconds.
volumeStatsAggPeriod: "{VOLUME_STATS_PERIOD}"
address: "{node_ip}"
port: {KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: "127.0.0.1"
healthzPort: {KUBELET_HEALTHZ_PORT}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: "{ca}"
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
failSwapOn: false
makeIPTablesUtilChains: false
oomScoreAdj: 0
volumePluginDir: "{plugins}"
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
"#,
        ca = client_ca.display(),
        plugins = plugin_dir.display(),
        runtime = runtime_socket.display(),
    )
}

/// The kubelet's `volumeStatsAggPeriod`.
pub(super) const VOLUME_STATS_PERIOD: &str = "5s";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_keeps_everything_under_the_state_dir() {
        let text = render_containerd(Path::new("/s"), "registry.k8s.io/pause:3.9");
        for line in [
            "version = 2",
            "root = \"/s/containerd/root\"",
            "state = \"/s/containerd/state\"",
            "  address = \"/s/containerd/containerd.sock\"",
            "  path = \"/s/containerd/opt\"",
            "  sandbox_image = \"registry.k8s.io/pause:3.9\"",
            "  restrict_oom_score_adj = true",
            "  disable_apparmor = true",
            "  netns_mounts_under_state_dir = true",
            "    snapshotter = \"overlayfs\"",
            "        SystemdCgroup = false",
            "        Root = \"/s/containerd/runc\"",
            "    bin_dir = \"/usr/lib/cni\"",
            "    conf_dir = \"/s/cni/net.d\"",
        ] {
            assert_eq!(
                text.lines().filter(|l| *l == line).count(),
                1,
                "{line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn the_cni_network_is_a_bridge_without_masquerading() {
        let v: serde_json::Value =
            serde_json::from_str(&render_cni(Path::new("/s/cni/ipam"))).unwrap();
        assert_eq!(v["name"], NETWORK_NAME);
        let plugins = v["plugins"].as_array().unwrap();
        assert_eq!(plugins.len(), 1);
        assert_eq!(plugins[0]["type"], "bridge");
        assert_eq!(plugins[0]["bridge"], "cni0");
        assert_eq!(plugins[0]["ipMasq"], false);
        assert_eq!(plugins[0]["ipam"]["type"], "host-local");
        assert_eq!(plugins[0]["ipam"]["dataDir"], "/s/cni/ipam");
        assert_eq!(
            plugins[0]["ipam"]["ranges"][0][0]["subnet"],
            "10.244.0.0/24"
        );
    }

    #[test]
    fn the_kubelet_config_has_the_measured_settings() {
        let text = render_kubelet(
            Ipv4Addr::new(192, 0, 2, 2),
            Path::new("/s/pki/ca.crt"),
            Path::new("/s/kubelet/volume-plugins"),
            Path::new("/s/containerd/containerd.sock"),
        );
        for line in [
            "containerRuntimeEndpoint: \"unix:///s/containerd/containerd.sock\"",
            "failCgroupV1: false",
            "volumeStatsAggPeriod: \"5s\"",
            "address: \"192.0.2.2\"",
            "port: 10250",
            "readOnlyPort: 0",
            "healthzPort: 10248",
            "    clientCAFile: \"/s/pki/ca.crt\"",
            "  mode: Webhook",
            "cgroupDriver: cgroupfs",
            "failSwapOn: false",
            "makeIPTablesUtilChains: false",
            "volumePluginDir: \"/s/kubelet/volume-plugins\"",
            "  nodefs.available: \"1%\"",
        ] {
            assert_eq!(
                text.lines().filter(|l| *l == line).count(),
                1,
                "{line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn kubeconfigs_carry_the_token_and_the_ca() {
        let text = render_kubeconfig(
            "https://127.0.0.1:6443",
            Path::new("/s/pki/ca.crt"),
            "system:node:vm",
            "abc",
        );
        assert!(text.contains("    server: \"https://127.0.0.1:6443\"\n"));
        assert!(text.contains("    certificate-authority: \"/s/pki/ca.crt\"\n"));
        assert!(text.contains("- name: \"system:node:vm\"\n  user:\n    token: \"abc\"\n"));
        assert!(text.contains("current-context: volume-health\n"));
    }
}
