//! `cargo xtask image`: the agent's OCI image, written without a container
//! engine, as an OCI image layout in one tar archive
//! (`target/image/volume-health-agent-<tag>.oci.tar`) that `kind load
//! image-archive`, `ctr images import`, `podman load`, `docker load` and
//! `skopeo copy oci-archive:FILE ...` accept. One image index holds linux/amd64
//! and linux/arm64 ([`oci`]); the architecture the build host is not is
//! cross-compiled ([`crate::cross`]), its libraries are Debian's packages of
//! that architecture ([`foreign`]).
//!
//! What the image holds, and why: the release agent (kernel programs
//! embedded) with its debug info stripped (`objcopy --strip-debug`: the
//! symbol table stays, so a panic's backtrace still names functions), and
//! the shared libraries it links, copied from the build host: the ELF
//! interpreter and every library `ldd` resolves (glibc's libc, libm, and
//! libgcc_s), at the same paths and through the same symlinks as on the
//! host ([`rootfs`]). Not a static binary: the toolchain here has no musl
//! target offline, and glibc linked statically would still want its own
//! shared objects for name lookups. Nothing else: no shell, no CA bundle (in
//! a cluster the API server is verified with the service account's CA, the
//! only root kube uses then), no /etc/passwd (the DaemonSet runs as uid 0 by
//! number), no /tmp (the agent writes no temporary files; the DaemonSet's
//! root filesystem is read-only). The container runtime creates the mount
//! points (/proc, /sys, /dev, /host/proc, /var/lib/kubelet) itself.
//!
//! The host architecture's libraries come from the build host, the other's
//! from Debian bookworm's packages at the host's versions, so the image runs
//! where that glibc runs: build on Debian bookworm (the README's build host). It is
//! the project's only image builder: no Dockerfile is kept in step with it.
//! Its SBOM ([`sbom`]) goes in the image and beside the archive.
//!
//! Reproducible: the same commit gives the same bytes ([`oci`] says how).
//! Every time in it is the commit's (`SOURCE_DATE_EPOCH` when set, else
//! `git log -1 --format=%ct`). The agent binary itself is the same only from
//! the same checkout path and toolchain: it carries absolute source paths
//! (the kernel object's BTF, generated code, the cargo registry).

pub mod foreign;
pub mod oci;
pub mod platform;
pub mod rootfs;
pub mod sbom;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::build;
use crate::cross::{self, Arch};
use crate::util::{output, say, workspace_root};

/// Where the agent is in the image; the entrypoint.
pub const AGENT_PATH: &str = "/usr/local/bin/health-agent";
/// Where the controller is in the image: the sidecar's command (it carries
/// no kernel programs; the image holds both binaries).
pub const CONTROLLER_PATH: &str = "/usr/local/bin/health-controller";
/// The image's `ENTRYPOINT` and `CMD`: `health-agent run`.
pub const ENTRYPOINT: &[&str] = &[AGENT_PATH];
pub const CMD: &[&str] = &["run"];
/// The repository deploy/daemonset.yaml and the chart's values name.
pub const REPOSITORY: &str = "volume-health-agent";
/// What building the image runs (command, Debian package).
const BUILD_TOOLS: &[(&str, &str)] = &[
    ("objcopy", "binutils"),
    ("readelf", "binutils"),
    ("ldd", "libc-bin"),
    ("git", "git"),
    ("dpkg-deb", "dpkg"),
    ("apt-get", "apt"),
];

#[derive(clap::Args, Default)]
pub struct ImageArgs {
    /// The archive to write [default: target/image/<repository>-<tag>.oci.tar].
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Put this agent binary in the image as it is instead of building one
    /// (it must have been built with its kernel programs embedded), for the
    /// build host's architecture; another architecture's is always built.
    #[arg(long, value_name = "FILE")]
    pub agent: Option<PathBuf>,
    /// Put this controller binary in the image as it is instead of building
    /// one, for the build host's architecture.
    #[arg(long, value_name = "FILE")]
    pub controller: Option<PathBuf>,
    /// The architectures the image holds [default: amd64,arm64; the local
    /// cluster's image: the host's only].
    #[arg(long = "platform", value_name = "ARCH", value_delimiter = ',')]
    pub platforms: Vec<String>,
    /// Image repository: the name without the tag [default: volume-health-agent, as deploy/ and the chart].
    #[arg(long)]
    pub repository: Option<String>,
    /// Image tag [default: the workspace version].
    #[arg(long)]
    pub tag: Option<String>,
    /// The `org.opencontainers.image.source` label, the URL of the source
    /// [default: the URL of the git remote `origin`, else the workspace's `repository`].
    #[arg(long, value_name = "URL")]
    pub source: Option<String>,
}

/// A written image.
pub struct Image {
    pub path: PathBuf,
    /// The reference containerd and kubelet know it by.
    pub full_name: String,
    pub written: oci::Written,
}

/// `cargo xtask image`: writes the archive and says what it holds.
pub fn run(args: &ImageArgs) -> anyhow::Result<()> {
    let image = build(args)?;
    let mut said = format!(
        "wrote {} ({} bytes)\n  name     {}\n  index    {}",
        image.path.display(),
        image.written.archive_size,
        image.full_name,
        image.written.index_digest,
    );
    for m in &image.written.manifests {
        said.push_str(&format!(
            "\n  {:<8} manifest {}\n           layer    {} ({} bytes; uncompressed {})",
            m.architecture, m.manifest_digest, m.layer_digest, m.layer_size, m.diff_id
        ));
    }
    say(said);
    Ok(())
}

pub fn build(args: &ImageArgs) -> anyhow::Result<Image> {
    crate::bootstrap::ensure_commands(BUILD_TOOLS)?;
    let architectures = architectures(&args.platforms)?;
    let commit = Commit::read(&workspace_root())?;
    let repository = args.repository.as_deref().unwrap_or(REPOSITORY);
    let version = env!("CARGO_PKG_VERSION");
    let tag = args.tag.as_deref().unwrap_or(version);
    let full_name = full_reference(repository, tag)?;
    let path = match &args.output {
        Some(path) => path.clone(),
        None => {
            let base = repository.rsplit('/').next().unwrap_or(repository);
            crate::util::target_dir()
                .join("image")
                .join(format!("{base}-{tag}.oci.tar"))
        }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let created = commit.rfc3339()?;
    // --source, else the checkout's `origin`, else the workspace's
    // `repository`: the label is always set.
    let source = args
        .source
        .clone()
        .or_else(|| origin_url(&workspace_root()))
        .unwrap_or_else(|| env!("CARGO_PKG_REPOSITORY").to_string());
    let about = platform::About {
        repository,
        version,
        created: &created,
    };

    let mut platforms = Vec::new();
    for arch in architectures {
        let (agent, controller) = binaries(arch, args)?;
        say(format!(
            "image {full_name}, {}: agent {}, controller {}",
            arch.name,
            agent.display(),
            controller.display()
        ));
        let assembled = platform::assemble(arch, &agent, &controller, &about)?;
        // What the files are made of: in the image and beside the archive.
        let bom_path = sbom_path(&path, arch.name);
        std::fs::write(&bom_path, &assembled.sbom)
            .with_context(|| format!("writing {}", bom_path.display()))?;
        platforms.push(oci::Platform {
            rootfs: assembled.rootfs,
            config: oci::ImageConfig {
                architecture: arch.name.to_string(),
                entrypoint: ENTRYPOINT.iter().map(|s| s.to_string()).collect(),
                cmd: CMD.iter().map(|s| s.to_string()).collect(),
                env: vec![
                    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                ],
                labels: labels(version, &commit.revision, &created, &source),
                created: created.clone(),
            },
        });
    }
    let names = oci::ImageNames {
        full: full_name.clone(),
        tag: tag.to_string(),
    };
    let written = oci::write_archive(&platforms, &names, commit.time, &path)?;
    Ok(Image {
        path,
        full_name,
        written,
    })
}

/// `--platform`'s architectures, each once, in the image's order; none
/// given: every one.
fn architectures(names: &[String]) -> anyhow::Result<Vec<&'static Arch>> {
    if names.is_empty() {
        return Ok(cross::ALL.to_vec());
    }
    let mut wanted = Vec::new();
    for name in names {
        wanted.push(cross::by_name(name.trim())?);
    }
    Ok(cross::ALL
        .into_iter()
        .filter(|a| wanted.contains(a))
        .collect())
}

/// The agent and the controller of `arch`: the given ones or the host's
/// release build for the host's architecture (both in one cargo run, as
/// `cargo xtask build` builds them: after it, nothing compiles again), a
/// cross build for the other.
fn binaries(arch: &Arch, args: &ImageArgs) -> anyhow::Result<(PathBuf, PathBuf)> {
    if !arch.is_host() {
        let built = cross::build(arch)?;
        let controller = built.controller.context("the cross build makes both")?;
        return Ok((built.agent, controller));
    }
    let built = match (&args.agent, &args.controller) {
        (Some(_), Some(_)) => None,
        _ => Some(build::binaries(&build::Wanted {
            controller: true,
            ..Default::default()
        })?),
    };
    let agent = match (&args.agent, &built) {
        (Some(agent), _) => agent.clone(),
        (None, built) => built.as_ref().context("built above")?.agent.clone(),
    };
    let controller = match (&args.controller, &built) {
        (Some(controller), _) => controller.clone(),
        (None, built) => built
            .as_ref()
            .and_then(|b| b.controller.clone())
            .context("built above")?,
    };
    Ok((agent, controller))
}

/// An architecture's SBOM beside the archive: `NAME.oci.tar` →
/// `NAME.ARCH.cdx.json`.
pub fn sbom_path(archive: &Path, arch: &str) -> PathBuf {
    let name = archive
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let base = name.strip_suffix(".oci.tar").unwrap_or(&name);
    archive.with_file_name(format!("{base}.{arch}.cdx.json"))
}

fn labels(version: &str, revision: &str, created: &str, source: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut set = |key: &str, value: &str| {
        labels.insert(format!("org.opencontainers.image.{key}"), value.to_string());
    };
    set("title", REPOSITORY);
    set(
        "description",
        "volume-health node agent (kernel storage errors, eBPF, reported as Events on Pods and PVCs and as Prometheus metrics) and its cluster-side controller",
    );
    set("version", version);
    set("revision", revision);
    set("created", created);
    set("licenses", env!("CARGO_PKG_LICENSE"));
    set("source", source);
    labels
}

/// The reference containerd stores for `repository:tag`, normalized the way
/// the Docker reference grammar does (and kubelet, for the manifests'
/// `image:`): a first component that is no host name means Docker Hub, and a
/// single component there means `library/`.
fn full_reference(repository: &str, tag: &str) -> anyhow::Result<String> {
    let valid_tag = !tag.is_empty()
        && tag.len() <= 128
        && !tag.starts_with(['.', '-'])
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if !valid_tag {
        bail!("{tag:?} is not a valid image tag");
    }
    if repository.is_empty()
        || repository.contains('@')
        || repository.split('/').any(str::is_empty)
        || repository
            .rsplit('/')
            .next()
            .is_some_and(|last| last.contains(':'))
    {
        bail!("{repository:?} is not an image repository (a name without tag or digest)");
    }
    let first = repository.split('/').next().unwrap_or_default();
    let has_host = repository.contains('/')
        && (first.contains('.') || first.contains(':') || first == "localhost");
    let full = match (has_host, repository.contains('/')) {
        (true, _) => repository.to_string(),
        (false, true) => format!("docker.io/{repository}"),
        (false, false) => format!("docker.io/library/{repository}"),
    };
    Ok(format!("{full}:{tag}"))
}

/// The commit the image is built from.
struct Commit {
    /// `git rev-parse HEAD`, with `-dirty` when tracked files differ from it
    /// (the binary then is not the commit's; the label says so).
    revision: String,
    /// Seconds since the epoch: SOURCE_DATE_EPOCH, else the commit's time.
    time: u64,
}

impl Commit {
    fn read(root: &Path) -> anyhow::Result<Commit> {
        let git = |args: &[&str]| {
            output(Command::new("git").arg("-C").arg(root).args(args)).with_context(|| {
                format!(
                    "the image's revision label and times come from git; {} must be a git checkout",
                    root.display()
                )
            })
        };
        let mut revision = git(&["rev-parse", "HEAD"])?.trim().to_string();
        if !git(&["status", "--porcelain", "--untracked-files=no"])?
            .trim()
            .is_empty()
        {
            say("the checkout has uncommitted changes: revision label ends in -dirty");
            revision.push_str("-dirty");
        }
        let time = match std::env::var("SOURCE_DATE_EPOCH") {
            Ok(value) => value.trim().parse().with_context(|| {
                format!("SOURCE_DATE_EPOCH={value:?} is not a number of seconds")
            })?,
            Err(_) => {
                let text = git(&["log", "-1", "--format=%ct", "HEAD"])?;
                text.trim()
                    .parse()
                    .with_context(|| format!("git's commit time {text:?} is not a number"))?
            }
        };
        Ok(Commit { revision, time })
    }

    fn rfc3339(&self) -> anyhow::Result<String> {
        let seconds = i64::try_from(self.time).context("the commit time is out of range")?;
        let time = time::OffsetDateTime::from_unix_timestamp(seconds)?;
        Ok(time.format(&time::format_description::well_known::Rfc3339)?)
    }
}

/// The URL of the remote `origin` when it is an http(s) URL, without any
/// credentials in it; none otherwise (an ssh remote is no URL to browse).
fn origin_url(root: &Path) -> Option<String> {
    let url = output(
        Command::new("git")
            .arg("-C")
            .arg(root)
            .args(["remote", "get-url", "origin"]),
    )
    .ok()?;
    public_url(url.trim())
}

fn public_url(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "https" && scheme != "http" {
        return None;
    }
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let host = authority.rsplit('@').next()?;
    let path = path.strip_suffix(".git").unwrap_or(path);
    Some(format!("{scheme}://{host}/{path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_normalized_as_containerd_stores_them() {
        let full = |r, t| full_reference(r, t).unwrap();
        assert_eq!(
            full("volume-health-agent", "0.1.0"),
            "docker.io/library/volume-health-agent:0.1.0"
        );
        assert_eq!(full("acme/agent", "e2e"), "docker.io/acme/agent:e2e");
        assert_eq!(full("ghcr.io/acme/agent", "1"), "ghcr.io/acme/agent:1");
        assert_eq!(full("localhost:5000/agent", "1"), "localhost:5000/agent:1");
        assert!(full_reference("agent:1", "2").is_err());
        assert!(full_reference("agent", "-x").is_err());
        assert!(full_reference("agent", "a/b").is_err());
        assert!(full_reference("a//b", "1").is_err());
    }

    #[test]
    fn the_test_tools_are_those_the_image_tests_drive_with_their_packages() {
        use health_tests::cmd::{package_of, IMAGE_TEST_TOOLS};
        let tools: Vec<&str> = crate::bootstrap::IMAGE_TEST_TOOLS
            .iter()
            .map(|(tool, _)| *tool)
            .collect();
        assert_eq!(tools, IMAGE_TEST_TOOLS);
        for (tool, package) in crate::bootstrap::IMAGE_TEST_TOOLS {
            assert_eq!(package_of(tool), Some(*package), "{tool}");
        }
    }

    #[test]
    fn the_source_url_has_no_credentials() {
        assert_eq!(
            public_url("https://user:token@github.com/acme/volume-health.git").as_deref(),
            Some("https://github.com/acme/volume-health")
        );
        assert_eq!(public_url("git@github.com:acme/volume-health.git"), None);
        assert_eq!(public_url("/srv/git/volume-health"), None);
    }

    #[test]
    fn labels_name_version_revision_and_time() {
        let commit = Commit {
            revision: "abc".into(),
            time: 1_795_504_142,
        };
        let created = commit.rfc3339().unwrap();
        let labels = labels("0.1.0", "abc", &created, "https://example.org/vh");
        let get = |k: &str| labels[&format!("org.opencontainers.image.{k}")].as_str();
        assert_eq!(get("version"), "0.1.0");
        assert_eq!(get("revision"), "abc");
        assert_eq!(get("created"), "2026-11-24T07:09:02Z");
        assert_eq!(get("source"), "https://example.org/vh");
        assert_eq!(get("licenses"), "Apache-2.0");
        assert_eq!(get("title"), "volume-health-agent");
        assert_eq!(labels.len(), 7);
        assert_eq!(
            env!("CARGO_PKG_REPOSITORY"),
            "https://github.com/volume-health/volume-health"
        );
    }
}
