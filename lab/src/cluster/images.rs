//! The images the cluster runs, built here and imported into containerd
//! (no registry is reachable, nothing is pulled): the pause image (a tiny
//! static C program, containerd's `sandbox_image`), a busybox image for
//! test pods (Debian's busybox-static and a link per applet) and the
//! agent's (`cargo xtask image`, under the chart's default name). All three
//! are OCI archives written by xtask's image writer.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use xtask::image::oci::{self, ImageConfig, ImageNames, Platform};
use xtask::image::rootfs::{Entry, Rootfs};
use xtask::util::{output, run as run_cmd, say};

use super::{network, State};

/// containerd's sandbox image (the name the kubelet protects from GC).
pub(super) const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.9";
/// The test pods' image.
pub(super) const BUSYBOX_IMAGE: &str = "volume-health-test/busybox:1";
/// The agent's image under the chart's default repository and tag.
pub(super) const AGENT_IMAGE: &str = concat!("volume-health-agent:", env!("CARGO_PKG_VERSION"));
/// Debian busybox-static's binary.
const BUSYBOX_BIN: &str = "/bin/busybox";

/// The written archives.
pub(super) struct Built {
    archives: Vec<PathBuf>,
}

/// Builds what is missing; the agent's image is built every time (cargo
/// decides whether anything changed) unless `agent_archive` is given.
pub(super) fn build(state: &State, agent_archive: Option<&Path>) -> anyhow::Result<Built> {
    let dir = state.path("images");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let pause = dir.join("pause.oci.tar");
    if !pause.exists() {
        say("building the pause image (gcc -static)");
        build_pause(&dir, &pause)?;
    }
    let busybox = dir.join("busybox.oci.tar");
    if !busybox.exists() {
        say(format!("building the busybox image from {BUSYBOX_BIN}"));
        build_busybox(&busybox)?;
    }
    let agent = match agent_archive {
        Some(archive) => {
            say(format!("the agent's image: {} as it is", archive.display()));
            archive.to_path_buf()
        }
        None => {
            say(format!(
                "building the agent's image {AGENT_IMAGE} (cargo xtask image)"
            ));
            let (repository, tag) = AGENT_IMAGE.split_once(':').expect("a tag");
            // The node's architecture only: the cluster is this machine.
            // The other's cross build is `cargo xtask image`'s and the
            // image test's.
            let host = xtask::cross::host()?;
            xtask::image::build(&xtask::image::ImageArgs {
                repository: Some(repository.into()),
                tag: Some(tag.into()),
                platforms: vec![host.name.to_string()],
                ..Default::default()
            })
            .context("building the agent's image")?
            .path
        }
    };
    Ok(Built {
        archives: vec![pause, busybox, agent],
    })
}

/// `ctr images import` of every archive into containerd's `k8s.io`
/// namespace (the CRI plugin's); an image of the same name is replaced.
pub(super) fn import(state: &State, built: &Built) -> anyhow::Result<()> {
    for archive in &built.archives {
        import_archive(state, archive)?;
    }
    Ok(())
}

/// One OCI archive into containerd, under the name in its index.
pub(super) fn import_archive(state: &State, archive: &Path) -> anyhow::Result<()> {
    run_cmd(ctr(state).args(["images", "import"]).arg(archive))
        .with_context(|| format!("importing {}", archive.display()))
}

/// `ctr` on this cluster's containerd, in the CRI plugin's namespace.
pub(super) fn ctr(state: &State) -> Command {
    let mut cmd = Command::new("ctr");
    cmd.arg("--address")
        .arg(network::containerd_socket(state))
        .args(["--namespace", "k8s.io"]);
    cmd
}

/// Blocks in pause(2) as a pod's first process; exits on SIGINT/SIGTERM
/// and reaps children it inherits (it is pid 1 of the pod's namespace).
const PAUSE_C: &str = r#"#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, 0, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = quit;
    sigaction(SIGINT, &sa, 0);
    sigaction(SIGTERM, &sa, 0);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, 0);
    for (;;)
        pause();
}
"#;

fn build_pause(dir: &Path, out: &Path) -> anyhow::Result<()> {
    let source = dir.join("pause.c");
    let binary = dir.join("pause");
    std::fs::write(&source, PAUSE_C)?;
    output(
        Command::new("gcc")
            .args(["-static", "-O2", "-s", "-o"])
            .arg(&binary)
            .arg(&source),
    )
    .context("compiling the pause binary (gcc and libc6-dev)")?;
    let mut fs = Rootfs::default();
    fs.add(
        "pause",
        Entry::File {
            data: std::fs::read(&binary)?,
            executable: true,
        },
    )?;
    write(fs, PAUSE_IMAGE, vec!["/pause".into()], Vec::new(), out)
}

fn build_busybox(out: &Path) -> anyhow::Result<()> {
    let data = std::fs::read(BUSYBOX_BIN)
        .with_context(|| format!("reading {BUSYBOX_BIN} (Debian's busybox-static)"))?;
    let applets = output(Command::new(BUSYBOX_BIN).arg("--list"))?;
    let mut fs = Rootfs::default();
    fs.add(
        "bin/busybox",
        Entry::File {
            data,
            executable: true,
        },
    )?;
    for applet in applets.lines().map(str::trim) {
        if !applet.is_empty() && applet != "busybox" && !applet.contains('/') {
            fs.add(&format!("bin/{applet}"), Entry::Symlink("busybox".into()))?;
        }
    }
    for dir in ["tmp", "etc", "root", "var"] {
        fs.add(dir, Entry::Dir)?;
    }
    write(fs, BUSYBOX_IMAGE, Vec::new(), vec!["sh".into()], out)
}

fn write(
    fs: Rootfs,
    name: &str,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    out: &Path,
) -> anyhow::Result<()> {
    let config = ImageConfig {
        architecture: xtask::cross::host()?.name.into(),
        entrypoint,
        cmd,
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        labels: Default::default(),
        created: "1970-01-01T00:00:00Z".into(),
    };
    let names = ImageNames {
        full: full_name(name),
        tag: name.rsplit_once(':').map_or("latest", |(_, t)| t).into(),
    };
    let platform = Platform { rootfs: fs, config };
    oci::write_archive(&[platform], &names, 0, out)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// The reference as containerd stores it (Docker Hub's normalization).
pub(super) fn full_name(name: &str) -> String {
    let first = name.split('/').next().unwrap_or_default();
    match name.contains('/') {
        true if first.contains('.') || first.contains(':') || first == "localhost" => name.into(),
        true => format!("docker.io/{name}"),
        false => format!("docker.io/library/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stored_as_containerd_stores_them() {
        assert_eq!(full_name(PAUSE_IMAGE), "registry.k8s.io/pause:3.9");
        assert_eq!(
            full_name(BUSYBOX_IMAGE),
            "docker.io/volume-health-test/busybox:1"
        );
        assert_eq!(
            full_name("volume-health-agent:0.1.0"),
            "docker.io/library/volume-health-agent:0.1.0"
        );
    }

    #[test]
    fn the_agent_image_is_the_charts_and_the_manifests_default() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let values =
            std::fs::read_to_string(root.join("deploy/helm/volume-health/values.yaml")).unwrap();
        let (repository, tag) = AGENT_IMAGE.split_once(':').unwrap();
        assert!(values.contains(&format!(
            "\nimage:\n  repository: {repository}\n  tag: \"{tag}\"\n"
        )));
        let daemonset = std::fs::read_to_string(root.join("deploy/daemonset.yaml")).unwrap();
        assert!(daemonset.contains(&format!("image: {AGENT_IMAGE}\n")));
    }
}
