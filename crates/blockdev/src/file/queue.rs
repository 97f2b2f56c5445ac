//! [`FileQueue`]: the `file` backend's [`BlockQueue`], one io_uring per
//! controller queue worker with several requests in flight.
//!
//! * `submit` queues one operation; `commit` hands the kernel every
//!   operation queued since the last with one `io_uring_enter` (a worker's
//!   pass submits its requests with one system call), and `poll` commits
//!   first. A commit that fails completes the requests the kernel did not
//!   take with its error (the ring is then broken, and replaced once
//!   nothing of it is left in flight; meanwhile requests run
//!   synchronously). The request's [`Data`] (its own buffer, or guest memory held mapped) moves
//!   into the ring's slot (`uring::Ring`), which gives it back only once
//!   the kernel is done with it; the queue keeps what it needs to finish
//!   the request (token, range, bytes done) in a table indexed by the same
//!   slot. Nothing is allocated per request.
//! * Requests the queue cannot take are given back unstarted, for the
//!   caller to run synchronously, where [`BlockDevice`](crate::BlockDevice)
//!   reports any error: over the limits below, larger than one operation
//!   ([`MAX_IO`]), empty, *out of range* (so the synchronous path, which
//!   checks ranges, answers `OutOfRange`), or refused by the ring.
//! * `poll` reaps completions without blocking. A short transfer
//!   resubmits its rest through the page cache under the same token; a
//!   transfer that moves nothing fails as the synchronous path does.
//! * The waker runs on a thread of the queue's own (`vnvme-uring-wake`),
//!   which blocks on an eventfd the kernel signals for every completion it
//!   posts: a completion posted while the consumer sleeps always calls the
//!   waker, after it is visible to `poll`.
//! * Dropping the queue commits what is queued and waits for the requests
//!   in flight (the ring does), then stops the thread.

use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::backing::{bump, Backing};
use super::MAX_IO;
use crate::uring::{Op, Ring};
use crate::{
    check_range, BlockCompletion, BlockError, BlockQueue, BlockRequest, Data, IoBuf, Waker,
};

/// Requests in flight per queue: deep enough to keep an NVMe SSD busy
/// from one worker, small enough that a slot table is a fixed few KiB.
pub(super) const MAX_IN_FLIGHT: usize = 64;

/// Bytes in flight per queue: bounds the memory a worker pins in
/// buffers to 16 MiB (16 requests of [`MAX_IO`], or 64 of 256 KiB).
pub(super) const MAX_BYTES_IN_FLIGHT: usize = 16 << 20;

/// Completions one `poll` reaps at most, counting those that only
/// resubmit the rest of a short transfer.
const REAP_BUDGET: usize = 2 * MAX_IN_FLIGHT;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Transfer(Transfer),
    Flush,
}

#[derive(Debug, Clone, Copy)]
enum Transfer {
    Read,
    /// `dsync`: RWF_DSYNC (FUA).
    Write {
        dsync: bool,
    },
}

impl Transfer {
    /// The operation moving `len` bytes at `offset`, from byte `at` of the
    /// request's buffer. `len` is at most [`MAX_IO`], so it fits a `u32`
    /// (a larger one would not fit the buffer, and the ring refuses it).
    fn op(self, fd: RawFd, offset: u64, at: usize, len: usize) -> Op {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        match self {
            Transfer::Read => Op::Read {
                fd,
                offset,
                at,
                len,
            },
            Transfer::Write { dsync } => Op::Write {
                fd,
                offset,
                at,
                len,
                dsync,
            },
        }
    }
}

/// A request in flight; its buffer is in the ring's slot of the same index.
#[derive(Debug, Clone, Copy)]
struct Pending {
    token: u64,
    kind: Kind,
    offset: u64,
    len: usize,
    /// Bytes transferred so far (less than `len` after a short transfer).
    done: usize,
}

/// One io_uring and its requests in flight; see the module doc.
#[derive(Debug)]
pub(super) struct FileQueue {
    /// Declared first, so it is dropped (waiting for the kernel) while
    /// the descriptors are open and before the wake thread stops.
    ring: Ring,
    /// Indexed by ring slot.
    pending: Box<[Option<Pending>]>,
    in_flight: usize,
    bytes_in_flight: usize,
    backing: Arc<Backing>,
    wake: WakeThread,
    /// As last set by `set_waking`, for a renewed ring.
    waking: bool,
}

impl FileQueue {
    pub(super) fn new(backing: Arc<Backing>, waker: Waker) -> Result<Self, BlockError> {
        let ring = Ring::new(MAX_IN_FLIGHT).map_err(BlockError::Io)?;
        let wake = WakeThread::spawn(waker).map_err(BlockError::Io)?;
        ring.register_eventfd(wake.eventfd.as_fd())
            .map_err(BlockError::Io)?;
        Ok(Self {
            ring,
            pending: vec![None; MAX_IN_FLIGHT].into_boxed_slice(),
            in_flight: 0,
            bytes_in_flight: 0,
            backing,
            wake,
            waking: true,
        })
    }

    /// Starts a read or write, or gives its data back.
    fn start_transfer(
        &mut self,
        transfer: Transfer,
        offset: u64,
        data: Data,
        token: u64,
    ) -> Result<(), Data> {
        let len = data.len();
        let fits = len > 0
            && len <= MAX_IO
            && self.bytes_in_flight + len <= MAX_BYTES_IN_FLIGHT
            && check_range(offset, len as u64, self.backing.size).is_ok();
        if !fits {
            return Err(data);
        }
        let route = self.backing.route_data(offset, &data);
        let mapped = matches!(data, Data::Mapped(_));
        let op = transfer.op(route.fd(), offset, 0, len);
        // The ring's reason is not needed: a request it refuses runs
        // synchronously, where any error is reported.
        let slot = self.ring.queue(op, data).map_err(|(data, _)| data)?;
        self.backing.count(route);
        if mapped {
            bump(&self.backing.counters.mapped_ops);
        }
        if let Transfer::Write { dsync: true } = transfer {
            bump(&self.backing.counters.dsync_writes);
        }
        self.track(slot, token, Kind::Transfer(transfer), offset, len);
        Ok(())
    }

    fn start_flush(&mut self, token: u64) -> Result<(), ()> {
        let op = Op::Datasync {
            fd: self.backing.buffered_fd(),
        };
        let slot = self.ring.queue(op, Data::Buf(IoBuf::new())).map_err(drop)?;
        bump(&self.backing.counters.flushes);
        self.track(slot, token, Kind::Flush, 0, 0);
        Ok(())
    }

    fn track(&mut self, slot: usize, token: u64, kind: Kind, offset: u64, len: usize) {
        if let Some(p) = self.pending.get_mut(slot) {
            *p = Some(Pending {
                token,
                kind,
                offset,
                len,
                done: 0,
            });
            self.in_flight += 1;
            self.bytes_in_flight += len;
        }
    }

    /// Hands the kernel what was queued, counting the calls; wakes the
    /// consumer if some requests failed to be submitted (their failures
    /// wait in the ring, and no completion will signal them).
    fn commit_queued(&mut self) {
        let fault = self.backing.take_submit_fault();
        let done = self.ring.commit(fault);
        self.backing
            .counters
            .submit_calls
            .fetch_add(done.enters, std::sync::atomic::Ordering::Relaxed);
        if done.failed > 0 {
            bump(&self.backing.counters.submit_failures);
            self.wake.signal();
        }
    }

    /// A broken ring with nothing left in it is replaced by a new one, so a
    /// failed submit does not send every later request the slow way. If
    /// that fails, the queue goes on with the broken ring (requests run
    /// synchronously).
    fn renew_ring(&mut self) {
        if !self.ring.is_broken() || !self.ring.is_idle() {
            return;
        }
        let renewed = Ring::new(MAX_IN_FLIGHT).and_then(|ring| {
            ring.register_eventfd(self.wake.eventfd.as_fd())?;
            Ok(ring)
        });
        match renewed {
            Ok(mut ring) => {
                ring.set_eventfd_enabled(self.waking);
                self.ring = ring;
            }
            Err(e) => tracing::debug!("renewing the queue's io_uring: {e}"),
        }
    }

    /// Handles the completion of `slot`: the request's result, or `None`
    /// when the rest of a short transfer was resubmitted.
    fn complete(&mut self, slot: usize, res: i32) -> Option<BlockCompletion> {
        let Some(p) = self.pending.get_mut(slot).and_then(Option::as_mut) else {
            // Not a request of ours (cannot happen): free the slot anyway.
            self.ring.finish(slot);
            return None;
        };
        let result = match (p.kind, u32::try_from(res)) {
            (_, Err(_)) => Err(io::Error::from_raw_os_error(res.saturating_neg())),
            (Kind::Flush, Ok(_)) => Ok(()),
            // As the synchronous path: the file shrank, or the disk is full.
            (Kind::Transfer(Transfer::Read), Ok(0)) => Err(io::ErrorKind::UnexpectedEof.into()),
            (Kind::Transfer(Transfer::Write { .. }), Ok(0)) => Err(io::ErrorKind::WriteZero.into()),
            (Kind::Transfer(transfer), Ok(n)) => {
                p.done = p.done.saturating_add(n as usize).min(p.len);
                if p.done == p.len {
                    Ok(())
                } else {
                    // The rest is unaligned: through the page cache.
                    let fd = self.backing.buffered_fd();
                    let op = transfer.op(fd, p.offset + p.done as u64, p.done, p.len - p.done);
                    match self.ring.requeue(slot, op) {
                        Ok(()) => return None,
                        Err(e) => Err(e),
                    }
                }
            }
        };
        let p = self.pending.get_mut(slot)?.take()?;
        self.in_flight -= 1;
        self.bytes_in_flight -= p.len;
        let data = self.ring.finish(slot);
        Some(BlockCompletion {
            token: p.token,
            data: if let Kind::Flush = p.kind { None } else { data },
            result: result.map_err(BlockError::Io),
        })
    }
}

impl BlockQueue for FileQueue {
    fn submit(&mut self, request: BlockRequest, token: u64) -> Result<(), BlockRequest> {
        if self.in_flight >= MAX_IN_FLIGHT {
            return Err(request);
        }
        match request {
            BlockRequest::Read { offset, data } => self
                .start_transfer(Transfer::Read, offset, data, token)
                .map_err(|data| BlockRequest::Read { offset, data }),
            BlockRequest::Write { offset, data, fua } => self
                .start_transfer(Transfer::Write { dsync: fua }, offset, data, token)
                .map_err(|data| BlockRequest::Write { offset, data, fua }),
            BlockRequest::Flush => self.start_flush(token).map_err(|()| BlockRequest::Flush),
        }
    }

    fn commit(&mut self) {
        self.commit_queued();
    }

    fn poll(&mut self, out: &mut Vec<BlockCompletion>, max: usize) -> usize {
        self.commit_queued();
        let mut returned = 0;
        let mut reaped = 0;
        while returned < max && reaped < REAP_BUDGET {
            let Some((slot, res)) = self.ring.reap() else {
                break;
            };
            reaped += 1;
            if let Some(completion) = self.complete(slot, res) {
                out.push(completion);
                returned += 1;
            }
        }
        // The rests of short transfers, requeued above.
        self.commit_queued();
        self.renew_ring();
        // The waker already ran for what is left behind: have it run again
        // so a consumer that sleeps now is not stranded.
        if self.ring.has_completions() {
            self.wake.signal();
        }
        returned
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Off: the kernel stops signalling the eventfd, so the wake thread
    /// sleeps while the consumer polls anyway.
    fn set_waking(&mut self, on: bool) {
        self.waking = on;
        self.ring.set_eventfd_enabled(on);
    }
}

impl Drop for FileQueue {
    /// Requests queued are in flight to the caller: start them, then the
    /// ring (dropped next) waits for them all.
    fn drop(&mut self) {
        self.commit_queued();
    }
}

/// A thread that calls the waker each time the kernel (or
/// [`signal`](Self::signal)) writes the eventfd, until dropped.
#[derive(Debug)]
struct WakeThread {
    eventfd: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl WakeThread {
    fn spawn(waker: Waker) -> io::Result<Self> {
        use rustix::event::{eventfd, EventfdFlags};
        let fd = Arc::new(eventfd(0, EventfdFlags::CLOEXEC)?);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("vnvme-uring-wake".into())
            .spawn({
                let (fd, stop) = (Arc::clone(&fd), Arc::clone(&stop));
                move || wake_loop(&fd, &stop, &*waker)
            })?;
        Ok(Self {
            eventfd: fd,
            stop,
            thread: Some(thread),
        })
    }

    fn signal(&self) {
        // Fails only if the counter would overflow: a wake is pending anyway.
        let _ = rustix::io::write(&*self.eventfd, &1u64.to_ne_bytes());
    }
}

fn wake_loop(eventfd: &OwnedFd, stop: &AtomicBool, waker: &(dyn Fn() + Send + Sync)) {
    let mut count = [0u8; 8];
    loop {
        let read = rustix::io::read(eventfd, &mut count);
        if stop.load(Ordering::Acquire) {
            return;
        }
        match read {
            Ok(_) => waker(),
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => {
                // Cannot happen on an eventfd; if it does, wake the
                // consumer now and then rather than never.
                waker();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

impl Drop for WakeThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.signal();
        if let Some(thread) = self.thread.take() {
            // A waker that drops the queue runs on this very thread.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
mod tests;
