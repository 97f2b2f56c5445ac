//! Reads, writes and flushes on their way to the backend, whatever the
//! backend: [`InFlight::start`] either submits the request to an
//! asynchronous backend (the `file` backend on io_uring) and the worker
//! goes on fetching commands, or runs it at once (a synchronous backend
//! such as `ram` or `null`, or an asynchronous queue with no room for it).
//! Either way the command ends as a [`BlockCompletion`] given to the one
//! completion function, [`crate::io::finish`]: at once, or when the worker
//! reaps it.
//!
//! For requests in flight:
//!
//! * Each worker has one [`BlockQueue`] per backend it used, opened on first
//!   use, with a waker that kicks the worker when completions are ready.
//! * A command in flight keeps what its completion needs: the command, the
//!   namespace, and the SQ and CQ it came from, by instance. Its data is
//!   in the backend request: a buffer of ours (a bounced read maps its PRPs
//!   again at completion, so a DMA_UNMAP meanwhile is a Data Transfer
//!   Error, never a write to freed memory), or the host's memory itself,
//!   which the request holds mapped until the kernel is done with it (a
//!   DMA_UNMAP meanwhile waits for it; see [`crate::io`]).
//! * Its CQ entry is reserved when it is fetched ([`Cq::reserved`]), so the
//!   completion always has room when it arrives.
//! * Delete I/O Submission Queue waits for the SQ's commands in flight
//!   (§5.6: its completion comes after theirs). A completion whose SQ is
//!   gone all the same (a controller reset) is dropped, and its buffer
//!   never reaches guest memory (what the kernel read in place is there
//!   already, as a device's DMA would be). Whatever a request's data is,
//!   the request owns it, so nothing the guest does can pull memory from
//!   under the kernel.
//! * Requests are queued on their backend queue as the worker starts them
//!   and started together when it reaps ([`InFlight::reap`] polls, which
//!   commits first; [`InFlight::commit`] after completions that started
//!   more): the `file` backend makes one `io_uring_enter` per pass, not one
//!   per request. A request that then fails to start completes with the
//!   error, as any other, so a command is never lost.
//! * When the worker stops (controller reset, detach), the queues are
//!   dropped, which waits for the kernel to finish with their data.
//! * When a pause stops it (a save: a supervised server's checkpoint, an
//!   upgrade) with commands still in flight after its drain, it leaves
//!   them, with their queues, in
//!   [`Shared::inflight_parked`](crate::state::Shared::inflight_parked)
//!   for the next worker of its index, which reaps them: dropped, their
//!   completions would never be posted, and the host would wait for them
//!   for ever. A reset drops them there.
//!
//! Bounded: each backend queue limits requests and bytes in flight, and
//! gives back what it cannot take, which then runs at once.

use std::sync::{Arc, Weak};
use std::time::Instant;

use vnvme_blockdev::{
    BlockCompletion, BlockDevice, BlockQueue, BlockRequest, IoBuf, ReadFill, Waker,
};
use vnvme_spec::Command;

use crate::backend_error::Chain;
use crate::io_request::ReadWrite;
use crate::namespace::reservation::Admitted;
use crate::namespace::Namespace;
use crate::queue::{Cq, Sq};

/// Completions reaped per poll of one backend queue (bounded work).
pub(crate) const REAP_BATCH: usize = 64;

/// Buffers kept for reuse; more are freed when they come back.
const MAX_POOLED: usize = 64;

/// What a command asks of its backend.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Read(ReadWrite),
    Write(ReadWrite),
    Flush,
}

/// How [`InFlight::start`] left a request.
#[derive(Debug)]
pub(crate) enum Started {
    /// Submitted to the backend's queue under this token; reaped later.
    InFlight(u64),
    /// Ran at once: its completion.
    Done(BlockCompletion),
}

/// Token of a completion that ran at once: never reaped, so no slot.
const RAN_AT_ONCE: u64 = u64::MAX;

/// A command in flight: what its completion needs.
#[derive(Debug)]
pub(crate) struct Request {
    pub cmd: Command,
    pub ns: Arc<Namespace>,
    pub kind: Kind,
    /// How the command was admitted (the namespace's reservation word,
    /// its count while it runs): dropped with the request.
    pub admitted: Admitted,
    /// Where it came from and where its completion goes (set by
    /// [`InFlight::bind`]).
    pub sqid: u16,
    pub sq_instance: u64,
    pub cqid: u16,
    pub cq_instance: u64,
    /// When it was fetched, if its latency is sampled.
    pub started: Option<Instant>,
}

struct BackendQueue {
    backend: Weak<dyn BlockDevice>,
    /// `None`: the backend could not open one; run synchronously.
    queue: Option<Box<dyn BlockQueue>>,
}

/// One worker's commands in flight.
pub(crate) struct InFlight {
    waker: Waker,
    queues: Vec<BackendQueue>,
    /// Indexed by token.
    slots: Vec<Option<Request>>,
    free: Vec<usize>,
    bufs: Vec<IoBuf>,
    reaped: Vec<BlockCompletion>,
    /// Whether the queues call the waker (see [`BlockQueue::set_waking`]).
    waking: bool,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("queues", &self.queues.len())
            .field("in_flight", &self.len())
            .finish_non_exhaustive()
    }
}

impl InFlight {
    pub fn new(waker: Waker) -> Self {
        Self {
            waker,
            queues: Vec::new(),
            slots: Vec::new(),
            free: Vec::new(),
            bufs: Vec::new(),
            reaped: Vec::new(),
            waking: true,
        }
    }

    /// Turns the backends' wakers on (before the worker sleeps: then reap
    /// once more) or off (while it is awake and reaps anyway).
    pub fn set_waking(&mut self, on: bool) {
        if on == self.waking {
            return;
        }
        self.waking = on;
        for q in &mut self.queues {
            if let Some(queue) = q.queue.as_mut() {
                queue.set_waking(on);
            }
        }
    }

    /// Commands submitted and not yet reaped.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A buffer of `len` bytes, from the pool when one is there.
    pub fn buffer(&mut self, len: usize) -> IoBuf {
        let mut buf = self.bufs.pop().unwrap_or_default();
        buf.set_len(len);
        buf
    }

    /// Returns a buffer to the pool.
    pub fn recycle(&mut self, buf: IoBuf) {
        if self.bufs.len() < MAX_POOLED {
            self.bufs.push(buf);
        }
    }

    /// Whether `ns`'s backend takes asynchronous requests.
    pub fn is_async(ns: &Namespace) -> bool {
        ns.backend.as_async().is_some()
    }

    /// Starts `request` for `ns`'s command `cmd` (`kind`, and as it was
    /// admitted, taken if it goes in flight): submitted to the backend's queue, or, on a synchronous
    /// backend or a queue with no room for it, run at once, a read's bytes
    /// passing through `fill`.
    pub fn start(
        &mut self,
        ns: &Arc<Namespace>,
        cmd: &Command,
        kind: (Kind, &mut Admitted),
        request: BlockRequest,
        fill: Option<&mut dyn ReadFill>,
    ) -> Started {
        if !Self::is_async(ns) {
            return Started::Done(request.run_with(&*ns.backend, RAN_AT_ONCE, fill));
        }
        match self.submit(ns, cmd, kind, request) {
            Ok(token) => Started::InFlight(token),
            Err(request) => Started::Done(request.run_with(&*ns.backend, RAN_AT_ONCE, fill)),
        }
    }

    /// Submits `request` to `ns`'s backend queue. Returns the token, or
    /// gives the request back unstarted.
    #[allow(clippy::result_large_err)]
    fn submit(
        &mut self,
        ns: &Arc<Namespace>,
        cmd: &Command,
        (kind, admitted): (Kind, &mut Admitted),
        request: BlockRequest,
    ) -> Result<u64, BlockRequest> {
        let token = match self.free.last() {
            Some(&t) => t,
            None => self.slots.len(),
        };
        let Some(queue) = self.queue_for(&ns.backend) else {
            return Err(request);
        };
        queue.submit(request, token as u64)?;
        if self.free.pop().is_none() {
            self.slots.push(None);
        }
        if let Some(slot) = self.slots.get_mut(token) {
            *slot = Some(Request {
                cmd: *cmd,
                ns: ns.clone(),
                kind,
                admitted: std::mem::take(admitted),
                sqid: 0,
                sq_instance: 0,
                cqid: 0,
                cq_instance: 0,
                started: None,
            });
        }
        Ok(token as u64)
    }

    /// Records where the command behind `token` came from, counts it in
    /// flight on `sq`, and reserves its completion's entry in `cq`.
    pub fn bind(&mut self, token: u64, sq: &mut Sq, cq: &mut Cq, started: Option<Instant>) {
        let slot = usize::try_from(token)
            .ok()
            .and_then(|t| self.slots.get_mut(t));
        if let Some(Some(r)) = slot {
            r.sqid = sq.qid;
            r.sq_instance = sq.instance;
            r.cqid = cq.qid;
            r.cq_instance = cq.instance;
            r.started = started;
            cq.reserved = cq.reserved.saturating_add(1);
            sq.in_flight = sq.in_flight.saturating_add(1);
        }
    }

    /// Starts the requests queued on the backends since the last commit or
    /// reap (see the module doc).
    pub fn commit(&mut self) {
        for q in &mut self.queues {
            if let Some(queue) = q.queue.as_mut() {
                queue.commit();
            }
        }
    }

    /// Starts what was queued (each queue's poll commits first), then
    /// reaps finished commands into `out` without blocking: at most
    /// [`REAP_BATCH`] per backend queue.
    pub fn reap(&mut self, out: &mut Vec<(Request, BlockCompletion)>) {
        if self.is_empty() {
            return;
        }
        for q in &mut self.queues {
            if let Some(queue) = q.queue.as_mut() {
                if queue.in_flight() > 0 {
                    queue.poll(&mut self.reaped, REAP_BATCH);
                }
            }
        }
        for c in self.reaped.drain(..) {
            let Some(t) = usize::try_from(c.token).ok() else {
                continue;
            };
            if let Some(request) = self.slots.get_mut(t).and_then(Option::take) {
                self.free.push(t);
                out.push((request, c));
            }
        }
    }

    /// The worker's queue on `backend`, opened on first use.
    fn queue_for(&mut self, backend: &Arc<dyn BlockDevice>) -> Option<&mut Box<dyn BlockQueue>> {
        let found = self
            .queues
            .iter()
            .position(|q| std::ptr::addr_eq(q.backend.as_ptr(), Arc::as_ptr(backend)));
        let i = match found {
            Some(i) => i,
            None => {
                // Forget queues of backends gone (namespace deleted) once
                // they have nothing in flight.
                self.queues.retain(|q| {
                    q.backend.strong_count() > 0
                        || q.queue.as_ref().is_some_and(|q| q.in_flight() > 0)
                });
                let queue = match backend.as_async()?.queue(self.waker.clone()) {
                    Ok(mut q) => {
                        q.set_waking(self.waking);
                        Some(q)
                    }
                    Err(e) => {
                        tracing::warn!(
                            "asynchronous I/O unavailable, running synchronously: {}",
                            Chain(&e)
                        );
                        None
                    }
                };
                self.queues.push(BackendQueue {
                    backend: Arc::downgrade(backend),
                    queue,
                });
                self.queues.len() - 1
            }
        };
        self.queues.get_mut(i)?.queue.as_mut()
    }
}
