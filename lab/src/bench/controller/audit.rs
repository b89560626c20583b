//! The API server's audit log, kept for the controller's user only: which
//! requests the controller made, exactly, where `apiserver_request_total`
//! mixes in kube-apiserver's own loopback traffic (its endpoints, services,
//! namespaces and identity Lease) and the benchmark's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Requests by (verb, resource), e.g. ("create", "events").
pub type Requests = BTreeMap<(String, String), u64>;

pub struct AuditLog {
    policy: PathBuf,
    log: PathBuf,
}

impl AuditLog {
    /// Writes a policy logging `user`'s requests once each, at completion
    /// (a watch too, when it ends), metadata only.
    pub fn new(dir: &Path, user: &str) -> Result<AuditLog> {
        let policy = dir.join("audit-policy.yaml");
        std::fs::write(
            &policy,
            format!(
                "apiVersion: audit.k8s.io/v1\nkind: Policy\n\
                 omitStages: [RequestReceived, ResponseStarted]\n\
                 rules:\n- level: Metadata\n  users: [\"{user}\"]\n- level: None\n"
            ),
        )
        .with_context(|| format!("writing {}", policy.display()))?;
        Ok(AuditLog {
            policy,
            log: dir.join("audit.log"),
        })
    }

    /// The kube-apiserver flags that turn it on.
    pub fn apiserver_args(&self) -> [String; 2] {
        [
            format!("--audit-policy-file={}", self.policy.display()),
            format!("--audit-log-path={}", self.log.display()),
        ]
    }

    /// Entries so far (a mark for [`AuditLog::since`]).
    pub fn mark(&self) -> Result<usize> {
        Ok(self.lines()?.len())
    }

    /// Requests logged after `mark`.
    pub fn since(&self, mark: usize) -> Result<Requests> {
        let mut out = Requests::new();
        for line in self.lines()?.iter().skip(mark) {
            let entry: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("an audit entry: {line}"))?;
            let verb = entry["verb"].as_str().unwrap_or("").to_string();
            let resource = match entry["objectRef"]["resource"].as_str() {
                Some(r) => r.to_string(),
                None => entry["requestURI"].as_str().unwrap_or("").to_string(),
            };
            *out.entry((verb, resource)).or_insert(0) += 1;
        }
        Ok(out)
    }

    fn lines(&self) -> Result<Vec<String>> {
        match std::fs::read_to_string(&self.log) {
            // Whole lines only: the last one may be half written.
            Ok(text) => Ok(text
                .rsplit_once('\n')
                .map_or("", |(whole, _)| whole)
                .lines()
                .map(str::to_string)
                .collect()),
            // Nothing logged yet.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e).with_context(|| format!("reading {}", self.log.display())),
        }
    }
}

/// `3 get leases, 3 patch leases`; `none` when empty.
pub fn describe(requests: &Requests) -> String {
    if requests.is_empty() {
        return "none".into();
    }
    requests
        .iter()
        .map(|((verb, resource), n)| format!("{n} {verb} {resource}"))
        .collect::<Vec<_>>()
        .join(", ")
}
