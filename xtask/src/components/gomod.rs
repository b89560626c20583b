//! Building Go programs from their modules with the `go` command, into the
//! tools cache, once per version.
//!
//! A module is consumed the usual way: a generated module of our own
//! requires it (and, for `k8s.io/kubernetes`, replaces each of its staging
//! modules with the published version, since a module download does not
//! honour the `=> ./staging/...` lines of its go.mod), a `tools.go` imports
//! the programs' packages, `go mod tidy` resolves the rest, and one `go
//! build` compiles every program of the set (their packages are shared, and
//! one build runs their compiles and links side by side). The programs land
//! in `<cache>/<set>-<version>/` with a `.recipe` file saying how they were
//! built: a folder whose recipe differs (another Go, other flags) is built
//! again, one that matches is used as it is. A lock file keeps two xtask
//! processes from building the same set at once.
//!
//! The go command's build and module caches are those of one `components`
//! run ([`super::gocaches`]), removed after it.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::gocaches::GoCaches;
use crate::util::{lock_exclusive, output, replace_dir, say};

/// One set of programs from one module at one version.
pub struct GoSet {
    /// The cache folder's name without the version (`kubernetes`).
    pub name: &'static str,
    /// The module path (`k8s.io/kubernetes`).
    pub module: &'static str,
    pub version: &'static str,
    /// (package path, binary name) of each program.
    pub programs: Vec<(&'static str, &'static str)>,
    /// For `k8s.io/kubernetes`: the version its staging modules are
    /// replaced with (`v0.37.2` for `v1.37.2`).
    pub staging: Option<String>,
    /// `-X` assignments for the linker (a version the program reports).
    pub ldflags_x: Vec<String>,
}

impl GoSet {
    /// Where the programs are (whether built or not).
    pub fn dir(&self, cache: &Path) -> PathBuf {
        cache.join(format!("{}-{}", self.name, self.version))
    }

    /// Every input of the build, one per line: a folder built from other
    /// inputs is built again.
    fn recipe(&self, go_version: &str) -> String {
        let mut text = format!(
            "module {} {}\n{go_version}\nCGO_ENABLED=0 -trimpath -ldflags={}\n",
            self.module,
            self.version,
            self.ldflags()
        );
        if let Some(staging) = &self.staging {
            text.push_str(&format!("staging {staging}\n"));
        }
        for (package, binary) in &self.programs {
            text.push_str(&format!("{package} -> {binary}\n"));
        }
        text
    }

    /// Stripped (`-s -w`: the unstripped kube-apiserver is 170 MB), with
    /// the version assignments.
    fn ldflags(&self) -> String {
        let mut flags = vec!["-s".to_string(), "-w".to_string()];
        for x in &self.ldflags_x {
            flags.push(format!("-X {x}"));
        }
        flags.join(" ")
    }

    /// "kubernetes v1.37.2".
    fn label(&self) -> String {
        format!("{} {}", self.name, self.version)
    }
}

/// The programs of `set`, built first when the cache has no folder built
/// by this recipe (with `caches` for the go command).
pub fn ensure(set: &GoSet, cache: &Path, caches: &GoCaches) -> anyhow::Result<PathBuf> {
    let go_version = go_version()?;
    let dir = set.dir(cache);
    let recipe = set.recipe(&go_version);
    if is_built(&dir, set, &recipe) {
        return Ok(dir);
    }
    let _lock = lock_exclusive(
        &cache.join(format!(".{}-{}.lock", set.name, set.version)),
        || {
            format!(
                "go: another xtask is building {}; waiting for it",
                set.label()
            )
        },
    )?;
    // Built by the other process meanwhile.
    if is_built(&dir, set, &recipe) {
        return Ok(dir);
    }
    remove_stale_work(set, cache)?;
    caches.prepare()?;
    build(set, cache, &dir, &recipe, caches)?;
    Ok(dir)
}

/// Work folders of this set that an interrupted build left (nobody else
/// builds it while the lock is held).
fn remove_stale_work(set: &GoSet, cache: &Path) -> anyhow::Result<()> {
    let prefix = work_prefix(set);
    for entry in fs::read_dir(cache).with_context(|| format!("listing {}", cache.display()))? {
        let path = entry?.path();
        let stale = path.is_dir()
            && path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix));
        if stale {
            fs::remove_dir_all(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// `.kubernetes-v1.37.2-`: a work folder's name starts with its set's.
fn work_prefix(set: &GoSet) -> String {
    format!(".{}-{}-", set.name, set.version)
}

fn is_built(dir: &Path, set: &GoSet, recipe: &str) -> bool {
    fs::read_to_string(dir.join(".recipe")).is_ok_and(|r| r == recipe)
        && set
            .programs
            .iter()
            .all(|(_, binary)| dir.join(binary).is_file())
}

fn build(
    set: &GoSet,
    cache: &Path,
    dir: &Path,
    recipe: &str,
    caches: &GoCaches,
) -> anyhow::Result<()> {
    let started = Instant::now();
    say(format!(
        "go: building {} from the Go module proxy into {} (once per version; minutes)",
        set.label(),
        dir.display()
    ));
    // Generated next to the final folder and renamed: never half a set.
    let work = tempfile::Builder::new()
        .prefix(&work_prefix(set))
        .tempdir_in(cache)
        .with_context(|| format!("creating a work dir in {}", cache.display()))?;
    let module_dir = work.path().join("module");
    let out = work.path().join("out");
    fs::create_dir_all(&module_dir)?;
    fs::create_dir_all(&out)?;
    write_module(set, &module_dir, caches)?;
    let mut tidy = go(&module_dir, caches);
    tidy.args(["mod", "tidy"]);
    stream(set, "go mod tidy", tidy, started)?;

    let mut build = go(&module_dir, caches);
    build
        .args(["build", "-v", "-trimpath", "-ldflags"])
        .arg(set.ldflags());
    // One program: `-o` names the file. Several: `-o DIR` (which exists)
    // names each after its package, renamed below.
    match set.programs.as_slice() {
        [(package, binary)] => {
            build.arg("-o").arg(out.join(binary)).arg(package);
        }
        programs => {
            build
                .arg("-o")
                .arg(&out)
                .args(programs.iter().map(|(package, _)| *package));
        }
    }
    stream(set, "go build", build, started)?;
    for (package, binary) in &set.programs {
        let default = out.join(default_binary_name(package));
        let wanted = out.join(binary);
        if !wanted.is_file() {
            fs::rename(&default, &wanted).with_context(|| {
                format!("renaming {} to {}", default.display(), wanted.display())
            })?;
        }
    }
    fs::write(out.join(".recipe"), recipe)?;
    replace_dir(&out, dir)?;
    say(format!(
        "go: built {} in {}",
        set.label(),
        minutes(started.elapsed())
    ));
    Ok(())
}

/// go.mod (the module required, staging replaced) and tools.go (the
/// programs' packages imported) of the generated module.
fn write_module(set: &GoSet, dir: &Path, caches: &GoCaches) -> anyhow::Result<()> {
    let mut go_mod = format!(
        "// Generated by cargo xtask: builds {} {}.\nmodule volume-health.local/build/{}\n\ngo 1.26.0\n\nrequire {} {}\n",
        set.module, set.version, set.name, set.module, set.version
    );
    if let Some(staging) = &set.staging {
        let upstream = downloaded_go_mod(set, caches)?;
        let modules = staging_modules(&upstream);
        if modules.is_empty() {
            bail!(
                "{} {}'s go.mod replaces no ./staging modules; is it k8s.io/kubernetes?",
                set.module,
                set.version
            );
        }
        go_mod.push_str("\nreplace (\n");
        for module in modules {
            go_mod.push_str(&format!("\t{module} => {module} {staging}\n"));
        }
        go_mod.push_str(")\n");
    }
    fs::write(dir.join("go.mod"), go_mod)?;
    let mut tools = String::from("//go:build tools\n\npackage tools\n\nimport (\n");
    for (package, _) in &set.programs {
        tools.push_str(&format!("\t_ \"{package}\"\n"));
    }
    tools.push_str(")\n");
    fs::write(dir.join("tools.go"), tools)?;
    Ok(())
}

/// The module's own go.mod, as the proxy serves it.
fn downloaded_go_mod(set: &GoSet, caches: &GoCaches) -> anyhow::Result<String> {
    let json = output(
        go(Path::new("/"), caches)
            .args(["mod", "download", "-json"])
            .arg(format!("{}@{}", set.module, set.version)),
    )?;
    let answer: serde_json::Value = serde_json::from_str(&json)
        .with_context(|| format!("`go mod download -json` answered {json}"))?;
    let path = answer["GoMod"]
        .as_str()
        .with_context(|| format!("no GoMod in `go mod download -json`: {json}"))?;
    fs::read_to_string(path).with_context(|| format!("reading {path}"))
}

/// The modules a go.mod replaces with a local `./staging/...` folder.
pub fn staging_modules(go_mod: &str) -> Vec<&str> {
    go_mod
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once("=>")?;
            right
                .trim()
                .starts_with("./staging/")
                .then(|| left.trim().trim_start_matches("replace").trim())
        })
        .filter(|m| !m.is_empty())
        .collect()
}

/// The file `go build -o DIR/` writes for `package`: its last element, or
/// the one before a major version suffix (`.../server/v3` -> `server`).
pub fn default_binary_name(package: &str) -> &str {
    let mut parts = package.rsplit('/');
    let last = parts.next().unwrap_or(package);
    let is_major =
        last.len() > 1 && last.starts_with('v') && last[1..].chars().all(|c| c.is_ascii_digit());
    match (is_major, parts.next()) {
        (true, Some(before)) => before,
        _ => last,
    }
}

/// A go command in `dir`: the local toolchain only (no download of
/// another Go), modules resolved from go.mod, static programs, the run's
/// own caches (a module cache it can delete).
fn go(dir: &Path, caches: &GoCaches) -> Command {
    let mut cmd = Command::new("go");
    cmd.current_dir(dir)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod -modcacherw")
        .env("CGO_ENABLED", "0")
        .stdin(Stdio::null());
    caches.apply(&mut cmd);
    cmd
}

/// "go1.26.8", or why there is no usable go command.
fn go_version() -> anyhow::Result<String> {
    let text = output(Command::new("go").args(["env", "GOVERSION"])).context(
        "the Kubernetes and CSI components are built from Go modules and need Go 1.26 or \
         newer on PATH (https://go.dev/dl; Debian's golang package is too old)",
    )?;
    let version = text.trim().to_string();
    let minor = version
        .strip_prefix("go1.")
        .and_then(|rest| rest.split(['.', 'r', 'b']).next())
        .and_then(|m| m.parse::<u32>().ok());
    match minor {
        Some(m) if m >= 26 => Ok(version),
        _ => bail!("{version} is too old: the Kubernetes 1.37 modules need Go 1.26 or newer"),
    }
}

/// Runs a go command, printing a progress line every half minute (how many
/// packages were compiled or modules downloaded so far) and, when it
/// fails, its last lines.
fn stream(set: &GoSet, what: &str, mut cmd: Command, started: Instant) -> anyhow::Result<()> {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what} for {}", set.label()))?;
    let stderr = child.stderr.take().context("the go command's stderr")?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let reader = {
        let seen = Arc::clone(&seen);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut s) = seen.lock() {
                    s.add(line);
                }
            }
        })
    };
    let mut last_report = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if last_report.elapsed() >= Duration::from_secs(30) {
            last_report = Instant::now();
            let s = seen.lock().map(|s| s.summary()).unwrap_or_default();
            say(format!(
                "go: {} {what}: {s} ({})",
                set.label(),
                minutes(started.elapsed())
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = reader.join();
    if !status.success() {
        let tail = seen.lock().map(|s| s.tail.join("\n")).unwrap_or_default();
        bail!("{what} for {} failed with {status}:\n{tail}", set.label());
    }
    Ok(())
}

/// What a go command said so far.
#[derive(Default)]
struct Seen {
    packages: usize,
    downloads: usize,
    tail: Vec<String>,
}

impl Seen {
    const TAIL: usize = 40;

    fn add(&mut self, line: String) {
        if line.starts_with("go: downloading ") {
            self.downloads += 1;
        } else if !line.contains(' ') && !line.starts_with('#') {
            // `go build -v` names each package as it is compiled.
            self.packages += 1;
        }
        if self.tail.len() == Self::TAIL {
            self.tail.remove(0);
        }
        self.tail.push(line);
    }

    fn summary(&self) -> String {
        match (self.downloads, self.packages) {
            (0, packages) => format!("{packages} packages compiled"),
            (downloads, _) => format!("{downloads} modules downloaded"),
        }
    }
}

/// "7 min 50 s".
pub fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    match s / 60 {
        0 => format!("{s} s"),
        m => format!("{m} min {} s", s % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_modules_are_the_local_replacements_only() {
        let go_mod =
            "module k8s.io/kubernetes\n\ngo 1.26.0\n\nrequire (\n\tk8s.io/api v0.0.0\n)\n\n\
                      replace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\
                      \tk8s.io/client-go => ./staging/src/k8s.io/client-go\n\
                      \tgithub.com/x/y => github.com/x/y v1.2.3\n)\n\
                      replace k8s.io/kubelet => ./staging/src/k8s.io/kubelet\n";
        assert_eq!(
            staging_modules(go_mod),
            ["k8s.io/api", "k8s.io/client-go", "k8s.io/kubelet"]
        );
    }

    #[test]
    fn go_build_names_a_major_version_package_after_its_parent() {
        assert_eq!(
            default_binary_name("k8s.io/kubernetes/cmd/kubelet"),
            "kubelet"
        );
        assert_eq!(default_binary_name("go.etcd.io/etcd/server/v3"), "server");
        assert_eq!(
            default_binary_name("github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity"),
            "csi-sanity"
        );
        assert_eq!(default_binary_name("example.com/vendor"), "vendor");
    }

    #[test]
    fn the_recipe_changes_with_every_input() {
        let set = |version: &'static str, x: &str| GoSet {
            name: "kubernetes",
            module: "k8s.io/kubernetes",
            version,
            programs: vec![("k8s.io/kubernetes/cmd/kubelet", "kubelet")],
            staging: Some("v0.37.2".into()),
            ldflags_x: vec![x.to_string()],
        };
        let base = set("v1.37.2", "a=b").recipe("go1.26.8");
        assert_eq!(
            base,
            "module k8s.io/kubernetes v1.37.2\ngo1.26.8\nCGO_ENABLED=0 -trimpath -ldflags=-s -w -X a=b\n\
             staging v0.37.2\nk8s.io/kubernetes/cmd/kubelet -> kubelet\n"
        );
        assert_ne!(set("v1.37.1", "a=b").recipe("go1.26.8"), base);
        assert_ne!(set("v1.37.2", "a=c").recipe("go1.26.8"), base);
        assert_ne!(set("v1.37.2", "a=b").recipe("go1.26.9"), base);
    }

    #[test]
    fn progress_counts_packages_and_downloads() {
        let mut seen = Seen::default();
        seen.add("k8s.io/api/core/v1".into());
        seen.add("# k8s.io/broken".into());
        seen.add("k8s.io/broken/x.go:1:1: syntax error".into());
        assert_eq!(seen.summary(), "1 packages compiled");
        seen.add("go: downloading k8s.io/api v0.37.2".into());
        assert_eq!(seen.summary(), "1 modules downloaded");
        for i in 0..50 {
            seen.add(format!("p{i}"));
        }
        assert_eq!(seen.tail.len(), Seen::TAIL);
        assert_eq!(seen.tail.last().map(String::as_str), Some("p49"));
    }

    #[test]
    fn durations_read_as_minutes() {
        assert_eq!(minutes(Duration::from_secs(42)), "42 s");
        assert_eq!(minutes(Duration::from_secs(470)), "7 min 50 s");
    }
}
