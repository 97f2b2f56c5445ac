//! A submission/completion queue pair in host memory (NVMe 2.0 §3.3): ring
//! index math, command slots, phase-bit reaping and data pointers. Shared by
//! the admin queue and the I/O queues; owned by one thread at a time.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_spec::command::Command;
use vnvme_spec::regs::Doorbell;
use vnvme_spec::Completion;

use crate::access::{AccessError, DeviceAccess, DmaBuffer, PAGE_SIZE};
use crate::doorbell::{DoorbellRegister, ShadowBuffers};
use crate::error::Error;
use crate::irq::QueueIrq;
use crate::prp;

/// Completions reaped per poll when the caller asks for more: keeps one
/// poll bounded even against a device that keeps posting.
pub const REAP_CAP: usize = 256;

/// The next index of a ring of `size` entries.
pub fn ring_next(index: u16, size: u16) -> u16 {
    let next = u32::from(index) + 1;
    if next >= u32::from(size) {
        0
    } else {
        next as u16
    }
}

/// Entries between `head` and `tail` of a ring of `size` (occupied entries).
pub fn ring_used(head: u16, tail: u16, size: u16) -> u16 {
    if tail >= head {
        tail - head
    } else {
        size.wrapping_sub(head).wrapping_add(tail)
    }
}

/// Whether one more entry fits: a ring of `size` holds at most `size - 1`.
pub fn ring_has_room(head: u16, tail: u16, size: u16) -> bool {
    ring_used(head, tail, size) + 1 < size
}

/// Counters of one queue pair. Plain integers: the queue has one owner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounters {
    pub submitted: u64,
    pub completions: u64,
    /// SQ tail register writes sent to the device (traps on an emulated
    /// controller).
    pub sq_doorbell_writes: u64,
    /// CQ head register writes sent to the device (traps).
    pub cq_doorbell_writes: u64,
    /// SQ tail values stored to the mapped doorbell page (no trap).
    pub sq_mapped_writes: u64,
    /// CQ head values stored to the mapped doorbell page (no trap).
    pub cq_mapped_writes: u64,
    /// SQ tail values stored in the shadow doorbell buffer.
    pub sq_shadow_updates: u64,
    /// CQ head values stored in the shadow doorbell buffer.
    pub cq_shadow_updates: u64,
    pub interrupts_waited: u64,
    /// Completions whose command identifier was not in flight (ignored).
    pub spurious_completions: u64,
}

/// Command identifiers in flight; a CID is also the index of the command's
/// reserved PRP list pages.
#[derive(Debug)]
struct CidTable {
    free: Vec<u16>,
    in_flight: Vec<bool>,
}

impl CidTable {
    fn new(slots: u16) -> Self {
        Self {
            free: (0..slots).rev().collect(),
            in_flight: vec![false; usize::from(slots)],
        }
    }

    fn alloc(&mut self) -> Option<u16> {
        let cid = self.free.pop()?;
        self.in_flight[usize::from(cid)] = true;
        Some(cid)
    }

    /// Marks `cid` complete; false if it was not in flight (a device bug).
    fn release(&mut self, cid: u16) -> bool {
        match self.in_flight.get_mut(usize::from(cid)) {
            Some(f) if *f => {
                *f = false;
                self.free.push(cid);
                true
            }
            _ => false,
        }
    }

    fn outstanding(&self) -> usize {
        self.in_flight.len() - self.free.len()
    }
}

/// Memory and state of one queue pair.
#[derive(Debug)]
pub(crate) struct QueuePair {
    qid: u16,
    size: u16,
    sq: DmaBuffer,
    cq: DmaBuffer,
    sq_tail: u16,
    sq_head: u16,
    cq_head: u16,
    phase: bool,
    sq_db: DoorbellRegister,
    cq_db: DoorbellRegister,
    cids: CidTable,
    prp_lists: Option<DmaBuffer>,
    lists_per_slot: usize,
    max_transfer: usize,
    pub counters: QueueCounters,
}

impl QueuePair {
    /// Allocates the rings (zeroed, so the first pass expects phase 1) and one
    /// PRP list area per command slot for transfers up to `max_transfer`.
    pub fn new(
        access: &Arc<dyn DeviceAccess>,
        qid: u16,
        size: u16,
        dstrd: u8,
        max_transfer: usize,
    ) -> Result<Self, AccessError> {
        let size = size.max(2);
        let sq = access.dma_alloc(usize::from(size) * Command::SIZE)?;
        let cq = access.dma_alloc(usize::from(size) * Completion::SIZE)?;
        let slots = size - 1;
        let lists_per_slot = prp::list_pages_for_max_transfer(max_transfer);
        let prp_lists = match lists_per_slot {
            0 => None,
            n => Some(access.dma_alloc(usize::from(slots) * n * PAGE_SIZE)?),
        };
        Ok(Self {
            qid,
            size,
            sq,
            cq,
            sq_tail: 0,
            sq_head: 0,
            cq_head: 0,
            phase: true,
            sq_db: DoorbellRegister::new(Arc::clone(access), Doorbell::SqTail(qid), dstrd),
            cq_db: DoorbellRegister::new(Arc::clone(access), Doorbell::CqHead(qid), dstrd),
            cids: CidTable::new(slots),
            prp_lists,
            lists_per_slot,
            max_transfer,
            counters: QueueCounters::default(),
        })
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }

    pub fn size(&self) -> u16 {
        self.size
    }

    pub fn sq_iova(&self) -> u64 {
        self.sq.iova()
    }

    pub fn cq_iova(&self) -> u64 {
        self.cq.iova()
    }

    pub fn max_transfer(&self) -> usize {
        self.max_transfer
    }

    /// Routes both doorbells through their slots in the shadow buffers.
    pub fn attach_shadow(&mut self, bufs: &ShadowBuffers) -> Result<(), AccessError> {
        self.sq_db.attach_shadow(bufs)?;
        self.cq_db.attach_shadow(bufs)
    }

    /// Commands submitted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.cids.outstanding()
    }

    /// Reserves a command identifier.
    pub fn alloc_cid(&mut self) -> Result<u16, Error> {
        self.cids.alloc().ok_or(Error::QueueFull(self.qid))
    }

    /// Gives back a CID reserved with [`Self::alloc_cid`] but never submitted.
    pub fn free_cid(&mut self, cid: u16) {
        self.cids.release(cid);
    }

    /// Points `cmd`'s PRP1/PRP2 at `len` bytes of `buf`, using `cid`'s list pages.
    pub fn set_data(
        &mut self,
        cmd: &mut Command,
        cid: u16,
        buf: &DmaBuffer,
        len: usize,
    ) -> Result<(), Error> {
        if len > buf.len() {
            return Err(Error::BufferTooSmall {
                len,
                buffer: buf.len(),
            });
        }
        self.set_data_at(cmd, cid, buf.iova(), len)
    }

    /// Points `cmd`'s PRP1/PRP2 at `len` bytes from device address `iova`
    /// (inside a buffer the caller has checked), using `cid`'s list pages.
    pub fn set_data_at(
        &mut self,
        cmd: &mut Command,
        cid: u16,
        iova: u64,
        len: usize,
    ) -> Result<(), Error> {
        let per_slot = self.lists_per_slot;
        let (base, lists) = match &self.prp_lists {
            Some(l) => (
                l.iova() + (usize::from(cid) * per_slot * PAGE_SIZE) as u64,
                l,
            ),
            None => (0, &self.sq),
        };
        let slot_offset = usize::from(cid) * per_slot * PAGE_SIZE;
        let mut failed = None;
        let p = prp::build(
            iova,
            len,
            self.max_transfer,
            base,
            per_slot,
            |page, i, v| {
                let at = slot_offset + page * PAGE_SIZE + i * 8;
                if let Err(e) = lists.store_u64(at, v) {
                    failed.get_or_insert(e);
                }
            },
        )?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        cmd.prp1 = p.prp1.into();
        cmd.prp2 = p.prp2.into();
        Ok(())
    }

    /// Writes `cmd` (whose CID is already set) at the SQ tail without
    /// ringing the doorbell.
    pub fn push(&mut self, cmd: &Command) -> Result<(), Error> {
        if !ring_has_room(self.sq_head, self.sq_tail, self.size) {
            return Err(Error::QueueFull(self.qid));
        }
        self.sq
            .write_obj(usize::from(self.sq_tail) * Command::SIZE, cmd)?;
        self.sq_tail = ring_next(self.sq_tail, self.size);
        self.counters.submitted += 1;
        Ok(())
    }

    /// Rings the SQ tail doorbell if entries were pushed since the last ring.
    pub fn ring(&mut self) -> Result<(), Error> {
        // Between two rings at most `size - 1` entries can be pushed, so the
        // tail cannot come back around to the last published value.
        if self.sq_db.last() != self.sq_tail {
            let rung = self.sq_db.ring(self.sq_tail);
            self.counters.sq_doorbell_writes = self.sq_db.writes();
            self.counters.sq_shadow_updates = self.sq_db.shadow_updates();
            self.counters.sq_mapped_writes = self.sq_db.mapped_writes();
            rung?;
        }
        Ok(())
    }

    /// Reaps up to `max` (at most [`REAP_CAP`]) new completions into `out`,
    /// by phase tag, then writes the CQ head doorbell once for the batch.
    pub fn reap(&mut self, out: &mut impl Extend<Completion>, max: usize) -> Result<usize, Error> {
        let max = max.min(REAP_CAP);
        let mut n = 0;
        while n < max {
            let at = usize::from(self.cq_head) * Completion::SIZE;
            // DW3 holds the phase tag; its acquire load orders the reads of
            // the rest of the entry after it.
            let dw3 = self.cq.load_u32(at + 12)?;
            if (dw3 & (1 << 16) != 0) != self.phase {
                break;
            }
            let cqe: Completion = self.cq.read_obj(at)?;
            self.cq_head = ring_next(self.cq_head, self.size);
            if self.cq_head == 0 {
                self.phase = !self.phase;
            }
            n += 1;
            // A hostile or buggy device: ignore heads outside the ring.
            if cqe.sq_head() < self.size {
                self.sq_head = cqe.sq_head();
            }
            if self.cids.release(cqe.cid()) {
                self.counters.completions += 1;
                out.extend(Some(cqe));
            } else {
                self.counters.spurious_completions += 1;
                tracing::debug!(
                    qid = self.qid,
                    cid = cqe.cid(),
                    "completion for a command not in flight"
                );
            }
        }
        if n > 0 {
            let rung = self.cq_db.ring(self.cq_head);
            self.counters.cq_doorbell_writes = self.cq_db.writes();
            self.counters.cq_shadow_updates = self.cq_db.shadow_updates();
            self.counters.cq_mapped_writes = self.cq_db.mapped_writes();
            rung?;
        }
        Ok(n)
    }

    /// Waits for the completion of `cid`, keeping other completions in
    /// `stash`. Uses `interrupt` if given, else polls with backoff.
    pub fn wait_for(
        &mut self,
        cid: u16,
        interrupt: Option<&QueueIrq>,
        stash: &mut VecDeque<Completion>,
        timeout: Duration,
    ) -> Result<Option<Completion>, Error> {
        let mut deadline = Deadline::new(timeout);
        let mut backoff = Backoff::default();
        loop {
            if let Some(pos) = stash.iter().position(|c| c.cid() == cid) {
                return Ok(stash.remove(pos));
            }
            let ticket = interrupt.map_or(0, QueueIrq::ticket);
            if self.reap(stash, REAP_CAP)? > 0 {
                continue;
            }
            let left = deadline.left();
            if left.is_zero() {
                return Ok(None);
            }
            self.idle(interrupt, ticket, left, &mut backoff)?;
        }
    }

    /// Waits (bounded by `left`) for something to reap: an interrupt if there
    /// is one, else a spin, yield or short sleep. `ticket` is
    /// [`QueueIrq::ticket`] taken before the CQ was last found empty.
    pub fn idle(
        &mut self,
        interrupt: Option<&QueueIrq>,
        ticket: u64,
        left: Duration,
        backoff: &mut Backoff,
    ) -> Result<(), Error> {
        match interrupt {
            Some(irq) => {
                if irq
                    .wait(ticket, left.min(Duration::from_millis(100)))
                    .map_err(Error::Interrupt)?
                {
                    self.counters.interrupts_waited += 1;
                }
            }
            None => backoff.pause(left),
        }
        Ok(())
    }

    #[cfg(test)]
    pub fn cq(&self) -> &DmaBuffer {
        &self.cq
    }
}

/// When a wait gives up: `timeout` after the queue was first found with
/// nothing to reap. The clock is read only then and once per sleep after,
/// never for a completion already posted: at queue depth 1 that is every
/// other clock read of a command, and the synchronous, block and
/// asynchronous passthrough waits all count time this one way, so none
/// pays more for it than another.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    timeout: Duration,
    /// Set at the first [`left`](Self::left); `Some(None)` when `timeout`
    /// reaches past what `Instant` can hold (no deadline).
    at: Option<Option<Instant>>,
}

impl Deadline {
    pub fn new(timeout: Duration) -> Self {
        Self { timeout, at: None }
    }

    /// The timeout the caller gave.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Time left before the deadline (zero once it has passed); starts the
    /// clock on the first call.
    pub fn left(&mut self) -> Duration {
        let now = clock::now();
        match *self.at.get_or_insert_with(|| now.checked_add(self.timeout)) {
            Some(at) => at.saturating_duration_since(now),
            None => Duration::MAX,
        }
    }
}

/// The driver's clock reads, counted in tests: a QD 1 command's cost
/// includes them, and what a wait reads is asserted exactly.
pub(crate) mod clock {
    use std::time::Instant;

    #[cfg(test)]
    thread_local! {
        static READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    pub fn now() -> Instant {
        #[cfg(test)]
        READS.with(|r| r.set(r.get() + 1));
        Instant::now()
    }

    /// Clock reads by this thread so far.
    #[cfg(test)]
    pub fn reads() -> u64 {
        READS.with(std::cell::Cell::get)
    }
}

/// Busy-poll first (latency), then yield, then sleep up to 1 ms (CPU).
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    rounds: u32,
}

impl Backoff {
    pub fn pause(&mut self, left: Duration) {
        self.rounds = self.rounds.saturating_add(1);
        match self.rounds {
            0..=64 => std::hint::spin_loop(),
            65..=128 => std::thread::yield_now(),
            r => {
                let us = 10u64 << (r - 129).min(7);
                std::thread::sleep(Duration::from_micros(us).min(left));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::Recorder;
    use vnvme_spec::Status;

    fn setup(size: u16) -> (Arc<Recorder>, QueuePair) {
        let rec = Arc::new(Recorder::new());
        let access: Arc<dyn DeviceAccess> = rec.clone();
        let qp = QueuePair::new(&access, 1, size, 0, 128 << 10).unwrap();
        (rec, qp)
    }

    fn post(qp: &QueuePair, slot: u16, cid: u16, phase: bool) {
        let c = Completion::new(0, slot, 1, cid, phase, Status::SUCCESS);
        qp.cq().write_obj(usize::from(slot) * 16, &c).unwrap();
    }

    #[test]
    fn ring_index_math_wraps() {
        assert_eq!(ring_next(0, 4), 1);
        assert_eq!(ring_next(3, 4), 0);
        assert_eq!(ring_next(u16::MAX, u16::MAX), 0);
        assert_eq!(ring_used(1, 3, 4), 2);
        assert_eq!(ring_used(3, 1, 4), 2);
        assert!(ring_has_room(0, 2, 4));
        assert!(!ring_has_room(0, 3, 4), "a ring keeps one entry empty");
        assert!(!ring_has_room(2, 1, 4));
    }

    #[test]
    fn reap_stops_at_stale_phase_and_rings_cq_head_once() {
        let (rec, mut qp) = setup(4);
        let a = qp.alloc_cid().unwrap();
        let b = qp.alloc_cid().unwrap();
        post(&qp, 0, a, true);
        post(&qp, 1, b, true);
        let mut out = VecDeque::new();
        assert_eq!(qp.reap(&mut out, 16).unwrap(), 2);
        assert_eq!(out.iter().map(|c| c.cid()).collect::<Vec<_>>(), [a, b]);
        assert_eq!(
            *rec.writes.lock(),
            [(0x1000 + 3 * 4, 2)],
            "one CQ1 head write"
        );
        assert_eq!(qp.reap(&mut out, 16).unwrap(), 0);
        assert_eq!(
            rec.writes.lock().len(),
            1,
            "no doorbell when nothing reaped"
        );
    }

    #[test]
    fn reap_flips_phase_on_wrap() {
        let (_rec, mut qp) = setup(3);
        let mut out = VecDeque::new();
        for slot in 0..3u16 {
            let cid = qp.alloc_cid().unwrap();
            post(&qp, slot, cid, true);
            qp.reap(&mut out, 1).unwrap();
        }
        // Slot 0 still holds phase 1 from the first pass: not new.
        assert_eq!(qp.reap(&mut out, 16).unwrap(), 0);
        let cid = qp.alloc_cid().unwrap();
        post(&qp, 0, cid, false);
        assert_eq!(qp.reap(&mut out, 16).unwrap(), 1);
        assert_eq!(out.len(), 4);
    }

    #[test]
    fn reap_respects_the_cap_and_ignores_unknown_cids() {
        let (_rec, mut qp) = setup(8);
        let cids: Vec<u16> = (0..3).map(|_| qp.alloc_cid().unwrap()).collect();
        post(&qp, 0, cids[0], true);
        post(&qp, 1, 6, true); // never submitted
        post(&qp, 2, cids[1], true);
        let mut out = VecDeque::new();
        assert_eq!(qp.reap(&mut out, 1).unwrap(), 1);
        assert_eq!(qp.reap(&mut out, 16).unwrap(), 2);
        assert_eq!(out.len(), 2);
        assert_eq!(qp.counters.spurious_completions, 1);
        assert_eq!(qp.outstanding(), 1);
    }

    #[test]
    fn submit_batch_rings_sq_tail_once() {
        let (rec, mut qp) = setup(8);
        for _ in 0..3 {
            let cid = qp.alloc_cid().unwrap();
            qp.push(&Command::new(0x02, cid)).unwrap();
        }
        qp.ring().unwrap();
        qp.ring().unwrap();
        assert_eq!(*rec.writes.lock(), [(0x1000 + 2 * 4, 3)]);
        assert_eq!(qp.counters.sq_doorbell_writes, 1);
    }

    #[test]
    fn cids_run_out_at_queue_size_minus_one() {
        let (_rec, mut qp) = setup(4);
        for _ in 0..3 {
            qp.alloc_cid().unwrap();
        }
        assert!(matches!(qp.alloc_cid(), Err(Error::QueueFull(1))));
    }

    #[test]
    fn set_data_writes_the_prp_list_of_the_commands_slot() {
        let (_rec, mut qp) = setup(4);
        let access: Arc<dyn DeviceAccess> = _rec.clone();
        let data = access.dma_alloc(16384).unwrap();
        let cid = qp.alloc_cid().unwrap();
        let cid = qp.alloc_cid().unwrap().max(cid);
        let mut cmd = Command::new(0x02, cid);
        qp.set_data(&mut cmd, cid, &data, 16384).unwrap();
        assert_eq!(cmd.prp1.get(), data.iova());
        let lists = qp.prp_lists.clone().unwrap();
        assert_eq!(cmd.prp2.get(), lists.iova() + u64::from(cid) * 4096);
        let at = usize::from(cid) * 4096;
        assert_eq!(lists.load_u64(at).unwrap(), data.iova() + 4096);
        assert_eq!(lists.load_u64(at + 16).unwrap(), data.iova() + 12288);
        assert!(matches!(
            qp.set_data(&mut cmd, cid, &data, 20000),
            Err(Error::BufferTooSmall { .. })
        ));
    }
}
