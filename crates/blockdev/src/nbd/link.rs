//! [`Link`]: a connection that is opened again after it dies.
//!
//! A request finds its link's connection dead when the server went away;
//! the link then reconnects, at most once per [`Timeouts::retry`] so a
//! server that is down costs each request one failed look, not a
//! connection attempt. Until a reconnection succeeds requests fail at
//! once with the reason. A reconnected export must still hold the
//! namespace and be writable; a server that came back with a smaller or
//! read-only export is refused, as at start.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::conn::Conn;
use super::{check_export, Target};
use crate::BlockError;

pub(super) struct Link {
    target: Arc<Target>,
    state: Mutex<State>,
}

struct State {
    conn: Option<Arc<Conn>>,
    last_attempt: Option<Instant>,
    last_error: String,
    /// Whether a connection was ever open (the next one is a reconnection).
    connected_before: bool,
}

impl Link {
    /// A link that connects when first used.
    pub fn new(target: Arc<Target>) -> Self {
        Self::with(target, None)
    }

    /// A link over `conn`, already open.
    pub fn with(target: Arc<Target>, conn: Option<Conn>) -> Self {
        Self {
            target,
            state: Mutex::new(State {
                connected_before: conn.is_some(),
                conn: conn.map(Arc::new),
                last_attempt: None,
                last_error: String::new(),
            }),
        }
    }

    /// The live connection, reconnecting if it died and the last attempt
    /// is old enough.
    pub fn get(&self) -> Result<Arc<Conn>, BlockError> {
        let mut state = self.state.lock();
        if let Some(conn) = state.conn.as_ref().filter(|c| !c.is_dead()) {
            return Ok(conn.clone());
        }
        // Drop the dead one now: its reply thread has ended.
        state.conn = None;
        let t = &self.target;
        if state
            .last_attempt
            .is_some_and(|at| at.elapsed() < t.timeouts.retry)
        {
            return Err(unreachable(&state.last_error));
        }
        state.last_attempt = Some(Instant::now());
        let opened = Conn::open(&t.uri.address, &t.uri.export, t.timeouts)
            .map_err(|e| format!("{}: {}", t.uri.address, chain(&e)))
            .and_then(|c| {
                check_export(&t.uri, c.export(), t.size)
                    .map(|()| c)
                    .map_err(|e| e.to_string())
            });
        match opened {
            Ok(conn) => {
                if state.connected_before {
                    tracing::info!("NBD server {} reconnected", t.uri.address);
                }
                state.connected_before = true;
                let conn = Arc::new(conn);
                state.conn = Some(conn.clone());
                Ok(conn)
            }
            Err(why) => {
                tracing::warn!("NBD reconnection failed: {why}");
                state.last_error = why;
                Err(unreachable(&state.last_error))
            }
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
