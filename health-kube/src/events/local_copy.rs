//! This node's own Events as the API server last accepted them, kept in a
//! file on the node: what a restarted agent continues its open episodes
//! from ([`crate::events::Recorder::adopt`]), instead of listing Events.
//!
//! Why not the list: the API server does not serve Events from its watch
//! cache (it is off for events by default), so even a label-selected list
//! makes it read every Event in the cluster from etcd (measured: 2,000 of
//! 2,000 evaluated for one node's 89-byte answer), and a DaemonSet rollout
//! does that once per node. The writer sees every write the server accepts,
//! so it can keep the same Events itself: a `POST` adds one, a merge
//! `PATCH` is applied to the copy as the server applies it (RFC 7386), and
//! a `PATCH` answered 404 (expired) removes it.
//!
//! The file is rewritten whole after each accepted write (a temporary file,
//! synced, renamed over it), so a crash leaves the old or the new copy,
//! never half of one. Events the server has expired are dropped from it
//! ([`KEEP`], the server's default `--event-ttl`), which bounds it by what
//! the node wrote in the last hour, at most [`MAX_EVENTS`].

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Event;
use serde::{Deserialize, Serialize};

use super::{Outcome, Write};

/// How long an Event stays after its last write: the API server's default
/// `--event-ttl`. An Event kept longer by a server with a longer TTL starts
/// anew after a restart; one the server dropped sooner is patched, found
/// gone (404) and created again, as without the copy.
pub const KEEP: Duration = Duration::from_secs(3600);
/// At most this many Events are kept (the oldest go first). The recorder's
/// per-object budget makes far fewer in an hour on any node.
pub const MAX_EVENTS: usize = 10_000;
/// The file's layout; another one is not read.
const VERSION: u32 = 1;

/// The file's contents: read as owned Events, written from borrowed ones
/// (every accepted write rewrites the file; nothing is cloned for it).
#[derive(Serialize, Deserialize)]
struct File<E> {
    version: u32,
    events: Vec<E>,
}

#[derive(Debug, thiserror::Error)]
pub enum LocalCopyError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a copy of this agent's Events: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path} has layout version {found}; this agent reads version {VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The Events by (namespace, name), and where they are kept.
#[derive(Debug)]
pub struct LocalCopy {
    path: PathBuf,
    events: BTreeMap<(String, String), Event>,
    saver: Option<Saver>,
}

impl LocalCopy {
    /// An empty copy that will be kept at `path`.
    pub fn empty(path: &Path) -> LocalCopy {
        LocalCopy {
            path: path.to_path_buf(),
            events: BTreeMap::new(),
            saver: None,
        }
    }

    /// The copy kept at `path`; empty when there is no file (the agent's
    /// first start on this node).
    pub fn load(path: &Path) -> Result<LocalCopy, LocalCopyError> {
        let mut copy = LocalCopy::empty(path);
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(copy),
            Err(source) => {
                return Err(LocalCopyError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let file: File<Event> =
            serde_json::from_slice(&bytes).map_err(|source| LocalCopyError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        if file.version != VERSION {
            return Err(LocalCopyError::Version {
                path: path.to_path_buf(),
                found: file.version,
            });
        }
        for event in file.events {
            if let Some(key) = key(&event) {
                copy.events.insert(key, event);
            }
        }
        Ok(copy)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The Events, for [`crate::events::Recorder::adopt`].
    pub fn events(&self) -> Vec<Event> {
        self.events.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Applies a write as the server answered it; whether the copy changed.
    pub fn apply(&mut self, write: &Write, outcome: &Outcome) -> bool {
        match (write, outcome) {
            (Write::Create { event, .. }, Outcome::Done) => match key(event) {
                Some(k) => {
                    self.events.insert(k, (**event).clone());
                    true
                }
                None => false,
            },
            (
                Write::Patch {
                    namespace,
                    name,
                    patch,
                    ..
                },
                Outcome::Done,
            ) => {
                let k = (namespace.clone(), name.clone());
                let Some(event) = self.events.get_mut(&k) else {
                    // Not kept (dropped by age): nothing to patch.
                    return false;
                };
                match merged(event, patch) {
                    Some(patched) => *event = patched,
                    // Not an Event after the patch: the server would have
                    // refused it; forget ours rather than keep a guess.
                    None => {
                        self.events.remove(&k);
                    }
                }
                true
            }
            (
                Write::Patch {
                    namespace, name, ..
                },
                Outcome::NotFound,
            ) => self
                .events
                .remove(&(namespace.clone(), name.clone()))
                .is_some(),
            _ => false,
        }
    }

    /// Drops what the server has expired by `now`, then writes the file.
    pub fn save(&mut self, now: SystemTime) -> Result<(), LocalCopyError> {
        let bytes = self.file_bytes(now);
        write_atomically(&self.path, &bytes).map_err(|source| LocalCopyError::Write {
            path: self.path.clone(),
            source,
        })
    }

    /// [`LocalCopy::save`] on a thread of its own (started at the first
    /// call), so that the caller never waits for the node's disk: the
    /// writer runs on the event thread, and a node whose disk hangs is one
    /// the agent must go on watching. Only the newest bytes are written.
    pub fn save_in_background(&mut self, now: SystemTime) {
        let bytes = self.file_bytes(now);
        if self.saver.is_none() {
            match Saver::start(self.path.clone()) {
                Ok(saver) => self.saver = Some(saver),
                Err(e) => {
                    tracing::error!("cannot start the thread that keeps this node's Events: {e}");
                    return;
                }
            }
        }
        if let Some(saver) = &self.saver {
            saver.put(bytes);
        }
    }

    /// Drops what the server has expired by `now`; the file's contents.
    fn file_bytes(&mut self, now: SystemTime) -> Vec<u8> {
        self.prune(now);
        let file = File {
            version: VERSION,
            events: self.events.values().collect(),
        };
        serde_json::to_vec(&file).expect("an Event serializes")
    }

    fn prune(&mut self, now: SystemTime) {
        self.events
            .retain(|_, e| last_write(e).is_some_and(|t| t + KEEP > now));
        if self.events.len() > MAX_EVENTS {
            let mut by_age: Vec<(SystemTime, (String, String))> = self
                .events
                .iter()
                .map(|(k, e)| (last_write(e).unwrap_or(SystemTime::UNIX_EPOCH), k.clone()))
                .collect();
            by_age.sort();
            let excess = self.events.len() - MAX_EVENTS;
            for (_, k) in by_age.into_iter().take(excess) {
                self.events.remove(&k);
            }
        }
    }
}

fn key(event: &Event) -> Option<(String, String)> {
    Some((
        event.metadata.namespace.clone()?,
        event.metadata.name.clone()?,
    ))
}

/// When the Event was last written: `lastTimestamp` (which every write of
/// the recorder sets), else `firstTimestamp`.
fn last_write(event: &Event) -> Option<SystemTime> {
    event
        .last_timestamp
        .as_ref()
        .or(event.first_timestamp.as_ref())
        .map(|t| SystemTime::from(t.0))
}

/// `event` with a JSON merge patch applied, as the API server applies it.
fn merged(event: &Event, patch: &serde_json::Value) -> Option<Event> {
    let mut value = serde_json::to_value(event).ok()?;
    json_patch::merge(&mut value, patch);
    serde_json::from_value(value).ok()
}

/// How long dropping a [`Saver`] waits for its last write (the agent's
/// shutdown): the newest counts should reach the file, but a hung disk
/// must not hold the process.
const LAST_WRITE_WAIT: Duration = Duration::from_secs(2);

/// The newest bytes to write, and whether the owner is gone.
#[derive(Default)]
struct Slot {
    bytes: Option<Vec<u8>>,
    writing: bool,
    closed: bool,
}

/// A thread that writes the file: it holds at most one pending version
/// (a newer one replaces it), so memory stays bounded however long a write
/// takes. A failure is logged once until a write succeeds again.
struct Saver {
    slot: Arc<(Mutex<Slot>, Condvar)>,
}

impl std::fmt::Debug for Saver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Saver")
    }
}

impl Saver {
    fn start(path: PathBuf) -> std::io::Result<Saver> {
        let slot: Arc<(Mutex<Slot>, Condvar)> = Arc::default();
        let theirs = Arc::clone(&slot);
        std::thread::Builder::new()
            .name("events-copy".into())
            .spawn(move || save_loop(&path, &theirs))?;
        Ok(Saver { slot })
    }

    fn put(&self, bytes: Vec<u8>) {
        let (lock, changed) = &*self.slot;
        lock.lock().unwrap_or_else(|e| e.into_inner()).bytes = Some(bytes);
        changed.notify_all();
    }
}

impl Drop for Saver {
    fn drop(&mut self) {
        let (lock, changed) = &*self.slot;
        let mut slot = lock.lock().unwrap_or_else(|e| e.into_inner());
        slot.closed = true;
        changed.notify_all();
        let deadline = std::time::Instant::now() + LAST_WRITE_WAIT;
        while slot.bytes.is_some() || slot.writing {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    "stopping before this node's Events were kept (the disk is slow or hung)"
                );
                return;
            }
            slot = changed
                .wait_timeout(slot, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

fn save_loop(path: &Path, slot: &(Mutex<Slot>, Condvar)) {
    let (lock, changed) = slot;
    let mut failing = false;
    loop {
        let bytes = {
            let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(bytes) = s.bytes.take() {
                    s.writing = true;
                    break bytes;
                }
                if s.closed {
                    return;
                }
                s = changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        };
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| write_atomically(path, &bytes));
        match written {
            Ok(()) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::error!(
                    "cannot keep this node's Events in {}: {e}; after a restart, open episodes will start new Events",
                    path.display()
                );
            }
            Err(_) => {}
        }
        lock.lock().unwrap_or_else(|e| e.into_inner()).writing = false;
        changed.notify_all();
    }
}

/// Writes `bytes` to `path` through a synced temporary file in the same
/// directory and a rename, so that `path` holds the old or the new bytes
/// whatever happens.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use serde_json::json;

    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn time(t: SystemTime) -> Time {
        Time(k8s_openapi::jiff::Timestamp::try_from(t).unwrap())
    }

    fn event(name: &str, last: SystemTime) -> Event {
        Event {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            count: Some(1),
            message: Some("pod default/web-0: Degraded BlockIOErrors: 1 failed write".into()),
            first_timestamp: Some(time(last)),
            last_timestamp: Some(time(last)),
            ..Event::default()
        }
    }

    fn create(e: &Event) -> Write {
        Write::Create {
            series: 1,
            event: Box::new(e.clone()),
        }
    }

    fn patch(name: &str, patch: serde_json::Value) -> Write {
        Write::Patch {
            series: 1,
            namespace: "default".into(),
            name: name.into(),
            type_: crate::events::EventType::Warning,
            reason: "BlockIOErrors".into(),
            patch,
        }
    }

    #[test]
    fn accepted_writes_are_kept_as_the_server_has_them_and_survive_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.json");
        let mut copy = LocalCopy::load(&path).unwrap();
        assert!(copy.is_empty(), "no file is an empty copy");
        let first = event("web-0.1", at(0));
        assert!(copy.apply(&create(&first), &Outcome::Done));
        let later = time(at(60));
        let p = json!({"count": 7, "lastTimestamp": later, "message": "pod default/web-0: Degraded BlockIOErrors: 7 failed writes"});
        assert!(copy.apply(&patch("web-0.1", p), &Outcome::Done));
        // Writes the server did not accept change nothing.
        let refused = event("web-0.2", at(61));
        assert!(!copy.apply(&create(&refused), &Outcome::Retry));
        assert!(!copy.apply(&create(&refused), &Outcome::Conflict));
        assert!(!copy.apply(&patch("web-0.1", json!({"count": 9})), &Outcome::Rejected));
        copy.save(at(61)).unwrap();

        let back = LocalCopy::load(&path).unwrap().events();
        assert_eq!(back.len(), 1);
        let e = &back[0];
        assert_eq!(e.metadata.name.as_deref(), Some("web-0.1"));
        assert_eq!(e.count, Some(7));
        assert_eq!(
            e.last_timestamp.as_ref().map(|t| SystemTime::from(t.0)),
            Some(at(60))
        );
        assert_eq!(
            e.first_timestamp.as_ref().map(|t| SystemTime::from(t.0)),
            Some(at(0))
        );
        assert_eq!(
            e.message.as_deref(),
            Some("pod default/web-0: Degraded BlockIOErrors: 7 failed writes")
        );
    }

    #[test]
    fn the_background_save_writes_the_newest_copy_before_it_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        // A directory that does not exist yet: the saver makes it.
        let path = dir.path().join("state").join("events.json");
        let mut copy = LocalCopy::empty(&path);
        copy.apply(&create(&event("a", at(0))), &Outcome::Done);
        copy.save_in_background(at(1));
        copy.apply(&create(&event("b", at(2))), &Outcome::Done);
        copy.save_in_background(at(3));
        drop(copy);
        let names: Vec<_> = LocalCopy::load(&path)
            .unwrap()
            .events()
            .into_iter()
            .map(|e| e.metadata.name.unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn an_expired_event_is_forgotten_whether_the_server_says_so_or_the_hour_passed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.json");
        let mut copy = LocalCopy::empty(&path);
        copy.apply(&create(&event("a", at(0))), &Outcome::Done);
        copy.apply(&create(&event("b", at(100))), &Outcome::Done);
        copy.apply(&create(&event("c", at(200))), &Outcome::Done);
        // The server no longer has `c`.
        assert!(copy.apply(&patch("c", json!({"count": 2})), &Outcome::NotFound));
        // An hour after `a`'s last write, the server's TTL took it.
        copy.save(at(3600)).unwrap();
        let names: Vec<_> = LocalCopy::load(&path)
            .unwrap()
            .events()
            .into_iter()
            .map(|e| e.metadata.name.unwrap())
            .collect();
        assert_eq!(names, ["b"]);
    }

    #[test]
    fn a_damaged_or_foreign_file_is_an_error_that_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.json");
        std::fs::write(&path, b"{\"version\": 1, \"events\": [").unwrap();
        let e = LocalCopy::load(&path).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "{} is not a copy of this agent's Events: ",
                path.display()
            )),
            "{e}"
        );
        std::fs::write(&path, b"{\"version\": 2, \"events\": []}").unwrap();
        let e = LocalCopy::load(&path).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} has layout version 2; this agent reads version 1",
                path.display()
            )
        );
    }

    #[test]
    fn at_most_max_events_are_kept_the_oldest_going_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut copy = LocalCopy::empty(&dir.path().join("events.json"));
        for i in 0..(MAX_EVENTS as u64 + 3) {
            copy.apply(
                &create(&event(&format!("e{i:05}"), at(i / 100))),
                &Outcome::Done,
            );
        }
        copy.prune(at(200));
        assert_eq!(copy.len(), MAX_EVENTS);
        let names: Vec<_> = copy.events.keys().map(|(_, n)| n.clone()).collect();
        assert_eq!(names.first().map(String::as_str), Some("e00003"));
    }
}
