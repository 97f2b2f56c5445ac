//! The control socket: `vnvme serve --control PATH` answers JSON-RPC 2.0
//! requests, one per line, on a UNIX socket (mode 0600: the owner only),
//! so the device can be changed and broken while it serves (`vnvme ctl`
//! is its client; the `methods` module lists what it does).
//!
//! The client is hostile like any other: each request line is at most
//! [`MAX_LINE`] bytes and must arrive whole within [`REQUEST_TIMEOUT`]
//! once started; a connection idle for [`IDLE_TIMEOUT`] is closed; a reply
//! the client does not read within [`REQUEST_TIMEOUT`] closes it; at most
//! [`MAX_CONNECTIONS`] are served at once (the next is told so and
//! closed). Nothing a client sends reaches the controller unchecked.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use vnvme_controller::Controller;
use vnvme_vfio_user::StopWake;

use crate::socket::{Access, SocketFile};
use crate::stopping::Stop;
use crate::upgrade::{Requests, Written};

pub mod client;
pub mod fault_params;
pub(crate) mod faults;
pub(crate) mod hold;
mod methods;

/// Longest request line, in bytes.
pub const MAX_LINE: usize = 64 * 1024;
/// How long a request may take to arrive once its first byte has, and a
/// reply to be taken by the client.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection may stay silent between requests.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// How often a connection's thread looks at the stop flag, and how long
/// the accepting thread waits after an error (EMFILE) before it retries.
const TICK: Duration = Duration::from_millis(100);

/// JSON-RPC 2.0 error codes (§5.1).
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    /// The request was understood, and the controller refused it.
    pub const REFUSED: i64 = -32000;
}

/// A JSON-RPC error: its code and a message saying what was wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// A method's named params `v` as `T`, or what is wrong with them.
fn params<T: serde::de::DeserializeOwned>(method: &str, v: Value) -> Result<T, RpcError> {
    serde_json::from_value(v)
        .map_err(|e| RpcError::new(code::INVALID_PARAMS, format!("{method}: {e}")))
}

/// A request the server understood and will not do, with why.
fn refused(e: impl std::fmt::Display) -> RpcError {
    RpcError::new(code::REFUSED, e.to_string())
}

/// The serving control socket; dropping it stops its threads and removes
/// the socket.
#[derive(Debug)]
pub struct ControlServer {
    file: SocketFile,
    done: Arc<AtomicBool>,
    /// Wakes the accepting thread, which sleeps until a connection or
    /// this (an idle control socket costs no wake-ups).
    wake: StopWake,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Binds `path` (mode `mode`, 0600 by default) and serves `ctrl` and
    /// its subsystem's `peers` on it; `stop` is what the `shutdown` method
    /// sets (the server's own stop flag).
    pub fn start(
        path: &Path,
        mode: u32,
        ctrl: Arc<Controller>,
        peers: Vec<Arc<Controller>>,
        stop: Stop,
    ) -> Result<Self> {
        let (listener, file) = bind(path, mode)?;
        let hooks = Hooks {
            stop,
            upgrade: None,
            peers,
            supervised: false,
        };
        Self::serve(listener, file, ctrl, hooks)
    }

    /// Serves `ctrl` on `listener`, bound at `file` (made here or by the
    /// process this one took over from), with `hooks`.
    pub fn serve(
        listener: UnixListener,
        file: SocketFile,
        ctrl: Arc<Controller>,
        hooks: Hooks,
    ) -> Result<Self> {
        listener
            .set_nonblocking(true)
            .context("making the control socket non-blocking")?;
        let done = Arc::new(AtomicBool::new(false));
        let wake = StopWake::new().context("making the control socket's wake-up socket pair")?;
        let (d, w) = (Arc::clone(&done), wake.clone());
        let thread = std::thread::Builder::new()
            .name("vnvme-control".into())
            .spawn(move || accept_loop(&listener, &ctrl, &hooks, &d, &w))
            .context("starting the control socket's thread")?;
        Ok(Self {
            file,
            done,
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        self.wake.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.file.remove();
    }
}

/// What the methods reach besides the controller: the server's stop flag
/// (`shutdown`), its upgrade requests (`upgrade`; `None`: not offered) and
/// the subsystem's other controllers (the faults' `controller`).
#[derive(Debug, Clone)]
pub struct Hooks {
    pub stop: Stop,
    pub upgrade: Option<Arc<Requests>>,
    /// CNTLID 2, 3, ...: empty for a one-controller subsystem.
    pub peers: Vec<Arc<Controller>>,
    /// Under `vnvme serve --supervise`, whose next server after a crash
    /// serves the namespaces of its arguments only.
    pub supervised: bool,
}

/// Binds the socket with `mode` from its first moment (see
/// `socket::bind`), replacing a stale file but not a live server's.
pub fn bind(path: &Path, mode: u32) -> Result<(UnixListener, SocketFile)> {
    let access = Access { mode, group: None };
    crate::socket::bind(path, &access, "--control", "control socket")
}

fn accept_loop(
    listener: &UnixListener,
    ctrl: &Arc<Controller>,
    hooks: &Hooks,
    done: &Arc<AtomicBool>,
    wake: &StopWake,
) {
    let open = Arc::new(AtomicUsize::new(0));
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    while !done.load(Ordering::Acquire) {
        threads.retain(|t| !t.is_finished());
        match listener.accept() {
            Ok((mut stream, _)) => {
                if open.load(Ordering::Acquire) >= MAX_CONNECTIONS {
                    let _ = stream.set_write_timeout(Some(TICK));
                    let e = RpcError::new(
                        code::REFUSED,
                        format!("too many control connections (at most {MAX_CONNECTIONS}): close one and retry"),
                    );
                    let _ = stream.write_all(&reply_line(Value::Null, Err(e)));
                    continue;
                }
                open.fetch_add(1, Ordering::AcqRel);
                let (ctrl, hooks, done, o) = (
                    Arc::clone(ctrl),
                    hooks.clone(),
                    Arc::clone(done),
                    Arc::clone(&open),
                );
                let spawned = std::thread::Builder::new()
                    .name("vnvme-control-conn".into())
                    .spawn(move || {
                        serve_connection(&mut stream, &ctrl, &hooks, &done);
                        // Its slot is free before the client sees the
                        // close: one that reconnects then is not refused.
                        o.fetch_sub(1, Ordering::AcqRel);
                        drop(stream);
                    });
                match spawned {
                    Ok(t) => threads.push(t),
                    Err(e) => {
                        open.fetch_sub(1, Ordering::AcqRel);
                        tracing::warn!("control connection dropped: no thread for it ({e})");
                    }
                }
            }
            // The connection threads that ended meanwhile are joined at
            // the next connection or at the end.
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                wake.wait_for(listener.as_fd());
            }
            Err(e) => {
                tracing::warn!("control socket accept: {e}");
                std::thread::sleep(TICK);
            }
        }
    }
    for t in threads {
        let _ = t.join();
    }
}

/// Serves one connection: a request per line, a reply per request (none
/// for a notification), until the client closes it, breaks a limit, or
/// the server stops.
fn serve_connection(
    stream: &mut UnixStream,
    ctrl: &Arc<Controller>,
    hooks: &Hooks,
    done: &AtomicBool,
) {
    if stream.set_read_timeout(Some(TICK)).is_err()
        || stream.set_write_timeout(Some(REQUEST_TIMEOUT)).is_err()
    {
        return;
    }
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut last_activity = Instant::now();
    // When the first byte of the request being read arrived.
    let mut started: Option<Instant> = None;
    loop {
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            started = (!buf.is_empty()).then(Instant::now);
            if let Some((reply, written)) =
                handle_line(line.get(..end).unwrap_or_default(), ctrl, hooks)
            {
                let failed = stream.write_all(&reply).is_err();
                // An upgrade's old process exits once its reply is out.
                if let Some(w) = written {
                    w.done();
                }
                if failed {
                    return;
                }
            }
        }
        if buf.len() > MAX_LINE {
            let e = RpcError::new(
                code::INVALID_REQUEST,
                format!("request longer than {MAX_LINE} bytes: closing the connection"),
            );
            let _ = stream.write_all(&reply_line(Value::Null, Err(e)));
            return;
        }
        if done.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        if started.is_some_and(|t| now.duration_since(t) > REQUEST_TIMEOUT)
            || now.duration_since(last_activity) > IDLE_TIMEOUT
        {
            return;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => {
                last_activity = Instant::now();
                started.get_or_insert(last_activity);
                buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
    }
}

/// A reply line, and for a successful upgrade what to tell once it is
/// written.
type Reply = (Vec<u8>, Option<Written>);

/// Answers one request line; `None` for a notification (no id).
fn handle_line(line: &[u8], ctrl: &Arc<Controller>, hooks: &Hooks) -> Option<Reply> {
    let request: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            let e = RpcError::new(code::PARSE_ERROR, format!("request is not JSON: {e}"));
            return Some((reply_line(Value::Null, Err(e)), None));
        }
    };
    let Value::Object(obj) = request else {
        let what = if request.is_array() {
            "batch requests are not supported: send one request per line"
        } else {
            "a request is a JSON object with jsonrpc, method, params and id"
        };
        return Some((
            reply_line(Value::Null, Err(RpcError::new(code::INVALID_REQUEST, what))),
            None,
        ));
    };
    let id = obj.get("id").cloned();
    let valid_id = matches!(
        id,
        None | Some(Value::Null | Value::Number(_) | Value::String(_))
    );
    let reply_id = if valid_id {
        id.clone().unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    let mut written = None;
    let result = check_request(&obj, valid_id).and_then(|(method, params)| {
        if method == "upgrade" {
            let (result, w) = methods::upgrade(hooks, params);
            written = w;
            return result;
        }
        methods::call(ctrl, hooks, method, params)
    });
    // A notification (no id) gets no reply, not even an error (§4.1).
    id.is_some()
        .then(|| (reply_line(reply_id, result), written))
}

/// The method and params of a well-formed JSON-RPC 2.0 request.
fn check_request(
    obj: &serde_json::Map<String, Value>,
    valid_id: bool,
) -> Result<(&str, Value), RpcError> {
    let invalid = |m: &str| RpcError::new(code::INVALID_REQUEST, m);
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid("\"jsonrpc\" must be \"2.0\""));
    }
    if !valid_id {
        return Err(invalid("\"id\" must be a number, a string or null"));
    }
    let method = obj
        .get("method")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("\"method\" must be a string"))?;
    let params = match obj.get("params") {
        None | Some(Value::Null) => json!({}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                "params must be an object of named parameters",
            ))
        }
    };
    Ok((method, params))
}

/// A reply line: `{"jsonrpc":"2.0","result"|"error":...,"id":...}\n`.
fn reply_line(id: Value, result: Result<Value, RpcError>) -> Vec<u8> {
    let body = match result {
        Ok(result) => json!({"jsonrpc": "2.0", "result": result, "id": id}),
        Err(e) => {
            json!({"jsonrpc": "2.0", "error": {"code": e.code, "message": e.message}, "id": id})
        }
    };
    let mut line = body.to_string().into_bytes();
    line.push(b'\n');
    line
}
