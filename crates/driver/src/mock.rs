//! A small in-process NVMe controller behind [`DeviceAccess`], for testing
//! the driver without a socket. Commands run synchronously inside the SQ
//! doorbell write. It walks PRPs with its own code (not `prp::build`), so
//! the tests check the driver's data pointers independently.
//!
//! Doorbell modes: register traps; Doorbell Buffer Config (§5.8) with the
//! QEMU algorithm (after each SQ pass publish EventIdx, then re-read the
//! shadow tail), where a shadow update that skips the register is only seen
//! by [`MockDevice::poll`], the stand-in for a polling worker; and a mapped
//! doorbell page, whose stores run the doorbell at once like an infinitely
//! fast poller, counted apart from traps.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use vnvme_spec::command::Command;
use vnvme_spec::identify::{oacs, IdentifyController};
use vnvme_spec::regs::{offset, Cap, Cc, Csts, Doorbell};
use vnvme_spec::{AdminOpcode, Completion, NvmOpcode, Status};
use zerocopy::IntoBytes;

use crate::access::{
    AccessError, BoxError, DeviceAccess, DmaBuffer, DmaMapper, DmaPool, DmaRegion, Interrupt,
};

#[derive(Debug, Clone)]
pub struct MockConfig {
    pub never_ready: bool,
    pub max_queues: u16,
    pub mdts: u8,
    pub mqes_z: u16,
    pub msix_vectors: u16,
    pub nsids: Vec<u32>,
    /// Identify Namespace answers Namespace Not Ready this many times first.
    pub not_ready: HashMap<u32, u32>,
    /// NSIDs in the active list whose identify fails with Invalid Namespace.
    pub invalid: Vec<u32>,
    pub blocks: u64,
    /// OACS bit 8: Doorbell Buffer Config offered.
    pub dbbuf: bool,
    /// Doorbell Buffer Config fails with this status.
    pub dbbuf_fails: Option<Status>,
    /// Where the device keeps the EventIdx of I/O queues (the admin queue
    /// is always [`EventIdxMode::Armed`]).
    pub event_idx: EventIdxMode,
    /// Offer the doorbell page (BAR0 0x1000..0x2000) as mappable memory.
    pub mapped_doorbells: bool,
    /// The VS register (NVMe 2.0 and later: the driver reads NSTAT).
    pub version: u32,
    /// Identify Controller OAES bit 8: Namespace Attribute Notices.
    pub aen: bool,
    /// Identify Namespace answers these statuses first, in order.
    pub statuses: HashMap<u32, Vec<Status>>,
    /// Namespaces whose format carries 8 bytes of metadata.
    pub metadata: Vec<u32>,
    /// Identify CNS 08h reports NSTAT not ready this many times first.
    pub nstat_not_ready: HashMap<u32, u32>,
}

/// Where the device puts EventIdx after it has seen a doorbell value `v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventIdxMode {
    /// EventIdx = `v` (QEMU): the next update writes the register.
    Armed,
    /// EventIdx = `v - 1` mod queue size (a polling device): no update ever
    /// crosses it, so the driver never writes the register.
    Behind,
    /// Never written by the device; the test sets it ([`MockDevice::set_event_idx`]).
    Manual,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            never_ready: false,
            max_queues: 64,
            mdts: 0,
            mqes_z: 1023,
            msix_vectors: 0,
            nsids: vec![1],
            not_ready: HashMap::new(),
            invalid: Vec::new(),
            blocks: 16384,
            dbbuf: false,
            dbbuf_fails: None,
            event_idx: EventIdxMode::Armed,
            mapped_doorbells: false,
            version: 0x0001_0400,
            aen: false,
            statuses: HashMap::new(),
            metadata: Vec::new(),
            nstat_not_ready: HashMap::new(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Sq {
    base: u64,
    size: u16,
    head: u16,
    cqid: u16,
}

#[derive(Debug, Clone, Copy)]
struct Cq {
    base: u64,
    size: u16,
    tail: u16,
    head: u16,
    phase: bool,
    iv: Option<u16>,
}

#[derive(Debug, Default)]
pub struct MockStats {
    pub admin_opcodes: Vec<u8>,
    pub sq_doorbells: u64,
    pub cq_doorbells: u64,
    pub interrupts: u64,
    pub io_commands: u64,
    /// Doorbell values stored to the mapped doorbell page (no trap).
    pub mapped_doorbells: u64,
}

#[derive(Debug)]
struct State {
    cfg: MockConfig,
    cc: u32,
    csts: u32,
    aqa: u32,
    asq: u64,
    acq: u64,
    sqs: HashMap<u16, Sq>,
    cqs: HashMap<u16, Cq>,
    data: HashMap<u32, Vec<u8>>,
    buffers: Vec<DmaBuffer>,
    irqs: Vec<Interrupt>,
    stats: MockStats,
    /// Doorbell Buffer Config: (shadow doorbell page, EventIdx page) IOVAs.
    dbbuf: Option<(u64, u64)>,
    /// The mapped doorbell page, once the driver has mapped it.
    mapped: Option<DmaBuffer>,
    events: ns::Events,
    /// CNS of every Identify received.
    identify_cns: Vec<u8>,
}

#[derive(Debug)]
pub struct MockDevice {
    pool: DmaPool,
    state: Mutex<State>,
}

struct NoMapper;
impl DmaMapper for NoMapper {
    fn map(&self, _: &DmaRegion) -> Result<(), BoxError> {
        Ok(())
    }
    fn unmap(&self, _: u64, _: usize) {}
}

const LBA: usize = 512;

impl MockDevice {
    pub fn new(cfg: MockConfig) -> Arc<Self> {
        let data = cfg
            .nsids
            .iter()
            .map(|&n| (n, vec![0u8; cfg.blocks as usize * LBA]))
            .collect();
        Arc::new(Self {
            pool: DmaPool::new(Arc::new(NoMapper), 4 << 20),
            state: Mutex::new(State {
                cfg,
                cc: 0,
                csts: 0,
                aqa: 0,
                asq: 0,
                acq: 0,
                sqs: HashMap::new(),
                cqs: HashMap::new(),
                data,
                buffers: Vec::new(),
                irqs: Vec::new(),
                stats: MockStats::default(),
                dbbuf: None,
                mapped: None,
                events: ns::Events::default(),
                identify_cns: Vec::new(),
            }),
        })
    }

    pub fn stats<R>(&self, f: impl FnOnce(&MockStats) -> R) -> R {
        f(&self.state.lock().stats)
    }

    pub fn cq_vector(&self, qid: u16) -> Option<u16> {
        self.state.lock().cqs.get(&qid).and_then(|c| c.iv)
    }

    pub fn ns_bytes(&self, nsid: u32, at: usize, len: usize) -> Vec<u8> {
        self.state.lock().data[&nsid][at..at + len].to_vec()
    }

    /// What a polling worker does: for every queue, read the shadow value
    /// (or the mapped doorbell), process, and publish EventIdx.
    pub fn poll(&self) {
        let mut s = self.state.lock();
        let mut sqids: Vec<u16> = s.sqs.keys().copied().collect();
        sqids.sort_unstable();
        for qid in sqids {
            if let Some(tail) = s.polled_value(Doorbell::SqTail(qid)) {
                s.run_sq(qid, tail);
            }
        }
        let mut cqids: Vec<u16> = s.cqs.keys().copied().collect();
        cqids.sort_unstable();
        for qid in cqids {
            if let Some(head) = s.polled_value(Doorbell::CqHead(qid)) {
                s.cq_head(qid, head);
            }
        }
    }

    /// Writes EventIdx of `db` (for [`EventIdxMode::Manual`]).
    pub fn set_event_idx(&self, db: Doorbell, value: u16) {
        let s = self.state.lock();
        let (_, eis) = s.dbbuf.expect("Doorbell Buffer Config not done");
        s.write(eis + db_slot(db), &u32::from(value).to_le_bytes());
    }

    /// The value the driver stored in `db`'s shadow slot.
    pub fn shadow_value(&self, db: Doorbell) -> Option<u32> {
        let s = self.state.lock();
        let (dbs, _) = s.dbbuf?;
        s.read_u32(dbs + db_slot(db))
    }
}

/// Offset of a doorbell in the shadow / EventIdx pages (CAP.DSTRD = 0).
fn db_slot(db: Doorbell) -> u64 {
    u64::from(db.index()) * 4
}

impl State {
    fn cap(&self) -> u64 {
        Cap::new()
            .with_mqes_z(self.cfg.mqes_z)
            .with_cqr(true)
            .with_to(1)
            .with_css(1)
            .into()
    }

    /// The buffer holding `len` bytes at `iova`, and the offset in it.
    fn mem(&self, iova: u64, len: usize) -> Option<(DmaBuffer, usize)> {
        self.buffers.iter().find_map(|b| {
            let off = iova.checked_sub(b.iova())? as usize;
            (off + len <= b.len()).then(|| (b.clone(), off))
        })
    }

    fn read(&self, iova: u64, out: &mut [u8]) -> bool {
        match self.mem(iova, out.len()) {
            Some((b, off)) => b.read_bytes(off, out).is_ok(),
            None => false,
        }
    }

    fn write(&self, iova: u64, data: &[u8]) -> bool {
        match self.mem(iova, data.len()) {
            Some((b, off)) => b.write_bytes(off, data).is_ok(),
            None => false,
        }
    }

    fn read_u32(&self, iova: u64) -> Option<u32> {
        let mut b = [0u8; 4];
        self.read(iova, &mut b).then(|| u32::from_le_bytes(b))
    }

    fn read_u64(&self, iova: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(iova, &mut b).then(|| u64::from_le_bytes(b))
    }

    /// Walks PRP1/PRP2 (and PRP lists, chained) into (address, length) segments.
    fn prp_segments(&self, cmd: &Command, len: usize) -> Option<Vec<(u64, usize)>> {
        let prp1 = cmd.prp1.get();
        let first = len.min(4096 - (prp1 % 4096) as usize);
        let mut segs = vec![(prp1, first)];
        let mut remaining = len - first;
        let prp2 = cmd.prp2.get();
        if remaining == 0 {
            return Some(segs);
        }
        if remaining <= 4096 {
            segs.push((prp2, remaining));
            return Some(segs);
        }
        let mut entry = prp2;
        while remaining > 0 {
            if entry % 4096 == 4088 && remaining > 4096 {
                entry = self.read_u64(entry)?;
                continue;
            }
            let page = self.read_u64(entry)?;
            if page % 4096 != 0 {
                return None;
            }
            let take = remaining.min(4096);
            segs.push((page, take));
            remaining -= take;
            entry += 8;
        }
        Some(segs)
    }

    fn enable(&mut self) {
        let size = (self.aqa & 0xFFF) as u16 + 1;
        let csize = ((self.aqa >> 16) & 0xFFF) as u16 + 1;
        self.sqs.clear();
        self.cqs.clear();
        // The buffers are not retained across a reset.
        self.dbbuf = None;
        self.sqs.insert(
            0,
            Sq {
                base: self.asq,
                size,
                head: 0,
                cqid: 0,
            },
        );
        let iv = (!self.irqs.is_empty()).then_some(0);
        self.cqs.insert(
            0,
            Cq {
                base: self.acq,
                size: csize,
                tail: 0,
                head: 0,
                phase: true,
                iv,
            },
        );
        if !self.cfg.never_ready {
            self.csts = Csts::from(self.csts).with_rdy(true).into();
        }
    }

    /// A doorbell value arriving by trap (or by a store to the mapped page).
    fn doorbell(&mut self, db: Doorbell, value: u32, trap: bool) {
        match (db, trap) {
            (Doorbell::CqHead(_), true) => self.stats.cq_doorbells += 1,
            (Doorbell::SqTail(_), true) => self.stats.sq_doorbells += 1,
            (_, false) => self.stats.mapped_doorbells += 1,
        }
        let value = value as u16;
        // QEMU: an admin trap copies the value into the shadow slot, so a
        // host that does not shadow the admin queue keeps the shadow view
        // consistent.
        if let (Doorbell::SqTail(0) | Doorbell::CqHead(0), Some((dbs, _))) = (db, self.dbbuf) {
            self.write(dbs + db_slot(db), &u32::from(value).to_le_bytes());
        }
        match db {
            Doorbell::CqHead(qid) => self.cq_head(qid, value),
            Doorbell::SqTail(qid) => self.run_sq(qid, value),
        }
    }

    /// The value a polling worker reads for `db`: the mapped doorbell if
    /// there is one, else the shadow slot. `None` without either.
    fn polled_value(&self, db: Doorbell) -> Option<u16> {
        if let Some(page) = &self.mapped {
            let at = usize::try_from(db.offset(0) - offset::DOORBELLS).ok()?;
            return page.load_u32(at).ok().map(|v| v as u16);
        }
        let (dbs, _) = self.dbbuf?;
        self.read_u32(dbs + db_slot(db)).map(|v| v as u16)
    }

    /// EventIdx to publish after seeing `value` on a queue of `size`.
    fn event_idx_for(&self, qid: u16, value: u16, size: u16) -> Option<u16> {
        let mode = if qid == 0 {
            EventIdxMode::Armed
        } else {
            self.cfg.event_idx
        };
        match mode {
            EventIdxMode::Armed => Some(value),
            EventIdxMode::Behind => Some((value + size - 1) % size),
            EventIdxMode::Manual => None,
        }
    }

    fn publish_event_idx(&self, db: Doorbell, value: u16, size: u16) {
        let qid = match db {
            Doorbell::SqTail(q) | Doorbell::CqHead(q) => q,
        };
        if let (Some((_, eis)), Some(ei)) = (self.dbbuf, self.event_idx_for(qid, value, size)) {
            self.write(eis + db_slot(db), &u32::from(ei).to_le_bytes());
        }
    }

    /// Processes SQ `qid` up to `tail`; with shadow buffers, then publishes
    /// EventIdx and re-reads the shadow tail until it stops moving (QEMU).
    fn run_sq(&mut self, qid: u16, mut tail: u16) {
        for _ in 0..64 {
            let Some(mut sq) = self.sqs.get(&qid).copied() else {
                return;
            };
            while sq.head != tail && tail < sq.size {
                let mut raw = [0u8; 64];
                self.read(sq.base + u64::from(sq.head) * 64, &mut raw);
                sq.head = (sq.head + 1) % sq.size;
                let cmd = Command::from_slice(&raw).unwrap_or_default();
                // The command is consumed before it runs (Doorbell Buffer
                // Config seeds the shadow tail from the head).
                if let Some(s) = self.sqs.get_mut(&qid) {
                    s.head = sq.head;
                }
                if qid == 0 && self.defer_admin(&cmd) {
                    continue;
                }
                let (status, dw0) = if qid == 0 {
                    self.admin(&cmd)
                } else {
                    self.io(&cmd)
                };
                self.post(sq.cqid, qid, sq.head, &cmd, status, dw0);
            }
            if self.dbbuf.is_none() || self.mapped.is_some() {
                return;
            }
            self.publish_event_idx(Doorbell::SqTail(qid), sq.head, sq.size);
            match self.polled_value(Doorbell::SqTail(qid)) {
                Some(t) if t != sq.head => tail = t,
                _ => return,
            }
        }
    }

    /// A new CQ head; with shadow buffers, publishes the CQ EventIdx.
    fn cq_head(&mut self, qid: u16, head: u16) {
        let Some(cq) = self.cqs.get_mut(&qid) else {
            return;
        };
        if head < cq.size {
            cq.head = head;
        }
        let (head, size) = (cq.head, cq.size);
        self.publish_event_idx(Doorbell::CqHead(qid), head, size);
    }

    fn post(
        &mut self,
        cqid: u16,
        sqid: u16,
        sq_head: u16,
        cmd: &Command,
        status: Status,
        dw0: u32,
    ) {
        let Some(cq) = self.cqs.get_mut(&cqid) else {
            return;
        };
        let cqe = Completion::new(dw0, sq_head, sqid, cmd.cid(), cq.phase, status);
        let at = cq.base + u64::from(cq.tail) * 16;
        cq.tail = (cq.tail + 1) % cq.size;
        if cq.tail == 0 {
            cq.phase = !cq.phase;
        }
        let iv = cq.iv;
        self.write(at, cqe.as_bytes());
        // QEMU: after posting, publish the CQ EventIdx from the shadow head
        // (this part was missing at first and caused timeouts).
        if let Some(head) = self.polled_value(Doorbell::CqHead(cqid)) {
            self.cq_head(cqid, head);
        }
        if let Some(irq) = iv.and_then(|v| self.irqs.get(usize::from(v))) {
            irq.signal().unwrap();
            self.stats.interrupts += 1;
        }
    }

    fn admin(&mut self, cmd: &Command) -> (Status, u32) {
        self.stats.admin_opcodes.push(cmd.opcode());
        let cdw10 = cmd.cdw10.get();
        let cdw11 = cmd.cdw11.get();
        match AdminOpcode(cmd.opcode()) {
            AdminOpcode::IDENTIFY => {
                self.identify_cns.push(cdw10 as u8);
                let page: Vec<u8> = match cdw10 & 0xFF {
                    1 => {
                        let mut id = IdentifyController::new_boxed();
                        id.mdts = self.cfg.mdts;
                        if self.cfg.dbbuf {
                            id.oacs = oacs::DOORBELL_BUFFER_CONFIG.into();
                        }
                        id.nn = self.cfg.nsids.iter().copied().max().unwrap_or(0).into();
                        if self.cfg.aen {
                            id.oaes = (1u32 << 8).into();
                        }
                        id.as_bytes().to_vec()
                    }
                    2 => {
                        let mut page = vec![0u8; 4096];
                        let start = cmd.nsid.get();
                        for (i, n) in self.cfg.nsids.iter().filter(|&&n| n > start).enumerate() {
                            page[i * 4..i * 4 + 4].copy_from_slice(&n.to_le_bytes());
                        }
                        page
                    }
                    0 => match self.identify_ns(cmd.nsid.get()) {
                        Ok(page) => page,
                        Err(status) => return (status, 0),
                    },
                    8 => match self.identify_ns_independent(cmd.nsid.get()) {
                        Ok(page) => page,
                        Err(status) => return (status, 0),
                    },
                    _ => return (Status::INVALID_FIELD.with_dnr(true), 0),
                };
                let segs = match self.prp_segments(cmd, 4096) {
                    Some(s) => s,
                    None => return (Status::DATA_TRANSFER_ERROR, 0),
                };
                let mut at = 0;
                for (addr, len) in segs {
                    self.write(addr, &page[at..at + len]);
                    at += len;
                }
                (Status::SUCCESS, 0)
            }
            AdminOpcode::SET_FEATURES if cdw10 & 0xFF == 7 => {
                let max = u32::from(self.cfg.max_queues) - 1;
                let nsq = (cdw11 & 0xFFFF).min(max);
                let ncq = (cdw11 >> 16).min(max);
                (Status::SUCCESS, nsq | (ncq << 16))
            }
            // Asynchronous Event Configuration: accepted.
            AdminOpcode::SET_FEATURES if cdw10 & 0xFF == 0x0B => (Status::SUCCESS, 0),
            AdminOpcode::GET_LOG_PAGE => self.get_log_page(cmd),
            AdminOpcode::CREATE_IO_CQ => {
                let qid = cdw10 as u16;
                let iv = (cdw11 & 2 != 0).then_some((cdw11 >> 16) as u16);
                self.cqs.insert(
                    qid,
                    Cq {
                        base: cmd.prp1.get(),
                        size: (cdw10 >> 16) as u16 + 1,
                        tail: 0,
                        head: 0,
                        phase: true,
                        iv,
                    },
                );
                self.new_queue_slots(Doorbell::CqHead(qid), (cdw10 >> 16) as u16 + 1);
                (Status::SUCCESS, 0)
            }
            AdminOpcode::CREATE_IO_SQ => {
                let qid = cdw10 as u16;
                let cqid = (cdw11 >> 16) as u16;
                if !self.cqs.contains_key(&cqid) {
                    return (Status::INVALID_CQ.with_dnr(true), 0);
                }
                let size = (cdw10 >> 16) as u16 + 1;
                self.sqs.insert(
                    qid,
                    Sq {
                        base: cmd.prp1.get(),
                        size,
                        head: 0,
                        cqid,
                    },
                );
                self.new_queue_slots(Doorbell::SqTail(qid), size);
                (Status::SUCCESS, 0)
            }
            AdminOpcode::DOORBELL_BUFFER_CONFIG => self.doorbell_buffer_config(cmd),
            AdminOpcode::DELETE_IO_SQ => {
                self.sqs.remove(&(cdw10 as u16));
                (Status::SUCCESS, 0)
            }
            AdminOpcode::DELETE_IO_CQ => {
                self.cqs.remove(&(cdw10 as u16));
                (Status::SUCCESS, 0)
            }
            _ => (Status::INVALID_OPCODE.with_dnr(true), 0),
        }
    }

    /// Doorbell Buffer Config (§5.8): two distinct page-aligned pages.
    fn doorbell_buffer_config(&mut self, cmd: &Command) -> (Status, u32) {
        if !self.cfg.dbbuf {
            return (Status::INVALID_OPCODE.with_dnr(true), 0);
        }
        if let Some(status) = self.cfg.dbbuf_fails {
            return (status, 0);
        }
        let (dbs, eis) = (cmd.prp1.get(), cmd.prp2.get());
        let valid = dbs % 4096 == 0
            && eis % 4096 == 0
            && dbs != eis
            && self.mem(dbs, 4096).is_some()
            && self.mem(eis, 4096).is_some();
        if !valid {
            return (Status::INVALID_FIELD.with_dnr(true), 0);
        }
        self.dbbuf = Some((dbs, eis));
        // Seed the shadow slots of the queues that exist (the admin queue)
        // with the values seen so far.
        let sqs: Vec<(u16, u16)> = self.sqs.iter().map(|(&q, sq)| (q, sq.head)).collect();
        for (qid, head) in sqs {
            self.write(
                dbs + db_slot(Doorbell::SqTail(qid)),
                &u32::from(head).to_le_bytes(),
            );
        }
        let cqs: Vec<(u16, u16)> = self.cqs.iter().map(|(&q, cq)| (q, cq.head)).collect();
        for (qid, head) in cqs {
            self.write(
                dbs + db_slot(Doorbell::CqHead(qid)),
                &u32::from(head).to_le_bytes(),
            );
        }
        (Status::SUCCESS, 0)
    }

    /// A created queue starts with a zero shadow slot (hosts may leave stale
    /// values) and the EventIdx its mode gives for value 0.
    fn new_queue_slots(&mut self, db: Doorbell, size: u16) {
        if let Some((dbs, _)) = self.dbbuf {
            self.write(dbs + db_slot(db), &0u32.to_le_bytes());
            self.publish_event_idx(db, 0, size);
        }
    }

    fn io(&mut self, cmd: &Command) -> (Status, u32) {
        self.stats.io_commands += 1;
        let nsid = cmd.nsid.get();
        let op = NvmOpcode(cmd.opcode());
        if op == NvmOpcode::FLUSH {
            return (Status::SUCCESS, 0);
        }
        if op != NvmOpcode::READ && op != NvmOpcode::WRITE {
            return (Status::INVALID_OPCODE.with_dnr(true), 0);
        }
        let lba = u64::from(cmd.cdw10.get()) | (u64::from(cmd.cdw11.get()) << 32);
        let nlb = u64::from(cmd.cdw12.get() & 0xFFFF) + 1;
        if lba + nlb > self.cfg.blocks {
            return (Status::LBA_OUT_OF_RANGE.with_dnr(true), 0);
        }
        let len = nlb as usize * LBA;
        let Some(segs) = self.prp_segments(cmd, len) else {
            return (Status::DATA_TRANSFER_ERROR, 0);
        };
        let Some(mut store) = self.data.remove(&nsid) else {
            return (Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true), 0);
        };
        let mut at = lba as usize * LBA;
        let mut ok = true;
        for (addr, seg) in segs {
            let range = at..at + seg;
            ok &= if op == NvmOpcode::READ {
                self.write(addr, &store[range])
            } else {
                self.read(addr, &mut store[range])
            };
            at += seg;
        }
        self.data.insert(nsid, store);
        if ok {
            (Status::SUCCESS, 0)
        } else {
            (Status::DATA_TRANSFER_ERROR, 0)
        }
    }
}

impl DeviceAccess for MockDevice {
    fn read32(&self, off: u64) -> Result<u32, AccessError> {
        let s = self.state.lock();
        Ok(match off {
            offset::CAP => s.cap() as u32,
            0x04 => (s.cap() >> 32) as u32,
            offset::VS => s.cfg.version,
            offset::CC => s.cc,
            offset::CSTS => s.csts,
            offset::AQA => s.aqa,
            _ => 0,
        })
    }

    fn write32(&self, off: u64, value: u32) -> Result<(), AccessError> {
        let mut s = self.state.lock();
        match off {
            offset::CC => {
                let old = Cc::from(s.cc);
                let new = Cc::from(value);
                s.cc = value;
                if new.en() && !old.en() {
                    s.enable();
                } else if !new.en() && old.en() {
                    s.sqs.clear();
                    s.cqs.clear();
                    s.csts = 0;
                }
                if new.shn() != 0 {
                    s.csts = Csts::from(s.csts).with_shst(2).into();
                }
            }
            offset::AQA => s.aqa = value,
            offset::ASQ => s.asq = (s.asq & !0xFFFF_FFFF) | u64::from(value),
            0x2C => s.asq = (s.asq & 0xFFFF_FFFF) | (u64::from(value) << 32),
            offset::ACQ => s.acq = (s.acq & !0xFFFF_FFFF) | u64::from(value),
            0x34 => s.acq = (s.acq & 0xFFFF_FFFF) | (u64::from(value) << 32),
            _ => {
                let page = s.mapped.clone();
                let mapped = page.as_ref().and_then(|p| {
                    let at = usize::try_from(off.checked_sub(offset::DOORBELLS)?).ok()?;
                    p.store_u32(at, value).ok()
                });
                if let Some(db) = Doorbell::decode(off, 0) {
                    if Csts::from(s.csts).rdy() {
                        s.doorbell(db, value, mapped.is_none());
                    }
                }
            }
        }
        Ok(())
    }

    fn dma_alloc(&self, size: usize) -> Result<DmaBuffer, AccessError> {
        let buf = self.pool.alloc(size)?;
        self.state.lock().buffers.push(buf.clone());
        Ok(buf)
    }

    fn enable_interrupts(&self, n: u16) -> Result<Vec<Interrupt>, AccessError> {
        let mut s = self.state.lock();
        let n = n.min(s.cfg.msix_vectors);
        let mut out = Vec::new();
        s.irqs.clear();
        for v in 0..n {
            let irq = Interrupt::new(v).map_err(|e| AccessError::Interrupts(e.into()))?;
            s.irqs.push(
                irq.try_clone()
                    .map_err(|e| AccessError::Interrupts(e.into()))?,
            );
            out.push(irq);
        }
        Ok(out)
    }

    fn disable_interrupts(&self) -> Result<(), AccessError> {
        self.state.lock().irqs.clear();
        Ok(())
    }

    fn map_registers(&self) -> Result<bool, AccessError> {
        let mut s = self.state.lock();
        if s.cfg.mapped_doorbells && s.mapped.is_none() {
            s.mapped = Some(self.pool.alloc(4096)?);
        }
        Ok(s.mapped.is_some())
    }

    fn is_mapped(&self, off: u64) -> bool {
        self.state.lock().mapped.is_some() && (offset::DOORBELLS..0x2000).contains(&off)
    }
}

mod ns;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod init_tests;

#[cfg(test)]
mod doorbell_tests;
