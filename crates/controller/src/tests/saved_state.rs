//! Saved state (docs/state-format.md): a controller driven through a
//! random valid sequence of admin and I/O commands is paused, saved,
//! restored into a fresh controller on a copy of the guest memory and of
//! its namespaces' data; then both get the same next commands and must
//! answer them alike (status, CID, result, data). States that must be
//! refused are in `hostile`.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::zoned::{send, ZSZE};
use super::*;
use crate::{SavedState, StateError, ZonedConfig};

const BUF: u64 = DATA + 0x40000;
/// Namespace 2 is zoned: 16 zones of 128 blocks.
const ZONES: u64 = NS_BLOCKS / ZSZE;
/// I/O queue ids the sequences use.
const QIDS: u16 = 4;

fn zoned() -> ZonedConfig {
    let mut z = ZonedConfig::new(ZSZE * 512);
    z.max_open = Some(4);
    z.max_active = Some(6);
    z
}

fn namespaces(b1: Arc<RamDevice>, b2: Arc<RamDevice>) -> Vec<NamespaceConfig> {
    vec![
        NamespaceConfig::new(1, 512, b1),
        NamespaceConfig::new(2, 512, b2).with_zoned(Some(zoned())),
    ]
}

/// Enabled, namespace 1 conventional and 2 zoned, no I/O queue yet.
fn host() -> (Host, Arc<RamDevice>) {
    let mut h = Host::new();
    let b2 = Arc::new(RamDevice::new(NS_BLOCKS * 512));
    h.ctrl = Controller::new(config(), namespaces(h.backend.clone(), b2.clone())).unwrap();
    h.ctrl.attach(h.mem.clone(), h.irq.clone());
    h.enable();
    (h, b2)
}

fn copy_of(dev: &RamDevice) -> Arc<RamDevice> {
    let mut data = vec![0; dev.size() as usize];
    dev.read(0, &mut data).unwrap();
    let copy = Arc::new(RamDevice::new(dev.size()));
    copy.write(0, &data).unwrap();
    copy
}

/// `a` paused (with `pending` pushed and rung meanwhile), saved through
/// its encoding, restored into a new controller on copies of its memory
/// and namespaces; `a` resumes. The restored twin's host side starts as
/// `a`'s (rings, CIDs, shadow buffers, AERs).
fn twin(a: &mut Run, b2: &RamDevice, pending: Option<(u16, Command)>) -> Run {
    a.h.ctrl.pause();
    if let Some((qid, c)) = pending {
        a.h.push(qid, c);
        a.h.ring_sq(qid);
    }
    let saved = a.h.ctrl.save_state().expect("saved at a quiescent point");
    let decoded = SavedState::decode(&saved.encode()).expect("its own encoding decodes");
    assert_eq!(decoded, saved, "the encoding round-trips");
    let mem = Arc::new(VecMemory::new(MEM_SIZE));
    mem.write(GuestAddress(0), &a.h.read_mem(0, MEM_SIZE))
        .unwrap();
    let b1 = copy_of(&a.h.backend);
    let irq = Arc::new(CountingIrq::default());
    let ctrl = Controller::restore(
        config(),
        namespaces(b1.clone(), copy_of(b2)),
        &decoded,
        mem.clone(),
        irq.clone(),
    )
    .expect("the saved state restores");
    a.h.ctrl.resume().expect("the saved controller resumes");
    let h = Host {
        ctrl,
        mem,
        irq,
        backend: b1,
        rings: a.h.rings.clone(),
        cid: a.h.cid,
        dbbuf: a.h.dbbuf,
        spdk: a.h.spdk,
    };
    Run {
        h,
        aers: a.aers.clone(),
        aer_cids: a.aer_cids.clone(),
    }
}

fn run(h: Host) -> Run {
    Run {
        h,
        aers: BTreeSet::new(),
        aer_cids: BTreeSet::new(),
    }
}

#[derive(Debug, Clone)]
enum Op {
    CreatePair {
        qid: u16,
        size: u16,
    },
    DeletePair {
        qid: u16,
    },
    Write {
        qid: u16,
        nsid: u32,
        slba: u64,
        nlb: u32,
        seed: u8,
    },
    Read {
        qid: u16,
        nsid: u32,
        slba: u64,
        nlb: u32,
    },
    Zeroes {
        qid: u16,
        slba: u64,
        nlb: u32,
    },
    Uncorrectable {
        qid: u16,
        slba: u64,
        nlb: u32,
    },
    Flush {
        qid: u16,
    },
    SetFeature {
        fid: u8,
        value: u32,
    },
    GetFeature {
        fid: u8,
    },
    HostId {
        id: u8,
    },
    Register {
        qid: u16,
        rrega: u32,
        crkey: u64,
        nrkey: u64,
    },
    Acquire {
        qid: u16,
        rtype: u8,
        crkey: u64,
    },
    Release {
        qid: u16,
        rtype: u8,
        crkey: u64,
    },
    Report {
        qid: u16,
    },
    ZoneSend {
        qid: u16,
        zone: u64,
        action: u8,
    },
    ZoneAppend {
        qid: u16,
        zone: u64,
        nlb: u32,
        seed: u8,
    },
    ZoneReport {
        qid: u16,
    },
    Aer,
    BadDoorbell,
    GetLog {
        lid: u8,
    },
    KeepAlive,
    Dbbuf,
    Identify {
        cns: u8,
        nsid: u32,
    },
    Format {
        lbaf: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let qid = 1..=QIDS;
    let lba = 0..NS_BLOCKS - 8;
    let nlb = 1..=8u32;
    prop_oneof![
        3 => (qid.clone(), prop_oneof![2..=8u16, 2..=32u16])
            .prop_map(|(qid, size)| Op::CreatePair { qid, size }),
        1 => qid.clone().prop_map(|qid| Op::DeletePair { qid }),
        6 => (qid.clone(), 1..=2u32, lba.clone(), nlb.clone(), any::<u8>())
            .prop_map(|(qid, nsid, slba, nlb, seed)| Op::Write { qid, nsid, slba, nlb, seed }),
        5 => (qid.clone(), 1..=2u32, lba.clone(), nlb.clone())
            .prop_map(|(qid, nsid, slba, nlb)| Op::Read { qid, nsid, slba, nlb }),
        1 => (qid.clone(), lba.clone(), nlb.clone())
            .prop_map(|(qid, slba, nlb)| Op::Zeroes { qid, slba, nlb }),
        1 => (qid.clone(), lba.clone(), nlb.clone())
            .prop_map(|(qid, slba, nlb)| Op::Uncorrectable { qid, slba, nlb }),
        1 => qid.clone().prop_map(|qid| Op::Flush { qid }),
        3 => (
            prop_oneof![Just(0x01u8), Just(0x02), Just(0x04), Just(0x05), Just(0x07),
                Just(0x08), Just(0x09), Just(0x0A), Just(0x0B), Just(0x0E), Just(0x80)],
            any::<u32>(),
        )
            .prop_map(|(fid, value)| Op::SetFeature { fid, value }),
        2 => prop_oneof![Just(0x01u8), Just(0x02), Just(0x04), Just(0x05), Just(0x07),
                Just(0x08), Just(0x09), Just(0x0A), Just(0x0B), Just(0x0F), Just(0x80), Just(0x81)]
            .prop_map(|fid| Op::GetFeature { fid }),
        1 => (1..=3u8).prop_map(|id| Op::HostId { id }),
        2 => (qid.clone(), 0..=2u32, 0..3u64, 0..3u64)
            .prop_map(|(qid, rrega, crkey, nrkey)| Op::Register { qid, rrega, crkey, nrkey }),
        1 => (qid.clone(), 1..=6u8, 0..3u64)
            .prop_map(|(qid, rtype, crkey)| Op::Acquire { qid, rtype, crkey }),
        1 => (qid.clone(), 1..=6u8, 0..3u64)
            .prop_map(|(qid, rtype, crkey)| Op::Release { qid, rtype, crkey }),
        1 => qid.clone().prop_map(|qid| Op::Report { qid }),
        3 => (qid.clone(), 0..ZONES, 1..=4u8)
            .prop_map(|(qid, zone, action)| Op::ZoneSend { qid, zone, action }),
        3 => (qid.clone(), 0..ZONES, nlb.clone(), any::<u8>())
            .prop_map(|(qid, zone, nlb, seed)| Op::ZoneAppend { qid, zone, nlb, seed }),
        1 => qid.clone().prop_map(|qid| Op::ZoneReport { qid }),
        1 => Just(Op::Aer),
        1 => Just(Op::BadDoorbell),
        1 => prop_oneof![Just(0x01u8), Just(0x03), Just(0x04), Just(0x06), Just(0x0D)]
            .prop_map(|lid| Op::GetLog { lid }),
        1 => Just(Op::KeepAlive),
        1 => Just(Op::Dbbuf),
        1 => (prop_oneof![Just(0u8), Just(1), Just(2), Just(3)], 0..=3u32)
            .prop_map(|(cns, nsid)| Op::Identify { cns, nsid }),
        1 => (0..=1u8).prop_map(|lbaf| Op::Format { lbaf }),
    ]
}

/// What a host saw of one operation: its own completions and data. AER
/// completions are collected apart ([`Run::aers`]): when one lands
/// relative to other admin commands is the worker's timing.
#[derive(Debug, Default, PartialEq, Eq)]
struct Seen {
    cqes: Vec<Vec<u8>>,
    data: Vec<u8>,
}

struct Run {
    h: Host,
    /// AER completions seen: (CID, status, dword 0).
    aers: BTreeSet<(u16, u16, u32)>,
    /// CIDs of AERs submitted and not completed.
    aer_cids: BTreeSet<u16>,
}

fn bytes(c: &Completion) -> Vec<u8> {
    c.as_bytes().to_vec()
}

impl Run {
    fn admin(&mut self, c: Command) -> Completion {
        let (own, others) = self.h.admin_collect(c);
        for o in others {
            assert!(
                self.aer_cids.remove(&o.cid()),
                "a stray admin completion {o:?}"
            );
            self.aers.insert((o.cid(), o.status().raw(), o.dw0.get()));
        }
        own
    }

    fn io(&mut self, qid: u16, c: Command) -> Option<Completion> {
        self.h.rings[usize::from(qid)]
            .is_some()
            .then(|| self.h.submit(qid, c))
    }

    fn apply(&mut self, op: &Op) -> Seen {
        let mut seen = Seen::default();
        let mut io = |run: &mut Self, qid: u16, c: Command| {
            if let Some(c) = run.io(qid, c) {
                seen.cqes.push(bytes(&c));
            }
        };
        match *op {
            Op::CreatePair { qid, size } => {
                // A host zeroes the memory of a CQ it creates (never one
                // in use: its entries' phase would read as new).
                if self.h.rings[usize::from(qid)].is_none() {
                    self.h
                        .mem
                        .zero(GuestAddress(cq_base(qid)), u64::from(size) * 16)
                        .unwrap();
                }
                let cq = self.admin(create_cq(qid, size, qid, cq_base(qid)));
                let sq = self.admin(create_sq(qid, size, qid, sq_base(qid)));
                if cq.status() == Status::SUCCESS && sq.status() == Status::SUCCESS {
                    self.h.rings[usize::from(qid)] =
                        Some(Ring::new(sq_base(qid), cq_base(qid), size));
                } else if sq.status() != Status::SUCCESS && cq.status() == Status::SUCCESS {
                    let d = self.admin(delete(AdminOpcode::DELETE_IO_CQ, qid));
                    seen.cqes.push(bytes(&d));
                }
                seen.cqes.extend([bytes(&cq), bytes(&sq)]);
            }
            Op::DeletePair { qid } => {
                let sq = self.admin(delete(AdminOpcode::DELETE_IO_SQ, qid));
                let cq = self.admin(delete(AdminOpcode::DELETE_IO_CQ, qid));
                if cq.status() == Status::SUCCESS {
                    self.h.rings[usize::from(qid)] = None;
                }
                seen.cqes.extend([bytes(&sq), bytes(&cq)]);
            }
            Op::Write {
                qid,
                nsid,
                slba,
                nlb,
                seed,
            } => {
                let data: Vec<u8> = (0..nlb * 512).map(|i| seed.wrapping_add(i as u8)).collect();
                self.h.mem.write(GuestAddress(DATA), &data).unwrap();
                io(self, qid, rw(NvmOpcode::WRITE, nsid, slba, nlb, DATA, 0));
            }
            Op::Read {
                qid,
                nsid,
                slba,
                nlb,
            } => {
                self.h.mem.write(GuestAddress(DATA), &[0xEE; 4096]).unwrap();
                io(self, qid, rw(NvmOpcode::READ, nsid, slba, nlb, DATA, 0));
                seen.data = self.h.read_mem(DATA, 4096);
            }
            Op::Zeroes { qid, slba, nlb } => {
                io(self, qid, rw(NvmOpcode::WRITE_ZEROES, 1, slba, nlb, 0, 0));
            }
            Op::Uncorrectable { qid, slba, nlb } => {
                io(
                    self,
                    qid,
                    rw(NvmOpcode::WRITE_UNCORRECTABLE, 1, slba, nlb, 0, 0),
                );
            }
            Op::Flush { qid } => {
                let mut c = cmd(NvmOpcode::FLUSH.0);
                c.nsid = U32::new(1);
                io(self, qid, c);
            }
            Op::SetFeature { fid, value } => {
                // Number of Queues within the controller's; Arbitration,
                // Error Recovery as given: each answers by its own rules.
                let value = match fid {
                    0x07 => value & 0x0003_0003,
                    _ => value,
                };
                let mut c = set_features(fid, value);
                if fid == 0x05 {
                    c.nsid = U32::new(1);
                }
                let c = self.admin(c);
                seen.cqes.push(bytes(&c));
            }
            Op::GetFeature { fid } => {
                self.h.mem.write(GuestAddress(BUF), &[0xEE; 4096]).unwrap();
                let mut g = get_features(fid, 0, BUF);
                if fid == 0x05 {
                    g.nsid = U32::new(1);
                }
                let c = self.admin(g);
                seen.cqes.push(bytes(&c));
                seen.data = self.h.read_mem(BUF, 512);
            }
            Op::HostId { id } => {
                self.h.mem.write(GuestAddress(BUF), &[id; 16]).unwrap();
                let mut c = set_features(0x81, 0);
                c.prp1 = U64::new(BUF);
                let c = self.admin(c);
                seen.cqes.push(bytes(&c));
            }
            Op::Register {
                qid,
                rrega,
                crkey,
                nrkey,
            } => {
                let keys = [crkey.to_le_bytes(), nrkey.to_le_bytes()].concat();
                self.resv(
                    &mut seen,
                    qid,
                    NvmOpcode::RESERVATION_REGISTER,
                    rrega,
                    &keys,
                );
            }
            Op::Acquire { qid, rtype, crkey } => {
                let keys = [crkey.to_le_bytes(), [0; 8]].concat();
                let cdw10 = u32::from(rtype) << 8;
                self.resv(&mut seen, qid, NvmOpcode::RESERVATION_ACQUIRE, cdw10, &keys);
            }
            Op::Release { qid, rtype, crkey } => {
                let cdw10 = u32::from(rtype) << 8;
                let key = crkey.to_le_bytes();
                self.resv(&mut seen, qid, NvmOpcode::RESERVATION_RELEASE, cdw10, &key);
            }
            Op::Report { qid } => {
                self.h.mem.write(GuestAddress(BUF), &[0xEE; 4096]).unwrap();
                let mut c = cmd(NvmOpcode::RESERVATION_REPORT.0);
                c.nsid = U32::new(1);
                c.prp1 = U64::new(BUF);
                c.cdw10 = U32::new(255);
                io(self, qid, c);
                seen.data = self.h.read_mem(BUF, 1024);
            }
            Op::ZoneSend { qid, zone, action } => {
                io(self, qid, send(2, zone * ZSZE, action, false));
            }
            Op::ZoneAppend {
                qid,
                zone,
                nlb,
                seed,
            } => {
                let data = vec![seed; nlb as usize * 512];
                self.h.mem.write(GuestAddress(DATA), &data).unwrap();
                io(
                    self,
                    qid,
                    rw(NvmOpcode::ZONE_APPEND, 2, zone * ZSZE, nlb, DATA, 0),
                );
            }
            Op::ZoneReport { qid } => {
                self.h.mem.write(GuestAddress(DATA), &[0xEE; 4096]).unwrap();
                let mut c = rw(NvmOpcode::ZONE_MGMT_RECV, 2, 0, 1, DATA, 0);
                c.cdw12 = U32::new(4096 / 4 - 1);
                io(self, qid, c);
                seen.data = self.h.read_mem(DATA, 4096);
            }
            Op::Aer => {
                let cid = self.h.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
                self.h.ring_sq(0);
                self.aer_cids.insert(cid);
                // Fetched (and completed, if an event waits) before the
                // next command: an event a later command clears (Get Log
                // Page) must not depend on the worker's timing.
                self.await_aer(Duration::from_millis(50));
            }
            Op::BadDoorbell => {
                // The SQ tail doorbell of a queue id past the last: an
                // error event (invalid doorbell register).
                self.h.write32(0x1000 + 8 * 8, 1);
                // An outstanding AER completes with it, in its own time:
                // wait for it here, not racing the next admin command.
                if !self.aer_cids.is_empty() {
                    self.await_aer(Duration::from_millis(300));
                }
            }
            Op::GetLog { lid } => {
                self.h.mem.write(GuestAddress(BUF), &[0xEE; 4096]).unwrap();
                let c = self.admin(get_log(lid, 128, 0, BUF));
                seen.cqes.push(bytes(&c));
                // The Persistent Event Log needs a context first: its
                // answer is the status; its timestamps are the clock's.
                if lid != 0x0D {
                    seen.data = self.h.read_mem(BUF, 512);
                }
            }
            Op::KeepAlive => {
                let c = self.admin(cmd(AdminOpcode::KEEP_ALIVE.0));
                seen.cqes.push(bytes(&c));
            }
            Op::Dbbuf => {
                let c = self.admin({
                    let mut c = cmd(AdminOpcode::DOORBELL_BUFFER_CONFIG.0);
                    c.prp1 = U64::new(SHADOW);
                    c.prp2 = U64::new(EVENTIDX);
                    c
                });
                if c.status() == Status::SUCCESS {
                    self.h.dbbuf = Some((SHADOW, EVENTIDX));
                }
                seen.cqes.push(bytes(&c));
            }
            Op::Identify { cns, nsid } => {
                self.h.mem.write(GuestAddress(BUF), &[0xEE; 4096]).unwrap();
                let c = self.admin(identify(cns, nsid, BUF));
                seen.cqes.push(bytes(&c));
                seen.data = self.h.read_mem(BUF, 4096);
            }
            Op::Format { lbaf } => {
                let mut c = cmd(AdminOpcode::FORMAT_NVM.0);
                c.nsid = U32::new(1);
                c.cdw10 = U32::new(u32::from(lbaf));
                let c = self.admin(c);
                seen.cqes.push(bytes(&c));
            }
        }
        seen
    }

    fn resv(&mut self, seen: &mut Seen, qid: u16, op: NvmOpcode, cdw10: u32, data: &[u8]) {
        self.h.mem.write(GuestAddress(BUF), data).unwrap();
        let mut c = cmd(op.0);
        c.nsid = U32::new(1);
        c.prp1 = U64::new(BUF);
        c.cdw10 = U32::new(cdw10);
        if let Some(c) = self.io(qid, c) {
            seen.cqes.push(bytes(&c));
        }
    }

    /// Waits up to `limit` for an AER completion on the admin CQ and
    /// takes it.
    fn await_aer(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.h.peek_cqe(0).is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(100));
        }
        if let Some(o) = self.h.peek_cqe(0) {
            self.h.advance_head(0);
            self.h.ring_cq(0);
            assert!(self.aer_cids.remove(&o.cid()), "a stray completion {o:?}");
            self.aers.insert((o.cid(), o.status().raw(), o.dw0.get()));
        }
    }

    /// Collects AER completions still on their way: one more admin
    /// command, whose own completion is compared too.
    fn settle(&mut self) -> Seen {
        self.apply(&Op::GetFeature { fid: 0x0B })
    }
}

/// Reads of every feature, log page, identify page and report the
/// sequences touch.
fn probes() -> Vec<Op> {
    let mut ops: Vec<Op> = [
        0x01u8, 0x02, 0x04, 0x05, 0x07, 0x08, 0x0A, 0x0B, 0x0F, 0x80, 0x81,
    ]
    .into_iter()
    .map(|fid| Op::GetFeature { fid })
    .collect();
    ops.extend([0x01u8, 0x03, 0x04, 0x06].map(|lid| Op::GetLog { lid }));
    ops.extend([(0u8, 1u32), (0, 2), (1, 0), (2, 0)].map(|(cns, nsid)| Op::Identify { cns, nsid }));
    for qid in 1..=QIDS {
        ops.extend([Op::Report { qid }, Op::ZoneReport { qid }]);
    }
    ops
}

/// Where the command pending at the save reads to.
const PENDING: u64 = DATA + 0x20000;

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_restored_controller_answers_the_next_commands_as_the_saved_one(
        before in proptest::collection::vec(op(), 0..120),
        pending in proptest::option::of((1..=QIDS, 0..NS_BLOCKS)),
        after in proptest::collection::vec(op(), 1..25),
    ) {
        let (h, b2) = host();
        let mut a = run(h);
        // Small I/O queues from the start: their rings wrap (phase 0)
        // before most saves.
        let start = [Op::CreatePair { qid: 1, size: 4 }, Op::CreatePair { qid: 2, size: 3 }];
        for op in start.iter().chain(&before) {
            a.apply(op);
        }
        let pending = pending
            .filter(|&(qid, _)| a.h.rings[usize::from(qid)].is_some())
            .map(|(qid, slba)| (qid, rw(NvmOpcode::READ, 1, slba, 1, PENDING, 0)));
        let mut b = twin(&mut a, &b2, pending);
        if let Some((qid, _)) = pending {
            let (ca, cb) = (a.h.reap(qid), b.h.reap(qid));
            prop_assert_eq!(bytes(&ca), bytes(&cb), "the command rung while paused");
            prop_assert_eq!(a.h.read_mem(PENDING, 512), b.h.read_mem(PENDING, 512));
        }
        for op in &after {
            let (sa, sb) = (a.apply(op), b.apply(op));
            prop_assert_eq!(sa, sb, "after {:?}", op);
        }
        // Then every feature, log and report once: a value the random
        // commands did not happen to read back is compared too.
        for op in probes() {
            let (sa, sb) = (a.apply(&op), b.apply(&op));
            prop_assert_eq!(sa, sb, "probe {:?}", op);
        }
        let (sa, sb) = (a.settle(), b.settle());
        prop_assert_eq!(sa, sb);
        prop_assert_eq!(&a.aers, &b.aers, "asynchronous event completions");
    }
}

mod hostile;
