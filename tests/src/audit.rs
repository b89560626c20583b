//! The real API server's audit log, as the tests compare it with a
//! component's own `api_requests_total`: each request of one user, once,
//! by (verb, resource, code) as the server saw it.
//!
//! The policy logs the user's requests at `Metadata` level, without the
//! `RequestReceived` stage. A request that is not long-running is logged
//! once, at `ResponseComplete`. A watch is logged at `ResponseStarted`
//! (when its response head went out, which is when the component counts
//! it) and again at `ResponseComplete` only when it ends, minutes later or
//! never while the component runs; each request is counted once by its
//! `auditID`, with the code of its first entry.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use health_tests::audit::AuditLog;
//! use health_tests::envtest::Options;
//! let audit = AuditLog::new("system:serviceaccount:ns:sa")?;
//! let mut options = Options::new().service_account("ns", "sa");
//! for arg in audit.apiserver_args() {
//!     options = options.apiserver_arg(&arg);
//! }
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Requests by (verb, resource with subresource, code), e.g.
/// (`patch`, `volumehealths/status`, `200`).
pub type Requests = BTreeMap<(String, String, String), u64>;

/// An audit policy and log of the requests of one user, in a directory of
/// their own (the server's is created only when it starts).
pub struct AuditLog {
    dir: tempfile::TempDir,
    user: String,
}

impl AuditLog {
    /// Writes the policy for `user`.
    pub fn new(user: &str) -> Result<AuditLog> {
        let dir = tempfile::Builder::new()
            .prefix("audit-")
            .tempdir()
            .context("creating the audit directory")?;
        let policy = format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\n\
             omitStages: [RequestReceived]\n\
             rules:\n- level: Metadata\n  users: [\"{user}\"]\n- level: None\n"
        );
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, policy).with_context(|| format!("writing {}", path.display()))?;
        Ok(AuditLog {
            dir,
            user: user.to_string(),
        })
    }

    /// The kube-apiserver flags that turn it on (the log backend's default
    /// mode is blocking: an entry is written before the request goes on).
    pub fn apiserver_args(&self) -> [String; 2] {
        [
            format!(
                "--audit-policy-file={}",
                self.dir.path().join("policy.yaml").display()
            ),
            format!("--audit-log-path={}", self.log().display()),
        ]
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    /// The user's requests logged so far.
    pub fn requests(&self) -> Result<Requests> {
        let text = match std::fs::read_to_string(self.log()) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.log().display())),
        };
        // Whole lines only: the last one may be half written.
        let whole = text.rsplit_once('\n').map_or("", |(whole, _)| whole);
        let mut seen = BTreeSet::new();
        let mut out = Requests::new();
        for line in whole.lines() {
            let entry: Value =
                serde_json::from_str(line).with_context(|| format!("an audit entry: {line}"))?;
            if entry["user"]["username"] != self.user.as_str() {
                bail!(
                    "an entry of another user (the policy logs only {}): {line}",
                    self.user
                );
            }
            let id = entry["auditID"]
                .as_str()
                .context("an entry without auditID")?;
            if !seen.insert(id.to_string()) {
                // A watch that ended: counted at ResponseStarted.
                continue;
            }
            *out.entry(key(&entry)?).or_insert(0) += 1;
        }
        Ok(out)
    }
}

impl AuditLog {
    /// Waits for a moment when the component's count (`scrape`, e.g. its
    /// `/metrics`) and the log agree, and returns that count; fails with
    /// the differences if they do not within `within`.
    ///
    /// A component keeps making requests (renewals, watches restarting),
    /// and the two are read one after the other: the count is read before
    /// and after the log, and a comparison counts only when nothing moved
    /// in between. A request counted and not logged (or the reverse) keeps
    /// them apart however long this waits.
    pub fn agreed(
        &self,
        within: std::time::Duration,
        scrape: impl Fn() -> Result<Requests>,
    ) -> Result<Requests> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let before = scrape()?;
            let logged = self.requests()?;
            let after = scrape()?;
            if before == after && after == logged {
                return Ok(logged);
            }
            if std::time::Instant::now() >= deadline {
                let differ: Vec<String> = differences(&after, &logged)
                    .iter()
                    .map(|(request, counted, logged)| {
                        format!("{request}: counted {counted}, logged {logged}")
                    })
                    .collect();
                bail!(
                    "the component's count and the audit log of {} differ after {within:?}:\n{}\n\
                     counted: {}\nlogged: {}",
                    self.user,
                    differ.join("\n"),
                    describe(&after),
                    describe(&logged)
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// (verb, resource, code) of an entry: the resource with its subresource,
/// or for a request that names none (`/api`, `/version`) its path.
fn key(entry: &Value) -> Result<(String, String, String)> {
    let verb = entry["verb"].as_str().unwrap_or_default().to_string();
    let object = &entry["objectRef"];
    let resource = match (object["resource"].as_str(), object["subresource"].as_str()) {
        (Some(r), Some(sub)) => format!("{r}/{sub}"),
        (Some(r), None) => r.to_string(),
        (None, _) => {
            let uri = entry["requestURI"].as_str().unwrap_or_default();
            uri.split_once('?')
                .map_or(uri, |(path, _)| path)
                .to_string()
        }
    };
    let code = entry["responseStatus"]["code"]
        .as_u64()
        .with_context(|| format!("an entry without a response code: {entry}"))?;
    Ok((verb, resource, code.to_string()))
}

/// `family`'s samples in a Prometheus text exposition, by (verb, resource,
/// code), e.g. `volume_health_api_requests_total`.
pub fn metric_requests(text: &str, family: &str) -> Result<Requests> {
    let mut out = Requests::new();
    let prefix = format!("{family}{{");
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let (labels, value) = line[prefix.len()..]
            .rsplit_once("} ")
            .with_context(|| format!("a sample: {line}"))?;
        let label = |name: &str| -> Result<String> {
            let start = format!("{name}=\"");
            let at = labels
                .find(&start)
                .with_context(|| format!("no {name} in {line}"))?
                + start.len();
            let len = labels[at..]
                .find('"')
                .with_context(|| format!("{name} unterminated in {line}"))?;
            Ok(labels[at..at + len].to_string())
        };
        let n: f64 = value
            .trim()
            .parse()
            .with_context(|| format!("the value of {line}"))?;
        out.insert(
            (label("verb")?, label("resource")?, label("code")?),
            n as u64,
        );
    }
    Ok(out)
}

/// `3 list pods 200, 1 watch pods 200`, for a report; `none` when empty.
pub fn describe(requests: &Requests) -> String {
    if requests.is_empty() {
        return "none".into();
    }
    requests
        .iter()
        .map(|((verb, resource, code), n)| format!("{n} {verb} {resource} {code}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The entries on which `a` and `b` differ: (key, in a, in b).
pub fn differences(a: &Requests, b: &Requests) -> Vec<(String, u64, u64)> {
    let keys: BTreeSet<_> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (x, y) = (
                a.get(k).copied().unwrap_or(0),
                b.get(k).copied().unwrap_or(0),
            );
            (x != y).then(|| (format!("{} {} {}", k.0, k.1, k.2), x, y))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_by_labels() {
        let text = "# HELP x\n\
            volume_health_api_requests_total{verb=\"list\",resource=\"pods\",code=\"200\"} 2\n\
            volume_health_api_requests_total{verb=\"create\",resource=\"events\",code=\"error\"} 1\n\
            volume_health_api_requests_totally{verb=\"x\",resource=\"y\",code=\"1\"} 9\n";
        let got = metric_requests(text, "volume_health_api_requests_total").unwrap();
        assert_eq!(describe(&got), "1 create events error, 2 list pods 200");
    }

    #[test]
    fn entries_by_verb_resource_and_code() {
        let status: Value = serde_json::from_str(
            r#"{"verb":"patch","objectRef":{"resource":"volumehealths","subresource":"status"},
                "requestURI":"/apis/g/v/namespaces/a/volumehealths/b/status","responseStatus":{"code":200}}"#,
        )
        .unwrap();
        assert_eq!(
            key(&status).unwrap(),
            ("patch".into(), "volumehealths/status".into(), "200".into())
        );
        let discovery: Value = serde_json::from_str(
            r#"{"verb":"get","requestURI":"/apis/g/v?timeout=32s","responseStatus":{"code":200}}"#,
        )
        .unwrap();
        assert_eq!(
            key(&discovery).unwrap(),
            ("get".into(), "/apis/g/v".into(), "200".into())
        );
    }
}
