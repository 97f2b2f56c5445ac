//! [`NbdQueue`]: the `nbd` backend's [`BlockQueue`], many requests in
//! flight on one connection (the queue's own with multi-conn, once open;
//! else the device's).
//!
//! * `submit` sends the request and returns; a read's data lands in its
//!   own buffer, or is copied into the guest memory it carries when its
//!   reply arrives. Requests the queue does not take are given back for
//!   the synchronous path: empty, out of range (which answers
//!   `OutOfRange`), larger than the server's maximum payload, a FUA write
//!   to a server without FUA (the synchronous path writes, then flushes),
//!   or past [`MAX_IN_FLIGHT`].
//! * A request that cannot be sent (the server is away) completes at
//!   once with the error, so `poll` finds it.
//! * Dropping the queue waits a moment ([`DROP_WAIT`]) for what is in
//!   flight, then leaves it to the connection, which owns the requests'
//!   data until each completes or fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::{Command, Sink};
use super::link::Link;
use super::proto::{cmd, tflag, ExportInfo};
use super::Timeouts;
use crate::{check_range, BlockCompletion, BlockError, BlockQueue, BlockRequest, Data};

/// Requests in flight per queue: more than a guest's usual queue depth
/// per queue, and the replies of one burst fit the reply buffer.
pub(super) const MAX_IN_FLIGHT: usize = 128;

/// How long dropping a queue waits for its requests: enough for a server
/// that answers, short enough that a silent one cannot hold up a
/// controller reset or the server's exit (SIGTERM stops it within 2 s).
const DROP_WAIT: Duration = Duration::from_secs(1);

pub(super) struct NbdQueue {
    size: u64,
    export: ExportInfo,
    timeouts: Timeouts,
    /// The queue's own connection (with multi-conn).
    own: Option<Link>,
    /// The device's connection.
    shared: Arc<Link>,
    sink: Arc<Sink>,
    in_flight: usize,
}

impl NbdQueue {
    pub fn new(
        size: u64,
        export: ExportInfo,
        timeouts: Timeouts,
        own: Option<Link>,
        shared: Arc<Link>,
        sink: Arc<Sink>,
    ) -> Self {
        Self {
            size,
            export,
            timeouts,
            own,
            shared,
            sink,
            in_flight: 0,
        }
    }

    /// The command for `request`, or `None` if the queue does not take it.
    fn command(&self, request: &BlockRequest) -> Option<Command> {
        let (kind, offset, data, fua) = match request {
            BlockRequest::Read { offset, data } => (cmd::READ, *offset, data, false),
            BlockRequest::Write { offset, data, fua } => (cmd::WRITE, *offset, data, *fua),
            BlockRequest::Flush => {
                return Some(Command {
                    kind: cmd::FLUSH,
                    flags: 0,
                    offset: 0,
                    len: 0,
                })
            }
        };
        let len = u32::try_from(data.len())
            .ok()
            .filter(|&l| l > 0 && l <= self.export.max_payload)?;
        check_range(offset, u64::from(len), self.size).ok()?;
        let flags = match (fua, self.export.has(tflag::SEND_FUA)) {
            (false, _) => 0,
            (true, true) => cmd::FLAG_FUA,
            (true, false) => return None,
        };
        Some(Command {
            kind,
            flags,
            offset,
            len,
        })
    }

    fn complete_now(&mut self, token: u64, data: Option<Data>, result: Result<(), BlockError>) {
        self.sink.push(BlockCompletion {
            token,
            data,
            result,
        });
        self.in_flight += 1;
    }
}

impl BlockQueue for NbdQueue {
    fn submit(&mut self, request: BlockRequest, token: u64) -> Result<(), BlockRequest> {
        if self.in_flight >= MAX_IN_FLIGHT {
            return Err(request);
        }
        let Some(command) = self.command(&request) else {
            return Err(request);
        };
        let data = match request {
            BlockRequest::Read { data, .. } | BlockRequest::Write { data, .. } => Some(data),
            BlockRequest::Flush if !self.export.has(tflag::SEND_FLUSH) => {
                // Nothing to flush: the server's writes are stable.
                self.complete_now(token, None, Ok(()));
                return Ok(());
            }
            BlockRequest::Flush => None,
        };
        // Any connection serves with multi-conn: the queue's own while it
        // is up, the device's while it is (re)connecting.
        let conn = match self.own.as_ref().and_then(|l| l.get().ok()) {
            Some(conn) => Ok(conn),
            None => self.shared.get(),
        };
        let conn = match conn {
            Ok(conn) => conn,
            Err(e) => {
                self.complete_now(token, data, Err(e));
                return Ok(());
            }
        };
        match conn.submit(command, data, token, &self.sink) {
            Ok(()) => self.in_flight += 1,
            Err((data, e)) => self.complete_now(token, data, Err(e)),
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<BlockCompletion>, max: usize) -> usize {
        let n = self.sink.take(out, max);
        self.in_flight = self.in_flight.saturating_sub(n);
        n
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn set_waking(&mut self, on: bool) {
        self.sink.set_waking(on);
    }
}

impl Drop for NbdQueue {
    fn drop(&mut self) {
        // Writes the host was told nothing about may still land: give them
        // a moment, so a reset usually leaves nothing behind.
        if self.in_flight > 0 {
            let deadline = Instant::now() + DROP_WAIT.min(self.timeouts.io);
            self.sink.wait_for(self.in_flight, deadline);
        }
    }
}
