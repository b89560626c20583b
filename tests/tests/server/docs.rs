//! Documentation that cannot rot: README.md and every page under docs/
//! are checked against the repository and the code.
//!
//! - every relative link resolves to a file or folder, and every `#anchor`
//!   to a heading of its page (GitHub's slugs, doc_pages::markdown);
//! - every citation of a page in the code's comments (and strings) names a
//!   page that exists and headings it has (doc_pages::citations);
//! - the CLI reference lists exactly the long flags of every command of
//!   the built `health-agent` and `health-controller` (their `--help`,
//!   which `cargo xtask test` builds: HEALTH_AGENT_BIN, HEALTH_CONTROLLER_BIN);
//! - the metrics reference lists exactly the families the code registers,
//!   with their types and labels (the registries encoded, as
//!   deploy_monitoring.rs reads them);
//! - every path a page names exists, and every measured figure it states
//!   is one docs/benchmarks.md shows (doc_pages::figures).
//!
//! The runbook pages are checked against the chart's alerts with the other
//! monitoring checks, in deploy_monitoring.rs. Here, beside the other tests
//! that need the built binaries (`tests/`), because the CLI check runs them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::doc_pages;
// The code's registries as deploy_monitoring.rs reads them.
use crate::monitoring::exported;

use doc_pages::citations::{citations, fold};
use doc_pages::figures::figures;
use doc_pages::help::{commands, help, long_flags};
use doc_pages::markdown::{self, Page};
use health_tests::agent::{agent_bin, controller_bin};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Files under `dir` (recursively), skipping directories named in `skip`.
fn files(dir: &Path, skip: &[&str], out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = entry.file_name().into_string().unwrap_or_default();
        if entry.file_type().unwrap().is_dir() {
            if !skip.contains(&name.as_str()) {
                files(&path, skip, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// README.md and every Markdown page under docs/, relative to the root.
fn doc_pages() -> Vec<PathBuf> {
    let root = repo_root();
    let mut all = vec![];
    files(&root.join("docs"), &[], &mut all);
    let mut pages: Vec<PathBuf> = all
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(&root).unwrap().to_path_buf())
        .collect();
    pages.push(PathBuf::from("README.md"));
    pages.sort();
    pages
}

/// Parsed pages, by path relative to the root; any Markdown file a link
/// reaches is parsed on demand.
struct Pages {
    root: PathBuf,
    parsed: BTreeMap<PathBuf, Page>,
}

impl Pages {
    fn new() -> Self {
        Pages {
            root: repo_root(),
            parsed: BTreeMap::new(),
        }
    }

    fn get(&mut self, rel: &Path) -> &Page {
        let path = self.root.join(rel);
        self.parsed
            .entry(rel.to_path_buf())
            .or_insert_with(|| markdown::parse(&read(&path)))
    }
}

/// `base/rel` with `.` and `..` resolved lexically; None when it leaves the
/// repository.
fn resolve(base: &Path, rel: &str) -> Option<PathBuf> {
    let mut out = base.to_path_buf();
    for part in rel.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if !out.pop() {
                    return None;
                }
            }
            p => out.push(p),
        }
    }
    Some(out)
}

#[test]
fn every_link_and_anchor_in_the_docs_resolves() {
    let mut pages = Pages::new();
    let mut problems = vec![];
    let mut checked = 0;
    for page in doc_pages() {
        let links = pages.get(&page).links.clone();
        let dir = page.parent().unwrap().to_path_buf();
        for link in links.iter().filter(|l| !l.is_external()) {
            let at = format!("{}:{}: {}", page.display(), link.line, link.target);
            let (path, anchor) = link.split();
            let target = if path.is_empty() {
                Some(page.clone())
            } else {
                resolve(&dir, path)
            };
            let Some(target) = target else {
                problems.push(format!("{at}: leaves the repository"));
                continue;
            };
            if !pages.root.join(&target).exists() {
                problems.push(format!("{at}: no {}", target.display()));
                continue;
            }
            checked += 1;
            let Some(anchor) = anchor else { continue };
            if target.extension().is_none_or(|e| e != "md") {
                problems.push(format!("{at}: an anchor into a page that is not Markdown"));
                continue;
            }
            if !pages.get(&target).anchors.contains_key(anchor) {
                let known: Vec<&String> = pages.get(&target).anchors.keys().collect();
                problems.push(format!(
                    "{at}: no heading #{anchor} in {} (it has {known:?})",
                    target.display()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} broken links:\n{}",
        problems.len(),
        problems.join("\n")
    );
    // Something was checked: the pages link to each other.
    assert!(checked > 100, "only {checked} links checked");
}

/// Source files whose comments may cite the docs; not this suite's own,
/// whose examples are made up.
fn sources() -> Vec<PathBuf> {
    let root = repo_root();
    let mut all = vec![];
    files(
        &root,
        &["target", ".git", "docs", "corpus", "node_modules"],
        &mut all,
    );
    let mut out: Vec<PathBuf> = all
        .into_iter()
        .filter(|p| {
            let ext = p.extension().map(|e| e.to_string_lossy().to_string());
            matches!(
                ext.as_deref(),
                Some("rs" | "yaml" | "yml" | "sh" | "tpl" | "txt" | "toml" | "json")
            ) || p
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|d| d == ".ci")
        })
        .filter(|p| {
            !p.ends_with("tests/tests/server/docs.rs")
                && !p.parent().unwrap().ends_with("doc_pages")
        })
        .collect();
    out.sort();
    out
}

/// Whether `cited` names `heading`: all of it, or the part before its
/// qualifier (`"Scale"` for "Scale: the fleet's footprint ...",
/// `"Kernel error to Kubernetes Event"` for "... Event (cluster mode)").
fn names(cited: &str, heading: &str) -> bool {
    heading == cited
        || heading
            .strip_prefix(cited)
            .is_some_and(|rest| rest.starts_with(" (") || rest.starts_with(':'))
}

#[test]
fn every_documentation_citation_in_the_code_names_a_page_and_heading_that_exist() {
    let root = repo_root();
    let mut pages = Pages::new();
    let mut problems = vec![];
    let mut cited = 0;
    for file in sources() {
        let rel = file.strip_prefix(&root).unwrap().display().to_string();
        let text = read(&file);
        // BENCHMARKS.md moved to docs/benchmarks.md.
        if text.contains("BENCHMARKS") {
            problems.push(format!("{rel}: names BENCHMARKS (now docs/benchmarks.md)"));
        }
        for c in citations(&fold(&text)) {
            let page = PathBuf::from(if c.page == "README" {
                "README.md"
            } else {
                &c.page
            });
            if c.page == "README" {
                problems.push(format!(
                    "{rel}: cites README {:?}: name the page, README.md or docs/...",
                    c.headings
                ));
            }
            if !root.join(&page).is_file() {
                problems.push(format!(
                    "{rel}: cites {}, which does not exist",
                    page.display()
                ));
                continue;
            }
            cited += 1;
            for heading in &c.headings {
                if !pages.get(&page).headings.iter().any(|h| names(heading, h)) {
                    problems.push(format!(
                        "{rel}: cites {} {heading:?}, no such heading",
                        page.display()
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} stale citations:\n{}",
        problems.len(),
        problems.join("\n")
    );
    assert!(cited > 20, "only {cited} citations found");
}

/// The long flags documented per `## ` section of a reference page: table
/// rows whose first cell is a flag (`| \`--name VALUE\` | ...`).
fn documented_flags(page: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in page.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = markdown::rendered(h);
            out.entry(section.clone()).or_default();
        } else if let Some(cell) = line.strip_prefix("| `--") {
            let name: String = cell
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            let fresh = out.entry(section.clone()).or_default().insert(name.clone());
            assert!(fresh, "--{name} twice in section {section:?}");
        }
    }
    out
}

#[test]
fn the_cli_reference_lists_exactly_the_flags_of_every_command() {
    let page = read(&repo_root().join("docs/reference/cli.md"));
    let documented = documented_flags(&page);
    let agent = agent_bin().unwrap();
    let controller = controller_bin().unwrap();
    let top = help(&agent, &[]);
    let global = long_flags(&top);
    assert_eq!(
        documented.get("health-agent"),
        Some(&global),
        "section health-agent: the global options"
    );
    let subcommands = commands(&top);
    assert_eq!(
        subcommands,
        ["watch", "volumes", "run", "uninstall", "csi-proxy"]
    );
    let mut problems = vec![];
    for sub in &subcommands {
        let section = format!("health-agent {sub}");
        let have = long_flags(&help(&agent, &[sub]));
        let Some(doc) = documented.get(&section) else {
            problems.push(format!("no section {section:?}"));
            continue;
        };
        let doc: BTreeSet<String> = doc.union(&global).cloned().collect();
        for missing in have.difference(&doc) {
            problems.push(format!("{section}: --{missing} is not documented"));
        }
        for gone in doc.difference(&have) {
            problems.push(format!("{section}: --{gone} is documented but not a flag"));
        }
    }
    let have = long_flags(&help(&controller, &[]));
    let doc = documented
        .get("health-controller")
        .cloned()
        .unwrap_or_default();
    for missing in have.difference(&doc) {
        problems.push(format!("health-controller: --{missing} is not documented"));
    }
    for gone in doc.difference(&have) {
        problems.push(format!(
            "health-controller: --{gone} is documented but not a flag"
        ));
    }
    // Every section of flags is a command.
    for (section, flags) in &documented {
        let known = section == "health-agent"
            || section == "health-controller"
            || subcommands
                .iter()
                .any(|s| *section == format!("health-agent {s}"));
        if !flags.is_empty() && !known {
            problems.push(format!("section {section:?} documents flags of no command"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A family as the reference states it: type and own labels.
type Families = BTreeMap<String, (String, BTreeSet<String>)>;

/// The families of an OpenMetrics text, by the name their samples carry
/// (counters with `_total`, histograms by the family's name, their `le`
/// left out).
fn families(text: &str) -> Families {
    let series = exported::series(text, "docs");
    let mut out = Families::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (family, kind) = rest.split_once(' ').unwrap();
        let (name, sample) = match kind {
            "counter" => (format!("{family}_total"), format!("{family}_total")),
            "histogram" => (family.to_string(), format!("{family}_bucket")),
            _ => (family.to_string(), family.to_string()),
        };
        let mut labels = series[&sample].clone();
        labels.remove("le");
        out.insert(name, (kind.to_string(), labels));
    }
    out
}

/// The families of the metrics reference's tables: `| \`name\` | type | \`label\`, ... | meaning |`.
fn documented_families(page: &str) -> Families {
    let mut out = Families::new();
    for line in page.lines().filter(|l| l.starts_with("| `volume_health_")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 6, "a metric row of four cells: {line}");
        let cells = &cells[1..5];
        let name = cells[0].trim_matches('`').to_string();
        let labels = cells[2]
            .split(", ")
            .map(|l| l.trim().trim_matches('`').to_string())
            .filter(|l| !l.is_empty())
            .collect();
        let previous = out.insert(name.clone(), (cells[1].to_string(), labels));
        assert!(previous.is_none(), "{name} documented twice");
    }
    out
}

#[test]
fn the_metrics_reference_lists_exactly_the_families_the_code_registers() {
    let mut code = families(&exported::agent_exposition());
    code.extend(families(&exported::controller_exposition()));
    let page = read(&repo_root().join("docs/reference/metrics.md"));
    let documented = documented_families(&page);
    let mut problems = vec![];
    for (name, family) in &code {
        match documented.get(name) {
            None => problems.push(format!("{name} {family:?} is not documented")),
            Some(doc) if doc != family => {
                problems.push(format!("{name}: the code has {family:?}, the page {doc:?}"))
            }
            Some(_) => {}
        }
    }
    for name in documented.keys().filter(|n| !code.contains_key(*n)) {
        problems.push(format!("{name} is documented but not registered"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // 24 agent families and 11 controller families.
    assert_eq!(code.len(), 35, "{:?}", code.keys());
}

/// The README says the project is Apache-2.0: LICENSE is that license's
/// text, and every package says so, but the kernel programs, which the
/// kernel lets call its GPL-only helpers only under a GPL-compatible
/// license (`MIT OR GPL-2.0-only`; the object's `license` section says
/// `Dual MIT/GPL`).
#[test]
fn the_license_the_readme_names_is_shipped_and_every_package_declares_it() {
    let root = repo_root();
    let readme = read(&root.join("README.md"));
    assert!(
        readme.contains("Licensed under Apache-2.0 ([LICENSE](LICENSE))"),
        "the README's license line"
    );
    let text = read(&root.join("LICENSE"));
    let head: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(2)
        .collect();
    assert_eq!(head, ["Apache License", "Version 2.0, January 2004"]);
    let mut manifests = Vec::new();
    files(&root, &["target", ".git", "node_modules"], &mut manifests);
    manifests.retain(|p| p.file_name().is_some_and(|n| n == "Cargo.toml"));
    assert!(manifests.len() >= 15, "{manifests:?}");
    for manifest in manifests {
        let text = read(&manifest);
        let declared: Vec<&str> = text.lines().filter(|l| l.starts_with("license")).collect();
        let own = manifest.strip_prefix(&root).unwrap().display().to_string();
        let want = match own.as_str() {
            "health-ebpf/Cargo.toml" => "license = \"MIT OR GPL-2.0-only\"",
            "Cargo.toml" | "fuzz/Cargo.toml" => "license = \"Apache-2.0\"",
            _ => "license.workspace = true",
        };
        assert_eq!(declared, [want], "{own}");
    }
}

/// Every repository path a page names in backticks (`health-node/src/...`,
/// `tests/tests/guest/nfs.rs`, `deploy/...`) exists: files move, and a
/// page that sends a reader to one that is gone is wrong. A path is a code
/// span that starts with one of the repository's top-level directories and
/// holds no space, placeholder or pattern; a `:line` or `#anchor` suffix
/// is dropped.
#[test]
fn every_repository_path_the_docs_name_exists() {
    let root = repo_root();
    let tops: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "target" && n != ".git")
        .collect();
    let mut missing = Vec::new();
    let mut named = 0;
    for page in doc_pages() {
        // Fenced blocks are commands and output, not references.
        let mut fenced = false;
        let text: String = read(&root.join(&page))
            .lines()
            .filter(|l| {
                if l.trim_start().starts_with("```") {
                    fenced = !fenced;
                    return false;
                }
                !fenced
            })
            .collect::<Vec<_>>()
            .join("\n");
        for (i, span) in text.split('`').enumerate() {
            if i % 2 == 0 || span.contains(char::is_whitespace) {
                continue;
            }
            if span.contains(['<', '>', '*', '{', '}', '$', '…']) || span.contains("...") {
                continue;
            }
            let Some((top, _)) = span.split_once('/') else {
                continue;
            };
            if !tops.iter().any(|t| t == top) {
                continue;
            }
            let path = span
                .split(['#', ':'])
                .next()
                .unwrap_or(span)
                .trim_end_matches('/');
            named += 1;
            if !root.join(path).exists() {
                missing.push(format!("{}: `{span}`", page.display()));
            }
        }
    }
    assert!(named > 100, "only {named} paths found: the scan is broken");
    assert!(
        missing.is_empty(),
        "paths that do not exist:\n{}",
        missing.join("\n")
    );
}

/// Every measured figure a page states (doc_pages::figures: a number with
/// `ns`, `µs`, `MB`, `KB` or `CPU-s`, in prose) is one docs/benchmarks.md
/// shows, rounded as the page writes it: a figure nobody measured, or one
/// measured again and changed, fails here until the page says what the
/// benchmarks do.
#[test]
fn every_measured_figure_in_the_docs_is_one_the_benchmarks_show() {
    let root = repo_root();
    let bench = PathBuf::from("docs/benchmarks.md");
    let shown = figures(&read(&root.join(&bench)));
    assert!(
        shown.len() > 300,
        "only {} figures in {}",
        shown.len(),
        bench.display()
    );
    let mut stated = 0;
    let mut unbacked = Vec::new();
    for page in doc_pages().into_iter().filter(|p| *p != bench) {
        for f in figures(&read(&root.join(&page))) {
            stated += 1;
            if !shown.iter().any(|s| f.is(s)) {
                unbacked.push(format!(
                    "{}: {} {} in \"{}\"",
                    page.display(),
                    f.number,
                    f.unit,
                    f.context
                ));
            }
        }
    }
    assert!(
        stated >= 30,
        "only {stated} figures found: the scan is broken"
    );
    assert!(
        unbacked.is_empty(),
        "figures docs/benchmarks.md does not show:\n{}",
        unbacked.join("\n")
    );
}

/// The quoted value of `const NAME: &str = "..."` in a source file.
fn str_const(path: &str, name: &str) -> String {
    let text = read(&repo_root().join(path));
    let start = format!("const {name}: &str = \"");
    let at = text
        .find(&start)
        .unwrap_or_else(|| panic!("{path} has no {start}"));
    let rest = &text[at + start.len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

/// The row of the compatibility table whose first cell is `first`.
fn compatibility_row(page: &str, first: &str) -> String {
    page.lines()
        .find(|l| l.starts_with(&format!("| {first} |")))
        .unwrap_or_else(|| panic!("docs/compatibility.md has no row {first:?}"))
        .to_string()
}

/// docs/compatibility.md names the versions the project builds, boots and
/// ships: the API servers and kubelet `cargo xtask components` builds, the
/// kernels `cargo xtask vm` boots, the architectures the DaemonSet selects,
/// and one version number for the crates, the chart and the image.
#[test]
fn the_compatibility_table_names_what_the_project_tests_and_ships() {
    let page = read(&repo_root().join("docs/compatibility.md"));
    let newest = str_const("xtask/src/components/mod.rs", "KUBERNETES");
    let oldest = str_const("xtask/src/components/mod.rs", "KUBERNETES_OLDEST");
    let servers = compatibility_row(&page, "Kubernetes API server");
    assert!(
        servers.contains(&format!("{oldest} and {newest}")),
        "{servers}"
    );
    let minor = |v: &str| {
        v.trim_start_matches('v')
            .rsplit_once('.')
            .unwrap()
            .0
            .to_string()
    };
    assert!(
        servers.contains(&format!("| {} and newer |", minor(&oldest))),
        "{servers}"
    );
    let chart = read(&repo_root().join("deploy/helm/volume-health/Chart.yaml"));
    assert!(
        chart.contains(&format!("kubeVersion: \">={}.0-0\"", minor(&oldest))),
        "the chart's kubeVersion is not the oldest tested"
    );
    let kubelet = compatibility_row(&page, "kubelet");
    assert!(kubelet.contains(&format!("| {newest} (")), "{kubelet}");

    let kernels_rs = read(&repo_root().join("xtask/src/vm/kernels.rs"));
    let booted: Vec<&str> = kernels_rs
        .lines()
        .filter_map(|l| l.trim().strip_prefix("#[value(name = \""))
        .map(|l| l.trim_end_matches("\")]"))
        .collect();
    assert_eq!(booted, ["5.10", "6.1", "6.12"]);
    let kernels = compatibility_row(&page, "Linux kernel");
    assert!(
        kernels.contains("| 5.10, 6.1, 6.12 (Debian's, in QEMU guests"),
        "{kernels}"
    );

    let daemon_set = read(&repo_root().join("deploy/daemonset.yaml"));
    let arch = daemon_set
        .lines()
        .skip_while(|l| !l.contains("key: kubernetes.io/arch"))
        .find_map(|l| l.trim().strip_prefix("values: ["))
        .and_then(|l| l.strip_suffix(']'))
        .expect("the DaemonSet selects its architectures");
    assert_eq!(arch, "amd64, arm64");
    let architecture = compatibility_row(&page, "architecture");
    assert!(
        architecture.starts_with(&format!("| architecture | {arch} | {arch} (")),
        "{architecture}"
    );

    let helm =
        std::process::Command::new(health_tests::k8s_tools::find("HELM_BIN", "helm").unwrap())
            .args(["version", "--short"])
            .output()
            .unwrap();
    let helm = String::from_utf8_lossy(&helm.stdout);
    let helm = helm.trim().split('+').next().unwrap();
    let row = compatibility_row(&page, "Helm");
    assert!(
        row.contains(&format!("| {helm}, the `helm` of")),
        "{row} (helm {helm})"
    );

    // One version: the workspace's (every crate's), the chart's, its
    // appVersion and the image tag it installs.
    let cargo = read(&repo_root().join("Cargo.toml"));
    let version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .map(|v| v.trim_end_matches('"'))
        .expect("the workspace's version");
    let values = read(&repo_root().join("deploy/helm/volume-health/values.yaml"));
    for (what, line) in [
        ("Chart.yaml version", format!("\nversion: {version}\n")),
        (
            "Chart.yaml appVersion",
            format!("\nappVersion: \"{version}\"\n"),
        ),
    ] {
        assert!(chart.contains(&line), "{what} is not {version}");
    }
    assert!(
        values.contains(&format!("  tag: \"{version}\"\n")),
        "values.yaml's image.tag is not {version}"
    );
}
