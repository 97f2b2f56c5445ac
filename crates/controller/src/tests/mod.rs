//! The controller driven like a host would: registers through `mmio_write`,
//! commands through queues in (fake) guest memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_blockdev::{BlockDevice, RamDevice};
use vnvme_spec::event_idx::{need_event_linux, need_event_spdk};
use vnvme_spec::identify::{IdentifyController, IdentifyNamespace};
use vnvme_spec::regs::{offset, Cap, Csts};
use vnvme_spec::{AdminOpcode, Command, Completion, NvmOpcode, Status};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, IntoBytes};

use crate::memory::GuestAddress;
use crate::memory::GuestMemory;
use crate::testing::{CountingIrq, VecMemory};
use crate::{Controller, ControllerConfig, DoorbellMode, NamespaceConfig};

const MEM_SIZE: usize = 16 << 20;
const ASQ: u64 = 0x10000;
const ACQ: u64 = 0x20000;
const DATA: u64 = 0x800000;
const NS_BLOCKS: u64 = 2048;
/// CC with EN, IOSQES 6 and IOCQES 4; CRIME (bit 24) clear: ready with media.
const CC_ENABLE: u32 = 0x0046_0001;
const CC_CRIME: u32 = 1 << 24;

fn sq_base(qid: u16) -> u64 {
    0x100000 + u64::from(qid) * 0x10000
}
fn cq_base(qid: u16) -> u64 {
    0x400000 + u64::from(qid) * 0x10000
}

#[derive(Debug, Clone, Copy)]
struct Ring {
    sq: u64,
    cq: u64,
    size: u16,
    /// The CQ's size, when it differs from the SQ's.
    cq_size: u16,
    tail: u16,
    head: u16,
    phase: bool,
    /// Values last given to the SQ tail / CQ head doorbells (register or
    /// shadow).
    sq_db: u16,
    cq_db: u16,
}

impl Ring {
    fn new(sq: u64, cq: u64, size: u16) -> Self {
        Self {
            sq,
            cq,
            size,
            cq_size: size,
            tail: 0,
            head: 0,
            phase: true,
            sq_db: 0,
            cq_db: 0,
        }
    }
}

struct Host {
    ctrl: Controller,
    mem: Arc<VecMemory>,
    irq: Arc<CountingIrq>,
    backend: Arc<RamDevice>,
    rings: Vec<Option<Ring>>,
    cid: u16,
    /// Shadow doorbell and EventIdx buffers, once configured: I/O queues
    /// then ring through them like Linux (the admin queue keeps trapping).
    dbbuf: Option<(u64, u64)>,
    /// Use SPDK's need-event test instead of Linux's.
    spdk: bool,
}

/// Shadow doorbell and EventIdx buffers the tests configure.
const SHADOW: u64 = 0x30000;
const EVENTIDX: u64 = 0x31000;

fn mode_config(mode: DoorbellMode) -> ControllerConfig {
    ControllerConfig {
        doorbells: mode,
        ..config()
    }
}

fn config() -> ControllerConfig {
    ControllerConfig {
        max_io_queues: 8,
        msix_vectors: 9,
        mqes_z: 63,
        ..Default::default()
    }
}

impl Host {
    fn new() -> Self {
        Self::with(config(), 512)
    }

    fn with(config: ControllerConfig, lba_size: u32) -> Self {
        let backend = Arc::new(RamDevice::new(NS_BLOCKS * u64::from(lba_size)));
        let ns = NamespaceConfig::new(1, lba_size, backend.clone());
        let ctrl = Controller::new(config, vec![ns]).unwrap();
        let mem = Arc::new(VecMemory::new(MEM_SIZE));
        let irq = Arc::new(CountingIrq::default());
        ctrl.attach(mem.clone(), irq.clone());
        Self {
            ctrl,
            mem,
            irq,
            backend,
            rings: vec![None; 16],
            cid: 0,
            dbbuf: None,
            spdk: false,
        }
    }

    /// Enabled, with namespace 1 (512-byte blocks) on `backend`.
    fn enabled_on(config: ControllerConfig, backend: Arc<dyn BlockDevice>) -> Self {
        let mut h = Self::new();
        h.ctrl = Controller::new(config, vec![NamespaceConfig::new(1, 512, backend)]).unwrap();
        h.ctrl.attach(h.mem.clone(), h.irq.clone());
        h.enable();
        h
    }

    fn with_mode(mode: DoorbellMode) -> Self {
        Self::with(mode_config(mode), 512)
    }

    /// Doorbell Buffer Config with `shadow` and `event_idx`.
    fn dbbuf_config(&mut self, shadow: u64, event_idx: u64) -> Completion {
        let mut c = cmd(AdminOpcode::DOORBELL_BUFFER_CONFIG.0);
        c.prp1 = U64::new(shadow);
        c.prp2 = U64::new(event_idx);
        self.admin(c)
    }

    /// Configures the test buffers and rings I/O queues through them.
    fn enable_dbbuf(&mut self) {
        let c = self.dbbuf_config(SHADOW, EVENTIDX);
        assert_eq!(c.status(), Status::SUCCESS, "doorbell buffer config");
        self.dbbuf = Some((SHADOW, EVENTIDX));
    }

    fn shadow_slot(&self, index: u32) -> u32 {
        self.mem
            .load_u32(GuestAddress(SHADOW + u64::from(index) * 4))
            .unwrap()
    }

    fn eventidx_slot(&self, index: u32) -> u32 {
        self.mem
            .load_u32(GuestAddress(EVENTIDX + u64::from(index) * 4))
            .unwrap()
    }

    /// A doorbell update as the host driver does it: with shadow buffers,
    /// store the shadow, full fence, read EventIdx, and write the register
    /// only if the need-event test says so. Returns whether it trapped.
    fn update_doorbell(&self, qid: u16, index: u32, old: u16, new: u16) -> bool {
        let Some((shadow, event_idx)) = self.dbbuf.filter(|_| qid != 0) else {
            self.write32(0x1000 + 4 * u64::from(index), u32::from(new));
            return true;
        };
        let off = u64::from(index) * 4;
        self.mem
            .store_u32(GuestAddress(shadow + off), u32::from(new))
            .unwrap();
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let ei = self.mem.load_u32(GuestAddress(event_idx + off)).unwrap() as u16;
        let need = if self.spdk {
            need_event_spdk(ei, new, old)
        } else {
            need_event_linux(ei, new, old)
        };
        if need {
            self.write32(0x1000 + 4 * u64::from(index), u32::from(new));
        }
        need
    }

    fn write32(&self, off: u64, v: u32) {
        self.ctrl.mmio_write(off, &v.to_le_bytes());
    }
    fn write64(&self, off: u64, v: u64) {
        self.ctrl.mmio_write(off, &v.to_le_bytes());
    }
    fn read32(&self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.ctrl.mmio_read(off, &mut b);
        u32::from_le_bytes(b)
    }
    fn read64(&self, off: u64) -> u64 {
        let mut b = [0u8; 8];
        self.ctrl.mmio_read(off, &mut b);
        u64::from_le_bytes(b)
    }
    fn csts(&self) -> Csts {
        Csts::from(self.read32(offset::CSTS))
    }

    /// Programs the admin queue (32 entries) and writes CC with `cc`.
    fn enable_with(&mut self, cc: u32, asq: u64, aqa: u32) {
        self.write32(offset::AQA, aqa);
        self.write64(offset::ASQ, asq);
        self.write64(offset::ACQ, ACQ);
        self.write32(offset::CC, cc);
        self.rings[0] = Some(Ring::new(asq, ACQ, 32));
    }

    fn enable(&mut self) {
        self.enable_with(CC_ENABLE, ASQ, (31 << 16) | 31);
        assert!(self.csts().rdy(), "CSTS.RDY after enable");
        assert!(!self.csts().cfs());
    }

    /// Enables in Controller Ready Independent of Media mode (CC.CRIME), as
    /// Linux does when CAP.CRMS.CRIMS is set: RDY at once, slow namespaces
    /// announced one by one.
    fn enable_independent_of_media(&mut self) {
        self.enable_with(CC_ENABLE | CC_CRIME, ASQ, (31 << 16) | 31);
        assert!(self.csts().rdy(), "CSTS.RDY after enable");
    }

    /// Controller reset (CC.EN 1 -> 0), then enable on a zeroed admin CQ
    /// (stale entries would carry a valid phase).
    fn reenable(&mut self) {
        self.write32(offset::CC, 0);
        self.mem.zero(GuestAddress(ACQ), 4096).unwrap();
        self.enable();
    }

    fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        self.cid
    }

    /// Puts `cmd` on SQ `qid` without ringing the doorbell.
    fn push(&mut self, qid: u16, mut cmd: Command) -> u16 {
        let cid = self.next_cid();
        cmd.set_cid(cid);
        let r = self.rings[usize::from(qid)].as_mut().expect("queue exists");
        self.mem
            .write(GuestAddress(r.sq + u64::from(r.tail) * 64), cmd.as_bytes())
            .unwrap();
        r.tail = (r.tail + 1) % r.size;
        cid
    }

    fn ring_sq(&mut self, qid: u16) -> bool {
        let r = self.rings[usize::from(qid)].unwrap();
        let trapped = self.update_doorbell(qid, 2 * u32::from(qid), r.sq_db, r.tail);
        if let Some(r) = self.rings[usize::from(qid)].as_mut() {
            r.sq_db = r.tail;
        }
        trapped
    }

    /// Consumes `n` completions, then one CQ head doorbell update.
    fn reap_batch(&mut self, qid: u16, n: usize) -> Vec<Completion> {
        let cqes = (0..n)
            .map(|_| {
                let cqe = self.wait_cqe(qid).expect("completion within 5 s");
                self.advance_head(qid);
                cqe
            })
            .collect();
        self.ring_cq(qid);
        cqes
    }

    fn advance_head(&mut self, qid: u16) {
        let r = self.rings[usize::from(qid)].as_mut().unwrap();
        r.head += 1;
        if r.head == r.cq_size {
            r.head = 0;
            r.phase = !r.phase;
        }
    }

    fn ring_cq(&mut self, qid: u16) -> bool {
        let r = self.rings[usize::from(qid)].unwrap();
        let trapped = self.update_doorbell(qid, 2 * u32::from(qid) + 1, r.cq_db, r.head);
        if let Some(r) = self.rings[usize::from(qid)].as_mut() {
            r.cq_db = r.head;
        }
        trapped
    }

    /// Waits for the next CQE on `qid` (polling memory, like a host without
    /// interrupts), consumes it and rings the CQ head doorbell.
    fn reap(&mut self, qid: u16) -> Completion {
        let cqe = self.wait_cqe(qid).expect("completion within 5 s");
        self.advance_head(qid);
        self.ring_cq(qid);
        cqe
    }

    fn peek_cqe(&self, qid: u16) -> Option<Completion> {
        let r = self.rings[usize::from(qid)].unwrap();
        let mut b = [0u8; 16];
        self.mem
            .read(GuestAddress(r.cq + u64::from(r.head) * 16), &mut b)
            .unwrap();
        let cqe = Completion::read_from_bytes(&b).unwrap();
        (cqe.phase() == r.phase).then_some(cqe)
    }

    fn wait_cqe(&self, qid: u16) -> Option<Completion> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(c) = self.peek_cqe(qid) {
                return Some(c);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        None
    }

    fn submit(&mut self, qid: u16, cmd: Command) -> Completion {
        let cid = self.push(qid, cmd);
        self.ring_sq(qid);
        let cqe = self.reap(qid);
        assert_eq!(cqe.cid(), cid);
        cqe
    }

    fn admin(&mut self, cmd: Command) -> Completion {
        self.submit(0, cmd)
    }

    /// Submits an admin command and returns its completion, with any other
    /// admin completions (AERs) seen first.
    fn admin_collect(&mut self, cmd: Command) -> (Completion, Vec<Completion>) {
        let cid = self.push(0, cmd);
        self.ring_sq(0);
        let mut others = Vec::new();
        loop {
            let c = self.reap(0);
            if c.cid() == cid {
                return (c, others);
            }
            others.push(c);
        }
    }

    fn create_pair(&mut self, qid: u16, size: u16) {
        // A host zeroes CQ memory: stale entries would carry a valid phase.
        self.mem
            .zero(GuestAddress(cq_base(qid)), u64::from(size) * 16)
            .unwrap();
        let c = self.admin(create_cq(qid, size, qid, cq_base(qid)));
        assert_eq!(c.status(), Status::SUCCESS, "create cq {qid}");
        let c = self.admin(create_sq(qid, size, qid, sq_base(qid)));
        assert_eq!(c.status(), Status::SUCCESS, "create sq {qid}");
        self.rings[usize::from(qid)] = Some(Ring::new(sq_base(qid), cq_base(qid), size));
    }

    fn read_mem(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read(GuestAddress(addr), &mut v).unwrap();
        v
    }
}

fn cmd(opcode: u8) -> Command {
    Command::new(opcode, 0)
}

fn create_cq(qid: u16, size: u16, iv: u16, base: u64) -> Command {
    let mut c = cmd(AdminOpcode::CREATE_IO_CQ.0);
    c.prp1 = U64::new(base);
    c.cdw10 = U32::new(u32::from(qid) | (u32::from(size - 1) << 16));
    c.cdw11 = U32::new(0b11 | (u32::from(iv) << 16));
    c
}

fn create_sq(qid: u16, size: u16, cqid: u16, base: u64) -> Command {
    let mut c = cmd(AdminOpcode::CREATE_IO_SQ.0);
    c.prp1 = U64::new(base);
    c.cdw10 = U32::new(u32::from(qid) | (u32::from(size - 1) << 16));
    c.cdw11 = U32::new(1 | (u32::from(cqid) << 16));
    c
}

fn delete(op: AdminOpcode, qid: u16) -> Command {
    let mut c = cmd(op.0);
    c.cdw10 = U32::new(u32::from(qid));
    c
}

fn identify(cns: u8, nsid: u32, buf: u64) -> Command {
    let mut c = cmd(AdminOpcode::IDENTIFY.0);
    c.nsid = U32::new(nsid);
    c.prp1 = U64::new(buf);
    c.cdw10 = U32::new(u32::from(cns));
    c
}

fn rw(op: NvmOpcode, nsid: u32, slba: u64, nlb: u32, prp1: u64, prp2: u64) -> Command {
    let mut c = cmd(op.0);
    c.nsid = U32::new(nsid);
    c.prp1 = U64::new(prp1);
    c.prp2 = U64::new(prp2);
    c.cdw10 = U32::new(slba as u32);
    c.cdw11 = U32::new((slba >> 32) as u32);
    c.cdw12 = U32::new(nlb - 1);
    c
}

fn set_features(fid: u8, value: u32) -> Command {
    let mut c = cmd(AdminOpcode::SET_FEATURES.0);
    c.cdw10 = U32::new(u32::from(fid));
    c.cdw11 = U32::new(value);
    c
}

fn get_features(fid: u8, sel: u8, buf: u64) -> Command {
    let mut c = cmd(AdminOpcode::GET_FEATURES.0);
    c.prp1 = U64::new(buf);
    c.cdw10 = U32::new(u32::from(fid) | (u32::from(sel) << 8));
    c
}

fn get_log(lid: u8, dwords: u32, offset: u64, buf: u64) -> Command {
    let mut c = cmd(AdminOpcode::GET_LOG_PAGE.0);
    c.nsid = U32::new(0xFFFF_FFFF);
    c.prp1 = U64::new(buf);
    let numd = dwords - 1;
    c.cdw10 = U32::new(u32::from(lid) | (numd << 16));
    c.cdw11 = U32::new(numd >> 16);
    c.cdw12 = U32::new(offset as u32);
    c.cdw13 = U32::new((offset >> 32) as u32);
    c
}

mod abort;
mod admin;
mod backend_errors;
mod copy;
mod crash_restore;
mod dbbuf;
mod directives;
mod durability;
mod faults;
mod features;
mod firmware;
mod handed;
mod identify;
mod identities;
mod idle_groups;
mod inflight;
mod io;
mod keep_alive;
mod logs;
mod modes;
mod namespaces;
mod protection;
mod qos;
mod registers;
mod reservations;
mod sanitize;
mod saved_state;
mod self_test;
mod sgl;
mod stress;
mod uncorrectable;
mod zone_changes;
mod zone_extensions;
mod zoned;
