//! Submission and completion queue rings in guest memory (§3.3.1, §4.1):
//! head/tail arithmetic, phase tag, validation of doorbell values.

pub(crate) mod bell;
pub(crate) mod mailbox;
pub(crate) mod owed;
pub(crate) mod rings;
mod saved;
pub(crate) mod table;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use vnvme_spec::regs::Doorbell;
use vnvme_spec::{Command, Completion};
use zerocopy::IntoBytes;

use crate::doorbell::{DoorbellSource, Doorbells, EventIdx};
use crate::irq_batch::Batch;
use crate::memory::{DmaError, GuestAddress, GuestMemory};
pub(crate) use saved::{Limits, SavedCq, SavedQueues, SavedSource, SavedSq};

/// Numbers every queue created, so a completion owed to a queue that was
/// deleted (or reset) and re-created under the same id is recognised.
static INSTANCES: AtomicU64 = AtomicU64::new(1);

fn next_instance() -> u64 {
    INSTANCES.fetch_add(1, Ordering::Relaxed)
}

/// A submission queue. Owned by the worker of its CQ ([`rings::Rings`]);
/// rests in `QueueTable::sqs[qid]` while no worker runs.
#[derive(Debug)]
pub(crate) struct Sq {
    pub qid: u16,
    /// Unique among all queues ever created.
    pub instance: u64,
    pub base: GuestAddress,
    /// Entries (2..=65536).
    pub size: u32,
    pub head: u32,
    /// Last valid tail seen.
    pub tail: u32,
    pub cqid: u16,
    pub source: DoorbellSource,
    /// Last SQ EventIdx written (shadow sources).
    pub event_idx: EventIdx,
    /// Commands fetched from it and in flight on an asynchronous backend.
    pub in_flight: u32,
    /// A Delete I/O Submission Queue (its CID) waits for those: nothing
    /// more is fetched, and the queue goes once the last completes (§5.6).
    pub deleting: Option<u16>,
    /// CIDs an Abort found still queued: completed with Command Abort
    /// Requested when fetched, instead of running. At most ACL + 1.
    aborts: Vec<u16>,
    /// Entries from head on, fetched in one guest memory access;
    /// `batch[next..end]` are not popped yet. All lie before the tail that
    /// was valid when they were read: the host may not rewrite them until a
    /// completion reports the head past them.
    batch: Vec<Command>,
    next: usize,
    end: usize,
}

/// Entries [`Sq::pop`] fetches at once, at most.
const FETCH_BATCH: usize = 16;

impl Sq {
    pub fn new(qid: u16, base: GuestAddress, size: u32, cqid: u16) -> Self {
        Self {
            qid,
            instance: next_instance(),
            base,
            size,
            head: 0,
            tail: 0,
            cqid,
            source: DoorbellSource::Register,
            event_idx: EventIdx::default(),
            in_flight: 0,
            deleting: None,
            aborts: Vec::new(),
            batch: vec![Command::default(); FETCH_BATCH],
            next: 0,
            end: 0,
        }
    }

    /// Re-reads the tail from the doorbell source. Returns `false` if the
    /// value is invalid or unreadable (ignored, the old tail kept).
    pub fn refresh_tail(&mut self, doorbells: &Doorbells, mem: &dyn GuestMemory) -> bool {
        let db = Doorbell::SqTail(self.qid);
        let Some(v) = self.source.current(doorbells, db, self.qid, mem) else {
            return false;
        };
        if v < self.size {
            self.tail = v;
            true
        } else {
            false
        }
    }

    pub fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Switches to `source` (Doorbell Buffer Config, queue creation).
    pub fn set_source(&mut self, source: DoorbellSource) {
        self.source = source;
        self.event_idx.reset();
    }

    /// Marks `cid` to be aborted when fetched; false if `limit` aborts are
    /// pending already.
    pub fn request_abort(&mut self, cid: u16, limit: usize) -> bool {
        if self.aborts.contains(&cid) {
            return true;
        }
        if self.aborts.len() >= limit {
            return false;
        }
        self.aborts.push(cid);
        true
    }

    /// Whether the command just popped was aborted (forgets the mark).
    pub fn take_abort(&mut self, cid: u16) -> bool {
        if self.aborts.is_empty() {
            return false;
        }
        let before = self.aborts.len();
        self.aborts.retain(|&c| c != cid);
        self.aborts.len() != before
    }

    /// The entry at head (the queue must not be empty); advances head.
    /// Entries up to the tail (at most [`FETCH_BATCH`], not across the end
    /// of the ring) are fetched together, one guest memory access for many
    /// commands.
    pub fn pop(&mut self, mem: &dyn GuestMemory) -> Result<Command, DmaError> {
        if self.next == self.end {
            let ahead = if self.tail > self.head {
                self.tail - self.head
            } else {
                self.size - self.head
            };
            let n = (ahead as usize).clamp(1, self.batch.len());
            let addr = self
                .base
                .wrapping_add(u64::from(self.head) * Command::SIZE as u64);
            let batch = self.batch.get_mut(..n).unwrap_or_default();
            mem.read(addr, batch.as_mut_bytes())?;
            (self.next, self.end) = (0, n);
        }
        let cmd = self.batch.get(self.next).copied().unwrap_or_default();
        self.next += 1;
        self.head = if self.head + 1 >= self.size {
            0
        } else {
            self.head + 1
        };
        Ok(cmd)
    }
}

/// A completion queue. Owned by the worker of its qid ([`rings::Rings`]);
/// rests in `QueueTable::cqs[qid]` while no worker runs.
#[derive(Debug)]
pub(crate) struct Cq {
    pub qid: u16,
    /// Unique among all queues ever created.
    pub instance: u64,
    pub base: GuestAddress,
    pub size: u32,
    pub head: u32,
    pub tail: u32,
    pub phase: bool,
    /// Interrupts enabled (IEN) and the vector (IV).
    pub ien: bool,
    pub iv: u16,
    pub source: DoorbellSource,
    /// Last CQ EventIdx written (shadow sources).
    pub event_idx: EventIdx,
    /// Head and tail for other threads (the INTx level).
    pub view: Arc<CqView>,
    /// Completions posted since the last interrupt, and when the first was.
    pub irq_pending: u32,
    pub irq_since: Option<Instant>,
    /// Last rejected head value, so a bad write is counted once.
    pub bad_head: Option<u32>,
    /// Entries promised to commands in flight on an asynchronous backend:
    /// a command is fetched only if its completion will have room.
    pub reserved: u32,
    /// The host's submissions, for interrupt batching.
    pub batch: Batch,
}

impl Cq {
    pub fn new(qid: u16, base: GuestAddress, size: u32, ien: bool, iv: u16) -> Self {
        Self {
            qid,
            instance: next_instance(),
            base,
            size,
            head: 0,
            tail: 0,
            phase: true,
            ien,
            iv,
            source: DoorbellSource::Register,
            event_idx: EventIdx::default(),
            view: Arc::default(),
            irq_pending: 0,
            irq_since: None,
            bad_head: None,
            reserved: 0,
            batch: Batch::default(),
        }
    }

    /// Entries from `from` forward to `to` around the ring.
    fn distance(&self, from: u32, to: u32) -> u32 {
        if to >= from {
            to - from
        } else {
            self.size - from + to
        }
    }

    /// Re-reads the head from the doorbell source. A head beyond the queue or
    /// past the entries posted so far is ignored; returns `Err(value)` the
    /// first time a given bad value is seen.
    pub fn refresh_head(
        &mut self,
        doorbells: &Doorbells,
        mem: &dyn GuestMemory,
    ) -> Result<(), u32> {
        let db = Doorbell::CqHead(self.qid);
        let Some(v) = self.source.current(doorbells, db, self.qid, mem) else {
            return Ok(());
        };
        if v == self.head {
            return Ok(());
        }
        if v < self.size && self.distance(self.head, v) <= self.distance(self.head, self.tail) {
            self.head = v;
            self.view.publish(self.head, self.tail);
            self.bad_head = None;
            return Ok(());
        }
        if self.bad_head == Some(v) {
            return Ok(());
        }
        self.bad_head = Some(v);
        Err(v)
    }

    /// Switches to `source` (Doorbell Buffer Config, queue creation).
    pub fn set_source(&mut self, source: DoorbellSource) {
        self.source = source;
        self.event_idx.reset();
    }

    /// Entries the host has outstanding: posted and not yet reaped (as of
    /// the last head read), or in flight on an asynchronous backend.
    pub fn outstanding(&self) -> u32 {
        self.distance(self.head, self.tail)
            .saturating_add(self.reserved)
    }

    /// No room for another command's completion: the entries posted and
    /// not yet reaped, plus those reserved, leave no free entry (a full ring
    /// keeps one entry empty, §4.1.2).
    pub fn is_full(&self) -> bool {
        let used = self.distance(self.head, self.tail);
        used.saturating_add(self.reserved).saturating_add(1) >= self.size
    }

    /// Writes `cqe` (its phase set here) at tail and advances tail. The
    /// dword holding the phase tag is stored last, with release ordering, so
    /// the host never sees a new phase with stale contents.
    pub fn post(&mut self, mem: &dyn GuestMemory, mut cqe: Completion) -> Result<(), DmaError> {
        let addr = self
            .base
            .wrapping_add(u64::from(self.tail) * Completion::SIZE as u64);
        let dw3 = (cqe.dw3.get() & !(1 << 16)) | (u32::from(self.phase) << 16);
        cqe.dw3.set(dw3);
        let bytes = cqe.as_bytes();
        mem.write_then_store_u32(addr, bytes.get(..12).unwrap_or_default(), dw3)?;
        self.tail += 1;
        if self.tail >= self.size {
            self.tail = 0;
            self.phase = !self.phase;
        }
        self.view.publish(self.head, self.tail);
        self.irq_pending = self.irq_pending.saturating_add(1);
        if self.irq_since.is_none() {
            self.irq_since = Some(Instant::now());
        }
        Ok(())
    }
}

/// A CQ's head and tail as its worker last saw them, for threads that do
/// not own the ring (the INTx level, asked on the control thread).
#[derive(Debug, Default)]
pub(crate) struct CqView(AtomicU64);

impl CqView {
    pub fn publish(&self, head: u32, tail: u32) {
        self.0
            .store(u64::from(head) << 32 | u64::from(tail), Ordering::Release);
    }

    /// (head, tail).
    pub fn get(&self) -> (u32, u32) {
        let v = self.0.load(Ordering::Acquire);
        ((v >> 32) as u32, v as u32)
    }

    /// Whether `head`, a head the host wrote, is one the worker would take:
    /// within the ring and not past the entries posted.
    pub fn accepts(&self, size: u32, head: u32) -> bool {
        let (h, t) = self.get();
        let distance = |from: u32, to: u32| {
            if to >= from {
                to - from
            } else {
                size.wrapping_sub(from).wrapping_add(to)
            }
        };
        head < size && distance(h, head) <= distance(h, t)
    }
}
