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
        Self::write(dir, &[user], "[RequestReceived, ResponseStarted]")
    }

    /// [`AuditLog::new`] for the requests of several users (the scale
    /// benchmark's agents and controller), with a watch logged when it
    /// starts as well: a start is measured while its watches still run.
    /// [`AuditLog::since`] counts such a watch once.
    pub fn for_users(dir: &Path, users: &[&str]) -> Result<AuditLog> {
        Self::write(dir, users, "[RequestReceived]")
    }

    fn write(dir: &Path, users: &[&str], omit: &str) -> Result<AuditLog> {
        let policy = dir.join("audit-policy.yaml");
        let users: Vec<String> = users.iter().map(|u| format!("\"{u}\"")).collect();
        std::fs::write(
            &policy,
            format!(
                "apiVersion: audit.k8s.io/v1\nkind: Policy\n\
                 omitStages: {omit}\n\
                 rules:\n- level: Metadata\n  users: [{}]\n- level: None\n",
                users.join(", ")
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
        let mut started = std::collections::HashSet::new();
        for entry in self.entries_since(mark)? {
            // A watch logged when it started is not counted again when it
            // ends.
            let id = entry["auditID"].as_str().unwrap_or("").to_string();
            match entry["stage"].as_str() {
                Some("ResponseStarted") => {
                    started.insert(id);
                }
                _ if started.contains(&id) => continue,
                _ => {}
            }
            let verb = entry["verb"].as_str().unwrap_or("").to_string();
            let resource = match entry["objectRef"]["resource"].as_str() {
                Some(r) => r.to_string(),
                None => entry["requestURI"].as_str().unwrap_or("").to_string(),
            };
            *out.entry((verb, resource)).or_insert(0) += 1;
        }
        Ok(out)
    }

    /// The entries logged after `mark`, whole (user, URI, timestamps).
    pub fn entries_since(&self, mark: usize) -> Result<Vec<serde_json::Value>> {
        self.lines()?
            .iter()
            .skip(mark)
            .map(|line| {
                serde_json::from_str(line).with_context(|| format!("an audit entry: {line}"))
            })
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_logged_at_start_and_end_counts_once() {
        let dir = tempfile::tempdir().unwrap();
        let audit = AuditLog::for_users(dir.path(), &["a", "b"]).unwrap();
        let policy = std::fs::read_to_string(dir.path().join("audit-policy.yaml")).unwrap();
        assert!(policy.contains("users: [\"a\", \"b\"]"), "{policy}");
        assert!(policy.contains("omitStages: [RequestReceived]"), "{policy}");
        let entry = |id: &str, stage: &str, verb: &str, resource: &str| {
            serde_json::json!({"auditID": id, "stage": stage, "verb": verb,
                               "objectRef": {"resource": resource}})
            .to_string()
        };
        let lines = [
            entry("1", "ResponseComplete", "list", "pods"),
            entry("2", "ResponseStarted", "watch", "pods"),
            entry("3", "ResponseComplete", "get", "persistentvolumes"),
            entry("2", "ResponseComplete", "watch", "pods"),
            // A watch that started before the mark: counted when it ends.
            entry("4", "ResponseComplete", "watch", "events"),
        ];
        std::fs::write(dir.path().join("audit.log"), lines.join("\n") + "\n").unwrap();
        let got = audit.since(0).unwrap();
        let want: Requests = [
            (("get", "persistentvolumes"), 1),
            (("list", "pods"), 1),
            (("watch", "events"), 1),
            (("watch", "pods"), 1),
        ]
        .into_iter()
        .map(|((v, r), n)| ((v.to_string(), r.to_string()), n))
        .collect();
        assert_eq!(got, want);
        assert_eq!(audit.since(4).unwrap().len(), 1);
    }
}
