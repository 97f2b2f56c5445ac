//! A small in-process NVMe controller behind [`DeviceAccess`], for testing
//! the driver without a socket. Commands run synchronously inside the SQ
//! doorbell write. It walks PRPs with its own code (not `prp::build`), so
//! the tests check the driver's data pointers independently.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use vnvme_spec::command::Command;
use vnvme_spec::identify::{IdentifyController, IdentifyNamespace};
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
                phase: true,
                iv,
            },
        );
        if !self.cfg.never_ready {
            self.csts = Csts::from(self.csts).with_rdy(true).into();
        }
    }

    fn doorbell(&mut self, db: Doorbell, value: u32) {
        match db {
            Doorbell::CqHead(_) => self.stats.cq_doorbells += 1,
            Doorbell::SqTail(qid) => {
                self.stats.sq_doorbells += 1;
                let Some(mut sq) = self.sqs.get(&qid).copied() else {
                    return;
                };
                let tail = value as u16;
                while sq.head != tail && tail < sq.size {
                    let mut raw = [0u8; 64];
                    self.read(sq.base + u64::from(sq.head) * 64, &mut raw);
                    sq.head = (sq.head + 1) % sq.size;
                    let cmd = Command::from_slice(&raw).unwrap_or_default();
                    let (status, dw0) = if qid == 0 {
                        self.admin(&cmd)
                    } else {
                        self.io(&cmd)
                    };
                    self.post(sq.cqid, qid, sq.head, &cmd, status, dw0);
                    if let Some(s) = self.sqs.get_mut(&qid) {
                        s.head = sq.head;
                    }
                }
            }
        }
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
                let page: Vec<u8> = match cdw10 & 0xFF {
                    1 => {
                        let mut id = IdentifyController::new_boxed();
                        id.mdts = self.cfg.mdts;
                        id.nn = self.cfg.nsids.iter().copied().max().unwrap_or(0).into();
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
                    0 => {
                        let nsid = cmd.nsid.get();
                        if let Some(left) = self.cfg.not_ready.get_mut(&nsid) {
                            if *left > 0 {
                                *left -= 1;
                                return (Status::NAMESPACE_NOT_READY, 0);
                            }
                        }
                        if self.cfg.invalid.contains(&nsid) || !self.cfg.nsids.contains(&nsid) {
                            return (Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true), 0);
                        }
                        let mut id = IdentifyNamespace::new_boxed();
                        id.nsze = self.cfg.blocks.into();
                        id.ncap = self.cfg.blocks.into();
                        id.lbaf[0].lbads = 9;
                        id.as_bytes().to_vec()
                    }
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
            AdminOpcode::CREATE_IO_CQ => {
                let qid = cdw10 as u16;
                let iv = (cdw11 & 2 != 0).then_some((cdw11 >> 16) as u16);
                self.cqs.insert(
                    qid,
                    Cq {
                        base: cmd.prp1.get(),
                        size: (cdw10 >> 16) as u16 + 1,
                        tail: 0,
                        phase: true,
                        iv,
                    },
                );
                (Status::SUCCESS, 0)
            }
            AdminOpcode::CREATE_IO_SQ => {
                let qid = cdw10 as u16;
                let cqid = (cdw11 >> 16) as u16;
                if !self.cqs.contains_key(&cqid) {
                    return (Status::INVALID_CQ.with_dnr(true), 0);
                }
                self.sqs.insert(
                    qid,
                    Sq {
                        base: cmd.prp1.get(),
                        size: (cdw10 >> 16) as u16 + 1,
                        head: 0,
                        cqid,
                    },
                );
                (Status::SUCCESS, 0)
            }
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
            offset::VS => 0x0001_0400,
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
                if let Some(db) = Doorbell::decode(off, 0) {
                    if Csts::from(s.csts).rdy() {
                        s.doorbell(db, value);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::{Controller, InitOptions};
    use crate::error::Error;
    use crate::prp::PrpError;
    use std::time::Duration;

    fn init(cfg: MockConfig, opts: InitOptions) -> (Arc<MockDevice>, Result<Controller, Error>) {
        let dev = MockDevice::new(cfg);
        let ctrl = Controller::init(dev.clone(), opts);
        (dev, ctrl)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn init_sends_2n_plus_3_plus_ns_admin_commands() {
        let cfg = MockConfig {
            nsids: vec![1, 2],
            ..Default::default()
        };
        let opts = InitOptions {
            io_queues: 3,
            ..Default::default()
        };
        let (dev, ctrl) = init(cfg, opts);
        let ctrl = ctrl.unwrap();
        assert_eq!(ctrl.io_queue_count(), 3);
        assert_eq!(ctrl.namespaces().len(), 2);
        assert_eq!(ctrl.namespaces()[1].nsid, 2);
        assert_eq!(ctrl.namespaces()[0].lba_size, 512);
        assert_eq!(ctrl.init_admin_commands(), 2 * 3 + 3 + 2);
        let creates = dev.stats(|s| {
            s.admin_opcodes
                .iter()
                .filter(|&&o| o == 0x05 || o == 0x01)
                .count()
        });
        assert_eq!(creates, 6, "no create-learn-delete-recreate");
        assert!(!ctrl.interrupts_enabled());
    }

    #[test]
    fn init_uses_the_granted_number_of_queues() {
        let cfg = MockConfig {
            max_queues: 2,
            ..Default::default()
        };
        let opts = InitOptions {
            io_queues: 8,
            ..Default::default()
        };
        let ctrl = init(cfg, opts).1.unwrap();
        assert_eq!(ctrl.io_queue_count(), 2);
        assert!(ctrl.take_io_queue(1).is_ok());
        assert!(matches!(ctrl.take_io_queue(1), Err(Error::QueueTaken(2))));
        assert!(matches!(ctrl.take_io_queue(2), Err(Error::NoSuchQueue(3))));
    }

    #[test]
    fn controller_that_never_becomes_ready_times_out() {
        let cfg = MockConfig {
            never_ready: true,
            ..Default::default()
        };
        let opts = InitOptions {
            ready_timeout: Some(Duration::from_millis(30)),
            ..Default::default()
        };
        let err = init(cfg, opts).1.unwrap_err();
        assert!(
            matches!(
                err,
                Error::ReadyTimeout {
                    what: "set CSTS.RDY",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn namespace_not_ready_is_retried_and_invalid_namespace_skipped() {
        let cfg = MockConfig {
            nsids: vec![1, 2, 3],
            not_ready: [(1, 3)].into(),
            invalid: vec![2],
            ..Default::default()
        };
        let (dev, ctrl) = init(cfg, InitOptions::default());
        let ctrl = ctrl.unwrap();
        let nsids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.nsid).collect();
        assert_eq!(nsids, [1, 3]);
        let identifies = dev.stats(|s| s.admin_opcodes.iter().filter(|&&o| o == 0x06).count());
        // Controller, list, nsid 1 four times, nsid 2 once, nsid 3 once.
        assert_eq!(identifies, 1 + 1 + 4 + 1 + 1);
    }

    #[test]
    fn zero_namespaces_finishes_init() {
        let cfg = MockConfig {
            nsids: vec![],
            ..Default::default()
        };
        let ctrl = init(cfg, InitOptions::default()).1.unwrap();
        assert!(ctrl.namespaces().is_empty());
    }

    #[test]
    fn write_then_read_round_trips_through_a_prp_list_at_an_offset() {
        let (dev, ctrl) = init(MockConfig::default(), InitOptions::default());
        let ctrl = ctrl.unwrap();
        let mut q = ctrl.take_io_queue(0).unwrap();
        let access = ctrl.access();
        let whole = access.dma_alloc(40960).unwrap();
        // 32 KiB starting 512 bytes into a page: 9 pages, a PRP list.
        let seg = whole.subrange(512, 32768).unwrap();
        let data = pattern(32768, 7);
        seg.write_bytes(0, &data).unwrap();
        q.write(1, 100, 64, &seg).unwrap();
        assert_eq!(dev.ns_bytes(1, 100 * 512, 32768), data);
        let mut back = access.dma_alloc(32768).unwrap();
        q.read(1, 100, 64, &mut back).unwrap();
        assert_eq!(back.to_vec(), data);
        q.flush(1).unwrap();
        let c = q.counters();
        assert_eq!((c.submitted, c.completions), (3, 3));
        assert_eq!((c.sq_doorbell_writes, c.cq_doorbell_writes), (3, 3));
    }

    #[test]
    fn large_transfer_uses_chained_prp_lists() {
        let cfg = MockConfig {
            blocks: 16384,
            ..Default::default()
        };
        let opts = InitOptions {
            max_transfer: 4 << 20,
            queue_depth: 4,
            ..Default::default()
        };
        let (dev, ctrl) = init(cfg, opts);
        let ctrl = ctrl.unwrap();
        let mut q = ctrl.take_io_queue(0).unwrap();
        // 3 MiB: PRP1 + 767 list entries over two chained list pages.
        let len = 3 << 20;
        let buf = ctrl.access().dma_alloc(len).unwrap();
        let data = pattern(len, 3);
        buf.write_bytes(0, &data).unwrap();
        q.write(1, 8, (len / 512) as u32, &buf).unwrap();
        assert_eq!(dev.ns_bytes(1, 8 * 512, len), data);
    }

    #[test]
    fn transfer_over_mdts_is_rejected_before_submission() {
        let cfg = MockConfig {
            mdts: 2,
            ..Default::default()
        };
        let (dev, ctrl) = init(cfg, InitOptions::default());
        let ctrl = ctrl.unwrap();
        assert_eq!(ctrl.max_transfer(), 16384);
        let mut q = ctrl.take_io_queue(0).unwrap();
        let mut buf = ctrl.access().dma_alloc(32768).unwrap();
        let before = dev.stats(|s| s.sq_doorbells);
        let err = q.read(1, 0, 64, &mut buf).unwrap_err();
        assert!(
            matches!(err, Error::Prp(PrpError::TooLarge { .. })),
            "{err}"
        );
        assert_eq!(dev.stats(|s| s.sq_doorbells), before);
        assert_eq!(q.outstanding(), 0, "the command slot was given back");
        q.read(1, 0, 32, &mut buf).unwrap();
    }

    #[test]
    fn batch_costs_one_sq_and_one_cq_doorbell() {
        let (dev, ctrl) = init(MockConfig::default(), InitOptions::default());
        let ctrl = ctrl.unwrap();
        let mut q = ctrl.take_io_queue(0).unwrap();
        let bufs: Vec<_> = (0..8)
            .map(|_| ctrl.access().dma_alloc(4096).unwrap())
            .collect();
        let before = dev.stats(|s| (s.sq_doorbells, s.cq_doorbells));
        for (i, b) in bufs.iter().enumerate() {
            q.enqueue_rw(NvmOpcode::READ, 1, i as u64 * 8, 8, b)
                .unwrap();
        }
        q.ring().unwrap();
        let mut out = Vec::new();
        assert_eq!(q.wait(&mut out, 64, Duration::from_secs(1)).unwrap(), 8);
        assert!(out.iter().all(|c| c.status().is_success()));
        let after = dev.stats(|s| (s.sq_doorbells, s.cq_doorbells));
        assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1));
        assert_eq!(q.counters().sq_doorbell_writes, 1);
    }

    #[test]
    fn admin_error_status_is_typed() {
        let ctrl = init(MockConfig::default(), InitOptions::default())
            .1
            .unwrap();
        let err = ctrl.admin(Command::new(0x3F, 0), None).unwrap_err();
        assert!(
            err.status().unwrap().same_code(Status::INVALID_OPCODE),
            "{err}"
        );
        let mut q = ctrl.take_io_queue(0).unwrap();
        let mut buf = ctrl.access().dma_alloc(4096).unwrap();
        let err = q.read(1, 16383, 8, &mut buf).unwrap_err();
        assert!(err.status().unwrap().same_code(Status::LBA_OUT_OF_RANGE));
        assert!(matches!(
            q.read(9, 0, 1, &mut buf),
            Err(Error::NoSuchNamespace(9))
        ));
    }

    #[test]
    fn io_queues_get_their_own_msix_vector() {
        let cfg = MockConfig {
            msix_vectors: 8,
            ..Default::default()
        };
        let opts = InitOptions {
            io_queues: 2,
            ..Default::default()
        };
        let (dev, ctrl) = init(cfg, opts);
        let ctrl = ctrl.unwrap();
        assert!(ctrl.interrupts_enabled());
        assert_eq!(dev.cq_vector(0), Some(0));
        assert_eq!(dev.cq_vector(1), Some(1));
        assert_eq!(dev.cq_vector(2), Some(2));
        let mut q = ctrl.take_io_queue(1).unwrap();
        assert!(q.has_interrupt());
        q.flush(1).unwrap();
        assert!(dev.stats(|s| s.interrupts) >= 1);
    }

    #[test]
    fn reset_makes_old_queues_stale_and_new_ones_work() {
        let (_dev, ctrl) = init(MockConfig::default(), InitOptions::default());
        let mut ctrl = ctrl.unwrap();
        let mut old = ctrl.take_io_queue(0).unwrap();
        ctrl.reset().unwrap();
        assert!(matches!(old.flush(1), Err(Error::StaleQueue(1))));
        let mut q = ctrl.take_io_queue(0).unwrap();
        q.flush(1).unwrap();
        ctrl.shutdown().unwrap();
        assert!(matches!(q.flush(1), Err(Error::StaleQueue(1))));
    }
}
