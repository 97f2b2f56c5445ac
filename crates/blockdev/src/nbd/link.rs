//! [`Link`]: a connection that is opened again, in the background, after
//! it dies.
//!
//! [`Link::get`] never blocks on the network: when the link has no live
//! connection it starts a thread that connects (at most one at a time, and
//! at most one attempt per [`Timeouts::retry`](super::Timeouts::retry)),
//! and fails at once with the reason. So a queue worker never waits for a
//! server that is down or a host that does not answer, and requests fail
//! promptly until the server is back. A reconnected export must still hold
//! the namespace and be writable; a server that came back with a smaller
//! or read-only export is refused, as at start.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::conn::Conn;
use super::{check_export, Target};
use crate::BlockError;

pub(super) struct Link {
    target: Arc<Target>,
    state: Arc<Mutex<State>>,
}

struct State {
    conn: Option<Arc<Conn>>,
    /// A thread is connecting.
    connecting: bool,
    last_attempt: Option<Instant>,
    last_error: String,
    /// Whether a connection was ever open (the next one is a reconnection).
    connected_before: bool,
}

impl Link {
    /// A link over `conn`, already open, or with none yet.
    pub fn new(target: Arc<Target>, conn: Option<Conn>) -> Self {
        Self {
            target,
            state: Arc::new(Mutex::new(State {
                connected_before: conn.is_some(),
                conn: conn.map(Arc::new),
                connecting: false,
                last_attempt: None,
                last_error: "connecting".into(),
            })),
        }
    }

    /// The live connection; without one, starts connecting (unless an
    /// attempt is under way or too recent) and fails.
    pub fn get(&self) -> Result<Arc<Conn>, BlockError> {
        let mut state = self.state.lock();
        if let Some(conn) = state.conn.take() {
            match conn.dead_reason() {
                None => {
                    state.conn = Some(conn.clone());
                    return Ok(conn);
                }
                // Dropped now: its reply thread has ended.
                Some(why) => state.last_error = why,
            }
        }
        let due = state
            .last_attempt
            .is_none_or(|at| at.elapsed() >= self.target.timeouts.retry);
        if !state.connecting && due {
            state.connecting = true;
            state.last_attempt = Some(Instant::now());
            let (target, shared) = (self.target.clone(), self.state.clone());
            let spawned = std::thread::Builder::new()
                .name("vnvme-nbd-connect".into())
                .spawn(move || connect(&target, &shared));
            if let Err(e) = spawned {
                state.connecting = false;
                state.last_error = format!("cannot start a thread to connect: {e}");
            }
        }
        Err(unreachable(&state.last_error))
    }
}

/// Opens a connection and installs it in `state`, or records why not.
fn connect(t: &Target, state: &Mutex<State>) {
    let opened = Conn::open(&t.uri.address, &t.uri.export, t.timeouts)
        .map_err(|e| format!("{}: {}", t.uri.address, chain(&e)))
        .and_then(|c| {
            check_export(&t.uri, c.export(), t.size)
                .map(|()| c)
                .map_err(|e| e.to_string())
        });
    let mut state = state.lock();
    state.connecting = false;
    match opened {
        Ok(conn) => {
            if state.connected_before {
                tracing::info!("NBD server {} reconnected", t.uri.address);
            }
            state.connected_before = true;
            state.conn = Some(Arc::new(conn));
        }
        Err(why) => {
            tracing::warn!("NBD reconnection failed: {why}");
            state.last_error = why;
        }
    }
}

fn unreachable(why: &str) -> BlockError {
    BlockError::Io(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        format!("NBD server unreachable: {why}"),
    ))
}

/// An error and its sources, on one line.
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
