//! The fake kube-apiserver (`health_tests::apiserver`) against kube-rs itself, the
//! client the agent uses: if these pass, the agent's reflectors and event writes work
//! against the fake the way they do against a real server.
//!
//! No root needed. Each test has its own server, so they run in parallel.

use std::collections::BTreeSet;
use std::future;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use futures_util::StreamExt;
use health_tests::{FakeApiServer, Mode, Recorded};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, PersistentVolume, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use serde_json::{json, Value};

const NODE: &str = "node-1";
const SELECTOR: &str = "spec.nodeName=node-1";
const WAIT: Duration = Duration::from_secs(5);

fn pod(namespace: &str, name: &str, node: Option<&str>) -> Value {
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    })
}

fn pv(name: &str) -> Value {
    json!({
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "csi": {"driver": "csi.example.com", "volumeHandle": format!("handle-{name}")},
            "claimRef": {"namespace": "default", "name": format!("claim-{name}"), "uid": "claim-uid"},
        },
    })
}

fn names(store: &Store<Pod>) -> BTreeSet<String> {
    store
        .state()
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn query(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Starts a reflector over this node's pods on `rt` and waits for its first list.
fn pod_reflector(
    rt: &tokio::runtime::Runtime,
    client: Client,
    config: watcher::Config,
) -> Result<Store<Pod>> {
    let (reader, writer) = reflector::store::<Pod>();
    let stream =
        reflector::reflector(writer, watcher(Api::<Pod>::all(client), config)).default_backoff();
    rt.spawn(stream.for_each(|_| future::ready(())));
    rt.block_on(async { tokio::time::timeout(WAIT, reader.wait_until_ready()).await })
        .context("reflector not ready in time")?
        .context("reflector writer dropped")?;
    Ok(reader)
}

fn lists(requests: &[Recorded], path: &str) -> Vec<Recorded> {
    requests
        .iter()
        .filter(|r| r.method == "GET" && r.path == path && !r.is_watch())
        .cloned()
        .collect()
}

fn watches(requests: &[Recorded], path: &str) -> Vec<Recorded> {
    requests
        .iter()
        .filter(|r| r.method == "GET" && r.path == path && r.is_watch())
        .cloned()
        .collect()
}

#[test]
fn list_with_node_selector_returns_exactly_that_nodes_pods() -> Result<()> {
    let server = FakeApiServer::start()?;
    server.put(pod("default", "a", Some(NODE)));
    server.put(pod("kube-system", "b", Some(NODE)));
    server.put(pod("default", "c", Some("node-2")));
    server.put(pod("default", "d", None));
    server.put(pv("pv-1"));
    let dir = tempfile::tempdir()?;
    let rt = health_tests::multi_thread_runtime()?;

    let (pods, pvs) = rt.block_on(async {
        let client = server.kube_client(dir.path(), true).await?;
        let pods = Api::<Pod>::all(client.clone())
            .list(&ListParams::default().fields(SELECTOR))
            .await
            .context("listing pods")?;
        let pvs = Api::<PersistentVolume>::all(client)
            .list(&ListParams::default())
            .await
            .context("listing PVs")?;
        anyhow::Ok((pods, pvs))
    })?;

    let got: Vec<(String, String, String)> = pods
        .items
        .iter()
        .map(|p| {
            (
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
                p.metadata.uid.clone().unwrap_or_default(),
            )
        })
        .collect();
    let want = vec![
        ("default".to_string(), "a".to_string(), "uid-a".to_string()),
        (
            "kube-system".to_string(),
            "b".to_string(),
            "uid-b".to_string(),
        ),
    ];
    ensure!(got == want, "pods listed: {got:?}, want {want:?}");
    ensure!(
        pods.metadata.resource_version.as_deref() == Some("5"),
        "list resourceVersion {:?}, want 5 (four pods and a PV put)",
        pods.metadata.resource_version
    );
    let pv_names: Vec<_> = pvs
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    ensure!(pv_names == ["pv-1"], "PVs listed: {pv_names:?}");
    let claim = pvs.items[0]
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref());
    ensure!(
        claim.and_then(|c| c.name.as_deref()) == Some("claim-pv-1"),
        "PV claimRef lost: {claim:?}"
    );

    let requests = server.requests();
    ensure!(requests.len() == 2, "requests: {requests:#?}");
    let r = &requests[0];
    ensure!(
        r.method == "GET"
            && r.path == "/api/v1/pods"
            && r.query == query(&[("fieldSelector", SELECTOR)])
            && r.authorization.as_deref() == Some("Bearer test-token")
            && r.body.is_none()
            && r.status == 200
            && r.at_mono_ns > 0,
        "pod list request: {r:#?}"
    );
    ensure!(
        requests[1].path == "/api/v1/persistentvolumes" && requests[1].query.is_empty(),
        "PV list request: {:#?}",
        requests[1]
    );
    ensure!(
        requests[0].at_mono_ns <= requests[1].at_mono_ns,
        "requests out of order"
    );
    // The kernel's receive time comes before the handler's, and (nothing
    // else running in this server) not long before.
    for r in &requests {
        let rx = r.rx_mono_ns.context("no kernel receive time")?;
        ensure!(
            rx <= r.at_mono_ns && r.at_mono_ns - rx < 1_000_000_000,
            "receive time {rx} against handler time {}",
            r.at_mono_ns
        );
    }
    Ok(())
}

#[test]
fn reflector_sees_put_move_and_delete_with_kube_watcher_params() -> Result<()> {
    let server = FakeApiServer::start()?;
    server.put(pod("default", "a", Some(NODE)));
    server.put(pod("default", "other", Some("node-2")));
    let dir = tempfile::tempdir()?;
    let rt = health_tests::multi_thread_runtime()?;
    let client = rt.block_on(server.kube_client(dir.path(), true))?;
    let store = pod_reflector(&rt, client, watcher::Config::default().fields(SELECTOR))?;
    ensure!(
        names(&store) == set(&["a"]),
        "initial store: {:?}",
        names(&store)
    );

    // The watch is open once the server has recorded it; changes before that would
    // be replayed from the list's version anyway.
    server.wait_for(WAIT, |s| {
        (!watches(&s.requests(), "/api/v1/pods").is_empty()).then_some(())
    })?;

    server.put(pod("default", "e", Some(NODE)));
    server
        .wait_for(WAIT, |_| (names(&store) == set(&["a", "e"])).then_some(()))
        .context("put pod e not seen")?;

    // Moving to another node is a DELETED for this node's watch.
    server.put(pod("default", "a", Some("node-2")));
    server
        .wait_for(WAIT, |_| (names(&store) == set(&["e"])).then_some(()))
        .context("pod a moved away still in the store")?;

    ensure!(
        server.delete("Pod", Some("default"), "e"),
        "pod e was not stored"
    );
    ensure!(
        !server.delete("Pod", Some("default"), "e"),
        "pod e deleted twice"
    );
    server
        .wait_for(WAIT, |_| names(&store).is_empty().then_some(()))
        .context("deleted pod e still in the store")?;

    // Exactly what kube-runtime 5's watcher asks (default Config).
    let requests = server.requests();
    let list = lists(&requests, "/api/v1/pods");
    ensure!(list.len() == 1, "pod lists: {list:#?}");
    ensure!(
        list[0].query == query(&[("fieldSelector", SELECTOR), ("limit", "500")]),
        "list query: {:?}",
        list[0].query
    );
    let watch = watches(&requests, "/api/v1/pods");
    ensure!(watch.len() == 1, "pod watches: {watch:#?}");
    ensure!(
        watch[0].query
            == query(&[
                ("watch", "true"),
                ("timeoutSeconds", "290"),
                ("fieldSelector", SELECTOR),
                ("allowWatchBookmarks", "true"),
                ("resourceVersion", "2"),
            ]),
        "watch query: {:?}",
        watch[0].query
    );
    ensure!(watch[0].status == 200, "watch status {}", watch[0].status);
    Ok(())
}

fn pod_event(name: &str) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("default".to_string()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("Pod".to_string()),
            namespace: Some("default".to_string()),
            name: Some("a".to_string()),
            uid: Some("uid-a".to_string()),
            ..Default::default()
        },
        reason: Some("VolumeIOError".to_string()),
        message: Some("1 block I/O error".to_string()),
        type_: Some("Warning".to_string()),
        count: Some(1),
        source: Some(EventSource {
            component: Some("volume-health".to_string()),
            host: Some(NODE.to_string()),
        }),
        ..Default::default()
    }
}

#[test]
fn events_create_and_merge_patch_like_a_real_server() -> Result<()> {
    let server = FakeApiServer::start()?;
    let dir = tempfile::tempdir()?;
    let rt = health_tests::multi_thread_runtime()?;
    let name = "a.17f0c0ffee";
    let event = pod_event(name);
    let patch = json!({"count": 2, "lastTimestamp": "2026-01-02T03:04:05Z", "message": "2 block I/O errors"});

    let (created, patched, missing, duplicate) = rt.block_on(async {
        let client = server.kube_client(dir.path(), true).await?;
        let api = Api::<Event>::namespaced(client, "default");
        let created = api
            .create(&PostParams::default(), &event)
            .await
            .context("create")?;
        let patched = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .context("patch")?;
        let missing = api
            .patch(
                "no-such-event",
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await;
        let duplicate = api.create(&PostParams::default(), &event).await;
        anyhow::Ok((created, patched, missing, duplicate))
    })?;

    ensure!(
        created.metadata.resource_version.as_deref() == Some("1")
            && created.metadata.uid.is_some()
            && created.metadata.creation_timestamp.is_some(),
        "server-assigned fields missing: {:?}",
        created.metadata
    );
    ensure!(
        patched.count == Some(2) && patched.metadata.resource_version.as_deref() == Some("2"),
        "patch result: {patched:?}"
    );

    let stored = server.events();
    ensure!(stored.len() == 1, "events stored: {stored:#?}");
    let created_at = stored[0]["metadata"]["creationTimestamp"].clone();
    ensure!(
        created_at
            .as_str()
            .is_some_and(|t| t.len() == 20 && t.ends_with('Z')),
        "creationTimestamp {created_at}"
    );
    let expected = json!({
        "kind": "Event",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": created.metadata.uid,
            "resourceVersion": "2",
            "creationTimestamp": created_at,
        },
        "involvedObject": {
            "apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": "a", "uid": "uid-a",
        },
        "reason": "VolumeIOError",
        "message": "2 block I/O errors",
        "type": "Warning",
        "count": 2,
        "lastTimestamp": "2026-01-02T03:04:05Z",
        "source": {"component": "volume-health", "host": NODE},
    });
    ensure!(
        stored[0] == expected,
        "stored event:\n{:#}\nexpected:\n{expected:#}",
        stored[0]
    );

    match missing {
        Err(kube::Error::Api(status)) if status.code == 404 && status.reason == "NotFound" => {}
        other => bail!("patch of a missing event: {other:?}"),
    }
    match duplicate {
        Err(kube::Error::Api(status)) if status.code == 409 && status.reason == "AlreadyExists" => {
        }
        other => bail!("second create: {other:?}"),
    }

    let requests = server.requests();
    let methods: Vec<(&str, &str, Option<&str>, u16)> = requests
        .iter()
        .map(|r| {
            (
                r.method.as_str(),
                r.path.as_str(),
                r.content_type.as_deref(),
                r.status,
            )
        })
        .collect();
    let path = "/api/v1/namespaces/default/events";
    let item = format!("{path}/{name}");
    let want = vec![
        ("POST", path, Some("application/json"), 201),
        (
            "PATCH",
            item.as_str(),
            Some("application/merge-patch+json"),
            200,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/events/no-such-event",
            Some("application/merge-patch+json"),
            404,
        ),
        ("POST", path, Some("application/json"), 409),
    ];
    ensure!(methods == want, "requests: {methods:#?}");
    ensure!(
        requests.iter().all(|r| r.query.is_empty()),
        "unexpected query: {requests:#?}"
    );
    ensure!(
        requests[0].body.as_ref() == Some(&serde_json::to_value(&event)?),
        "POST body: {:?}",
        requests[0].body
    );
    ensure!(
        requests[1].body.as_ref() == Some(&patch),
        "PATCH body: {:?}",
        requests[1].body
    );
    Ok(())
}

#[test]
fn events_strategic_patch_and_namespace_rules() -> Result<()> {
    let server = FakeApiServer::start()?;
    let dir = tempfile::tempdir()?;
    let rt = health_tests::multi_thread_runtime()?;
    rt.block_on(async {
        let client = server.kube_client(dir.path(), true).await?;
        let api = Api::<Event>::namespaced(client.clone(), "default");
        api.create(&PostParams::default(), &pod_event("e1")).await?;
        let patched = api
            .patch(
                "e1",
                &PatchParams::default(),
                &Patch::Strategic(json!({"count": 3, "series": null})),
            )
            .await?;
        ensure!(patched.count == Some(3), "strategic patch: {patched:?}");

        // An event about a PV (cluster-scoped) lives in `default`, not elsewhere.
        let mut about_pv = pod_event("pv-event");
        about_pv.involved_object = ObjectReference {
            kind: Some("PersistentVolume".to_string()),
            name: Some("pv-1".to_string()),
            ..Default::default()
        };
        api.create(&PostParams::default(), &about_pv).await?;
        about_pv.metadata.namespace = Some("other".to_string());
        let res = Api::<Event>::namespaced(client.clone(), "other")
            .create(&PostParams::default(), &about_pv)
            .await;
        match res {
            Err(kube::Error::Api(s)) if s.code == 422 && s.reason == "Invalid" => {}
            other => bail!("PV event in namespace other: {other:?}"),
        }
        // And generateName works.
        let mut generated = pod_event("");
        generated.metadata.name = None;
        generated.metadata.generate_name = Some("a.".to_string());
        let created = api.create(&PostParams::default(), &generated).await?;
        let got = created.metadata.name.unwrap_or_default();
        ensure!(
            got.starts_with("a.") && got.len() == 7,
            "generated name {got:?}"
        );
        let listed = api.list(&ListParams::default()).await?;
        ensure!(listed.items.len() == 3, "events listed: {:?}", listed.items);
        anyhow::Ok(())
    })?;
    let stored = server.events();
    ensure!(stored.len() == 3, "{stored:#?}");
    let patch = server
        .requests()
        .into_iter()
        .find(|r| r.method == "PATCH")
        .context("no PATCH recorded")?;
    ensure!(
        patch.content_type.as_deref() == Some("application/strategic-merge-patch+json"),
        "{patch:?}"
    );
    Ok(())
}

#[test]
fn unavailable_and_refuse_modes_fail_requests_and_end_watches() -> Result<()> {
    let server = FakeApiServer::start()?;
    server.put(pod("default", "a", Some(NODE)));
    let dir = tempfile::tempdir()?;
    let rt = health_tests::multi_thread_runtime()?;
    let lp = ListParams::default().fields(SELECTOR);
    let no_retry = Api::<Pod>::all(rt.block_on(server.kube_client(dir.path(), false))?);
    let retrying = Api::<Pod>::all(rt.block_on(server.kube_client(dir.path(), true))?);

    rt.block_on(no_retry.list(&lp)).context("list while up")?;

    server.set_mode(Mode::Unavailable);
    match rt.block_on(no_retry.list(&lp)) {
        Err(kube::Error::Api(s)) if s.code == 503 && s.reason == "ServiceUnavailable" => {}
        other => bail!("list while unavailable: {other:?}"),
    }
    ensure!(server.requests().last().map(|r| r.status) == Some(503));

    // kube's default client retries 503 by itself; it succeeds once the server is back.
    let before = server.requests().len();
    let pending = {
        let api = retrying.clone();
        let lp = lp.clone();
        rt.spawn(async move { api.list(&lp).await })
    };
    server.wait_for(WAIT, |s| {
        (s.requests()[before..]
            .iter()
            .filter(|r| r.status == 503)
            .count()
            >= 3)
            .then_some(())
    })?;
    server.set_mode(Mode::Up);
    let listed = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), pending).await })
        .context("retried list did not finish")??
        .context("retried list")?;
    ensure!(listed.items.len() == 1);
    ensure!(server.requests().last().map(|r| r.status) == Some(200));

    rt.block_on(no_retry.list(&lp))
        .context("list after Mode::Up")?;

    server.set_mode(Mode::Refuse);
    for api in [&no_retry, &retrying] {
        match rt.block_on(async { tokio::time::timeout(WAIT, api.list(&lp)).await }) {
            Ok(Err(kube::Error::Api(s))) => bail!("refused list got a Status: {s:?}"),
            Ok(Err(transport)) => eprintln!("refused list: {transport}"),
            Ok(Ok(list)) => bail!("list succeeded while refusing: {list:?}"),
            Err(_) => bail!("refused list hung"),
        }
    }
    server.set_mode(Mode::Up);
    rt.block_on(retrying.list(&lp))
        .context("list after refusing")?;

    // Open watches end in both modes.
    for mode in [Mode::Unavailable, Mode::Refuse] {
        server.set_mode(Mode::Up);
        rt.block_on(async {
            let mut stream = no_retry
                .watch(&WatchParams::default().fields(SELECTOR), "0")
                .await
                .context("watch")?
                .boxed();
            match tokio::time::timeout(WAIT, stream.next()).await {
                Ok(Some(Ok(WatchEvent::Added(p)))) if p.metadata.name.as_deref() == Some("a") => {}
                other => bail!("first watch event: {other:?}"),
            }
            server.set_mode(mode);
            match tokio::time::timeout(WAIT, stream.next()).await {
                Ok(None | Some(Err(_))) => Ok(()),
                Ok(Some(Ok(ev))) => bail!("watch event after {mode:?}: {ev:?}"),
                Err(_) => bail!("watch still open {WAIT:?} after {mode:?}"),
            }
        })?;
    }
    Ok(())
}

#[test]
fn paginated_list_and_relist_after_compaction() -> Result<()> {
    let server = FakeApiServer::start()?;
    for name in ["p1", "p2", "p3"] {
        server.put(pod("default", name, Some(NODE)));
    }
    let dir = tempfile::tempdir()?;
    let rt = health_tests::multi_thread_runtime()?;
    let client = rt.block_on(server.kube_client(dir.path(), true))?;
    // Short watches without bookmarks, so a resumed watch asks for the list's version.
    let config = watcher::Config::default()
        .fields(SELECTOR)
        .page_size(1)
        .timeout(1)
        .disable_bookmarks();
    let store = pod_reflector(&rt, client, config)?;
    ensure!(
        names(&store) == set(&["p1", "p2", "p3"]),
        "{:?}",
        names(&store)
    );
    let requests = server.requests();
    let pages = lists(&requests, "/api/v1/pods");
    ensure!(pages.len() == 3, "pages: {pages:#?}");
    ensure!(pages[0].param("continue").is_none() && pages[0].param("limit") == Some("1"));
    ensure!(
        pages[1..].iter().all(|p| p.param("continue").is_some()),
        "{pages:#?}"
    );

    // A change the watch does not select, then compaction: the watch from the list's
    // version 3 (the open one if it had not caught up, else the next, as bookmarks are
    // off) gets 410 Expired as an ERROR event, and the watcher lists again.
    server.put(pod("default", "elsewhere", Some("node-2")));
    server.compact_history();
    let seen = server.requests().len();
    server
        .wait_for(Duration::from_secs(10), |s| {
            s.requests()[seen..]
                .iter()
                .any(|r| r.path == "/api/v1/pods" && !r.is_watch())
                .then_some(())
        })
        .context("no relist after the watch version was compacted")?;
    // The new list is at version 4, and so is the next watch.
    server
        .wait_for(WAIT, |s| {
            watches(&s.requests()[seen..], "/api/v1/pods")
                .iter()
                .any(|r| r.param("resourceVersion") == Some("4"))
                .then_some(())
        })
        .context("no watch from the relist's version 4")?;

    server.put(pod("default", "p4", Some(NODE)));
    server
        .wait_for(WAIT, |_| {
            (names(&store) == set(&["p1", "p2", "p3", "p4"])).then_some(())
        })
        .context("p4 not seen after relist")?;
    Ok(())
}

#[test]
fn bookmark_at_watch_timeout_moves_the_resume_version() -> Result<()> {
    let server = FakeApiServer::start()?;
    server.put(pod("default", "a", Some(NODE)));
    let dir = tempfile::tempdir()?;
    let rt = health_tests::multi_thread_runtime()?;
    let client = rt.block_on(server.kube_client(dir.path(), true))?;
    let store = pod_reflector(
        &rt,
        client,
        watcher::Config::default().fields(SELECTOR).timeout(1),
    )?;
    ensure!(names(&store) == set(&["a"]));
    server.put(pod("default", "b", Some("node-2"))); // version 2, not selected
    server
        .wait_for(Duration::from_secs(5), |s| {
            watches(&s.requests(), "/api/v1/pods")
                .iter()
                .any(|r| r.param("resourceVersion") == Some("2"))
                .then_some(())
        })
        .context("no watch resumed from the bookmark's version")?;
    Ok(())
}

#[test]
fn streaming_list_watcher_gets_initial_events_and_end_bookmark() -> Result<()> {
    let server = FakeApiServer::start()?;
    server.put(pod("default", "a", Some(NODE)));
    server.put(pod("default", "b", Some(NODE)));
    let dir = tempfile::tempdir()?;
    let rt = health_tests::multi_thread_runtime()?;
    let client = rt.block_on(server.kube_client(dir.path(), true))?;
    let store = pod_reflector(
        &rt,
        client,
        watcher::Config::default()
            .fields(SELECTOR)
            .streaming_lists(),
    )?;
    ensure!(names(&store) == set(&["a", "b"]), "{:?}", names(&store));
    server.put(pod("default", "c", Some(NODE)));
    server.wait_for(WAIT, |_| {
        (names(&store) == set(&["a", "b", "c"])).then_some(())
    })?;
    let requests = server.requests();
    ensure!(
        lists(&requests, "/api/v1/pods").is_empty(),
        "streaming lists do not list"
    );
    let watch = watches(&requests, "/api/v1/pods");
    ensure!(
        watch[0].query
            == query(&[
                ("watch", "true"),
                ("timeoutSeconds", "290"),
                ("fieldSelector", SELECTOR),
                ("allowWatchBookmarks", "true"),
                ("sendInitialEvents", "true"),
                ("resourceVersionMatch", "NotOlderThan"),
                ("resourceVersion", "0"),
            ]),
        "{:?}",
        watch[0].query
    );
    Ok(())
}

#[test]
fn unknown_paths_and_version() -> Result<()> {
    let server = FakeApiServer::start()?;
    let dir = tempfile::tempdir()?;
    let rt = health_tests::multi_thread_runtime()?;
    rt.block_on(async {
        let client = server.kube_client(dir.path(), true).await?;
        let version = client.apiserver_version().await.context("GET /version")?;
        ensure!(version.major == "1" && version.minor == "33", "{version:?}");
        let res = client.list_api_groups().await;
        match res {
            Err(kube::Error::Api(s)) if s.code == 404 && s.reason == "NotFound" => {}
            other => bail!("GET /apis: {other:?}"),
        }
        anyhow::Ok(())
    })
}
