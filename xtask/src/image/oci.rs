//! The OCI image layout, written as one tar archive: `oci-layout`,
//! `index.json` and `blobs/sha256/` holding an image index, and for each
//! architecture its manifest, config and one gzip layer (image-spec v1.0
//! media types, which every importer knows).
//!
//! `index.json` names one descriptor, the image index, annotated with the
//! image's names; the index lists one manifest per platform (as `docker
//! buildx` writes a multi-platform OCI archive). Importers take the
//! platform of their machine (`ctr images import`, kubelet's containerd,
//! `skopeo copy`, which `--override-arch` points at another).
//!
//! Byte for byte the same from the same inputs: entries in path order, every
//! timestamp the given one (the commit's), uid and gid 0 with no owner
//! names, modes fixed by kind, gzip without a timestamp or file name, JSON
//! with sorted keys. The compressor is flate2's pure-Rust backend at the
//! version Cargo.lock pins, so its output does not depend on the host's zlib.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::rootfs::{Entry, Rootfs};

pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// What the image's config says about running it.
pub struct ImageConfig {
    pub architecture: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// RFC 3339, the commit's time.
    pub created: String,
}

/// One platform of the image: its files and its config.
pub struct Platform {
    pub rootfs: Rootfs,
    pub config: ImageConfig,
}

/// How importers name the image.
pub struct ImageNames {
    /// `io.containerd.image.name`: the full reference
    /// (`docker.io/library/volume-health-agent:0.1.0`), which containerd
    /// (`ctr images import`, `kind load image-archive`), Docker and podman
    /// use as the image's name.
    pub full: String,
    /// `org.opencontainers.image.ref.name`: the tag alone, as the image
    /// layout spec has it (`skopeo copy oci-archive:FILE:0.1.0` selects by it).
    pub tag: String,
}

/// What was written.
pub struct Written {
    /// The image index's digest: what a registry would call the image's.
    pub index_digest: String,
    /// Per platform, in the order given.
    pub manifests: Vec<WrittenManifest>,
    pub archive_size: u64,
}

/// One platform's manifest.
pub struct WrittenManifest {
    pub architecture: String,
    pub manifest_digest: String,
    pub layer_digest: String,
    /// The uncompressed layer's digest (the config's `diff_ids`).
    pub diff_id: String,
    pub layer_size: u64,
}

/// Writes the archive of `platforms` to `out` (through a temporary file
/// beside it, so a failed build leaves no half archive under the final
/// name).
pub fn write_archive(
    platforms: &[Platform],
    names: &ImageNames,
    mtime: u64,
    out: &Path,
) -> anyhow::Result<Written> {
    if platforms.is_empty() {
        bail!("an image of no platform");
    }
    let mut blobs: Vec<Vec<u8>> = Vec::new();
    let mut descriptors = Vec::new();
    let mut manifests = Vec::new();
    for platform in platforms {
        let arch = &platform.config.architecture;
        let layer_tar =
            layer(&platform.rootfs, mtime).with_context(|| format!("writing the {arch} layer"))?;
        let diff_id = sha256(&layer_tar);
        let layer_gz = gzip(&layer_tar).context("compressing the layer")?;
        let config_json = to_json(&config_document(&platform.config, &diff_id))?;
        let manifest_json = to_json(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": descriptor(CONFIG_MEDIA_TYPE, &config_json),
            "layers": [descriptor(LAYER_MEDIA_TYPE, &layer_gz)],
        }))?;
        let mut manifest_descriptor = descriptor(MANIFEST_MEDIA_TYPE, &manifest_json);
        manifest_descriptor["platform"] = json!({"architecture": arch, "os": "linux"});
        descriptors.push(manifest_descriptor);
        manifests.push(WrittenManifest {
            architecture: arch.clone(),
            manifest_digest: sha256(&manifest_json),
            layer_digest: sha256(&layer_gz),
            diff_id,
            layer_size: layer_gz.len() as u64,
        });
        blobs.extend([config_json, manifest_json, layer_gz]);
    }
    let image_index = to_json(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": descriptors,
    }))?;
    let mut index_descriptor = descriptor(INDEX_MEDIA_TYPE, &image_index);
    index_descriptor["annotations"] = json!({
        "io.containerd.image.name": names.full,
        "org.opencontainers.image.ref.name": names.tag,
    });
    let index_json = to_json(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [index_descriptor],
    }))?;
    let layout_json = to_json(&json!({"imageLayoutVersion": "1.0.0"}))?;
    let index_digest = sha256(&image_index);
    blobs.push(image_index);

    let mut files: BTreeMap<String, &[u8]> = BTreeMap::new();
    files.insert("oci-layout".into(), &layout_json);
    files.insert("index.json".into(), &index_json);
    for blob in &blobs {
        files.insert(format!("blobs/sha256/{}", hex(&Sha256::digest(blob))), blob);
    }

    let tmp = out.with_extension("tar.partial");
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut archive = tar::Builder::new(std::io::BufWriter::new(file));
    for dir in ["blobs/", "blobs/sha256/"] {
        append(&mut archive, dir, &Entry::Dir, &[], mtime)?;
    }
    for (path, data) in &files {
        let entry = Entry::File {
            data: Vec::new(),
            executable: false,
        };
        append(&mut archive, path, &entry, data, mtime)?;
    }
    let mut writer = archive.into_inner().context("finishing the archive")?;
    writer.flush()?;
    drop(writer);
    std::fs::rename(&tmp, out)
        .with_context(|| format!("moving {} to {}", tmp.display(), out.display()))?;
    let archive_size = std::fs::metadata(out)?.len();
    Ok(Written {
        index_digest,
        manifests,
        archive_size,
    })
}

fn config_document(config: &ImageConfig, diff_id: &str) -> Value {
    json!({
        "created": config.created,
        "architecture": config.architecture,
        "os": "linux",
        "config": {
            "Entrypoint": config.entrypoint,
            "Cmd": config.cmd,
            "Env": config.env,
            "Labels": config.labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": config.created, "created_by": "cargo xtask image"}],
    })
}

/// The root filesystem as an uncompressed tar.
fn layer(rootfs: &Rootfs, mtime: u64) -> anyhow::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, entry) in rootfs.entries() {
        let (name, data): (String, &[u8]) = match entry {
            Entry::Dir => (format!("{path}/"), &[]),
            Entry::File { data, .. } => (path.to_string(), data),
            Entry::Symlink(_) => (path.to_string(), &[]),
        };
        append(&mut tar, &name, entry, data, mtime)?;
    }
    Ok(tar.into_inner()?)
}

fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    entry: &Entry,
    data: &[u8],
    mtime: u64,
) -> anyhow::Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_mode(entry.mode());
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(mtime);
    header.set_size(data.len() as u64);
    let kind = match entry {
        Entry::Dir => tar::EntryType::Directory,
        Entry::File { .. } => tar::EntryType::Regular,
        Entry::Symlink(_) => tar::EntryType::Symlink,
    };
    header.set_entry_type(kind);
    match entry {
        Entry::Symlink(target) => tar.append_link(&mut header, path, target),
        _ => tar.append_data(&mut header, path, data),
    }
    .with_context(|| format!("adding {path}"))
}

fn gzip(data: &[u8]) -> anyhow::Result<Vec<u8>> {
    // GzBuilder writes mtime 0 and no file name unless told otherwise.
    let mut encoder = flate2::GzBuilder::new().write(Vec::new(), flate2::Compression::best());
    encoder.write_all(data)?;
    Ok(encoder.finish()?)
}

fn descriptor(media_type: &str, blob: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": sha256(blob), "size": blob.len()})
}

/// Compact JSON; `json!` objects are BTreeMaps (serde_json without
/// `preserve_order`), so keys come out sorted.
fn to_json(value: &Value) -> anyhow::Result<Vec<u8>> {
    Ok(serde_json::to_vec(value)?)
}

pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn platform(arch: &str) -> Platform {
        let mut fs = Rootfs::default();
        fs.add(
            "usr/local/bin/tool",
            Entry::File {
                data: format!("#!binary for {arch}").into_bytes(),
                executable: true,
            },
        )
        .unwrap();
        fs.add("lib", Entry::Symlink("usr/lib".into())).unwrap();
        let config = ImageConfig {
            architecture: arch.into(),
            entrypoint: vec!["/usr/local/bin/tool".into()],
            cmd: vec!["run".into()],
            env: vec!["PATH=/usr/local/bin".into()],
            labels: BTreeMap::from([("a".into(), "b".into())]),
            created: "2026-11-24T00:00:00Z".into(),
        };
        Platform { rootfs: fs, config }
    }

    fn sample() -> (Vec<Platform>, ImageNames) {
        let names = ImageNames {
            full: "docker.io/library/tool:1".into(),
            tag: "1".into(),
        };
        (vec![platform("amd64"), platform("arm64")], names)
    }

    /// One entry of an archive: path, mode, mtime, uid, gid, and the data.
    type TarEntry = (String, u32, u64, u64, u64, Vec<u8>);

    /// The archive's entries.
    fn entries(bytes: &[u8]) -> Vec<TarEntry> {
        let mut archive = tar::Archive::new(bytes);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let h = e.header().clone();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut data).unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                (
                    path,
                    h.mode().unwrap(),
                    h.mtime().unwrap(),
                    h.uid().unwrap(),
                    h.gid().unwrap(),
                    data,
                )
            })
            .collect()
    }

    fn blob<'a>(entries: &'a [TarEntry], digest: &str) -> &'a [u8] {
        let path = format!("blobs/{}", digest.replace(':', "/"));
        &entries.iter().find(|e| e.0 == path).unwrap().5
    }

    #[test]
    fn the_layout_is_complete_and_fixed() {
        let (platforms, names) = sample();
        let dir = tempfile::tempdir().unwrap();
        let (one, two) = (dir.path().join("1.tar"), dir.path().join("2.tar"));
        let a = write_archive(&platforms, &names, 1_700_000_000, &one).unwrap();
        let b = write_archive(&platforms, &names, 1_700_000_000, &two).unwrap();
        assert_eq!(a.index_digest, b.index_digest);
        let bytes = std::fs::read(&one).unwrap();
        assert_eq!(bytes, std::fs::read(&two).unwrap());

        // 2 directories, 3 blobs per platform and the image index, then
        // index.json and oci-layout.
        let entries = entries(&bytes);
        let paths: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(paths.len(), 2 + 7 + 2, "{paths:?}");
        assert_eq!(&paths[..2], ["blobs/", "blobs/sha256/"]);
        assert_eq!(&paths[9..], ["index.json", "oci-layout"]);
        assert!(entries
            .iter()
            .all(|e| e.2 == 1_700_000_000 && e.3 == 0 && e.4 == 0));
        // Every blob is named by its digest.
        for e in &entries[2..9] {
            assert_eq!(format!("blobs/{}", sha256(&e.5).replace(':', "/")), e.0);
        }

        // index.json: the image index, named.
        let layout: Value = serde_json::from_slice(&entries[9].5).unwrap();
        let [named] = layout["manifests"].as_array().unwrap().as_slice() else {
            panic!("{layout}");
        };
        assert_eq!(named["mediaType"], INDEX_MEDIA_TYPE);
        assert_eq!(named["digest"], a.index_digest.as_str());
        assert_eq!(
            named["annotations"]["io.containerd.image.name"],
            "docker.io/library/tool:1"
        );
        assert_eq!(
            named["annotations"]["org.opencontainers.image.ref.name"],
            "1"
        );
        assert!(named.get("platform").is_none());

        // The image index: one manifest per platform, in order.
        let index: Value = serde_json::from_slice(blob(&entries, &a.index_digest)).unwrap();
        let listed = index["manifests"].as_array().unwrap();
        assert_eq!(listed.len(), 2);
        for ((m, arch), written) in listed.iter().zip(["amd64", "arm64"]).zip(&a.manifests) {
            assert_eq!(m["mediaType"], MANIFEST_MEDIA_TYPE);
            assert_eq!(m["platform"], json!({"architecture": arch, "os": "linux"}));
            assert_eq!(m["digest"], written.manifest_digest.as_str());
            assert_eq!(written.architecture, arch);
            let manifest: Value =
                serde_json::from_slice(blob(&entries, &written.manifest_digest)).unwrap();
            let config: Value = serde_json::from_slice(blob(
                &entries,
                manifest["config"]["digest"].as_str().unwrap(),
            ))
            .unwrap();
            assert_eq!(config["architecture"], arch);
            assert_eq!(config["rootfs"]["diff_ids"], json!([written.diff_id]));
            assert_eq!(
                manifest["layers"][0]["digest"],
                written.layer_digest.as_str()
            );

            // The layer's gzip header has no time; its files are the platform's.
            let layer = blob(&entries, &written.layer_digest);
            assert_eq!(&layer[4..8], [0, 0, 0, 0]);
            let mut tar = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(layer), &mut tar).unwrap();
            assert_eq!(sha256(&tar), written.diff_id);
            let inner = self::entries(&tar);
            let names: Vec<(&str, u32)> = inner.iter().map(|e| (e.0.as_str(), e.1)).collect();
            assert_eq!(
                names,
                [
                    ("lib", 0o777),
                    ("usr/", 0o755),
                    ("usr/local/", 0o755),
                    ("usr/local/bin/", 0o755),
                    ("usr/local/bin/tool", 0o755),
                ]
            );
            assert_eq!(inner[4].5, format!("#!binary for {arch}").into_bytes());
        }
    }

    #[test]
    fn another_time_gives_another_digest() {
        let (platforms, names) = sample();
        let dir = tempfile::tempdir().unwrap();
        let a = write_archive(&platforms, &names, 1, &dir.path().join("1.tar")).unwrap();
        let b = write_archive(&platforms, &names, 2, &dir.path().join("2.tar")).unwrap();
        assert_ne!(a.index_digest, b.index_digest);
        assert!(write_archive(&[], &names, 1, &dir.path().join("3.tar")).is_err());
    }
}
