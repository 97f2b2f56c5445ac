//! A scripted device for what the real controller cannot be made to do
//! (the driver is otherwise tested against it: `crates/vnvme/tests/driver`):
//! never set CSTS.RDY; answer Identify Namespace with chosen statuses
//! (Namespace Not Ready as a status, with DNR, media-specific 0x82, Invalid
//! Namespace for an NSID it listed); offer Doorbell Buffer Config and fail
//! it; offer a mapped doorbell page and OACS bit 8 together. Garbage data
//! and lying completions are fuzzed instead (`fuzz/fuzz_targets/driver.rs`).
//!
//! Commands complete synchronously inside the SQ tail doorbell write, with
//! success unless scripted otherwise; queues never wrap in these tests, so
//! the fake neither checks nor handles it beyond phase tracking.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use vnvme_spec::cdw::{Cdw10CreateIoQueue, Cdw10Identify};
use vnvme_spec::command::Command;
use vnvme_spec::identify::{oacs, Cns, IdentifyController, IdentifyNamespace};
use vnvme_spec::regs::{offset, Cap, Cc, Csts, Doorbell};
use vnvme_spec::{AdminOpcode, Completion, Status};
use zerocopy::IntoBytes;

use crate::access::{AccessError, DeviceAccess, DmaBuffer, DmaPool, Interrupt, NoMapper};

#[derive(Debug, Clone, Default)]
pub struct Script {
    /// CSTS.RDY never follows CC.EN.
    pub never_ready: bool,
    /// The VS register.
    pub version: u32,
    /// The active namespace list.
    pub nsids: Vec<u32>,
    /// Identify Namespace (CNS 00h) answers these statuses first, in order.
    pub identify_ns: HashMap<u32, Vec<Status>>,
    /// OACS bit 8 set, and the status Doorbell Buffer Config completes with.
    pub dbbuf: Option<Status>,
    /// The doorbell page is mappable: doorbell writes are stores, not traps.
    pub mapped: bool,
}

#[derive(Debug, Clone, Copy)]
struct Ring {
    base: u64,
    size: u16,
    /// SQ head, or CQ tail.
    index: u16,
    phase: bool,
}

#[derive(Debug, Default)]
struct State {
    script: Script,
    cc: u32,
    aqa: u32,
    asq: u64,
    acq: u64,
    sqs: HashMap<u16, Ring>,
    cqs: HashMap<u16, Ring>,
    buffers: Vec<DmaBuffer>,
    /// Admin opcodes received, in order.
    admin: Vec<u8>,
    /// NSIDs of Identify Namespace (CNS 00h) commands received.
    identify_ns: Vec<u32>,
    /// Doorbell register writes that trapped, and stores to a mapped page.
    traps: u64,
    stores: u64,
}

#[derive(Debug)]
pub struct FakeDevice {
    pool: DmaPool,
    state: Mutex<State>,
}

impl FakeDevice {
    pub fn new(script: Script) -> Arc<Self> {
        Arc::new(Self {
            pool: DmaPool::new(Arc::new(NoMapper), DmaPool::DEFAULT_CHUNK),
            state: Mutex::new(State {
                script,
                ..State::default()
            }),
        })
    }

    pub fn admin_opcodes(&self) -> Vec<u8> {
        self.state.lock().admin.clone()
    }

    pub fn identify_ns(&self) -> Vec<u32> {
        self.state.lock().identify_ns.clone()
    }

    /// (doorbell traps, mapped doorbell stores).
    pub fn doorbells(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.traps, s.stores)
    }
}

impl State {
    fn write(&self, iova: u64, data: &[u8]) {
        for b in &self.buffers {
            if let Some(off) = iova.checked_sub(b.iova()) {
                if b.write_bytes(off as usize, data).is_ok() {
                    return;
                }
            }
        }
    }

    fn read(&self, iova: u64, out: &mut [u8]) {
        for b in &self.buffers {
            if let Some(off) = iova.checked_sub(b.iova()) {
                if b.read_bytes(off as usize, out).is_ok() {
                    return;
                }
            }
        }
    }

    fn sq_tail(&mut self, qid: u16, tail: u16) {
        while let Some(mut sq) = self.sqs.get(&qid).copied().filter(|sq| sq.index != tail) {
            let mut raw = [0u8; 64];
            self.read(sq.base + u64::from(sq.index) * 64, &mut raw);
            sq.index = (sq.index + 1) % sq.size;
            self.sqs.insert(qid, sq);
            let cmd = Command::from_slice(&raw).unwrap_or_default();
            let done = if qid == 0 {
                self.admin(&cmd)
            } else {
                Some((Status::SUCCESS, 0))
            };
            if let Some((status, dw0)) = done {
                self.post(qid, sq.index, &cmd, status, dw0);
            }
        }
    }

    /// Completes on the CQ with the SQ's qid (how the driver pairs them).
    fn post(&mut self, qid: u16, sq_head: u16, cmd: &Command, status: Status, dw0: u32) {
        let Some(cq) = self.cqs.get_mut(&qid) else {
            return;
        };
        let cqe = Completion::new(dw0, sq_head, qid, cmd.cid(), cq.phase, status);
        let at = cq.base + u64::from(cq.index) * 16;
        cq.index = (cq.index + 1) % cq.size;
        cq.phase ^= cq.index == 0;
        self.write(at, cqe.as_bytes());
    }

    /// Runs an admin command; `None` leaves it outstanding.
    fn admin(&mut self, cmd: &Command) -> Option<(Status, u32)> {
        self.admin.push(cmd.opcode());
        let nsid = cmd.nsid.get();
        let queue = Cdw10CreateIoQueue::from(cmd.cdw10);
        let (qid, size) = (queue.qid(), queue.qsize_z().wrapping_add(1));
        let cns = Cdw10Identify::from(cmd.cdw10).cns();
        let ring = Ring {
            base: cmd.prp1.get(),
            size,
            index: 0,
            phase: true,
        };
        let page = match AdminOpcode(cmd.opcode()) {
            AdminOpcode::IDENTIFY if cns == Cns::CONTROLLER => {
                let mut id = IdentifyController::new_boxed();
                if self.script.dbbuf.is_some() {
                    id.oacs = oacs::DOORBELL_BUFFER_CONFIG.into();
                }
                id.nn = self.script.nsids.iter().copied().max().unwrap_or(0).into();
                id.as_bytes().to_vec()
            }
            AdminOpcode::IDENTIFY if cns == Cns::ACTIVE_NAMESPACES => {
                let ids = self.script.nsids.iter().filter(|&&n| n > nsid);
                let mut list: Vec<u8> = ids.flat_map(|n| n.to_le_bytes()).collect();
                list.resize(4096, 0);
                list
            }
            AdminOpcode::IDENTIFY => {
                self.identify_ns.push(nsid);
                let scripted = self.script.identify_ns.get_mut(&nsid);
                if let Some(status) = scripted.filter(|s| !s.is_empty()).map(|s| s.remove(0)) {
                    return Some((status, 0));
                }
                let mut id = IdentifyNamespace::new_boxed();
                id.nsze = 1024.into();
                id.ncap = 1024.into();
                id.lbaf[0].lbads = 12;
                id.as_bytes().to_vec()
            }
            // Number of Queues: grants what was asked (CDW11 echoed).
            AdminOpcode::SET_FEATURES => return Some((Status::SUCCESS, cmd.cdw11.get())),
            AdminOpcode::CREATE_IO_CQ => {
                self.cqs.insert(qid, ring);
                Vec::new()
            }
            AdminOpcode::CREATE_IO_SQ => {
                self.sqs.insert(qid, ring);
                Vec::new()
            }
            AdminOpcode::DOORBELL_BUFFER_CONFIG => {
                let status = self.script.dbbuf.unwrap_or(Status::INVALID_OPCODE);
                return Some((status, 0));
            }
            AdminOpcode::ASYNC_EVENT_REQUEST => return None,
            _ => return Some((Status::INVALID_OPCODE.with_dnr(true), 0)),
        };
        self.write(cmd.prp1.get(), &page);
        Some((Status::SUCCESS, 0))
    }
}

impl DeviceAccess for FakeDevice {
    fn read32(&self, off: u64) -> Result<u32, AccessError> {
        let s = self.state.lock();
        let cap: u64 = Cap::new()
            .with_mqes_z(255)
            .with_cqr(true)
            .with_to(1)
            .with_css(1)
            .into();
        let rdy = Cc::from(s.cc).en() && !s.script.never_ready;
        Ok(match off {
            offset::CAP => cap as u32,
            0x04 => (cap >> 32) as u32,
            offset::VS => s.script.version,
            offset::CC => s.cc,
            offset::CSTS => Csts::new().with_rdy(rdy).into(),
            _ => 0,
        })
    }

    fn write32(&self, off: u64, value: u32) -> Result<(), AccessError> {
        let mut s = self.state.lock();
        match off {
            offset::CC => {
                if Cc::from(value).en() && !Cc::from(s.cc).en() {
                    let (asq, acq, aqa) = (s.asq, s.acq, s.aqa);
                    // AQA: ASQS (11:0) and ACQS (27:16), 0's based.
                    let ring = |base, size_z: u32| Ring {
                        base,
                        size: (size_z & 0xFFF) as u16 + 1,
                        index: 0,
                        phase: true,
                    };
                    s.sqs = HashMap::from([(0, ring(asq, aqa))]);
                    s.cqs = HashMap::from([(0, ring(acq, aqa >> 16))]);
                }
                s.cc = value;
            }
            offset::AQA => s.aqa = value,
            offset::ASQ => s.asq = (s.asq & !0xFFFF_FFFF) | u64::from(value),
            0x2C => s.asq = (s.asq & 0xFFFF_FFFF) | (u64::from(value) << 32),
            offset::ACQ => s.acq = (s.acq & !0xFFFF_FFFF) | u64::from(value),
            0x34 => s.acq = (s.acq & 0xFFFF_FFFF) | (u64::from(value) << 32),
            _ if off >= offset::DOORBELLS => {
                if s.script.mapped {
                    s.stores += 1;
                } else {
                    s.traps += 1;
                }
                if let Some(Doorbell::SqTail(qid)) = Doorbell::decode(off, 0) {
                    s.sq_tail(qid, value as u16);
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn dma_alloc(&self, size: usize) -> Result<DmaBuffer, AccessError> {
        let buf = self.pool.alloc(size)?;
        self.state.lock().buffers.push(buf.clone());
        Ok(buf)
    }

    fn enable_interrupts(&self, _: u16) -> Result<Vec<Interrupt>, AccessError> {
        Ok(Vec::new())
    }

    fn map_registers(&self) -> Result<bool, AccessError> {
        Ok(self.state.lock().script.mapped)
    }

    fn is_mapped(&self, off: u64) -> bool {
        self.state.lock().script.mapped && (offset::DOORBELLS..0x2000).contains(&off)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod waits;
