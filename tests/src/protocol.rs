//! The control protocol spoken between [`crate::FaultDisk`] and the `faultdisk` server.
//!
//! Transport: a unix stream socket `ctl.sock` in the server's work dir. Each request is
//! one line of JSON, each answer is one line of JSON; a connection may carry any number
//! of request/answer pairs, strictly alternating.
//!
//! ```text
//! -> {"cmd":"add_rule","rule":{"op":"write","range":{"start":1048576,"end":1052672},"errno":5,"limit":1}}
//! <- {"ok":true,"rule_id":1}
//! -> {"cmd":"stats"}
//! <- {"ok":true,"stats":{"total_injected":1,"injected":[{"op":"write","errno":5,"count":1}],...}}
//! -> {"cmd":"nonsense"}
//! <- {"ok":false,"error":"bad request: unknown variant `nonsense`, ..."}
//! ```
//!
//! Every answer has `ok`; failures carry `error`, successes carry the field named in
//! [`Response`] for that command (absent fields are omitted).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Name of the file the server exports at the root of its FUSE mount.
pub const IMAGE_NAME: &str = "disk.img";
/// Name of the control socket inside the work dir.
pub const CONTROL_SOCKET: &str = "ctl.sock";
/// Name of the FUSE mount point inside the work dir.
pub const MOUNT_DIR: &str = "mnt";
/// Name of the sparse backing file inside the work dir.
pub const BACKING_NAME: &str = "backing.img";
/// Name of the server's log file (its stderr) inside the work dir.
pub const LOG_NAME: &str = "faultdisk.log";
/// Default bound of the injection log; older entries are dropped (and counted).
pub const DEFAULT_LOG_CAPACITY: usize = 200_000;
/// Largest errno a FUSE reply may carry: the kernel rejects `error <= -ERESTARTSYS (512)`.
pub const MAX_ERRNO: i32 = 511;

/// Which FUSE requests a rule applies to.
///
/// The server sees what the loop driver turns block requests into:
/// * `read` / `write`: FUSE_READ / FUSE_WRITE (loop READ / WRITE requests);
/// * `discard`: FUSE_FALLOCATE, whatever its mode. Loop DISCARD becomes a punch-hole and
///   WRITE_ZEROES a zero-range *or* a punch-hole, so the two cannot be told apart here;
///   the injection log keeps the fallocate mode;
/// * `flush`: FUSE_FSYNC (loop FLUSH, and the post-flush of FUA writes). It has no byte
///   range, so only rules without a range match it;
/// * `any`: all of the above.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Read,
    Write,
    Discard,
    Flush,
    Any,
}

impl Op {
    /// Whether a rule for `self` applies to a request of kind `request` (never `Any`).
    pub fn matches(self, request: Op) -> bool {
        self == Op::Any || self == request
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Discard => "discard",
            Op::Flush => "flush",
            Op::Any => "any",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Half-open byte range `[start, end)` of the disk image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl ByteRange {
    /// Whether `[offset, offset + len)` shares at least one byte with this range.
    pub fn overlaps(&self, offset: u64, len: u64) -> bool {
        // saturating: a request near u64::MAX must not wrap around and match everything.
        let req_end = offset.saturating_add(len);
        len > 0 && offset < self.end && req_end > self.start
    }
}

/// One fault-injection rule. Rules are tried in the order they were added; the first one
/// that matches (and whose `limit` is not used up) decides the errno.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub op: Op,
    /// `None`: every byte (and flushes, which have no range).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<ByteRange>,
    /// Positive errno answered to the kernel (1..=511).
    pub errno: i32,
    /// Fail at most this many requests, then the rule stays but never matches again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

impl Rule {
    /// A rule failing every `op` request with `errno`.
    pub fn new(op: Op, errno: i32) -> Rule {
        Rule {
            op,
            range: None,
            errno,
            limit: None,
        }
    }

    /// Restrict the rule to requests overlapping `[start, start + len)`.
    pub fn range(mut self, start: u64, len: u64) -> Rule {
        self.range = Some(ByteRange {
            start,
            end: start.saturating_add(len),
        });
        self
    }

    /// Fail at most `n` requests.
    pub fn limit(mut self, n: u64) -> Rule {
        self.limit = Some(n);
        self
    }

    /// Checks the rule can be applied as the kernel expects; the server refuses others.
    pub fn validate(&self) -> Result<(), String> {
        if self.errno <= 0 || self.errno > MAX_ERRNO {
            return Err(format!(
                "errno {} out of range: FUSE accepts 1..={MAX_ERRNO}",
                self.errno
            ));
        }
        // ENOSYS is special to the kernel: on FSYNC / FALLOCATE it sets no_fsync /
        // no_fallocate for the rest of the connection, so every later flush silently
        // succeeds or every later discard returns EOPNOTSUPP without reaching us. That
        // would make the counters lie, so it is only allowed for read and write.
        if self.errno == libc::ENOSYS && !matches!(self.op, Op::Read | Op::Write) {
            return Err(format!(
                "errno ENOSYS ({}) on {} requests would permanently disable that request \
                 type in the kernel's FUSE connection; use it only with op read or write",
                libc::ENOSYS,
                self.op
            ));
        }
        if let Some(r) = self.range {
            if r.start >= r.end {
                return Err(format!("empty byte range [{}, {})", r.start, r.end));
            }
        }
        if self.limit == Some(0) {
            return Err("limit 0 would never fail anything; omit the rule instead".into());
        }
        Ok(())
    }
}

/// One failed request, as answered by the server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injection {
    /// Sequence number over the server's life (starts at 0, never reused, survives
    /// `reset_stats`), so callers can page with `injections_since`.
    pub seq: u64,
    /// `read`, `write`, `discard` or `flush` (never `any`).
    pub op: Op,
    /// Byte offset in the image (0 for flush).
    pub offset: u64,
    /// Byte length of the request (0 for flush).
    pub len: u64,
    pub errno: i32,
    /// Id of the rule that matched.
    pub rule_id: u64,
    /// fallocate mode bits for `discard` (FALLOC_FL_*), 0 otherwise.
    #[serde(default)]
    pub mode: i32,
    /// CLOCK_MONOTONIC nanoseconds read immediately before the error reply is written to
    /// /dev/fuse (after the rule lookup and the bookkeeping, so within a microsecond or
    /// two of the answer). Same clock as `bpf_ktime_get_ns` and tracefs' `mono` clock.
    pub mono_ns: u64,
}

/// Any served request (failed or not), recorded only while tracing is on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracedRequest {
    pub seq: u64,
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    /// 0 on success, else the errno answered.
    pub errno: i32,
    /// CLOCK_MONOTONIC ns when the request was received from /dev/fuse.
    pub received_ns: u64,
    /// CLOCK_MONOTONIC ns right before the answer was written.
    pub answered_ns: u64,
}

/// Failures injected for one (op, errno) pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrnoCount {
    pub op: Op,
    pub errno: i32,
    pub count: u64,
}

/// Per request type counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpCounters {
    pub read: u64,
    pub write: u64,
    pub discard: u64,
    pub flush: u64,
}

impl OpCounters {
    pub fn get(&self, op: Op) -> u64 {
        match op {
            Op::Read => self.read,
            Op::Write => self.write,
            Op::Discard => self.discard,
            Op::Flush => self.flush,
            Op::Any => self.read + self.write + self.discard + self.flush,
        }
    }

    pub fn get_mut(&mut self, op: Op) -> Option<&mut u64> {
        match op {
            Op::Read => Some(&mut self.read),
            Op::Write => Some(&mut self.write),
            Op::Discard => Some(&mut self.discard),
            Op::Flush => Some(&mut self.flush),
            Op::Any => None,
        }
    }
}

/// Counters since the server started (or since the last `reset_stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Every injected failure, all ops and errnos.
    pub total_injected: u64,
    /// Injected failures per (op, errno), sorted by op then errno.
    pub injected: Vec<ErrnoCount>,
    /// Requests received per type, failed or not. Includes the kernel's own: one FSYNC
    /// when a loop device switches to direct I/O at attach, and the WRITE_ZEROES that
    /// mkfs/BLKZEROOUT issue (they are fallocates, so they count as `discard`).
    pub requests: OpCounters,
    /// Bytes of requests received per type (flush: 0).
    pub bytes: OpCounters,
    /// Largest single request seen per type, in bytes: shows how the kernel split I/O.
    pub max_len: OpCounters,
    /// Entries currently held in the injection log.
    pub log_len: u64,
    /// Entries dropped from the front of the injection log because it was full.
    pub log_dropped: u64,
}

impl Stats {
    /// Failures injected for `op` (or every op, with `Op::Any`) with `errno`.
    pub fn injected(&self, op: Op, errno: i32) -> u64 {
        self.injected
            .iter()
            .filter(|c| op.matches(c.op) && c.errno == errno)
            .map(|c| c.count)
            .sum()
    }

    /// Failures injected for `op` (or every op, with `Op::Any`), any errno.
    pub fn injected_op(&self, op: Op) -> u64 {
        self.injected
            .iter()
            .filter(|c| op.matches(c.op))
            .map(|c| c.count)
            .sum()
    }
}

/// What the server says about itself once ready.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    pub pid: u32,
    pub size: u64,
    pub mount_dir: String,
    pub image_path: String,
    pub control_socket: String,
    /// FUSE protocol version the kernel offered, e.g. "7.45".
    pub kernel_abi: String,
    /// max_write the server asked for (fuser's ceiling, 16 MiB).
    pub max_write_requested: u32,
    /// /proc/sys/fs/fuse/max_pages_limit at mount time: the kernel clamps the
    /// connection's max_pages to it, so no READ/WRITE carries more than this many pages.
    pub max_pages_limit: u32,
    /// Largest READ/WRITE the kernel will send, in bytes, when the buffer is page
    /// aligned: min(max_write, max_pages_limit * page size).
    pub max_request_bytes: u64,
    /// Number of threads reading /dev/fuse.
    pub threads: u32,
}

/// A request on the control socket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Liveness check.
    Ping,
    /// The same [`ServerInfo`] the server printed when ready.
    Info,
    AddRule {
        rule: Rule,
    },
    RemoveRule {
        rule_id: u64,
    },
    ClearRules,
    /// Sleep this long before answering every read/write/discard/flush (0 = off).
    SetDelay {
        delay_us: u64,
    },
    Stats,
    /// Zero every counter and empty the injection log (sequence numbers go on).
    ResetStats,
    /// Entries of the injection log with `seq >= since` (all if absent).
    Injections {
        #[serde(default)]
        since: Option<u64>,
    },
    /// Start/stop recording every request (bounded like the injection log).
    SetTrace {
        on: bool,
    },
    /// Entries of the request trace with `seq >= since`.
    Requests {
        #[serde(default)]
        since: Option<u64>,
    },
    /// Answer, then exit at once without unmounting: every later request on the FUSE
    /// connection fails (the kernel aborts it when the /dev/fuse fds close).
    Vanish,
}

/// An answer on the control socket.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<ServerInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injections: Option<Vec<Injection>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<Vec<TracedRequest>>,
}

impl Response {
    pub fn ok() -> Response {
        Response {
            ok: true,
            ..Response::default()
        }
    }

    pub fn err(msg: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(msg.into()),
            ..Response::default()
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds (the clock BPF's `bpf_ktime_get_ns` uses).
pub fn mono_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail on Linux; 0 would only show up as an absurd timestamp.
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => (ts.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec() as u64),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_overlap() {
        let r = ByteRange {
            start: 4096,
            end: 8192,
        };
        assert!(!r.overlaps(0, 4096));
        assert!(r.overlaps(0, 4097));
        assert!(r.overlaps(8191, 1));
        assert!(!r.overlaps(8192, 4096));
        assert!(!r.overlaps(5000, 0));
        assert!(!r.overlaps(u64::MAX - 1, 10));
    }

    #[test]
    fn rule_json_shape() {
        let rule = Rule::new(Op::Write, 5).range(1 << 20, 4096).limit(1);
        let line = serde_json::to_string(&Request::AddRule { rule }).unwrap();
        assert_eq!(
            line,
            r#"{"cmd":"add_rule","rule":{"op":"write","range":{"start":1048576,"end":1052672},"errno":5,"limit":1}}"#
        );
        let back: Request = serde_json::from_str(&line).unwrap();
        assert!(matches!(back, Request::AddRule { .. }));
        let bare: Request = serde_json::from_str(r#"{"cmd":"injections"}"#).unwrap();
        assert_eq!(bare, Request::Injections { since: None });
    }

    #[test]
    fn rule_validation() {
        assert!(Rule::new(Op::Read, 0).validate().is_err());
        assert!(Rule::new(Op::Read, 512).validate().is_err());
        assert!(Rule::new(Op::Read, 511).validate().is_ok());
        assert!(Rule::new(Op::Flush, libc::ENOSYS).validate().is_err());
        assert!(Rule::new(Op::Read, libc::ENOSYS).validate().is_ok());
        assert!(Rule::new(Op::Read, 5).range(10, 0).validate().is_err());
        assert!(Rule::new(Op::Read, 5).limit(0).validate().is_err());
    }

    #[test]
    fn stats_lookup() {
        let s = Stats {
            injected: vec![
                ErrnoCount {
                    op: Op::Read,
                    errno: 5,
                    count: 2,
                },
                ErrnoCount {
                    op: Op::Write,
                    errno: 5,
                    count: 3,
                },
            ],
            ..Stats::default()
        };
        assert_eq!(s.injected(Op::Read, 5), 2);
        assert_eq!(s.injected(Op::Any, 5), 5);
        assert_eq!(s.injected_op(Op::Write), 3);
        assert_eq!(s.injected(Op::Write, 28), 0);
    }
}
