//! Watches of pods and PVs: where one starts (initial events or a resourceVersion), and
//! the task that streams its lines until its timeout, a history gap or an outage.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use hyper::body::Bytes;
use tokio::sync::mpsc;

use super::json::{bookmark_line, watch_line};
use super::query::param;
use super::reply::{error, Reply};
use super::select::WatchSpec;
use super::store::Shared;
use super::Mode;

/// A watch without `timeoutSeconds` (kube-rs always sends one) ends after this, the
/// real server's default `--min-request-timeout`.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Lines buffered per watch before the sender waits for the client to read.
const WATCH_BUFFER: usize = 256;

/// Starts a watch: decides where it starts under the lock, then hands the rest to a
/// task that streams lines into the response body.
pub(super) fn start_watch(
    shared: &Arc<Shared>,
    spec: WatchSpec,
    query: &[(String, String)],
) -> Reply {
    let timeout = match param(query, "timeoutSeconds").map(str::parse::<u64>) {
        // 0 means "the server's default", as on the real server.
        None | Some(Ok(0)) => DEFAULT_WATCH_TIMEOUT,
        Some(Ok(secs)) => Duration::from_secs(secs),
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!(
                    "invalid timeoutSeconds {:?}",
                    param(query, "timeoutSeconds").unwrap_or("")
                ),
                None,
            )
        }
    };
    let bookmarks = param(query, "allowWatchBookmarks") == Some("true");
    let send_initial = param(query, "sendInitialEvents") == Some("true");
    if send_initial && (!bookmarks || param(query, "resourceVersionMatch") != Some("NotOlderThan"))
    {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "sendInitialEvents=true requires allowWatchBookmarks=true and resourceVersionMatch=NotOlderThan"
                .to_string(),
            None,
        );
    }
    let resource_version = param(query, "resourceVersion").unwrap_or("");

    let mut initial = Vec::new();
    let cursor = {
        let st = shared.lock();
        if send_initial || resource_version.is_empty() || resource_version == "0" {
            // The current state as synthetic ADDED events, then changes.
            initial.extend(st.current(&spec).iter().map(|o| watch_line("ADDED", o)));
            if send_initial {
                initial.push(bookmark_line(spec.kind, st.rv, true));
            }
            st.rv
        } else {
            match resource_version.parse::<u64>() {
                Ok(rv) => rv,
                Err(_) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!("invalid resource version: {resource_version:?}"),
                        None,
                    )
                }
            }
        }
    };
    let (tx, rx) = mpsc::channel(WATCH_BUFFER);
    tokio::spawn(run_watch(
        shared.clone(),
        WatchTask {
            spec,
            cursor,
            initial,
            timeout,
            bookmarks,
        },
        tx,
    ));
    Reply::Watch(rx)
}

struct WatchTask {
    spec: WatchSpec,
    /// The version the client has seen everything up to.
    cursor: u64,
    initial: Vec<Bytes>,
    timeout: Duration,
    bookmarks: bool,
}

/// Streams a watch until its timeout (then a last BOOKMARK, so the client resumes
/// from the newest version even if nothing it selects changed), the client leaving,
/// a history gap (410 ERROR event), or a mode other than [`Mode::Up`].
async fn run_watch(shared: Arc<Shared>, task: WatchTask, tx: mpsc::Sender<Bytes>) {
    let mut changes = shared.changes.subscribe();
    let mut mode = shared.mode.subscribe();
    for line in task.initial {
        if tx.send(line).await.is_err() {
            return;
        }
    }
    let deadline = tokio::time::sleep(task.timeout);
    tokio::pin!(deadline);
    let mut cursor = task.cursor;
    let mut ending = false;
    loop {
        if *mode.borrow_and_update() != Mode::Up {
            return;
        }
        let drained = shared.lock().drain(&task.spec, cursor);
        match drained {
            Ok((lines, reached)) => {
                cursor = reached;
                for line in lines {
                    if tx.send(line).await.is_err() {
                        return;
                    }
                }
            }
            Err(gone) => {
                let _ = tx.send(gone).await;
                return;
            }
        }
        if ending {
            if task.bookmarks {
                let _ = tx.send(bookmark_line(task.spec.kind, cursor, false)).await;
            }
            return;
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = &mut deadline => ending = true,
            () = tx.closed() => return,
        }
    }
}
