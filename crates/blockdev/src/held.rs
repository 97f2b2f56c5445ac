//! The one fake asynchronous backend, for tests and the fuzz harness (feature
//! `testing`): a RAM disk whose requests stay in flight until a rule lets
//! them finish, so the controller's commands-in-flight path (CQ entries
//! reserved, completions out of order, queues deleted or reset under them,
//! a sanitize waiting for a write) meets what a real backend can do.
//!
//! * [`Release::NextPoll`]: each request finishes on its queue's next poll,
//!   newest first, at most `limit` in flight per queue (the next are given
//!   back); the fuzz harness's rule.
//! * [`Release::Test`]: requests wait until the test calls
//!   [`HeldRam::release_newest_first`] or [`HeldRam::open`] (after which
//!   they finish at once).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::{
    AsyncBlockDevice, BlockCompletion, BlockDevice, BlockError, BlockQueue, BlockRequest,
    RamDevice, Waker,
};

/// When a held request finishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// On its queue's next poll, newest first; at most `limit` in flight
    /// per queue.
    NextPoll { limit: usize },
    /// When the test says.
    Test,
}

/// A request submitted and not yet finished.
struct Held {
    queue: usize,
    token: u64,
    request: BlockRequest,
}

struct Gate {
    release: Release,
    /// [`HeldRam::open`] was called: requests finish at once.
    open: bool,
    held: Vec<Held>,
    /// Finished and not yet polled, by queue.
    done: Vec<Vec<BlockCompletion>>,
    /// Each queue's waker, by queue; `None` once the queue is dropped.
    wakers: Vec<Option<Waker>>,
    /// Most requests held at once.
    peak: usize,
}

impl Gate {
    fn held_by(&self, queue: usize) -> usize {
        self.held.iter().filter(|h| h.queue == queue).count()
    }
}

/// A RAM disk of `size` bytes with an asynchronous side under a
/// [`Release`] rule.
pub struct HeldRam {
    ram: Arc<RamDevice>,
    gate: Arc<Mutex<Gate>>,
    volatile_cache: bool,
}

impl std::fmt::Debug for HeldRam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldRam")
            .field("release", &self.gate.lock().release)
            .finish_non_exhaustive()
    }
}

impl HeldRam {
    pub fn new(size: u64, release: Release) -> Self {
        Self {
            ram: Arc::new(RamDevice::new(size)),
            gate: Arc::new(Mutex::new(Gate {
                release,
                open: false,
                held: Vec::new(),
                done: Vec::new(),
                wakers: Vec::new(),
                peak: 0,
            })),
            volatile_cache: false,
        }
    }

    /// Reports a volatile write cache (Flush then matters).
    pub fn with_volatile_cache(mut self) -> Self {
        self.volatile_cache = true;
        self
    }

    /// Requests held now.
    pub fn held(&self) -> usize {
        self.gate.lock().held.len()
    }

    /// Runs `f` on the held requests (token, request), oldest first.
    pub fn with_held<R>(&self, f: impl FnOnce(&[(u64, &BlockRequest)]) -> R) -> R {
        let g = self.gate.lock();
        let held: Vec<(u64, &BlockRequest)> =
            g.held.iter().map(|h| (h.token, &h.request)).collect();
        f(&held)
    }

    /// Most requests held at once so far.
    pub fn peak(&self) -> usize {
        self.gate.lock().peak
    }

    /// Queues opened and not yet dropped.
    pub fn queues_open(&self) -> usize {
        self.gate.lock().wakers.iter().flatten().count()
    }

    /// Finishes every held request, newest first, and wakes the queues.
    pub fn release_newest_first(&self) {
        let mut g = self.gate.lock();
        while let Some(h) = g.held.pop() {
            let done = h.request.run_on(&*self.ram, h.token);
            g.done[h.queue].push(done);
        }
        Self::wake(g);
    }

    /// Finishes every held request in submission order, and every later
    /// one at once.
    pub fn open(&self) {
        let mut g = self.gate.lock();
        g.open = true;
        for h in std::mem::take(&mut g.held) {
            let done = h.request.run_on(&*self.ram, h.token);
            g.done[h.queue].push(done);
        }
        Self::wake(g);
    }

    /// Wakes every open queue, with the gate unlocked (a waker may poll).
    fn wake(g: parking_lot::MutexGuard<'_, Gate>) {
        let wakers: Vec<Waker> = g.wakers.iter().flatten().cloned().collect();
        drop(g);
        for w in wakers {
            w();
        }
    }
}

impl BlockDevice for HeldRam {
    fn outlives_process(&self) -> bool {
        false
    }

    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn volatile_cache(&self) -> bool {
        self.volatile_cache
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.ram.write(offset, buf)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        self.ram.write_zeroes(offset, len)
    }
    fn as_async(&self) -> Option<&dyn AsyncBlockDevice> {
        Some(self)
    }
}

impl AsyncBlockDevice for HeldRam {
    fn queue(&self, waker: Waker) -> Result<Box<dyn BlockQueue>, BlockError> {
        let mut g = self.gate.lock();
        let queue = g.wakers.len();
        g.wakers.push(Some(waker));
        g.done.push(Vec::new());
        Ok(Box::new(HeldQueue {
            ram: Arc::clone(&self.ram),
            gate: Arc::clone(&self.gate),
            queue,
        }))
    }
}

struct HeldQueue {
    ram: Arc<RamDevice>,
    gate: Arc<Mutex<Gate>>,
    queue: usize,
}

impl BlockQueue for HeldQueue {
    fn submit(&mut self, request: BlockRequest, token: u64) -> Result<(), BlockRequest> {
        let mut g = self.gate.lock();
        if g.open {
            let done = request.run_on(&*self.ram, token);
            g.done[self.queue].push(done);
        } else {
            if let Release::NextPoll { limit } = g.release {
                if g.held_by(self.queue) >= limit {
                    return Err(request);
                }
            }
            g.held.push(Held {
                queue: self.queue,
                token,
                request,
            });
            g.peak = g.peak.max(g.held.len());
            if g.release == Release::Test {
                return Ok(());
            }
        }
        let waker = g.wakers[self.queue].clone();
        drop(g);
        if let Some(w) = waker {
            w();
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<BlockCompletion>, max: usize) -> usize {
        let mut g = self.gate.lock();
        if matches!(g.release, Release::NextPoll { .. }) {
            // This queue's held requests, newest first.
            let mut n = 0;
            while n < max {
                let Some(i) = g.held.iter().rposition(|h| h.queue == self.queue) else {
                    break;
                };
                let h = g.held.remove(i);
                out.push(h.request.run_on(&*self.ram, h.token));
                n += 1;
            }
            return n;
        }
        let done = &mut g.done[self.queue];
        let n = done.len().min(max);
        out.extend(done.drain(..n));
        n
    }

    fn in_flight(&self) -> usize {
        let g = self.gate.lock();
        g.held_by(self.queue) + g.done[self.queue].len()
    }
}

impl Drop for HeldQueue {
    fn drop(&mut self) {
        self.gate.lock().wakers[self.queue] = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn write(offset: u64, byte: u8) -> BlockRequest {
        let mut buf = crate::IoBuf::zeroed(512);
        buf.fill(byte);
        BlockRequest::Write {
            offset,
            data: buf.into(),
            fua: false,
        }
    }

    #[test]
    fn test_release_holds_until_released_newest_first_then_open_runs_at_once() {
        let dev = HeldRam::new(4096, Release::Test);
        let woken = Arc::new(AtomicUsize::new(0));
        let w = Arc::clone(&woken);
        let mut q = dev
            .queue(Arc::new(move || {
                w.fetch_add(1, Ordering::Relaxed);
            }))
            .unwrap();
        q.submit(write(0, 1), 10).unwrap();
        q.submit(write(512, 2), 11).unwrap();
        assert_eq!(
            (dev.held(), q.in_flight(), woken.load(Ordering::Relaxed)),
            (2, 2, 0)
        );
        let mut out = Vec::new();
        assert_eq!(q.poll(&mut out, 8), 0);
        dev.release_newest_first();
        assert_eq!(woken.load(Ordering::Relaxed), 1);
        assert_eq!(q.poll(&mut out, 8), 2);
        assert_eq!(out.iter().map(|c| c.token).collect::<Vec<_>>(), [11, 10]);
        dev.open();
        q.submit(write(0, 3), 12).unwrap();
        assert_eq!((dev.held(), dev.peak(), q.in_flight()), (0, 2, 1));
        assert_eq!(dev.queues_open(), 1);
        drop(q);
        assert_eq!(dev.queues_open(), 0);
        let mut b = [0; 1];
        dev.read(0, &mut b).unwrap();
        assert_eq!(b, [3]);
    }

    #[test]
    fn next_poll_release_finishes_newest_first_and_gives_back_past_the_limit() {
        let dev = HeldRam::new(4096, Release::NextPoll { limit: 2 });
        let mut q = dev.queue(Arc::new(|| {})).unwrap();
        let mut other = dev.queue(Arc::new(|| {})).unwrap();
        q.submit(write(0, 1), 1).unwrap();
        q.submit(write(512, 2), 2).unwrap();
        assert!(q.submit(write(1024, 3), 3).is_err(), "past the limit");
        other.submit(write(1536, 4), 4).unwrap();
        let mut out = Vec::new();
        assert_eq!(q.poll(&mut out, 8), 2);
        assert_eq!(out.iter().map(|c| c.token).collect::<Vec<_>>(), [2, 1]);
        assert_eq!((q.in_flight(), other.in_flight()), (0, 1));
    }
}
