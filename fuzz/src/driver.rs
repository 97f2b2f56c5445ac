//! The driver against a hostile device: register values (CAP, VS, CSTS) and
//! completions come from the input — wrong CIDs, phases, SQ heads, statuses,
//! duplicate and unsolicited entries, and hostile Identify data. The device
//! follows the driver's queues (it reads its SQEs and learns I/O queue
//! addresses from Create commands) only so that its lies land where the
//! driver looks.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use parking_lot::Mutex;
use vnvme_driver::access::NoMapper;
use vnvme_driver::{
    AccessError, Controller, DeviceAccess, DmaBuffer, DmaPool, InitOptions, Interrupt, PassthruData,
};
use vnvme_spec::{Command, Completion, Status};
use zerocopy::{FromBytes, IntoBytes};

/// Which CQ slot a scripted completion is written to.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Slot {
    Next,
    /// Skips ahead (or wraps) by this much.
    Skip(u8),
}

/// A completion the device posts for the next command it fetches.
#[derive(Arbitrary, Debug, Clone)]
pub struct Reply {
    pub dw0: u32,
    /// `None`: the SQ head the device really has.
    pub sq_head: Option<u16>,
    pub sqid: u16,
    /// `None`: the command's own CID.
    pub cid: Option<u16>,
    pub status: u16,
    pub wrong_phase: bool,
    pub slot: Slot,
    /// Extra copies posted after it (duplicates / unsolicited).
    pub extra: u8,
    /// Hostile bytes copied to the command's PRP1 page first (Identify data,
    /// log pages, read data).
    pub data: Option<Vec<u8>>,
    /// Post nothing at all for this command.
    pub silent: bool,
}

#[derive(Arbitrary, Debug)]
pub enum Op {
    Read {
        nsid: u32,
        lba: u64,
        blocks: u16,
    },
    Write {
        nsid: u32,
        lba: u64,
        blocks: u16,
    },
    Flush {
        nsid: u32,
    },
    Admin {
        opcode: u8,
        nsid: u32,
        cdw10: u32,
        len: u16,
    },
    Io {
        opcode: u8,
        nsid: u32,
        cdw10: u32,
        cdw12: u32,
        len: u16,
    },
    Poll,
}

#[derive(Arbitrary, Debug)]
pub struct Input {
    pub cap: u64,
    pub vs: u32,
    /// CSTS follows CC (RDY = EN, SHST complete on shutdown) xor these bits.
    pub csts_xor: u32,
    /// Values returned by the first CSTS reads instead.
    pub csts_script: Vec<u32>,
    pub shadow_doorbells: bool,
    pub io_queues: u8,
    pub queue_depth: u8,
    pub replies: Vec<Reply>,
    pub ops: Vec<Op>,
}

#[derive(Debug, Clone, Copy)]
struct Queue {
    sq: u64,
    sq_size: u16,
    sq_head: u16,
    cqid: u16,
}

#[derive(Debug, Clone, Copy)]
struct Cq {
    base: u64,
    size: u16,
    tail: u16,
    phase: bool,
}

#[derive(Debug)]
struct State {
    cap: u64,
    vs: u32,
    cc: u32,
    csts_xor: u32,
    csts_script: VecDeque<u32>,
    aqa: u32,
    asq: u64,
    acq: u64,
    sqs: Vec<(u16, Queue)>,
    cqs: Vec<(u16, Cq)>,
    buffers: Vec<DmaBuffer>,
    replies: VecDeque<Reply>,
}

#[derive(Debug)]
struct Hostile {
    pool: DmaPool,
    state: Mutex<State>,
}

impl State {
    fn mem(&self, iova: u64, len: usize) -> Option<(&DmaBuffer, usize)> {
        self.buffers.iter().find_map(|b| {
            let off = usize::try_from(iova.checked_sub(b.iova())?).ok()?;
            (off.checked_add(len)? <= b.len()).then_some((b, off))
        })
    }

    fn read(&self, iova: u64, out: &mut [u8]) -> bool {
        self.mem(iova, out.len())
            .is_some_and(|(b, off)| b.read_bytes(off, out).is_ok())
    }

    fn write(&self, iova: u64, data: &[u8]) -> bool {
        self.mem(iova, data.len())
            .is_some_and(|(b, off)| b.write_bytes(off, data).is_ok())
    }

    fn sq_tail(&mut self, qid: u16, tail: u32) {
        let Some(i) = self.sqs.iter().position(|(q, _)| *q == qid) else {
            return;
        };
        let mut q = self.sqs[i].1;
        let tail = (tail as u16) % q.sq_size.max(1);
        // At most one ring's worth per doorbell.
        for _ in 0..q.sq_size {
            if q.sq_head == tail {
                break;
            }
            let mut b = [0u8; 64];
            if !self.read(q.sq + u64::from(q.sq_head) * 64, &mut b) {
                break;
            }
            q.sq_head = (q.sq_head + 1) % q.sq_size.max(1);
            let Ok(cmd) = Command::read_from_bytes(&b) else {
                break;
            };
            if qid == 0 {
                self.learn(&cmd);
            }
            self.sqs[i].1 = q;
            self.complete(qid, q, &cmd);
        }
        self.sqs[i].1 = q;
    }

    /// Follows Create I/O CQ/SQ so replies can be posted where the driver looks.
    fn learn(&mut self, cmd: &Command) {
        let qid = cmd.cdw10.get() as u16;
        let size = ((cmd.cdw10.get() >> 16) as u16).saturating_add(1);
        match cmd.opcode() {
            0x05 => {
                self.cqs.retain(|(q, _)| *q != qid);
                self.cqs.push((
                    qid,
                    Cq {
                        base: cmd.prp1.get(),
                        size,
                        tail: 0,
                        phase: true,
                    },
                ));
            }
            0x01 => {
                self.sqs.retain(|(q, _)| *q != qid);
                let cqid = (cmd.cdw11.get() >> 16) as u16;
                self.sqs.push((
                    qid,
                    Queue {
                        sq: cmd.prp1.get(),
                        sq_size: size,
                        sq_head: 0,
                        cqid,
                    },
                ));
            }
            _ => {}
        }
    }

    fn complete(&mut self, qid: u16, q: Queue, cmd: &Command) {
        let reply = self.replies.pop_front().unwrap_or(Reply {
            dw0: 0,
            sq_head: None,
            sqid: qid,
            cid: None,
            status: 0,
            wrong_phase: false,
            slot: Slot::Next,
            extra: 0,
            data: None,
            silent: false,
        });
        if let Some(data) = &reply.data {
            let n = data.len().min(4096);
            let _ = self.write(cmd.prp1.get(), &data[..n]);
        }
        if reply.silent {
            return;
        }
        let Some(ci) = self.cqs.iter().position(|(c, _)| *c == q.cqid) else {
            return;
        };
        for _ in 0..=reply.extra.min(8) {
            let mut cq = self.cqs[ci].1;
            if let Slot::Skip(n) = reply.slot {
                let size = cq.size.max(1);
                cq.tail = ((u32::from(cq.tail) + u32::from(n)) % u32::from(size)) as u16;
            }
            let cqe = Completion::new(
                reply.dw0,
                reply.sq_head.unwrap_or(q.sq_head),
                reply.sqid,
                reply.cid.unwrap_or(cmd.cid()),
                cq.phase ^ reply.wrong_phase,
                Status::from_raw(reply.status),
            );
            let _ = self.write(cq.base + u64::from(cq.tail) * 16, cqe.as_bytes());
            cq.tail += 1;
            if cq.tail >= cq.size {
                cq.tail = 0;
                cq.phase = !cq.phase;
            }
            self.cqs[ci].1 = cq;
        }
    }
}

impl DeviceAccess for Hostile {
    fn read32(&self, off: u64) -> Result<u32, AccessError> {
        let mut s = self.state.lock();
        Ok(match off {
            0x00 => s.cap as u32,
            0x04 => (s.cap >> 32) as u32,
            0x08 => s.vs,
            0x14 => s.cc,
            0x1C => match s.csts_script.pop_front() {
                Some(v) => v,
                None => {
                    let cc = s.cc;
                    let shst = if (cc >> 14) & 3 != 0 { 2 << 2 } else { 0 };
                    ((cc & 1) | shst) ^ s.csts_xor
                }
            },
            0x24 => s.aqa,
            _ => 0,
        })
    }

    fn write32(&self, off: u64, value: u32) -> Result<(), AccessError> {
        let mut s = self.state.lock();
        match off {
            0x14 => {
                let was = s.cc & 1;
                s.cc = value;
                if was == 0 && value & 1 == 1 {
                    let (asq, acq, aqa) = (s.asq, s.acq, s.aqa);
                    s.sqs = vec![(
                        0,
                        Queue {
                            sq: asq,
                            sq_size: (aqa & 0xFFF) as u16 + 1,
                            sq_head: 0,
                            cqid: 0,
                        },
                    )];
                    s.cqs = vec![(
                        0,
                        Cq {
                            base: acq,
                            size: ((aqa >> 16) & 0xFFF) as u16 + 1,
                            tail: 0,
                            phase: true,
                        },
                    )];
                }
            }
            0x24 => s.aqa = value,
            0x28 => s.asq = (s.asq & !0xFFFF_FFFF) | u64::from(value),
            0x2C => s.asq = (s.asq & 0xFFFF_FFFF) | (u64::from(value) << 32),
            0x30 => s.acq = (s.acq & !0xFFFF_FFFF) | u64::from(value),
            0x34 => s.acq = (s.acq & 0xFFFF_FFFF) | (u64::from(value) << 32),
            o if o >= 0x1000 && (o - 0x1000) % 8 == 0 => {
                let qid = ((o - 0x1000) / 8) as u16;
                s.sq_tail(qid, value);
            }
            _ => {}
        }
        Ok(())
    }

    fn dma_alloc(&self, size: usize) -> Result<DmaBuffer, AccessError> {
        let b = self.pool.alloc(size)?;
        let mut s = self.state.lock();
        // Bounded: the driver allocates per queue and per op here.
        if s.buffers.len() < 4096 {
            s.buffers.push(b.clone());
        }
        Ok(b)
    }

    fn enable_interrupts(&self, _n: u16) -> Result<Vec<Interrupt>, AccessError> {
        Ok(Vec::new())
    }
}

pub fn run(input: Input) {
    let dev = Arc::new(Hostile {
        pool: DmaPool::new(Arc::new(NoMapper), 1 << 20),
        state: Mutex::new(State {
            cap: input.cap,
            vs: input.vs,
            cc: 0,
            csts_xor: input.csts_xor,
            csts_script: input.csts_script.into_iter().take(64).collect(),
            aqa: 0,
            asq: 0,
            acq: 0,
            sqs: Vec::new(),
            cqs: Vec::new(),
            buffers: Vec::new(),
            replies: input.replies.into_iter().take(256).collect(),
        }),
    });
    let opts = InitOptions {
        io_queues: u16::from(input.io_queues % 4),
        queue_depth: u16::from(input.queue_depth),
        admin_depth: 8,
        interrupts: false,
        ready_timeout: Some(Duration::from_millis(2)),
        admin_timeout: Duration::from_millis(3),
        io_timeout: Duration::from_millis(3),
        max_transfer: 64 << 10,
        shadow_doorbells: input.shadow_doorbells,
        map_doorbells: false,
        ..InitOptions::default()
    };
    let access: Arc<dyn DeviceAccess> = dev.clone();
    let Ok(ctrl) = Controller::init(access.clone(), opts) else {
        return;
    };
    let Ok(mut buf) = access.dma_alloc(64 << 10) else {
        return;
    };
    let mut q = ctrl.take_io_queue(0).ok();
    for op in input.ops.into_iter().take(32) {
        match op {
            Op::Read { nsid, lba, blocks } => {
                if let Some(q) = q.as_mut() {
                    let _ = q.read(nsid, lba, u32::from(blocks), &mut buf);
                }
            }
            Op::Write { nsid, lba, blocks } => {
                if let Some(q) = q.as_mut() {
                    let _ = q.write(nsid, lba, u32::from(blocks), &buf);
                }
            }
            Op::Flush { nsid } => {
                if let Some(q) = q.as_mut() {
                    let _ = q.flush(nsid);
                }
            }
            Op::Admin {
                opcode,
                nsid,
                cdw10,
                len,
            } => {
                let mut c = Command::new(opcode, 0);
                c.nsid = nsid.into();
                c.cdw10 = cdw10.into();
                let len = usize::from(len) % (buf.len() + 1);
                let data = (len > 0).then(|| PassthruData::read(&buf, len));
                let _ = ctrl.admin_passthru(c, data);
            }
            Op::Io {
                opcode,
                nsid,
                cdw10,
                cdw12,
                len,
            } => {
                if let Some(q) = q.as_mut() {
                    let mut c = Command::new(opcode, 0);
                    c.nsid = nsid.into();
                    c.cdw10 = cdw10.into();
                    c.cdw12 = cdw12.into();
                    let len = usize::from(len) % (buf.len() + 1);
                    let data = (len > 0).then(|| PassthruData::read(&buf, len));
                    let _ = q.passthru(c, data);
                }
            }
            Op::Poll => {
                if let Some(q) = q.as_mut() {
                    let mut out = Vec::new();
                    let _ = q.poll(&mut out, 64);
                }
            }
        }
    }
}
