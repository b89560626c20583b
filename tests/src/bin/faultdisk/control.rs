//! The control socket: one JSON request per line (protocol in
//! `health_tests::protocol`), answered with one JSON response line.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use health_tests::protocol::{OpCounters, Request, Response};

use crate::disk::{ActiveRule, Disk};

pub(super) fn control_loop(listener: UnixListener, disk: Arc<Disk>) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let disk = disk.clone();
                // One thread per client connection: a client that keeps its connection
                // open must not block others.
                let spawned = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve_conn(stream, &disk) {
                            eprintln!("faultdisk: control connection: {e:#}");
                        }
                    });
                if let Err(e) = spawned {
                    eprintln!("faultdisk: cannot start control thread: {e}");
                }
            }
            Err(e) => {
                eprintln!("faultdisk: accept on control socket: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn serve_conn(stream: UnixStream, disk: &Disk) -> Result<()> {
    let mut writer = stream.try_clone().context("cloning control stream")?;
    let reader = BufReader::new(stream);
    for line in reader.lines() {
        let line = line.context("reading request")?;
        if line.trim().is_empty() {
            continue;
        }
        let (resp, vanish) = match serde_json::from_str::<Request>(&line) {
            Ok(req) => handle(req, disk),
            Err(e) => (Response::err(format!("bad request: {e}")), false),
        };
        let mut text = serde_json::to_string(&resp).context("encoding response")?;
        text.push('\n');
        writer
            .write_all(text.as_bytes())
            .and_then(|_| writer.flush())
            .context("writing response")?;
        if vanish {
            eprintln!("faultdisk: vanish requested; exiting without unmounting");
            // _exit: no destructors, no unmount, no flushing of anything else. Closing the
            // /dev/fuse fds in the kernel's exit path aborts the connection, so every
            // pending and later request fails.
            // SAFETY: _exit never returns and touches no Rust state.
            unsafe { libc::_exit(0) };
        }
    }
    Ok(())
}

fn handle(req: Request, disk: &Disk) -> (Response, bool) {
    let resp = match req {
        Request::Ping => Response::ok(),
        Request::Info => Response {
            info: disk.info.get().cloned(),
            ..Response::ok()
        },
        Request::AddRule { rule } => match rule.validate() {
            Ok(()) => {
                let mut st = disk.lock();
                let id = st.next_rule_id;
                st.next_rule_id += 1;
                st.rules.push(ActiveRule { id, rule, used: 0 });
                Response {
                    rule_id: Some(id),
                    ..Response::ok()
                }
            }
            Err(e) => Response::err(format!("invalid rule: {e}")),
        },
        Request::RemoveRule { rule_id } => {
            let mut st = disk.lock();
            let before = st.rules.len();
            st.rules.retain(|r| r.id != rule_id);
            if st.rules.len() < before {
                Response::ok()
            } else {
                Response::err(format!("no rule with id {rule_id}"))
            }
        }
        Request::ClearRules => {
            disk.lock().rules.clear();
            Response::ok()
        }
        Request::SetDelay { delay_us } => {
            disk.delay_us.store(delay_us, Ordering::Relaxed);
            Response::ok()
        }
        Request::Stats => Response {
            stats: Some(disk.stats()),
            ..Response::ok()
        },
        Request::ResetStats => {
            let mut st = disk.lock();
            st.counts.clear();
            st.total = 0;
            st.requests = OpCounters::default();
            st.bytes = OpCounters::default();
            st.max_len = OpCounters::default();
            st.log.clear();
            st.log_dropped = 0;
            st.trace.clear();
            Response::ok()
        }
        Request::Injections { since } => {
            let since = since.unwrap_or(0);
            let st = disk.lock();
            Response {
                injections: Some(st.log.iter().filter(|i| i.seq >= since).cloned().collect()),
                ..Response::ok()
            }
        }
        Request::SetTrace { on } => {
            disk.trace_on.store(on, Ordering::Relaxed);
            Response::ok()
        }
        Request::Requests { since } => {
            let since = since.unwrap_or(0);
            let st = disk.lock();
            Response {
                requests: Some(
                    st.trace
                        .iter()
                        .filter(|t| t.seq >= since)
                        .cloned()
                        .collect(),
                ),
                ..Response::ok()
            }
        }
        Request::Vanish => return (Response::ok(), true),
    };
    (resp, false)
}
