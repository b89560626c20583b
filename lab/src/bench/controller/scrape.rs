//! Reading Prometheus text: the controller's `/metrics` (plain HTTP on
//! loopback) and the API server's (through the admin's kube client).
//!
//! Only samples are read, `name{label="value",...} number` one per line;
//! comments, `# EOF` and timestamps are skipped. That is all the two
//! expositions need, so the few lines here stand in for a parser crate.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

/// A sample's labels, by name.
pub type Labels = BTreeMap<String, String>;

/// One scrape: every sample, by metric name.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    by_name: BTreeMap<String, Vec<(Labels, f64)>>,
}

impl Samples {
    pub fn parse(text: &str) -> Samples {
        let mut by_name: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((name, labels, rest)) = split_sample(line) else {
                continue;
            };
            let Some(value) = rest.split_whitespace().next().and_then(parse_value) else {
                continue;
            };
            by_name
                .entry(name.to_string())
                .or_default()
                .push((labels, value));
        }
        Samples { by_name }
    }

    /// Sum of `name`'s samples whose labels include every pair of `with`.
    pub fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.matching(name, with).map(|(_, v)| v).sum()
    }

    /// `name`'s samples whose labels include every pair of `with`.
    pub fn matching<'a>(
        &'a self,
        name: &str,
        with: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = (&'a Labels, f64)> + 'a {
        self.by_name
            .get(name)
            .into_iter()
            .flatten()
            .filter(move |(labels, _)| {
                with.iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(labels, v)| (labels, *v))
    }
}

/// `name{a="1",b="x"} 3` -> (`name`, {a: 1, b: x}, ` 3`).
fn split_sample(line: &str) -> Option<(&str, Labels, &str)> {
    let Some(open) = line.find('{') else {
        let (name, rest) = line.split_once(char::is_whitespace)?;
        return Some((name, BTreeMap::new(), rest));
    };
    let name = &line[..open];
    let mut labels = BTreeMap::new();
    let mut rest = &line[open + 1..];
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(after) = rest.strip_prefix('}') {
            return Some((name, labels, after));
        }
        let (key, after) = rest.split_once("=\"")?;
        // Values escape `"` and `\` with a backslash.
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => value.push(chars.next()?.1),
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.insert(key.trim().to_string(), value);
        rest = &after[end + 1..];
    }
}

fn parse_value(word: &str) -> Option<f64> {
    match word {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        w => w.parse().ok(),
    }
}

/// GETs `http://ADDR/metrics`.
pub struct MetricsEndpoint {
    url: String,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl MetricsEndpoint {
    pub fn new(addr: SocketAddr) -> Self {
        MetricsEndpoint {
            url: format!("http://{addr}/metrics"),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub async fn scrape(&self) -> Result<Samples> {
        let uri: hyper::Uri = self.url.parse().context("metrics URL")?;
        let get = self.client.get(uri);
        let response = tokio::time::timeout(Duration::from_secs(5), get)
            .await
            .with_context(|| format!("GET {} timed out", self.url))?
            .with_context(|| format!("GET {}", self.url))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .with_context(|| format!("reading {}", self.url))?
            .to_bytes();
        if !status.is_success() {
            bail!("GET {}: {status}", self.url);
        }
        Ok(Samples::parse(&String::from_utf8_lossy(&body)))
    }
}

/// The API server's own `/metrics` (readable by the admin).
pub async fn apiserver(client: &kube::Client) -> Result<Samples> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .context("building GET /metrics")?;
    let text = client
        .request_text(request)
        .await
        .context("GET /metrics from kube-apiserver")?;
    Ok(Samples::parse(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_and_without_labels() {
        let text = "# HELP x y\n\
            volume_health_controller_cycles_total{result=\"complete\"} 3\n\
            volume_health_controller_cycles_total{result=\"failed\"} 1\n\
            volume_health_controller_volumes_monitored 10000\n\
            apiserver_request_total{code=\"201\",resource=\"events\",verb=\"POST\",x=\"a\\\"b,c\"} 2 1700000000\n\
            h_bucket{le=\"+Inf\"} 4\n\
            # EOF\n";
        let s = Samples::parse(text);
        assert_eq!(s.sum("volume_health_controller_cycles_total", &[]), 4.0);
        assert_eq!(
            s.sum(
                "volume_health_controller_cycles_total",
                &[("result", "complete")]
            ),
            3.0
        );
        assert_eq!(
            s.sum("volume_health_controller_volumes_monitored", &[]),
            10000.0
        );
        let posts: Vec<_> = s
            .matching("apiserver_request_total", &[("verb", "POST")])
            .collect();
        assert_eq!(posts.len(), 1);
        assert_eq!(posts[0].0["x"], "a\"b,c");
        assert_eq!(posts[0].1, 2.0);
        assert_eq!(s.sum("h_bucket", &[("le", "+Inf")]), 4.0);
        assert_eq!(s.sum("absent", &[]), 0.0);
    }
}
