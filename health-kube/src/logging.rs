//! The binaries' log filter: what `--log` says, with kube-client's own
//! request failure lines left out unless asked for by name.
//!
//! kube-client logs every 5xx answer at ERROR from its HTTP trace layer
//! ("failed with status 500 Internal Server Error"), before the caller has
//! seen it. Some 5xx answers are expected here: a server before 1.37
//! refuses `pvc.status.healthStatus` in a server-side apply with a 500, and
//! the controller learns from that refusal. Every request this project makes
//! reports its own failures with context (and counts them), so kube-client's
//! line adds only a false alarm.

use std::io::IsTerminal;

use tracing_subscriber::filter::{Directive, EnvFilter, ParseError};

/// kube-client's HTTP trace layer (its target).
const KUBE_TRACE_LAYER: &str = "kube_client::client::builder";

/// `spec` as an `EnvFilter`; kube-client's failure lines are off unless
/// `spec` names a `kube_client` target itself.
pub fn filter(spec: &str) -> Result<EnvFilter, ParseError> {
    let mut filter = EnvFilter::try_new(spec)?;
    if !spec.contains("kube_client") {
        let quiet: Directive = format!("{KUBE_TRACE_LAYER}=off").parse()?;
        filter = filter.add_directive(quiet);
    }
    Ok(filter)
}

/// Logs to stderr through [`filter`] (`info` when `spec` does not parse,
/// said once). Colours only on a terminal: a pod's log, journald and a log
/// shipper would otherwise store the escape codes.
pub fn init(binary: &str, spec: &str) {
    let filter = filter(spec).unwrap_or_else(|e| {
        eprintln!("{binary}: invalid --log filter {spec:?} ({e}); using `info`");
        EnvFilter::new("info")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_clients_lines_are_off_unless_named() {
        assert_eq!(
            filter("info").unwrap().to_string(),
            "kube_client::client::builder=off,info"
        );
        assert_eq!(
            filter("info,kube_client=debug").unwrap().to_string(),
            "kube_client=debug,info"
        );
        assert!(filter("info,[").is_err());
    }
}
