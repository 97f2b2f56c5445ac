//! The controller driven like a host would: registers through `mmio_write`,
//! commands through queues in (fake) guest memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_blockdev::{BlockDevice, RamDevice};
use vnvme_spec::identify::{IdentifyController, IdentifyNamespace};
use vnvme_spec::regs::{offset, Cap, Csts};
use vnvme_spec::{AdminOpcode, Command, Completion, NvmOpcode, Status};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, IntoBytes};

use crate::memory::GuestMemory;
use crate::testing::{CountingIrq, VecMemory};
use crate::{Controller, ControllerConfig, NamespaceConfig};

const MEM_SIZE: usize = 16 << 20;
const ASQ: u64 = 0x10000;
const ACQ: u64 = 0x20000;
const DATA: u64 = 0x800000;
const NS_BLOCKS: u64 = 2048;

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
    tail: u16,
    head: u16,
    phase: bool,
}

impl Ring {
    fn new(sq: u64, cq: u64, size: u16) -> Self {
        Self {
            sq,
            cq,
            size,
            tail: 0,
            head: 0,
            phase: true,
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
        let ns = NamespaceConfig {
            nsid: 1,
            lba_size,
            backend: backend.clone(),
        };
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
        }
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
        self.enable_with(0x0046_0001, ASQ, (31 << 16) | 31);
        assert!(self.csts().rdy(), "CSTS.RDY after enable");
        assert!(!self.csts().cfs());
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
            .write(r.sq + u64::from(r.tail) * 64, cmd.as_bytes())
            .unwrap();
        r.tail = (r.tail + 1) % r.size;
        cid
    }

    fn ring_sq(&self, qid: u16) {
        let r = self.rings[usize::from(qid)].unwrap();
        self.write32(0x1000 + 8 * u64::from(qid), u32::from(r.tail));
    }

    /// Waits for the next CQE on `qid` (polling memory, like a host without
    /// interrupts), consumes it and rings the CQ head doorbell.
    fn reap(&mut self, qid: u16) -> Completion {
        let cqe = self.wait_cqe(qid).expect("completion within 5 s");
        let r = self.rings[usize::from(qid)].as_mut().unwrap();
        r.head += 1;
        if r.head == r.size {
            r.head = 0;
            r.phase = !r.phase;
        }
        let head = r.head;
        self.write32(0x1004 + 8 * u64::from(qid), u32::from(head));
        cqe
    }

    fn peek_cqe(&self, qid: u16) -> Option<Completion> {
        let r = self.rings[usize::from(qid)].unwrap();
        let mut b = [0u8; 16];
        self.mem
            .read(r.cq + u64::from(r.head) * 16, &mut b)
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

    fn create_pair(&mut self, qid: u16, size: u16) {
        // A host zeroes CQ memory: stale entries would carry a valid phase.
        self.mem.zero(cq_base(qid), u64::from(size) * 16).unwrap();
        let c = self.admin(create_cq(qid, size, qid, cq_base(qid)));
        assert_eq!(c.status(), Status::SUCCESS, "create cq {qid}");
        let c = self.admin(create_sq(qid, size, qid, sq_base(qid)));
        assert_eq!(c.status(), Status::SUCCESS, "create sq {qid}");
        self.rings[usize::from(qid)] = Some(Ring::new(sq_base(qid), cq_base(qid), size));
    }

    fn read_mem(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read(addr, &mut v).unwrap();
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

// ---- Registers and enable --------------------------------------------------

#[test]
fn cap_and_version_describe_the_controller() {
    let h = Host::new();
    let cap = Cap::from(h.read64(offset::CAP));
    assert_eq!(cap.mqes_z(), 63);
    assert!(cap.cqr());
    assert_eq!(cap.dstrd(), 0);
    assert_eq!(cap.css() & 1, 1);
    assert_eq!(cap.mpsmin(), 0);
    assert!(cap.to() > 0);
    assert!(cap.crwms() && cap.crims());
    assert_eq!(h.read32(offset::VS), 0x0002_0000);
    assert_ne!(h.read32(offset::CRTO), 0);
    assert_eq!(h.read32(0x40), 0, "unknown offsets read 0");
}

#[test]
fn cc_enable_sets_rdy_and_disable_clears_it() {
    let mut h = Host::new();
    h.enable();
    h.write32(offset::CC, 0x0046_0000);
    assert!(!h.csts().rdy());
}

#[test]
fn cc_enable_with_bad_mps_sets_cfs() {
    let mut h = Host::new();
    h.enable_with(0x0046_0001 | (5 << 7), ASQ, (31 << 16) | 31);
    assert!(h.csts().cfs());
    assert!(!h.csts().rdy());
}

#[test]
fn cc_enable_with_zero_admin_queue_size_sets_cfs() {
    let mut h = Host::new();
    h.enable_with(0x0046_0001, ASQ, 31 << 16);
    assert!(h.csts().cfs());
    assert!(!h.csts().rdy());
}

#[test]
fn cc_enable_with_misaligned_asq_sets_cfs() {
    let mut h = Host::new();
    // 8 KiB aligned is fine for 4 KiB pages but not for 16 KiB (MPS = 2).
    h.enable_with(0x0046_0001 | (2 << 7), ASQ + 0x2000, (31 << 16) | 31);
    assert!(h.csts().cfs());
    // Clearing EN resets; a good configuration then enables.
    h.write32(offset::CC, 0);
    assert!(!h.csts().cfs());
    h.enable();
}

#[test]
fn shutdown_notification_completes_shst() {
    let mut h = Host::new();
    h.enable();
    h.write32(offset::CC, 0x0046_0001 | (1 << 14));
    assert_eq!(h.csts().shst(), 2);
}

#[test]
fn bad_register_accesses_never_panic() {
    let h = Host::new();
    for off in [
        0u64,
        1,
        3,
        0x14,
        0x1001,
        0x1FFE,
        0x3FFF,
        u64::MAX - 3,
        u64::MAX,
    ] {
        for len in [0usize, 1, 2, 3, 4, 5, 8, 16] {
            let mut buf = vec![0xAA; len];
            h.ctrl.mmio_read(off, &mut buf);
            h.ctrl.mmio_write(off, &buf);
        }
    }
    assert!(h.ctrl.stats().invalid_register_accesses > 0);
}

// ---- Admin commands ----------------------------------------------------------

#[test]
fn identify_controller_reports_the_configuration() {
    let mut h = Host::with(
        ControllerConfig {
            oacs_extra: 1 << 8,
            ..config()
        },
        512,
    );
    h.enable();
    let c = h.admin(identify(1, 0, DATA));
    assert_eq!(c.status(), Status::SUCCESS);
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert!(id.mn.starts_with(b"vnvme "));
    assert_eq!(id.sqes, 0x66);
    assert_eq!(id.cqes, 0x44);
    assert_eq!(id.nn.get(), 1);
    assert_eq!(id.mdts, 5);
    assert_eq!(id.oacs.get() & (1 << 8), 1 << 8);
    assert_eq!(id.oncs.get() & 0b1101, 0b1101);
    assert!(id.subnqn.starts_with(b"nqn."));
}

#[test]
fn identify_namespace_and_lists() {
    let mut h = Host::with(config(), 4096);
    h.enable();
    assert_eq!(h.admin(identify(0, 1, DATA)).status(), Status::SUCCESS);
    let ns = IdentifyNamespace::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(ns.nsze.get(), NS_BLOCKS);
    assert_eq!(ns.current_format().lbads, 12);
    assert_eq!(h.admin(identify(2, 0, DATA)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA, 8), [1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(h.admin(identify(3, 1, DATA)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA, 2), [2, 16], "NGUID descriptor first");
    assert_eq!(h.admin(identify(8, 1, DATA)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA + 14, 1), [1], "NSTAT: ready");
    // Identify with PRP1 offset crossing into PRP2.
    let mut c = identify(1, 0, DATA + 0x800);
    c.prp2 = U64::new(DATA + 0x10000);
    assert_eq!(h.admin(c).status(), Status::SUCCESS);
    assert_eq!(
        h.read_mem(DATA + 0x800 + 512, 2),
        [0x66, 0x44],
        "SQES/CQES via PRP1"
    );
    assert_eq!(
        h.read_mem(DATA + 0x10000, 2),
        2500u16.to_le_bytes(),
        "PSD0 (byte 2048) via PRP2"
    );
}

#[test]
fn malformed_commands_complete_with_expected_status() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    // A PRP list whose second entry has an offset.
    h.mem
        .write(DATA + 0x10000, &(DATA + 0x20000).to_le_bytes())
        .unwrap();
    h.mem
        .write(DATA + 0x10008, &(DATA + 0x30010).to_le_bytes())
        .unwrap();
    let dnr = |s: Status| s.with_dnr(true);
    let mut fused = rw(NvmOpcode::READ, 1, 0, 1, DATA, 0);
    fused.cdw0 = U32::new(fused.cdw0.get() | (1 << 8));
    let mut sgl = rw(NvmOpcode::READ, 1, 0, 1, DATA, 0);
    sgl.cdw0 = U32::new(sgl.cdw0.get() | (1 << 14));
    let mut noncontig_cq = create_cq(2, 16, 2, cq_base(2));
    noncontig_cq.cdw11 = U32::new(0b10 | (2 << 16));
    let mut nsq_ffff = set_features(0x07, 0xFFFF_0000);
    nsq_ffff.cdw11 = U32::new(0xFFFF);
    let cases: Vec<(&str, u16, Command, Status)> = vec![
        (
            "unknown admin opcode",
            0,
            cmd(0x3F),
            dnr(Status::INVALID_OPCODE),
        ),
        (
            "unknown io opcode",
            1,
            cmd(0x7E),
            dnr(Status::INVALID_OPCODE),
        ),
        (
            "nsid 0",
            1,
            rw(NvmOpcode::READ, 0, 0, 1, DATA, 0),
            dnr(Status::INVALID_NAMESPACE_OR_FORMAT),
        ),
        (
            "nsid beyond nn",
            1,
            rw(NvmOpcode::READ, 2, 0, 1, DATA, 0),
            dnr(Status::INVALID_NAMESPACE_OR_FORMAT),
        ),
        (
            "nsid broadcast read",
            1,
            rw(NvmOpcode::READ, 0xFFFF_FFFF, 0, 1, DATA, 0),
            dnr(Status::INVALID_NAMESPACE_OR_FORMAT),
        ),
        (
            "lba range past the end",
            1,
            rw(NvmOpcode::READ, 1, NS_BLOCKS - 1, 2, DATA, 0),
            dnr(Status::LBA_OUT_OF_RANGE),
        ),
        (
            "lba overflow",
            1,
            rw(NvmOpcode::WRITE, 1, u64::MAX, 1, DATA, 0),
            dnr(Status::LBA_OUT_OF_RANGE),
        ),
        (
            "transfer above mdts",
            1,
            rw(NvmOpcode::READ, 1, 0, 257, DATA, 0),
            dnr(Status::INVALID_FIELD),
        ),
        (
            "misaligned prp1",
            1,
            rw(NvmOpcode::READ, 1, 0, 1, DATA + 2, 0),
            dnr(Status::INVALID_PRP_OFFSET),
        ),
        (
            "prp2 data page with offset",
            1,
            rw(NvmOpcode::READ, 1, 0, 16, DATA, DATA + 0x10200),
            dnr(Status::INVALID_PRP_OFFSET),
        ),
        (
            "prp list entry with offset",
            1,
            rw(NvmOpcode::READ, 1, 0, 24, DATA, DATA + 0x10000),
            dnr(Status::INVALID_PRP_OFFSET),
        ),
        ("fused", 1, fused, dnr(Status::INVALID_FIELD)),
        ("sgl", 1, sgl, dnr(Status::INVALID_FIELD)),
        (
            "create cq qid 0",
            0,
            create_cq(0, 16, 0, cq_base(0)),
            dnr(Status::INVALID_QID),
        ),
        (
            "create cq qid beyond limit",
            0,
            create_cq(9, 16, 1, cq_base(2)),
            dnr(Status::INVALID_QID),
        ),
        (
            "create cq qid in use",
            0,
            create_cq(1, 16, 1, cq_base(2)),
            dnr(Status::INVALID_QID),
        ),
        (
            "create cq size 0's based 0",
            0,
            create_cq(2, 1, 2, cq_base(2)),
            dnr(Status::INVALID_QUEUE_SIZE),
        ),
        (
            "create cq size above mqes",
            0,
            create_cq(2, 65, 2, cq_base(2)),
            dnr(Status::INVALID_QUEUE_SIZE),
        ),
        (
            "create cq non-contiguous",
            0,
            noncontig_cq,
            dnr(Status::INVALID_FIELD),
        ),
        (
            "create cq vector out of range",
            0,
            create_cq(2, 16, 9, cq_base(2)),
            dnr(Status::INVALID_INTERRUPT_VECTOR),
        ),
        (
            "create cq misaligned base",
            0,
            create_cq(2, 16, 2, cq_base(2) + 0x100),
            dnr(Status::INVALID_PRP_OFFSET),
        ),
        (
            "create sq qid 0",
            0,
            create_sq(0, 16, 1, sq_base(2)),
            dnr(Status::INVALID_QID),
        ),
        (
            "create sq qid beyond limit",
            0,
            create_sq(9, 16, 1, sq_base(2)),
            dnr(Status::INVALID_QID),
        ),
        (
            "create sq on cq 0",
            0,
            create_sq(2, 16, 0, sq_base(2)),
            dnr(Status::INVALID_CQ),
        ),
        (
            "create sq on missing cq",
            0,
            create_sq(2, 16, 5, sq_base(2)),
            dnr(Status::INVALID_CQ),
        ),
        (
            "create sq size above mqes",
            0,
            create_sq(2, 65, 1, sq_base(2)),
            dnr(Status::INVALID_QUEUE_SIZE),
        ),
        (
            "delete cq in use",
            0,
            delete(AdminOpcode::DELETE_IO_CQ, 1),
            dnr(Status::INVALID_QUEUE_DELETION),
        ),
        (
            "delete cq 0",
            0,
            delete(AdminOpcode::DELETE_IO_CQ, 0),
            dnr(Status::INVALID_QID),
        ),
        (
            "delete missing sq",
            0,
            delete(AdminOpcode::DELETE_IO_SQ, 5),
            dnr(Status::INVALID_QID),
        ),
        (
            "identify unknown cns",
            0,
            identify(0x55, 0, DATA),
            dnr(Status::INVALID_FIELD),
        ),
        (
            "identify nsid 0",
            0,
            identify(0, 0, DATA),
            dnr(Status::INVALID_NAMESPACE_OR_FORMAT),
        ),
        (
            "unknown feature",
            0,
            set_features(0x7F, 0),
            dnr(Status::INVALID_FIELD),
        ),
        (
            "number of queues 0xffff",
            0,
            nsq_ffff,
            dnr(Status::INVALID_FIELD),
        ),
        (
            "number of queues after create",
            0,
            set_features(0x07, 0x0003_0003),
            dnr(Status::COMMAND_SEQUENCE_ERROR),
        ),
        (
            "log page offset past end",
            0,
            get_log(0x02, 16, 4096, DATA),
            dnr(Status::INVALID_FIELD),
        ),
        (
            "unknown log page",
            0,
            get_log(0x70, 16, 0, DATA),
            dnr(Status::INVALID_FIELD),
        ),
    ];
    for (name, qid, c, want) in cases {
        let got = h.submit(qid, c).status();
        assert_eq!(got, want, "{name}");
    }
    // Every one of them was counted as an error.
    let stats = h.ctrl.stats();
    assert!(stats.errors >= 36, "errors counted: {}", stats.errors);
}

#[test]
fn number_of_queues_grants_and_limits_creation() {
    let mut h = Host::new();
    h.enable();
    let c = h.admin(set_features(0x07, 0x0001_0001));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(c.dw0.get(), 0x0001_0001);
    // Two queues granted: qid 3 is beyond the grant.
    let c = h.admin(create_cq(3, 16, 1, cq_base(3)));
    assert_eq!(c.status(), Status::INVALID_QID.with_dnr(true));
    h.create_pair(2, 16);
}

#[test]
fn get_log_page_smart_counts_io() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    for i in 0..3 {
        assert!(h
            .submit(1, rw(NvmOpcode::WRITE, 1, i, 8, DATA, 0))
            .status()
            .is_success());
    }
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 0, 8, DATA, 0))
        .status()
        .is_success());
    assert_eq!(
        h.admin(get_log(0x02, 128, 0, DATA)).status(),
        Status::SUCCESS
    );
    let smart = h.read_mem(DATA, 512);
    let u128_at = |o: usize| u128::from_le_bytes(smart[o..o + 16].try_into().unwrap());
    assert_eq!(u128_at(64), 1, "host read commands");
    assert_eq!(u128_at(80), 3, "host write commands");
    assert_eq!(u128_at(48), 1, "data units written (rounded up)");
    // Any length: 3 dwords at offset 4 of the effects log.
    assert_eq!(h.admin(get_log(0x05, 3, 4, DATA)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA, 4), [1, 0, 0, 0], "create-io-sq supported");
}

#[test]
fn async_event_request_limit_and_invalid_doorbell_event() {
    let mut h = Host::new();
    h.enable();
    for _ in 0..4 {
        let cid = h.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
        let _ = cid;
    }
    h.ring_sq(0);
    // The fifth exceeds AERL + 1 = 4.
    let c = h.admin(cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    assert_eq!(c.status(), Status::AER_LIMIT_EXCEEDED.with_dnr(true));
    // A doorbell write to a queue that does not exist raises an error event.
    h.write32(0x1000 + 8 * 5, 1);
    let c = h.reap(0);
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(c.dw0.get() & 0x7, 0, "error event type");
    assert_eq!((c.dw0.get() >> 16) & 0xFF, 1, "error log page");
}

// ---- I/O -----------------------------------------------------------------

#[test]
fn write_then_read_back() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    h.mem.write(DATA, &data).unwrap();
    assert!(h
        .submit(1, rw(NvmOpcode::WRITE, 1, 10, 8, DATA, 0))
        .status()
        .is_success());
    let mut back = vec![0u8; 4096];
    h.backend.read(10 * 512, &mut back).unwrap();
    assert_eq!(back, data, "backend holds the data");
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 10, 8, DATA + 0x10000, 0))
        .status()
        .is_success());
    assert_eq!(h.read_mem(DATA + 0x10000, 4096), data);
    // Compare: equal, then different.
    assert!(h
        .submit(1, rw(NvmOpcode::COMPARE, 1, 10, 8, DATA, 0))
        .status()
        .is_success());
    h.mem.write(DATA + 100, &[0xEE]).unwrap();
    assert_eq!(
        h.submit(1, rw(NvmOpcode::COMPARE, 1, 10, 8, DATA, 0))
            .status(),
        Status::COMPARE_FAILURE.with_dnr(true)
    );
}

#[test]
fn prp_list_crossing_pages_moves_all_data() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    // 64 KiB starting 0x200 into a page: 17 pages, PRP list of 16 entries
    // starting 8 bytes before the end of a list page, so it chains.
    let len = 64 * 1024;
    let prp1 = DATA + 0x200;
    let pages: Vec<u64> = (0..16).map(|i| DATA + 0x100000 + i * 0x3000).collect();
    let list1 = DATA + 0x50FF8;
    let list2 = DATA + 0x60000;
    h.mem.write(list1, &list2.to_le_bytes()).unwrap();
    let l2: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
    h.mem.write(list2, &l2).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    // Scatter the data where the PRPs say.
    let first = 4096 - 0x200;
    h.mem.write(prp1, &data[..first]).unwrap();
    for (i, p) in pages.iter().enumerate() {
        let start = first + i * 4096;
        let end = (start + 4096).min(len);
        h.mem.write(*p, &data[start..end]).unwrap();
    }
    let c = h.submit(1, rw(NvmOpcode::WRITE, 1, 0, 128, prp1, list1));
    assert_eq!(c.status(), Status::SUCCESS);
    let mut back = vec![0u8; len];
    h.backend.read(0, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn write_zeroes_and_deallocate_read_back_zero() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    h.backend.write(0, &[0xAB; 8192]).unwrap();
    let mut wz = rw(NvmOpcode::WRITE_ZEROES, 1, 0, 4, 0, 0);
    wz.cdw12 = U32::new(3);
    assert!(h.submit(1, wz).status().is_success());
    // DSM deallocate blocks 8..16 via one range.
    let mut range = [0u8; 16];
    range[4..8].copy_from_slice(&8u32.to_le_bytes());
    range[8..16].copy_from_slice(&8u64.to_le_bytes());
    h.mem.write(DATA, &range).unwrap();
    let mut dsm = cmd(NvmOpcode::DATASET_MANAGEMENT.0);
    dsm.nsid = U32::new(1);
    dsm.prp1 = U64::new(DATA);
    dsm.cdw11 = U32::new(1 << 2);
    assert!(h.submit(1, dsm).status().is_success());
    let mut back = vec![0u8; 8192];
    h.backend.read(0, &mut back).unwrap();
    assert!(back[..2048].iter().all(|&b| b == 0));
    assert!(back[2048..4096].iter().all(|&b| b == 0xAB));
    assert!(back[4096..].iter().all(|&b| b == 0));
    // A range past the end fails without deallocating anything.
    range[8..16].copy_from_slice(&(NS_BLOCKS - 1).to_le_bytes());
    h.mem.write(DATA, &range).unwrap();
    assert_eq!(
        h.submit(1, dsm).status(),
        Status::LBA_OUT_OF_RANGE.with_dnr(true)
    );
    let mut flush = cmd(NvmOpcode::FLUSH.0);
    flush.nsid = U32::new(0xFFFF_FFFF);
    assert!(h.submit(1, flush).status().is_success());
}

#[test]
fn reset_and_reenable_keeps_data_and_drops_queues() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    h.mem.write(DATA, &[0x5A; 512]).unwrap();
    assert!(h
        .submit(1, rw(NvmOpcode::WRITE, 1, 3, 1, DATA, 0))
        .status()
        .is_success());
    h.write32(offset::CC, 0x0046_0000);
    assert!(!h.csts().rdy());
    // Queue 1 is gone: its doorbell is now invalid.
    let before = h.ctrl.stats().queue(1).invalid_doorbell_writes;
    h.write32(0x1008, 1);
    assert_eq!(h.ctrl.stats().queue(1).invalid_doorbell_writes, before + 1);
    h.mem.zero(ACQ, 4096).unwrap();
    h.enable();
    h.create_pair(1, 16);
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 3, 1, DATA + 0x1000, 0))
        .status()
        .is_success());
    assert_eq!(h.read_mem(DATA + 0x1000, 512), vec![0x5A; 512]);
    // A vfio-user reset then a new client: still there.
    h.ctrl.reset();
    assert_eq!(h.read32(offset::CC), 0);
    h.ctrl.detach();
    h.ctrl.attach(h.mem.clone(), h.irq.clone());
    h.mem.zero(ACQ, 4096).unwrap();
    h.enable();
    h.create_pair(1, 16);
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 3, 1, DATA + 0x2000, 0))
        .status()
        .is_success());
    assert_eq!(h.read_mem(DATA + 0x2000, 512), vec![0x5A; 512]);
}

#[test]
fn doorbell_beyond_queue_size_is_ignored_and_counted() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    h.write32(0x1008, 16);
    h.write32(0x1008, 0xFFFF_FFFF);
    h.write32(0x100C, 40);
    let q = h.ctrl.stats().queue(1);
    assert_eq!(q.invalid_doorbell_writes, 3);
    assert_eq!(q.commands, 0, "nothing was fetched");
    // The queue still works.
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
        .status()
        .is_success());
}

#[test]
fn cq_head_skipping_unposted_entries_is_ignored_and_counted() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
        .status()
        .is_success());
    // One entry posted and consumed (head 1); claim head 5.
    h.write32(0x100C, 5);
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
        .status()
        .is_success());
    assert_eq!(h.ctrl.stats().queue(1).invalid_doorbell_writes, 1);
}

#[test]
fn counters_count_one_sq_trap_per_doorbell_write() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    let before = h.ctrl.stats();
    for _ in 0..5 {
        assert!(h
            .submit(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
            .status()
            .is_success());
    }
    // Three commands, one doorbell write.
    for _ in 0..3 {
        h.push(1, rw(NvmOpcode::WRITE, 1, 0, 1, DATA, 0));
    }
    h.ring_sq(1);
    for _ in 0..3 {
        assert!(h.reap(1).status().is_success());
    }
    let after = h.ctrl.stats();
    let q = after.queue(1);
    assert_eq!(q.sq_doorbell_traps - before.queue(1).sq_doorbell_traps, 6);
    assert_eq!(q.cq_doorbell_traps - before.queue(1).cq_doorbell_traps, 8);
    assert_eq!(q.commands, 8);
    assert_eq!(after.io_commands.get("read"), Some(&5));
    assert_eq!(after.io_commands.get("write"), Some(&3));
    assert!(after.admin_commands.contains_key("create-io-sq"));
    assert!(after.completions.get("success").copied().unwrap_or(0) >= 10);
    // Interrupts went to vector 1 (CQ 1's IV), at least one per batch.
    assert!(h.irq.count(1) >= 6, "irqs on vector 1: {}", h.irq.count(1));
    assert_eq!(q.interrupts, h.irq.count(1));
    let json = serde_json::to_string(&after).unwrap();
    assert!(json.contains("\"sq_doorbell_traps\""));
}

#[test]
fn cq_full_stalls_until_the_head_moves() {
    let mut h = Host::new();
    h.enable();
    // CQ of 4 entries holds 3 completions; submit 6 commands.
    let c = h.admin(create_cq(1, 4, 1, cq_base(1)));
    assert!(c.status().is_success());
    assert!(h
        .admin(create_sq(1, 16, 1, sq_base(1)))
        .status()
        .is_success());
    h.rings[1] = Some(Ring {
        size: 16,
        ..Ring::new(sq_base(1), cq_base(1), 16)
    });
    for _ in 0..6 {
        h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
    }
    h.ring_sq(1);
    // Read the CQ as a 4-entry ring by hand.
    let mut head = 0u16;
    let mut phase = true;
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen < 6 && Instant::now() < deadline {
        let mut b = [0u8; 16];
        h.mem
            .read(cq_base(1) + u64::from(head) * 16, &mut b)
            .unwrap();
        let cqe = Completion::read_from_bytes(&b).unwrap();
        if cqe.phase() != phase {
            std::thread::sleep(Duration::from_micros(100));
            continue;
        }
        assert!(cqe.status().is_success());
        seen += 1;
        head = (head + 1) % 4;
        if head == 0 {
            phase = !phase;
        }
        h.write32(0x100C, u32::from(head));
    }
    assert_eq!(seen, 6, "all completions arrive as the head moves");
}

#[test]
fn interrupt_coalescing_aggregates_to_the_threshold() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 64);
    // THR = 3 (4 completions), TIME = 25.5 ms.
    assert!(h.admin(set_features(0x08, 0xFF03)).status().is_success());
    let before = h.irq.count(1);
    for _ in 0..8 {
        h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
    }
    h.ring_sq(1);
    for _ in 0..8 {
        h.reap(1);
    }
    // One batch of 8: one interrupt (or two if the batch was split).
    let n = h.irq.count(1) - before;
    assert!(
        (1..=2).contains(&n),
        "interrupts for 8 coalesced completions: {n}"
    );
    // A single completion below the threshold is still signalled once the
    // aggregation time passes.
    let before = h.irq.count(1);
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
        .status()
        .is_success());
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.irq.count(1) == before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(h.irq.count(1), before + 1);
}

#[test]
fn intx_masked_interrupt_is_held_until_unmasked() {
    let mut h = Host::new();
    h.irq.intx.store(true, std::sync::atomic::Ordering::SeqCst);
    h.enable();
    h.write32(offset::INTMS, 1);
    let before = h.irq.count(0);
    assert!(h.admin(identify(1, 0, DATA)).status().is_success());
    assert_eq!(h.irq.count(0), before, "masked");
    h.write32(offset::INTMC, 1);
    assert_eq!(h.irq.count(0), before + 1, "delivered on unmask");
}

#[test]
fn multiple_workers_serve_their_queues() {
    let mut h = Host::with(
        ControllerConfig {
            workers: 3,
            ..config()
        },
        512,
    );
    h.enable();
    for q in 1..=4 {
        h.create_pair(q, 16);
    }
    for q in 1..=4u16 {
        h.mem
            .write(DATA + u64::from(q) * 0x1000, &[q as u8; 512])
            .unwrap();
        let c = h.submit(
            q,
            rw(
                NvmOpcode::WRITE,
                1,
                u64::from(q),
                1,
                DATA + u64::from(q) * 0x1000,
                0,
            ),
        );
        assert!(c.status().is_success());
    }
    for q in 1..=4u16 {
        let mut b = [0u8; 512];
        h.backend.read(u64::from(q) * 512, &mut b).unwrap();
        assert_eq!(b, [q as u8; 512]);
    }
    // Deleting then recreating works; deleting the CQ first does not.
    assert!(h
        .admin(delete(AdminOpcode::DELETE_IO_SQ, 2))
        .status()
        .is_success());
    assert!(h
        .admin(delete(AdminOpcode::DELETE_IO_CQ, 2))
        .status()
        .is_success());
    h.create_pair(2, 16);
    assert!(h
        .submit(2, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0))
        .status()
        .is_success());
}

#[test]
fn unreachable_admin_queue_sets_cfs_and_never_hangs() {
    let mut h = Host::new();
    // ASQ beyond guest memory.
    h.enable_with(0x0046_0001, 0x4000_0000, (31 << 16) | 31);
    assert!(h.csts().rdy());
    h.write32(0x1000, 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !h.csts().cfs() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(h.csts().cfs());
    h.ctrl.detach();
}

#[test]
fn hostile_queue_entries_never_panic() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 64);
    // Deterministic pseudo-random commands on both queues.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..200 {
        let mut bytes = [0u8; 64];
        for chunk in bytes.chunks_mut(8) {
            chunk.copy_from_slice(&next().to_le_bytes());
        }
        let mut c = Command::read_from_bytes(&bytes).unwrap();
        // Keep admin commands away from the admin queue's own setup and
        // from creating queues over our rings.
        let qid = if round % 2 == 0 { 1 } else { 0 };
        if qid == 0 && [0x00u8, 0x01, 0x04, 0x05, 0x0C].contains(&c.opcode()) {
            c.cdw0 = U32::new(c.cdw0.get() & !0xFF | 0x06);
        }
        c.prp1 = U64::new(c.prp1.get() % (MEM_SIZE as u64 * 2));
        let cqe = h.submit(qid, c);
        let _ = cqe.status();
    }
    assert!(h.csts().rdy());
}
