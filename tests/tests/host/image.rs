//! `cargo xtask image` as independent tools see its archive: skopeo reads
//! both platforms of its image index, umoci unpacks each, the agent runs
//! from the unpacked amd64 root filesystem alone (chroot, mounts as the
//! DaemonSet has them) and attaches its programs, the arm64 binaries start
//! from the arm64 root filesystem's own loader and libraries (under
//! qemu-user: this host runs no arm64 code itself) and the arm64 agent
//! counts faults on Debian's arm64 kernels (`arm64_guest`, under
//! qemu-system-aarch64); two builds of one commit are the same bytes.
//!
//! Root and the real tools are required (`cargo xtask test` installs
//! skopeo and umoci); a missing one fails the test with its package named.
//! The image is built once per run (the agent from `HEALTH_AGENT_BIN`, as
//! the other real-kernel tests use) and shared; the files stay in the test
//! binary's scratch directory under target/ for a look after a failure.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, ensure, Context, Result};
use health_tests::cmd;
use serde_json::Value;

mod arm64_guest;

const SOURCE: &str = "https://example.org/volume-health";
const TAG: &str = "image-test";
const FULL_NAME: &str = "docker.io/library/volume-health-agent:image-test";

/// The root filesystem of the image on amd64 built on Debian bookworm (the
/// README's build host, merged /usr): the agent, the controller and exactly
/// the files their dynamic loader needs, with the host's symlinks. Type, mode, path, link.
const ROOTFS_AMD64: &[&str] = &[
    "l 777 lib -> usr/lib",
    "l 777 lib64 -> usr/lib64",
    "d 755 usr",
    "d 755 usr/lib",
    "d 755 usr/lib/x86_64-linux-gnu",
    "f 755 usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
    "f 755 usr/lib/x86_64-linux-gnu/libc.so.6",
    "f 644 usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
    "f 644 usr/lib/x86_64-linux-gnu/libm.so.6",
    "d 755 usr/lib64",
    "l 777 usr/lib64/ld-linux-x86-64.so.2 -> /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
    "d 755 usr/local",
    "d 755 usr/local/bin",
    "f 755 usr/local/bin/health-agent",
    "f 755 usr/local/bin/health-controller",
    "d 755 usr/share",
    "d 755 usr/share/doc",
    "d 755 usr/share/doc/volume-health",
    "f 644 usr/share/doc/volume-health/sbom.cdx.json",
];

/// The arm64 root filesystem: the same binaries cross-built, and what their
/// loader needs from Debian bookworm's arm64 packages (not usr-merged in
/// the packages themselves).
const ROOTFS_ARM64: &[&str] = &[
    "d 755 lib",
    "d 755 lib/aarch64-linux-gnu",
    "f 755 lib/aarch64-linux-gnu/ld-linux-aarch64.so.1",
    "f 755 lib/aarch64-linux-gnu/libc.so.6",
    "f 644 lib/aarch64-linux-gnu/libgcc_s.so.1",
    "f 644 lib/aarch64-linux-gnu/libm.so.6",
    "l 777 lib/ld-linux-aarch64.so.1 -> aarch64-linux-gnu/ld-linux-aarch64.so.1",
    "d 755 usr",
    "d 755 usr/local",
    "d 755 usr/local/bin",
    "f 755 usr/local/bin/health-agent",
    "f 755 usr/local/bin/health-controller",
    "d 755 usr/share",
    "d 755 usr/share/doc",
    "d 755 usr/share/doc/volume-health",
    "f 644 usr/share/doc/volume-health/sbom.cdx.json",
];

/// The xtask binary: `HEALTH_XTASK_BIN` (`cargo xtask test` sets it to
/// itself), else the workspace's debug build, which `cargo xtask` runs.
fn xtask_bin() -> PathBuf {
    std::env::var_os("HEALTH_XTASK_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/xtask"))
}

fn scratch() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("image-test")
}

fn agent() -> Result<PathBuf> {
    health_tests::agent::agent_bin()
}

/// `cargo xtask image --agent AGENT --controller CONTROLLER --output OUT`
/// with this test's name.
fn build_image(agent: &Path, out: &Path) -> Result<()> {
    let xtask = xtask_bin();
    let result = Command::new(&xtask)
        .args(["image", "--tag", TAG, "--source", SOURCE, "--agent"])
        .arg(agent)
        .arg("--controller")
        .arg(health_tests::agent::controller_bin()?)
        .arg("--output")
        .arg(out)
        .output()
        .with_context(|| format!("starting {}", xtask.display()))?;
    if !result.status.success() {
        bail!(
            "xtask image failed ({}): {}",
            result.status,
            String::from_utf8_lossy(&result.stderr)
        );
    }
    Ok(())
}

/// What every test shares: the archive, and what skopeo and umoci made of
/// each platform (`amd64`: this host's, `arm64`).
struct Built {
    archive: PathBuf,
    amd64: Unpacked,
    arm64: Unpacked,
}

/// One platform of the image as skopeo and umoci see it.
struct Unpacked {
    /// `skopeo inspect` and `skopeo inspect --config` (its `Digest` is the
    /// image index's, the name's target, whichever platform is chosen).
    inspect: Value,
    /// The platform's own manifest, as skopeo chose it from the index (the
    /// one its copy to a layout of its own names).
    manifest_digest: String,
    config: Value,
    /// The unpacked root filesystem and its listing taken right after
    /// unpacking (a later test adds mount points to it).
    rootfs: PathBuf,
    listing: Vec<String>,
}

fn built() -> Result<&'static Built> {
    static BUILT: OnceLock<std::result::Result<Built, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build_and_unpack().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("building and unpacking the image: {e}"))
}

fn build_and_unpack() -> Result<Built> {
    health_tests::require_root()?;
    cmd::require_tools(cmd::IMAGE_TEST_TOOLS)?;
    let dir = scratch();
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    let archive = dir.join("first.oci.tar");
    build_image(&agent()?, &archive)?;
    Ok(Built {
        amd64: unpack(&archive, "amd64")?,
        arm64: unpack(&archive, "arm64")?,
        archive,
    })
}

/// `arch`'s image from the archive's index, selected by the tag
/// (org.opencontainers.image.ref.name) and skopeo's `--override-arch`,
/// copied to a layout of its own and unpacked there by umoci.
fn unpack(archive: &Path, arch: &str) -> Result<Unpacked> {
    let dir = scratch().join(arch);
    std::fs::create_dir_all(&dir)?;
    let reference = format!("oci-archive:{}:{TAG}", archive.display());
    let skopeo =
        |args: &[&str]| cmd::run("skopeo", &[&["--override-arch", arch][..], args].concat());
    let inspect = json(&skopeo(&["inspect", &reference])?.stdout)?;
    let config = json(&skopeo(&["inspect", "--config", &reference])?.stdout)?;
    let layout = format!("oci:{}:{TAG}", dir.join("layout").display());
    skopeo(&["copy", "--quiet", &reference, &layout])?;
    let copied = json(&std::fs::read_to_string(dir.join("layout/index.json"))?)?;
    let manifest_digest = copied["manifests"][0]["digest"]
        .as_str()
        .context("the copy's index.json names no manifest")?
        .to_string();
    let bundle = dir.join("bundle");
    let image = format!("{}:{TAG}", dir.join("layout").display());
    cmd::run(
        "umoci",
        &["unpack", "--image", &image, &bundle.to_string_lossy()],
    )?;
    let rootfs = bundle.join("rootfs");
    let listing = list(&rootfs)?;
    Ok(Unpacked {
        inspect,
        manifest_digest,
        config,
        rootfs,
        listing,
    })
}

fn json(text: &str) -> Result<Value> {
    serde_json::from_str(text).with_context(|| format!("not JSON: {text}"))
}

/// Every entry under `root` as "type mode path[ -> target]", sorted;
/// anything not owned by root:root is an error.
fn list(root: &Path) -> Result<Vec<String>> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let path = entry?.path();
            let meta = std::fs::symlink_metadata(&path)?;
            let rel = path.strip_prefix(root)?.to_string_lossy().into_owned();
            ensure!(
                meta.uid() == 0 && meta.gid() == 0,
                "{rel} is owned by {}:{}",
                meta.uid(),
                meta.gid()
            );
            let mode = meta.permissions().mode() & 0o7777;
            let line = if meta.file_type().is_symlink() {
                format!(
                    "l {mode:o} {rel} -> {}",
                    std::fs::read_link(&path)?.display()
                )
            } else if meta.is_dir() {
                stack.push(path.clone());
                format!("d {mode:o} {rel}")
            } else if meta.is_file() {
                format!("f {mode:o} {rel}")
            } else {
                bail!("{rel} is neither a file, a directory nor a symlink");
            };
            out.push((rel, line));
        }
    }
    out.sort();
    Ok(out.into_iter().map(|(_, line)| line).collect())
}

fn git(args: &[&str]) -> Result<String> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = cmd::run("git", &[&["-C", root][..], args].concat())?;
    Ok(out.stdout.trim().to_string())
}

#[test]
fn skopeo_and_umoci_read_the_labels_config_and_files() -> Result<()> {
    let built = built()?;
    let mut revision = git(&["rev-parse", "HEAD"])?;
    if !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty() {
        revision.push_str("-dirty");
    }
    let seconds: i64 = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v.trim().parse()?,
        Err(_) => git(&["log", "-1", "--format=%ct"])?.parse()?,
    };
    let created = time::OffsetDateTime::from_unix_timestamp(seconds)?
        .format(&time::format_description::well_known::Rfc3339)?;
    let expected: BTreeMap<&str, &str> = BTreeMap::from([
        ("org.opencontainers.image.created", created.as_str()),
        (
            "org.opencontainers.image.description",
            "volume-health node agent (kernel storage errors, eBPF, reported as Events on Pods and PVCs and as Prometheus metrics) and its cluster-side controller",
        ),
        ("org.opencontainers.image.licenses", "Apache-2.0"),
        ("org.opencontainers.image.revision", revision.as_str()),
        ("org.opencontainers.image.source", SOURCE),
        ("org.opencontainers.image.title", "volume-health-agent"),
        ("org.opencontainers.image.version", env!("CARGO_PKG_VERSION")),
    ]);
    for (arch, unpacked, files) in [
        ("amd64", &built.amd64, ROOTFS_AMD64),
        ("arm64", &built.arm64, ROOTFS_ARM64),
    ] {
        let got: BTreeMap<&str, &str> = unpacked.inspect["Labels"]
            .as_object()
            .context("no labels")?
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or("(not a string)")))
            .collect();
        assert_eq!(got, expected, "{arch}");
        assert_eq!(unpacked.inspect["Architecture"], arch);
        assert_eq!(unpacked.inspect["Os"], "linux");
        assert_eq!(unpacked.inspect["Created"], created.as_str());
        assert_eq!(unpacked.inspect["Layers"].as_array().map(Vec::len), Some(1));
        let config = &unpacked.config["config"];
        assert_eq!(
            config["Entrypoint"],
            serde_json::json!(["/usr/local/bin/health-agent"])
        );
        assert_eq!(config["Cmd"], serde_json::json!(["run"]));
        assert_eq!(unpacked.config["os"], "linux");
        assert_eq!(unpacked.config["architecture"], arch);
        assert_eq!(
            unpacked.listing, files,
            "the image's files for {arch} (expected: the list for {arch} built on Debian bookworm)"
        );
        for binary in ["health-agent", "health-controller"] {
            let path = unpacked.rootfs.join("usr/local/bin").join(binary);
            let path = path.to_string_lossy();
            let header = cmd::run("readelf", &["-h", "-W", &path])?.stdout;
            let machine = if arch == "amd64" {
                "Advanced Micro Devices X86-64"
            } else {
                "AArch64"
            };
            assert!(header.contains(machine), "{arch} {binary}: {header}");
            let sections = cmd::run("readelf", &["-S", "-W", &path])?.stdout;
            assert!(sections.contains(" .text "), "{binary}: {sections}");
            // (.debug_gdb_scripts, 34 bytes that are loaded, stays.)
            assert!(
                !sections.contains(".debug_info") && !sections.contains(".debug_line"),
                "debug sections left in {arch} {binary}:\n{sections}"
            );
        }
    }
    // The two are different builds, not one binary twice.
    assert_ne!(built.amd64.manifest_digest, built.arm64.manifest_digest);

    // index.json names the image index for containerd, podman and Docker;
    // the index lists one manifest per platform, those skopeo chose.
    let read = |name: &str| -> Result<Value> {
        json(&cmd::run("tar", &["-xOf", &built.archive.to_string_lossy(), name])?.stdout)
    };
    let layout = read("index.json")?;
    assert_eq!(layout["manifests"].as_array().map(Vec::len), Some(1));
    let named = &layout["manifests"][0];
    assert_eq!(
        named["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    assert_eq!(named["annotations"]["io.containerd.image.name"], FULL_NAME);
    assert_eq!(
        named["annotations"]["org.opencontainers.image.ref.name"],
        TAG
    );
    let digest = named["digest"].as_str().context("no digest")?;
    assert_eq!(built.amd64.inspect["Digest"], digest);
    let index = read(&format!("blobs/{}", digest.replace(':', "/")))?;
    let platforms: Vec<(&str, &str)> = index["manifests"]
        .as_array()
        .context("no manifests")?
        .iter()
        .map(|m| {
            (
                m["platform"]["architecture"].as_str().unwrap_or_default(),
                m["digest"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        platforms,
        [
            ("amd64", built.amd64.manifest_digest.as_str()),
            ("arm64", built.arm64.manifest_digest.as_str()),
        ]
    );

    // The amd64 libraries are the host's very files.
    for line in ROOTFS_AMD64
        .iter()
        .filter(|l| l.starts_with('f') && l.contains(".so"))
    {
        let rel = line.rsplit(' ').next().unwrap_or_default();
        let host = std::fs::read(Path::new("/").join(rel))?;
        assert!(
            std::fs::read(built.amd64.rootfs.join(rel))? == host,
            "{rel} differs from the host's"
        );
    }
    Ok(())
}

/// The arm64 binaries start with nothing but the arm64 image's files: its
/// ELF interpreter and libraries (`qemu-aarch64 -L ROOTFS` resolves every
/// absolute path the program opens there first), so the image's loader
/// finds every library each binary links.
#[test]
fn the_arm64_binaries_start_from_the_arm64_files_alone() -> Result<()> {
    let built = built()?;
    let root = built.arm64.rootfs.to_string_lossy().into_owned();
    for (binary, name) in [
        ("usr/local/bin/health-controller", "health-controller"),
        ("usr/local/bin/health-agent", "health-agent"),
    ] {
        let path = built.arm64.rootfs.join(binary);
        let out = cmd::run(
            "qemu-aarch64",
            &["-L", &root, &path.to_string_lossy(), "--version"],
        )?;
        assert_eq!(
            out.stdout,
            format!("{name} {}\n", env!("CARGO_PKG_VERSION")),
            "{binary}: {}",
            out.stderr
        );
    }
    Ok(())
}

/// The versions Cargo.lock pins, per crate name.
fn locked_versions() -> Result<BTreeMap<String, Vec<String>>> {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock"))?;
    let mut versions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = \"") {
            name = Some(n.trim_end_matches('"').to_string());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = \""), name.take()) {
            versions
                .entry(n)
                .or_default()
                .push(v.trim_end_matches('"').to_string());
        }
    }
    Ok(versions)
}

/// Each platform's SBOM in the image (and the same bytes beside the
/// archive) lists the crates compiled into its binaries at the versions
/// Cargo.lock pins, not the tests' or the proc-macros', and the Debian
/// packages of the copied libraries: for amd64 at the versions dpkg has
/// installed here, for arm64 Debian's arm64 packages of the same release.
#[test]
fn the_sbom_lists_the_binaries_crates_and_the_libraries_packages() -> Result<()> {
    let built = built()?;
    for (arch, unpacked) in [("amd64", &built.amd64), ("arm64", &built.arm64)] {
        check_sbom(&built.archive, arch, unpacked).with_context(|| format!("the {arch} SBOM"))?;
    }
    Ok(())
}

fn check_sbom(archive: &Path, arch: &str, built: &Unpacked) -> Result<()> {
    let inside = std::fs::read(
        built
            .rootfs
            .join("usr/share/doc/volume-health/sbom.cdx.json"),
    )?;
    let beside = std::fs::read(archive.with_file_name(format!("first.{arch}.cdx.json")))?;
    assert!(
        inside == beside,
        "the SBOM beside the archive is not the image's"
    );
    let doc = json(&String::from_utf8(inside)?)?;
    assert_eq!(doc["bomFormat"], "CycloneDX");
    assert_eq!(doc["specVersion"], "1.5");
    assert_eq!(doc["metadata"]["component"]["name"], "volume-health-agent");
    assert_eq!(built.inspect["Created"], doc["metadata"]["timestamp"]);
    let components = doc["components"].as_array().context("no components")?;
    let by_name: BTreeMap<&str, &Value> = components
        .iter()
        .map(|c| (c["name"].as_str().unwrap_or_default(), c))
        .collect();
    for compiled in [
        "aya",
        "tokio",
        "kube-client",
        "tonic",
        "prometheus-client",
        "health-agent",
        "health-controller",
        "health-kernel",
    ] {
        assert!(by_name.contains_key(compiled), "{compiled} is not listed");
    }
    // Tests' crates and proc-macros are in no binary.
    for absent in [
        "promql-parser",
        "fuser",
        "serde_derive",
        "thiserror-impl",
        "tokio-macros",
    ] {
        assert!(!by_name.contains_key(absent), "{absent} is listed");
    }
    let locked = locked_versions()?;
    for c in components.iter().filter(|c| {
        c["purl"]
            .as_str()
            .is_some_and(|p| p.starts_with("pkg:cargo/"))
    }) {
        let (name, version) = (c["name"].as_str().unwrap(), c["version"].as_str().unwrap());
        assert!(
            locked
                .get(name)
                .is_some_and(|v| v.iter().any(|l| l == version)),
            "{name} {version} is not what Cargo.lock pins: {:?}",
            locked.get(name)
        );
        assert_eq!(c["purl"], format!("pkg:cargo/{name}@{version}"));
    }
    assert_eq!(
        by_name["health-agent"]["licenses"],
        serde_json::json!([{"expression": "Apache-2.0"}])
    );
    assert_eq!(by_name["health-agent"].get("purl"), None);
    for package in ["libc6", "libgcc-s1"] {
        let installed = cmd::run(
            "dpkg-query",
            &["--show", "--showformat", "${Version}", package],
        )?;
        let installed = installed.stdout.trim();
        let listed = by_name[package]["version"].as_str().unwrap_or_default();
        assert_eq!(
            by_name[package]["purl"],
            format!(
                "pkg:deb/debian/{package}@{}?arch={arch}",
                listed.replace('+', "%2B")
            ),
            "{package}"
        );
        match arch {
            "amd64" => assert_eq!(listed, installed, "{package}"),
            // Fetched today: at least as new as this host's, of the same
            // upstream version (bookworm's).
            _ => assert_eq!(
                listed.split('-').next(),
                installed.split('-').next(),
                "{package}: arm64 {listed}, host {installed}"
            ),
        }
    }
    let debian: Vec<&str> = components
        .iter()
        .filter_map(|c| c["purl"].as_str())
        .filter(|p| p.starts_with("pkg:deb/"))
        .collect();
    assert_eq!(debian.len(), 2, "libc6 and libgcc-s1 only: {debian:?}");
    Ok(())
}

/// Shell script run in a private mount namespace (`unshare --mount`): every
/// mount goes away with the namespace, however the test ends. The mounts
/// are the DaemonSet's: the host's /proc at /host/proc, /sys, tracefs and
/// /dev read-only, a bpffs (a fresh instance, seen by no other test) for
/// the pins, and the root filesystem read-only.
const RUN_SCRIPT: &str = r#"set -eu
root=$1
mkdir -p "$root/proc" "$root/sys" "$root/dev" "$root/host/proc"
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --bind -o ro /proc "$root/host/proc"
mount --bind -o ro /sys "$root/sys"
mount -t tracefs -o ro tracefs "$root/sys/kernel/tracing"
mount -t bpf bpf "$root/sys/fs/bpf"
mount --bind -o ro /dev "$root/dev"
mount -o remount,bind,ro "$root"
status=0
"$(command -v env)" -i HEALTH_HOST_PROC=/host/proc HEALTH_HOST_SYS=/sys HEALTH_LOG=info NO_COLOR=1 \
  "$(command -v timeout)" --kill-after=5 60 "$(command -v chroot)" "$root" \
  /usr/local/bin/health-agent watch --duration 2 --pin-dir /sys/fs/bpf/volume-health || status=$?
cd "$root/sys/fs/bpf/volume-health"
for dir in */links */programs; do echo "pinned $dir: $(ls "$dir" | wc -l)"; done
echo "agent exit status: $status"
"#;

#[test]
fn the_agent_runs_from_the_unpacked_image_alone_and_attaches() -> Result<()> {
    let built = built()?;
    let _kernel = health_tests::shared_kernel();
    let rootfs = built.amd64.rootfs.to_string_lossy().into_owned();
    let out = cmd::run(
        "unshare",
        &[
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            RUN_SCRIPT,
            "sh",
            &rootfs,
        ],
    )?;
    let all = format!("{}\n{}", out.stdout, out.stderr);
    assert!(all.contains("agent exit status: 0\n"), "{all}");
    let ready = out
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("volume-health: ready, "))
        .with_context(|| format!("no ready line:\n{all}"))?;
    let sources: usize = ready
        .strip_suffix(" error sources attached")
        .with_context(|| format!("unexpected ready line {ready:?}"))?
        .parse()?;
    assert!(sources > 0, "{all}");
    assert!(
        out.stderr.contains("active   block:block_rq_error"),
        "{all}"
    );
    assert!(!out.stderr.contains("ERROR"), "{all}");
    // One committed layout, with a pinned program and link per source
    // (none that follow bios: there are no pod volumes to judge).
    assert!(out.stderr.contains("stalls: off (no pod volumes)"), "{all}");
    let programs = sources;
    let pinned: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("pinned "))
        .collect();
    assert_eq!(pinned.len(), 2, "{all}");
    for line in pinned {
        assert!(
            line.ends_with(&format!(": {programs}")),
            "{line} (expected {programs}):\n{all}"
        );
    }
    Ok(())
}

/// The controller (the CSI sidecar's command) runs from the image's files
/// alone too: its dynamic loader finds every library it links.
#[test]
fn the_controller_runs_from_the_unpacked_image_alone() -> Result<()> {
    let built = built()?;
    let out = cmd::run(
        "chroot",
        &[
            &built.amd64.rootfs.to_string_lossy(),
            "/usr/local/bin/health-controller",
            "--version",
        ],
    )?;
    assert_eq!(
        out.stdout,
        format!("health-controller {}\n", env!("CARGO_PKG_VERSION"))
    );
    Ok(())
}

#[test]
fn two_builds_of_one_commit_are_the_same_bytes() -> Result<()> {
    let built = built()?;
    // The second build reads a copy of the agent with another mtime and
    // mode: neither may reach the image.
    let copy = scratch().join("agent-copy");
    std::fs::copy(agent()?, &copy)?;
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o700))?;
    let second = scratch().join("second.oci.tar");
    build_image(&copy, &second)?;
    std::fs::remove_file(&copy)?;
    let reference = format!("oci-archive:{}", second.display());
    let inspect = json(&cmd::run("skopeo", &["inspect", &reference])?.stdout)?;
    assert_eq!(inspect["Digest"], built.amd64.inspect["Digest"]);
    let (one, two) = (std::fs::read(&built.archive)?, std::fs::read(&second)?);
    assert!(
        one == two,
        "{} and {} differ",
        built.archive.display(),
        second.display()
    );
    eprintln!(
        "image: {} bytes, index {}, amd64 manifest {}, arm64 manifest {}",
        one.len(),
        built.amd64.inspect["Digest"].as_str().unwrap_or_default(),
        built.amd64.manifest_digest,
        built.arm64.manifest_digest
    );
    Ok(())
}
