//! The controller fed hostile register writes, doorbell values, SQEs, PRP
//! lists and shadow-buffer contents over fake guest memory.
//!
//! The input is a list of operations. Some are raw (any register, any
//! doorbell, any bytes anywhere in guest memory), some are "host-shaped"
//! (enable with a real admin queue, submit a command at the tail the host
//! tracks and wait briefly for its completion) so that the fuzzer gets deep
//! into command processing instead of stopping at CSTS.RDY = 0.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use vnvme_blockdev::held::{HeldRam, Release};
use vnvme_blockdev::{BlockDevice, NullDevice, RamDevice};

use vnvme_controller::testing::{CountingIrq, VecMemory};
use vnvme_controller::{
    Controller, ControllerConfig, DoorbellMode, GuestAddress, GuestMemory, NamespaceConfig, PiType,
    Protection, ZonedConfig,
};
use vnvme_spec::{Command, Completion};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, IntoBytes};

/// Guest memory the fake exposes: `0..MEM`; addresses the fuzzer picks
/// reach a little past it, and anywhere in 64 bits with `Addr::Raw`.
const MEM: u64 = 1 << 20;
const PAGE: u64 = 0x1000;
const ASQ: u64 = 0x1000;
const ACQ: u64 = 0x2000;
const SHADOW: u64 = 0x3000;
const EVENTIDX: u64 = 0x4000;
/// I/O queue `qid` (1..=4): SQ at `IOQ + qid * 0x4000`, CQ 0x2000 above it.
const IOQ: u64 = 0x10000;
const DATA: u64 = 0x40000;
/// How long a host-shaped submission waits for its completion.
const WAIT: Duration = Duration::from_millis(3);
const MAX_IO_QUEUES: u16 = 4;

/// A guest physical address: mostly in or near the data area, sometimes
/// anywhere.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Addr {
    /// A page (or an offset in one) of the data area.
    Data {
        page: u8,
        offset: u16,
    },
    /// A well-known structure: 0 ASQ, 1 ACQ, 2 shadow, 3 EventIdx, 4.. I/O queues.
    Known {
        which: u8,
        offset: u16,
    },
    /// Anywhere in the first 4 GiB (mostly unmapped).
    Low(u32),
    Raw(u64),
}

impl Addr {
    fn get(self) -> u64 {
        match self {
            Addr::Data { page, offset } => {
                DATA + u64::from(page) * PAGE + u64::from(offset % 0x1000)
            }
            Addr::Known { which, offset } => {
                let base = match which % 8 {
                    0 => ASQ,
                    1 => ACQ,
                    2 => SHADOW,
                    3 => EVENTIDX,
                    q => IOQ + u64::from(q - 3) * 0x4000,
                };
                base + u64::from(offset % 0x2000)
            }
            Addr::Low(a) => u64::from(a),
            Addr::Raw(a) => a,
        }
    }
}

/// A submission queue entry with fields the fuzzer steers.
#[derive(Arbitrary, Debug, Clone)]
pub struct Sqe {
    pub opcode: u8,
    pub flags: u8,
    pub nsid: u32,
    pub prp1: Addr,
    pub prp2: Addr,
    pub cdw: [u32; 6],
    pub mptr: u64,
}

impl Sqe {
    fn command(&self) -> Command {
        let mut c = Command::new(self.opcode, 0);
        // Byte 1 of CDW0 holds FUSE and PSDT.
        c.cdw0 = U32::new(u32::from(self.opcode) | (u32::from(self.flags) << 8));
        c.nsid = U32::new(self.nsid);
        c.prp1 = U64::new(self.prp1.get());
        c.prp2 = U64::new(self.prp2.get());
        c.cdw10 = U32::new(self.cdw[0]);
        c.cdw11 = U32::new(self.cdw[1]);
        c.cdw12 = U32::new(self.cdw[2]);
        c.cdw13 = U32::new(self.cdw[3]);
        c.cdw14 = U32::new(self.cdw[4]);
        c.cdw15 = U32::new(self.cdw[5]);
        c.mptr = U64::new(self.mptr);
        c
    }
}

#[derive(Arbitrary, Debug)]
pub enum Op {
    /// AQA, ASQ, ACQ, CC.EN = 1 as a host does it (queues of the given sizes).
    Enable {
        asqs_z: u8,
        acqs_z: u8,
    },
    /// Any register or doorbell write, 4 or 8 bytes, possibly unaligned.
    WriteReg {
        offset: u16,
        value: u64,
        wide: bool,
    },
    ReadReg {
        offset: u16,
        len: u8,
    },
    /// Arbitrary bytes into guest memory (SQEs, PRP lists, shadow values).
    WriteMem {
        addr: Addr,
        bytes: Vec<u8>,
    },
    /// A PRP list: `entries` at `addr`.
    PrpList {
        addr: Addr,
        entries: Vec<Addr>,
    },
    /// A command at the admin SQ tail the host tracks, the doorbell rung,
    /// and a short wait for the completion.
    Admin(Sqe),
    /// The same on I/O queue `qid` (created or not).
    Io {
        qid: u8,
        sqe: Sqe,
    },
    /// Host-shaped reads or writes of namespace 1 on I/O queue `qid`, 1 to
    /// 8 of them rung at once (several in flight when namespace 1 is
    /// asynchronous), each `nlb_z + 1` (at most 8) blocks at PRP1 = a data
    /// page.
    Rw {
        qid: u8,
        write: bool,
        fua: bool,
        slba: u16,
        nlb_z: u8,
        page: u8,
        count: u8,
    },
    /// Create I/O CQ + SQ `qid` in their usual place (host-shaped).
    CreatePair {
        qid: u8,
        size_z: u8,
        iv: u8,
        irq: bool,
    },
    /// Doorbell Buffer Config with the test buffers (or hostile ones).
    DbbufConfig {
        shadow: Addr,
        eventidx: Addr,
        canonical: bool,
    },
    /// Any value into doorbell `index` (register trap).
    Doorbell {
        index: u16,
        value: u32,
    },
    /// Any value into shadow doorbell slot `index` (no trap).
    Shadow {
        index: u8,
        value: u32,
    },
    /// Let the workers run.
    Poll {
        micros: u8,
    },
    Reset,
    /// The client goes away and comes back (new attachment).
    Reattach,
    IntxMode(bool),
}

#[derive(Arbitrary, Debug)]
pub struct Input {
    /// Doorbell mode (bits 0-1); bit 2: namespace 1 is asynchronous.
    pub mode: u8,
    pub two_workers: bool,
    pub ops: Vec<Op>,
}

#[derive(Default, Clone, Copy)]
struct Ring {
    base_sq: u64,
    base_cq: u64,
    size: u16,
    tail: u16,
    head: u16,
    phase: bool,
}

struct Host {
    ctrl: Controller,
    mem: Arc<VecMemory>,
    irq: Arc<CountingIrq>,
    rings: [Option<Ring>; MAX_IO_QUEUES as usize + 1],
    cid: u16,
}

impl Host {
    fn write32(&self, off: u64, v: u32) {
        self.ctrl.mmio_write(off, &v.to_le_bytes());
    }

    fn doorbell(&self, index: u32, v: u16) {
        self.write32(0x1000 + 4 * u64::from(index), u32::from(v));
    }

    /// Puts `cmd` at the tail of `qid`, rings, and waits a little for the
    /// next completion (consuming it and ringing the CQ head if it comes).
    fn submit(&mut self, qid: u16, cmd: Command) -> Option<Completion> {
        self.submit_all(qid, &[cmd]).pop()
    }

    /// Puts `cmds` at the tail of `qid`, rings once, and waits a little for
    /// as many completions (consuming each and ringing the CQ head).
    fn submit_all(&mut self, qid: u16, cmds: &[Command]) -> Vec<Completion> {
        let Some(mut r) = self.rings[usize::from(qid)] else {
            return Vec::new();
        };
        for cmd in cmds {
            let mut cmd = *cmd;
            self.cid = self.cid.wrapping_add(1);
            cmd.set_cid(self.cid);
            let _ = self.mem.write(
                GuestAddress(r.base_sq + u64::from(r.tail) * 64),
                cmd.as_bytes(),
            );
            r.tail = (r.tail + 1) % r.size.max(1);
        }
        self.doorbell(2 * u32::from(qid), r.tail);
        self.rings[usize::from(qid)] = Some(r);
        let mut got = Vec::new();
        while got.len() < cmds.len() {
            match self.reap_one(qid) {
                Some(c) => got.push(c),
                None => break,
            }
        }
        got
    }

    /// Waits a little for the next completion on `qid`; consumes it and
    /// rings the CQ head.
    fn reap_one(&mut self, qid: u16) -> Option<Completion> {
        let mut r = self.rings[usize::from(qid)]?;
        let deadline = Instant::now() + WAIT;
        let mut got = None;
        while Instant::now() < deadline {
            let mut b = [0u8; 16];
            if self
                .mem
                .read(GuestAddress(r.base_cq + u64::from(r.head) * 16), &mut b)
                .is_err()
            {
                break;
            }
            let cqe = Completion::read_from_bytes(&b).ok()?;
            if cqe.phase() == r.phase {
                r.head += 1;
                if r.head >= r.size {
                    r.head = 0;
                    r.phase = !r.phase;
                }
                self.doorbell(2 * u32::from(qid) + 1, r.head);
                got = Some(cqe);
                break;
            }
            std::thread::yield_now();
        }
        self.rings[usize::from(qid)] = Some(r);
        got
    }
}

fn mode(sel: u8) -> DoorbellMode {
    match sel % 4 {
        0 => DoorbellMode::Trap,
        1 => DoorbellMode::Shadow,
        2 => DoorbellMode::Adaptive,
        _ => DoorbellMode::MmapPoll,
    }
}

/// Runs one input. Panics (the fuzzer's crash) only if the controller does.
pub fn run(input: Input) {
    let config = ControllerConfig {
        max_io_queues: MAX_IO_QUEUES,
        msix_vectors: 5,
        mqes_z: 255,
        mdts: 3,
        workers: if input.two_workers { 2 } else { 1 },
        doorbells: mode(input.mode),
        idle_poll: Duration::from_micros(50),
        ready_timeout: Duration::from_millis(500),
        nvm_capacity: 1 << 20,
        max_namespaces: 8,
        ..ControllerConfig::default()
    };
    // Mode bit 2: namespace 1 keeps commands in flight (asynchronous).
    let ns1: Arc<dyn BlockDevice> = if input.mode & 4 != 0 {
        // Each request finishes on the next poll, newest first, at most 4
        // in flight per queue (the next are given back).
        Arc::new(HeldRam::new(256 << 10, Release::NextPoll { limit: 4 }).with_volatile_cache())
    } else {
        Arc::new(RamDevice::new(256 << 10))
    };
    // Namespace 3: zoned, 16 zones of 16 KiB, at most 2 open and 3 active,
    // the last zone read only.
    let mut zones = ZonedConfig::new(16 << 10);
    zones.max_open = Some(2);
    zones.max_active = Some(3);
    zones.read_only_zones = 1;
    let namespaces = vec![
        NamespaceConfig::new(1, 512, ns1),
        NamespaceConfig::new(2, 4096, Arc::new(NullDevice::new(1 << 30))),
        NamespaceConfig::new(3, 4096, Arc::new(RamDevice::new(256 << 10))).with_zoned(Some(zones)),
        // Namespace 4: 512+64, separate metadata with PI Type 1 last, so
        // MPTR is read and written (a contiguous buffer or, PSDT 10b, a
        // metadata SGL) and PRINFO checked.
        NamespaceConfig::new(4, 512, Arc::new(RamDevice::new(256 << 10)))
            .with_format(2)
            .with_protection(Some(Protection {
                pi_type: PiType::Type1,
                first: false,
            })),
    ];
    let Ok(ctrl) = Controller::new(config, namespaces) else {
        return;
    };
    let mem = Arc::new(VecMemory::new(MEM as usize));
    let irq = Arc::new(CountingIrq::default());
    ctrl.attach(mem.clone(), irq.clone());
    let mut host = Host {
        ctrl,
        mem,
        irq,
        rings: [None; MAX_IO_QUEUES as usize + 1],
        cid: 0,
    };
    for op in input.ops.into_iter().take(256) {
        step(&mut host, op);
    }
    // Dropping the controller joins its workers: a worker that never
    // returns is a hang the fuzzer reports as a timeout.
}

fn step(host: &mut Host, op: Op) {
    match op {
        Op::Enable { asqs_z, acqs_z } => {
            let (s, c) = (u16::from(asqs_z.max(1)), u16::from(acqs_z.max(1)));
            host.write32(0x14, 0);
            host.write32(0x24, u32::from(s) | (u32::from(c) << 16));
            host.ctrl.mmio_write(0x28, &ASQ.to_le_bytes());
            host.ctrl.mmio_write(0x30, &ACQ.to_le_bytes());
            let _ = host.mem.zero(GuestAddress(ACQ), 0x1000);
            host.write32(0x14, 0x0046_0001);
            host.rings = [None; MAX_IO_QUEUES as usize + 1];
            host.rings[0] = Some(Ring {
                base_sq: ASQ,
                base_cq: ACQ,
                size: s + 1,
                tail: 0,
                head: 0,
                phase: true,
            });
        }
        Op::WriteReg {
            offset,
            value,
            wide,
        } => {
            let off = u64::from(offset) % 0x4000;
            if wide {
                host.ctrl.mmio_write(off, &value.to_le_bytes());
            } else {
                host.ctrl.mmio_write(off, &(value as u32).to_le_bytes());
            }
        }
        Op::ReadReg { offset, len } => {
            let mut buf = [0u8; 8];
            let len = usize::from(len % 9);
            host.ctrl
                .mmio_read(u64::from(offset) % 0x4000, &mut buf[..len]);
        }
        Op::WriteMem { addr, bytes } => {
            let n = bytes.len().min(4096);
            let _ = host.mem.write(GuestAddress(addr.get()), &bytes[..n]);
        }
        Op::PrpList { addr, entries } => {
            let list: Vec<u8> = entries
                .iter()
                .take(512)
                .flat_map(|e| e.get().to_le_bytes())
                .collect();
            let _ = host.mem.write(GuestAddress(addr.get()), &list);
        }
        Op::Admin(sqe) => {
            host.submit(0, sqe.command());
        }
        Op::Io { qid, sqe } => {
            let qid = u16::from(qid % (MAX_IO_QUEUES as u8)) + 1;
            host.submit(qid, sqe.command());
        }
        Op::Rw {
            qid,
            write,
            fua,
            slba,
            nlb_z,
            page,
            count,
        } => {
            let qid = u16::from(qid % (MAX_IO_QUEUES as u8)) + 1;
            let nlb_z = nlb_z % 8;
            let cmds: Vec<Command> = (0..u64::from(count % 8) + 1)
                .map(|i| {
                    let mut c = Command::new(if write { 0x01 } else { 0x02 }, 0);
                    c.nsid = U32::new(1);
                    c.prp1 = U64::new(DATA + (u64::from(page) + i) % 64 * PAGE);
                    c.cdw10 = U32::new(u32::from(slba) + i as u32 * 8);
                    c.cdw12 = U32::new(u32::from(nlb_z) | if fua { 1 << 30 } else { 0 });
                    c
                })
                .collect();
            host.submit_all(qid, &cmds);
        }
        Op::CreatePair {
            qid,
            size_z,
            iv,
            irq,
        } => {
            let qid = u16::from(qid % (MAX_IO_QUEUES as u8)) + 1;
            let size = u16::from(size_z.max(1)) + 1;
            let sq = IOQ + u64::from(qid) * 0x4000;
            let cq = sq + 0x2000;
            let _ = host.mem.zero(GuestAddress(cq), 0x2000);
            let mut c = Command::new(0x05, 0);
            c.prp1 = U64::new(cq);
            c.cdw10 = U32::new(u32::from(qid) | (u32::from(size - 1) << 16));
            c.cdw11 = U32::new(1 | (u32::from(irq) << 1) | (u32::from(iv % 8) << 16));
            host.submit(0, c);
            let mut c = Command::new(0x01, 0);
            c.prp1 = U64::new(sq);
            c.cdw10 = U32::new(u32::from(qid) | (u32::from(size - 1) << 16));
            c.cdw11 = U32::new(1 | (u32::from(qid) << 16));
            host.submit(0, c);
            host.rings[usize::from(qid)] = Some(Ring {
                base_sq: sq,
                base_cq: cq,
                size,
                tail: 0,
                head: 0,
                phase: true,
            });
        }
        Op::DbbufConfig {
            shadow,
            eventidx,
            canonical,
        } => {
            let mut c = Command::new(0x7C, 0);
            let (s, e) = if canonical {
                (SHADOW, EVENTIDX)
            } else {
                (shadow.get(), eventidx.get())
            };
            c.prp1 = U64::new(s);
            c.prp2 = U64::new(e);
            host.submit(0, c);
        }
        Op::Doorbell { index, value } => {
            host.write32(0x1000 + 4 * u64::from(index % 0x400), value);
        }
        Op::Shadow { index, value } => {
            let _ = host
                .mem
                .store_u32(GuestAddress(SHADOW + 4 * u64::from(index % 16)), value);
        }
        Op::Poll { micros } => {
            std::thread::sleep(Duration::from_micros(u64::from(micros % 200)));
        }
        Op::Reset => host.ctrl.reset(),
        Op::Reattach => {
            host.ctrl.detach();
            host.ctrl.attach(host.mem.clone(), host.irq.clone());
            host.rings = [None; MAX_IO_QUEUES as usize + 1];
        }
        Op::IntxMode(on) => host.irq.intx.store(on, std::sync::atomic::Ordering::SeqCst),
    }
}
