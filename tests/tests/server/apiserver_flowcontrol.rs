//! The node agents' API Priority and Fairness objects
//! (deploy/components/flow-control and flow-control-v1beta3) on a real
//! kube-apiserver v1.26 (`health_tests::envtest`), the oldest Kubernetes the
//! manifests support, which serves flowcontrol v1beta3 but not v1:
//! - the v1beta3 objects are accepted (server-side apply, strict field
//!   validation) and kept as written;
//! - every request of the agents' ServiceAccount is classified by them: the
//!   server's answer names the FlowSchema and the priority level by UID
//!   (`X-Kubernetes-PF-FlowSchema-UID`, `X-Kubernetes-PF-PriorityLevel-UID`);
//!   the controller's account, an account of the same name in another
//!   namespace and the administrator keep their built-in schemas;
//! - the schema wins over the built-in schemas an agent would otherwise
//!   fall into (their precedences read from the server), also when the
//!   agents run in kube-system;
//! - the level gets the seats its comments compute (the server's own
//!   `apiserver_flowcontrol_*_limit_seats`).
//!
//! And, without a server: the v1 and v1beta3 Components differ in
//! apiVersion only. (That the chart renders them by version:
//! deploy_render.rs; that deploy/ with the v1beta3 one passes a 1.26 dry run
//! and with the v1 one is refused: apiserver_deploy.rs.)
//!
//! No root, no BPF; needs HEALTH_K8S_OLDEST_ASSETS (see the harness).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use health_tests::envtest::{apply_manifest, runtime, Options, RealApiServer};
use health_tests::manifests::{apply_all, manifests, repo_root};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};

const AGENT_NS: &str = "volume-health";
const AGENT_SA: &str = "volume-health";
const CONTROLLER_NS: &str = "kube-system";
const CONTROLLER_SA: &str = "volume-health-controller";
/// The agents' FlowSchema and PriorityLevelConfiguration.
const NAME: &str = "volume-health-agent";
const V1: &str = "flowcontrol.apiserver.k8s.io/v1";
const V1BETA3: &str = "flowcontrol.apiserver.k8s.io/v1beta3";
/// A PV the agents may GET (RBAC: get only).
const PV: &str = "pv-flow-control";
/// The server's seats: kube-apiserver's defaults, --max-requests-inflight
/// 400 plus --max-mutating-requests-inflight 200 (envtest sets neither).
const SERVER_SEATS: u64 = 600;
/// How long the server's APF configuration controller may take to act on
/// a new object.
const CONFIG_TIMEOUT: Duration = Duration::from_secs(30);

/// The documents of a flow-control Component: (PriorityLevelConfiguration,
/// FlowSchema).
fn component(dir: &str) -> Result<(Value, Value)> {
    let docs = manifests(&repo_root().join("deploy/components").join(dir))?;
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    // In name order: flowschema.yaml, prioritylevel.yaml.
    ensure!(
        kinds == ["FlowSchema", "PriorityLevelConfiguration"],
        "{dir}: {kinds:?}"
    );
    Ok((docs[1].clone(), docs[0].clone()))
}

#[test]
fn the_v1_and_v1beta3_components_differ_in_api_version_only() -> Result<()> {
    let (v1_level, v1_schema) = component("flow-control")?;
    let (beta_level, beta_schema) = component("flow-control-v1beta3")?;
    for (mut v1, mut beta) in [(v1_level, beta_level), (v1_schema, beta_schema)] {
        ensure!(v1["apiVersion"] == V1, "{}", v1["apiVersion"]);
        ensure!(beta["apiVersion"] == V1BETA3, "{}", beta["apiVersion"]);
        v1["apiVersion"] = Value::Null;
        beta["apiVersion"] = Value::Null;
        ensure!(
            v1 == beta,
            "beyond apiVersion:\nv1: {v1:#}\nv1beta3: {beta:#}"
        );
    }
    let list = |dir: &str| {
        let text = std::fs::read_to_string(
            repo_root()
                .join("deploy/components")
                .join(dir)
                .join("kustomization.yaml"),
        )?;
        let k: Value = serde_yaml::from_str(&text)?;
        anyhow::Ok((k["kind"].clone(), k["resources"].clone()))
    };
    let (kind, resources) = list("flow-control")?;
    ensure!(kind == "Component", "{kind}");
    ensure!(
        resources == json!(["prioritylevel.yaml", "flowschema.yaml"]),
        "{resources}"
    );
    ensure!(list("flow-control-v1beta3")? == (kind, resources));
    Ok(())
}

/// Where the server put one request: the UIDs it answered with, and the
/// HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Classified {
    flow_schema: String,
    priority_level: String,
    status: u16,
}

async fn classify(client: &Client, path: &str) -> Result<Classified> {
    let request = http::Request::get(path).body(Body::empty())?;
    let response = client
        .send(request)
        .await
        .with_context(|| format!("GET {path}"))?;
    let header = |name: &str| -> Result<String> {
        let value = response
            .headers()
            .get(name)
            .with_context(|| format!("GET {path}: no {name} in {:?}", response.headers()))?;
        Ok(value.to_str()?.to_string())
    };
    Ok(Classified {
        flow_schema: header("X-Kubernetes-PF-FlowSchema-UID")?,
        priority_level: header("X-Kubernetes-PF-PriorityLevel-UID")?,
        status: response.status().as_u16(),
    })
}

/// Waits until `path`, asked by `client`, is answered as `expected` (the
/// server reads its APF objects, and RBAC its bindings, through informers).
async fn wait_classified(client: &Client, path: &str, expected: &Classified) -> Result<()> {
    let deadline = Instant::now() + CONFIG_TIMEOUT;
    loop {
        let seen = classify(client, path).await?;
        if &seen == expected {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("GET {path} still {seen:?} after {CONFIG_TIMEOUT:?}, not {expected:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The server's objects of a flowcontrol v1beta3 resource, by name.
async fn v1beta3_objects(admin: &Client, resource: &str) -> Result<Objects> {
    let path = format!("/apis/{V1BETA3}/{resource}");
    let list: Value = admin
        .request(http::Request::get(&path).body(Vec::new())?)
        .await
        .with_context(|| format!("GET {path}"))?;
    let items = list["items"].as_array().context("items")?;
    Ok(items
        .iter()
        .map(|i| {
            (
                i["metadata"]["name"].as_str().unwrap_or("").to_string(),
                i.clone(),
            )
        })
        .collect())
}

fn uid(object: &Value) -> Result<String> {
    Ok(object["metadata"]["uid"]
        .as_str()
        .context("metadata.uid")?
        .to_string())
}

/// The value of one sample of the server's /metrics, e.g.
/// `apiserver_flowcontrol_nominal_limit_seats{priority_level="x"}`.
async fn metric(admin: &Client, series: &str) -> Result<f64> {
    let text = admin
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await
        .context("GET /metrics")?;
    let line = text
        .lines()
        .find(|l| l.strip_prefix(series).is_some_and(|v| v.starts_with(' ')))
        .with_context(|| format!("no {series} in /metrics"))?;
    Ok(line[series.len()..].trim().parse()?)
}

/// A client authenticated as ServiceAccount `ns/name`.
async fn client_of(server: &RealApiServer, ns: &str, name: &str) -> Result<Client> {
    let who = server
        .service_account(ns, name)
        .with_context(|| format!("no token for {ns}/{name}"))?;
    server.client(who).await
}

fn start() -> Option<RealApiServer> {
    Options::new()
        .oldest()
        .service_account(AGENT_NS, AGENT_SA)
        .service_account(CONTROLLER_NS, CONTROLLER_SA)
        // Same name, another namespace: not the agents.
        .service_account("default", AGENT_SA)
        // The agents installed into kube-system (`helm install -n kube-system`).
        .service_account("kube-system", AGENT_SA)
        .require()
}

/// The server's flowcontrol objects, by name.
type Objects = BTreeMap<String, Value>;

/// What the server made of the Component: its objects as stored, and the
/// built-in ones around them.
struct Installed {
    /// Every FlowSchema, the agents' and the built-in ones.
    schemas: Objects,
    /// Every PriorityLevelConfiguration.
    levels: Objects,
}

impl Installed {
    /// Where a request classified by FlowSchema `fs` goes.
    fn classified(&self, fs: &str, status: u16) -> Result<Classified> {
        let schema = self
            .schemas
            .get(fs)
            .with_context(|| format!("no FlowSchema {fs}"))?;
        let level = schema["spec"]["priorityLevelConfiguration"]["name"]
            .as_str()
            .context("priorityLevelConfiguration")?;
        Ok(Classified {
            flow_schema: uid(schema)?,
            priority_level: uid(self.levels.get(level).context("no level")?)?,
            status,
        })
    }
}

/// The built-in schemas the agents would fall into without theirs lose to
/// it, as the server has them.
async fn check_precedences(admin: &Client, schema: &Value) -> Result<()> {
    let builtin = v1beta3_objects(admin, "flowschemas").await?;
    let precedence = |fs: &Value| fs["spec"]["matchingPrecedence"].as_i64();
    let (sa, kube_system) = (
        precedence(&builtin["service-accounts"]),
        precedence(&builtin["kube-system-service-accounts"]),
    );
    ensure!(
        (sa, kube_system) == (Some(9000), Some(900)),
        "the built-in precedences: {sa:?} {kube_system:?}"
    );
    ensure!(precedence(schema) == Some(850), "{:?}", precedence(schema));
    Ok(())
}

/// deploy/ (the narrowed RBAC), the Component and a PV, applied; the
/// Component's objects as the server keeps them must be as written.
async fn install(admin: &Client, level: &Value, schema: &Value) -> Result<Installed> {
    let mut docs = manifests(&repo_root().join("deploy"))?;
    docs.extend([level.clone(), schema.clone()]);
    let refused = apply_all(admin, &docs).await;
    ensure!(refused.is_empty(), "refused: {refused:#?}");
    let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": PV},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "hostPath": {"path": "/tmp/pv-flow-control"}}});
    apply_manifest(admin, &pv).await.context("the PV")?;

    let installed = Installed {
        schemas: v1beta3_objects(admin, "flowschemas").await?,
        levels: v1beta3_objects(admin, "prioritylevelconfigurations").await?,
    };
    let (stored_schema, stored_level) = (&installed.schemas[NAME], &installed.levels[NAME]);
    ensure!(
        stored_schema["spec"] == schema["spec"] && stored_level["spec"] == level["spec"],
        "the server changed the specs:\n{:#}\n{:#}",
        stored_schema["spec"],
        stored_level["spec"]
    );
    let status = &stored_schema["status"]["conditions"];
    ensure!(
        status
            == &json!([{"type": "Dangling", "status": "False", "reason": "Found",
            "message": "This FlowSchema references the PriorityLevelConfiguration \
                        object named \"volume-health-agent\" and it exists",
            "lastTransitionTime": status[0]["lastTransitionTime"]}]),
        "{status:#}"
    );
    Ok(installed)
}

/// The agents' requests, allowed or not by RBAC, cluster-scoped or
/// namespaced, all go to their level.
async fn check_agent_requests(agent: &Client, ours: &Classified) -> Result<()> {
    wait_classified(agent, &pv_path(), ours).await?;
    for (path, status) in [
        ("/api/v1/persistentvolumes", 403),
        ("/api/v1/persistentvolumes?watch=true", 403),
        ("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1", 200),
        ("/api/v1/namespaces/default/events?labelSelector=a%3Db", 403),
        ("/api/v1/namespaces/default/persistentvolumeclaims", 403),
    ] {
        let seen = classify(agent, path).await?;
        let expected = Classified {
            status,
            ..ours.clone()
        };
        ensure!(seen == expected, "{path}: {seen:?}");
    }
    Ok(())
}

/// Everyone else keeps the built-in schema (and level) they had.
async fn check_others(server: &RealApiServer, admin: &Client, installed: &Installed) -> Result<()> {
    let ours = installed.classified(NAME, 200)?;
    // The statuses are RBAC's: the controller's roles are not applied here,
    // and classification comes before authorization.
    for (who, client, fs, level, status) in [
        (
            "the controller",
            client_of(server, CONTROLLER_NS, CONTROLLER_SA).await?,
            "kube-system-service-accounts",
            "workload-high",
            403,
        ),
        (
            "default/volume-health",
            client_of(server, "default", AGENT_SA).await?,
            "service-accounts",
            "workload-low",
            403,
        ),
        ("admin", admin.clone(), "exempt", "exempt", 200),
    ] {
        let seen = classify(&client, &pv_path()).await?;
        let expected = installed.classified(fs, status)?;
        ensure!(
            installed.schemas[fs]["spec"]["priorityLevelConfiguration"]["name"] == level,
            "{fs}"
        );
        ensure!(
            seen == expected
                && seen.flow_schema != ours.flow_schema
                && seen.priority_level != ours.priority_level,
            "{who}: {seen:?}, expected {fs}/{level} {expected:?}"
        );
    }
    Ok(())
}

/// The seats prioritylevel.yaml computes, on this server's 600: the
/// server's own limits for the level.
async fn check_seats(admin: &Client, installed: &Installed) -> Result<()> {
    let shares: u64 = installed
        .levels
        .values()
        .filter_map(|l| l["spec"]["limited"]["nominalConcurrencyShares"].as_u64())
        .sum();
    ensure!(shares == 255, "the shares of all levels: {shares}");
    let nominal = (SERVER_SEATS * 10).div_ceil(shares);
    ensure!(nominal == 24, "{nominal}");
    // lendablePercent 50, borrowingLimitPercent 0.
    for (series, seats) in [("nominal", 24.0), ("lower", 12.0), ("upper", 24.0)] {
        let name =
            format!("apiserver_flowcontrol_{series}_limit_seats{{priority_level=\"{NAME}\"}}");
        let seen = metric(admin, &name).await?;
        ensure!(seen == seats, "{name} = {seen}, not {seats}");
    }
    Ok(())
}

/// Installed into kube-system (`helm install -n kube-system`), the agents
/// still get their level: 850 wins over kube-system-service-accounts' 900.
async fn check_kube_system(
    server: &RealApiServer,
    admin: &Client,
    installed: &Installed,
    schema: &Value,
) -> Result<()> {
    let kube_system_agent = client_of(server, "kube-system", AGENT_SA).await?;
    // 403: RBAC binds volume-health/volume-health only.
    let before = classify(&kube_system_agent, &pv_path()).await?;
    ensure!(
        before == installed.classified("kube-system-service-accounts", 403)?,
        "{before:?}"
    );
    let mut moved = schema.clone();
    moved["spec"]["rules"][0]["subjects"][0]["serviceAccount"]["namespace"] = "kube-system".into();
    apply_manifest(admin, &moved)
        .await
        .context("the moved FlowSchema")?;
    wait_classified(
        &kube_system_agent,
        &pv_path(),
        &installed.classified(NAME, 403)?,
    )
    .await?;
    // And the agents of volume-health/ are matched no more.
    let agent = client_of(server, AGENT_NS, AGENT_SA).await?;
    let gone = classify(&agent, &pv_path()).await?;
    ensure!(
        gone == installed.classified("service-accounts", 200)?,
        "{gone:?}"
    );
    Ok(())
}

fn pv_path() -> String {
    format!("/api/v1/persistentvolumes/{PV}")
}

#[test]
fn the_v1beta3_objects_classify_every_agent_request_and_no_other() -> Result<()> {
    let Some(server) = start() else { return Ok(()) };
    let (level, schema) = component("flow-control-v1beta3")?;
    let rt = runtime()?;
    rt.block_on(async {
        let admin = server.client(server.admin()).await?;
        check_precedences(&admin, &schema).await?;
        let installed = install(&admin, &level, &schema).await?;
        let agent = client_of(&server, AGENT_NS, AGENT_SA).await?;
        check_agent_requests(&agent, &installed.classified(NAME, 200)?).await?;
        check_others(&server, &admin, &installed).await?;
        check_seats(&admin, &installed).await?;
        check_kube_system(&server, &admin, &installed, &schema).await
    })
}
