//! The admin queue and builders of the admin commands the driver sends
//! (NVMe 2.0 §5).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use vnvme_spec::cdw::{
    Cdw10CreateIoQueue, Cdw10DeleteIoQueue, Cdw10GetFeatures, Cdw10Identify, Cdw10SetFeatures,
    Cdw11CreateIoCq, Cdw11CreateIoSq,
};
use vnvme_spec::command::Command;
use vnvme_spec::feature::FeatureId;
use vnvme_spec::identify::Cns;
use vnvme_spec::log::{GetLogPage, LogPageId};
use vnvme_spec::{AdminOpcode, Completion, Status};

use crate::access::DmaBuffer;
use crate::error::Error;
use crate::irq::QueueIrq;
use crate::queue::{QueuePair, REAP_CAP};

/// Identify (§5.17): CNS in CDW10 7:0, CNTID in 31:16.
pub fn identify(cns: Cns, nsid: u32) -> Command {
    let mut c = Command::new(AdminOpcode::IDENTIFY.0, 0);
    c.nsid = nsid.into();
    c.cdw10 = Cdw10Identify::new().with_cns(cns).into();
    c
}

/// Set Features (§5.27): FID in CDW10 7:0, value in CDW11.
pub fn set_features(fid: FeatureId, cdw11: u32) -> Command {
    let mut c = Command::new(AdminOpcode::SET_FEATURES.0, 0);
    c.cdw10 = Cdw10SetFeatures::new().with_fid(fid).into();
    c.cdw11 = cdw11.into();
    c
}

/// Get Features (§5.15): FID in CDW10 7:0, SEL in 10:8.
pub fn get_features(fid: FeatureId, sel: u8) -> Command {
    let mut c = Command::new(AdminOpcode::GET_FEATURES.0, 0);
    c.cdw10 = Cdw10GetFeatures::new()
        .with_fid(fid)
        .with_sel(sel & 7)
        .into();
    c
}

/// Create I/O Completion Queue (§5.4): physically contiguous (PC = 1);
/// interrupts enabled on `vector` if given (IEN, IV).
pub fn create_io_cq(qid: u16, size: u16, iova: u64, vector: Option<u16>) -> Command {
    let mut c = Command::new(AdminOpcode::CREATE_IO_CQ.0, 0);
    c.prp1 = iova.into();
    c.cdw10 = Cdw10CreateIoQueue::new()
        .with_qid(qid)
        .with_qsize_z(size - 1)
        .into();
    c.cdw11 = Cdw11CreateIoCq::new()
        .with_pc(true)
        .with_ien(vector.is_some())
        .with_iv(vector.unwrap_or(0))
        .into();
    c
}

/// Create I/O Submission Queue (§5.5): physically contiguous, medium
/// priority (ignored under round robin), completing to `cqid`.
pub fn create_io_sq(qid: u16, size: u16, iova: u64, cqid: u16) -> Command {
    let mut c = Command::new(AdminOpcode::CREATE_IO_SQ.0, 0);
    c.prp1 = iova.into();
    c.cdw10 = Cdw10CreateIoQueue::new()
        .with_qid(qid)
        .with_qsize_z(size - 1)
        .into();
    c.cdw11 = Cdw11CreateIoSq::new().with_pc(true).with_cqid(cqid).into();
    c
}

/// Doorbell Buffer Config (§5.8): PRP1 = shadow doorbell buffer, PRP2 =
/// EventIdx buffer, one memory page each.
pub fn doorbell_buffer_config(shadow_iova: u64, event_idx_iova: u64) -> Command {
    let mut c = Command::new(AdminOpcode::DOORBELL_BUFFER_CONFIG.0, 0);
    c.prp1 = shadow_iova.into();
    c.prp2 = event_idx_iova.into();
    c
}

/// Get Log Page (§5.16) of `bytes` (a multiple of 4) from offset 0;
/// `rae` retains the asynchronous event (else reading the log clears it).
pub fn get_log_page(lid: LogPageId, nsid: u32, bytes: u32, rae: bool) -> Command {
    let mut c = Command::new(AdminOpcode::GET_LOG_PAGE.0, 0);
    c.nsid = nsid.into();
    let [d10, d11, d12, d13] = GetLogPage {
        lid,
        lsp: 0,
        rae,
        lsi: 0,
        dwords: (bytes / 4).max(1),
        offset: 0,
    }
    .to_cdws();
    c.cdw10 = d10.into();
    c.cdw11 = d11.into();
    c.cdw12 = d12.into();
    c.cdw13 = d13.into();
    c
}

/// Asynchronous Event Request (§5.2): completes when the controller has an
/// event to report, with the event in dword 0.
pub fn async_event_request() -> Command {
    Command::new(AdminOpcode::ASYNC_EVENT_REQUEST.0, 0)
}

/// Delete I/O Submission Queue (§5.7).
pub fn delete_io_sq(qid: u16) -> Command {
    let mut c = Command::new(AdminOpcode::DELETE_IO_SQ.0, 0);
    c.cdw10 = Cdw10DeleteIoQueue::new().with_qid(qid).into();
    c
}

/// Delete I/O Completion Queue (§5.6).
pub fn delete_io_cq(qid: u16) -> Command {
    let mut c = Command::new(AdminOpcode::DELETE_IO_CQ.0, 0);
    c.cdw10 = Cdw10DeleteIoQueue::new().with_qid(qid).into();
    c
}

/// Admin queue state, kept behind the controller's mutex.
#[derive(Debug)]
pub(crate) struct AdminQueue {
    pub qp: QueuePair,
    pub interrupt: Option<QueueIrq>,
    stash: VecDeque<Completion>,
    /// Admin commands submitted since initialisation began.
    pub commands: u64,
    /// The same, by opcode.
    pub by_opcode: BTreeMap<AdminOpcode, u64>,
    /// The outstanding Asynchronous Event Request, if any.
    aer_cid: Option<u16>,
    /// Completions of Asynchronous Event Requests not yet handled.
    events: VecDeque<Completion>,
}

impl AdminQueue {
    pub fn new(qp: QueuePair, interrupt: Option<QueueIrq>) -> Self {
        Self {
            qp,
            interrupt,
            stash: VecDeque::new(),
            commands: 0,
            by_opcode: BTreeMap::new(),
            aer_cid: None,
            events: VecDeque::new(),
        }
    }

    /// Submits `cmd` (its CID and, with `data`, its PRPs are filled in here)
    /// and waits for its completion. A completion with an error status is
    /// returned as [`Error::AdminCommand`].
    pub fn execute(
        &mut self,
        cmd: Command,
        data: Option<&DmaBuffer>,
        timeout: Duration,
    ) -> Result<Completion, Error> {
        let opcode = AdminOpcode(cmd.opcode());
        let cqe = self.submit_wait(cmd, data.map(|b| (b.iova(), b.len())), timeout)?;
        let status = cqe.status();
        if !status.is_success() {
            return Err(Error::AdminCommand { opcode, status });
        }
        Ok(cqe)
    }

    /// Writes `cmd` with a fresh CID (and PRPs for `data`) and rings; returns the CID.
    fn submit(&mut self, mut cmd: Command, data: Option<(u64, usize)>) -> Result<u16, Error> {
        let cid = self.qp.alloc_cid()?;
        cmd.set_cid(cid);
        let prepared = match data {
            Some((iova, len)) => self.qp.set_data_at(&mut cmd, cid, iova, len),
            None => Ok(()),
        }
        .and_then(|()| self.qp.push(&cmd));
        if let Err(e) = prepared {
            self.qp.free_cid(cid);
            return Err(e);
        }
        self.commands += 1;
        *self.by_opcode.entry(AdminOpcode(cmd.opcode())).or_default() += 1;
        self.qp.ring()?;
        Ok(cid)
    }

    /// Submits `cmd` with PRPs for `len` bytes at device address `iova`
    /// when `data` is `Some((iova, len))`, and waits for its completion,
    /// whatever its status. On an error before submission nothing is sent.
    pub fn submit_wait(
        &mut self,
        cmd: Command,
        data: Option<(u64, usize)>,
        timeout: Duration,
    ) -> Result<Completion, Error> {
        // Completions of commands that timed out earlier are of no use now;
        // an asynchronous event is, and is kept.
        self.keep_events();
        self.stash.clear();
        let opcode = AdminOpcode(cmd.opcode());
        let cid = self.submit(cmd, data)?;
        let cqe = self
            .qp
            .wait_for(cid, self.interrupt.as_ref(), &mut self.stash, timeout)?;
        self.keep_events();
        cqe.ok_or_else(|| Error::CommandTimeout {
            what: format!("admin command {opcode}"),
            qid: 0,
            cid,
            timeout,
        })
    }

    /// Submits an Asynchronous Event Request unless one is outstanding. It
    /// completes whenever the controller has an event: its completion is
    /// kept for [`take_events`](Self::take_events).
    pub fn arm_async_event(&mut self) -> Result<(), Error> {
        if self.aer_cid.is_none() {
            self.aer_cid = Some(self.submit(async_event_request(), None)?);
        }
        Ok(())
    }

    /// Whether an Asynchronous Event Request is outstanding.
    pub fn async_event_armed(&self) -> bool {
        self.aer_cid.is_some()
    }

    /// Moves the completion of the outstanding AER from the stash to the events.
    fn keep_events(&mut self) {
        let Some(cid) = self.aer_cid else { return };
        if let Some(pos) = self.stash.iter().position(|c| c.cid() == cid) {
            if let Some(cqe) = self.stash.remove(pos) {
                self.events.push_back(cqe);
                self.aer_cid = None;
            }
        }
    }

    /// Reaps without waiting (up to `wait` for an interrupt when nothing is
    /// there) and returns the completions of Asynchronous Event Requests
    /// seen so far. An AER must be re-armed by the caller.
    pub fn take_events(&mut self, wait: Duration) -> Result<Vec<Completion>, Error> {
        let deadline = std::time::Instant::now() + wait;
        let mut backoff = crate::queue::Backoff::default();
        loop {
            let ticket = self.interrupt.as_ref().map_or(0, QueueIrq::ticket);
            self.qp.reap(&mut self.stash, REAP_CAP)?;
            self.keep_events();
            let now = std::time::Instant::now();
            if !self.events.is_empty() || self.aer_cid.is_none() || now >= deadline {
                return Ok(self.events.drain(..).collect());
            }
            self.qp.idle(
                self.interrupt.as_ref(),
                ticket,
                deadline - now,
                &mut backoff,
            )?;
        }
    }

    /// Counts by opcode name, for reports.
    pub fn by_opcode_names(&self) -> BTreeMap<String, u64> {
        named(&self.by_opcode)
    }
}

/// `counts` keyed by the opcode's spec name (or `opcode-0xNN`).
pub(crate) fn named(counts: &BTreeMap<AdminOpcode, u64>) -> BTreeMap<String, u64> {
    counts.iter().map(|(op, n)| (op.to_string(), *n)).collect()
}

/// Namespace Not Ready that may be retried: status code type generic, code
/// 0x82, DNR clear. (0x82 of another type is something else, e.g. a media
/// error; DNR set means the same command will fail again.)
pub fn is_retryable_not_ready(status: Status) -> bool {
    status.same_code(Status::NAMESPACE_NOT_READY) && !status.dnr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_queue_commands_encode_zero_based_sizes_and_vectors() {
        let cq = create_io_cq(3, 64, 0x1000, Some(2));
        assert_eq!(cq.opcode(), 0x05);
        assert_eq!(cq.cdw10.get(), 3 | (63 << 16));
        assert_eq!(cq.cdw11.get(), 1 | 2 | (2 << 16));
        assert_eq!(
            create_io_cq(1, 2, 0, None).cdw11.get(),
            1,
            "polled CQ: IEN clear"
        );
        let sq = create_io_sq(3, 64, 0x2000, 3);
        assert_eq!(sq.opcode(), 0x01);
        assert_eq!(sq.cdw10.get(), 3 | (63 << 16));
        assert_eq!(sq.cdw11.get(), 1 | (3 << 16));
        assert_eq!(sq.prp1.get(), 0x2000);
    }

    #[test]
    fn doorbell_buffer_config_puts_the_pages_in_prp1_and_prp2() {
        let c = doorbell_buffer_config(0x4000, 0x5000);
        assert_eq!(c.opcode(), 0x7C);
        assert_eq!((c.prp1.get(), c.prp2.get()), (0x4000, 0x5000));
    }

    #[test]
    fn identify_and_features_encode_cdw10() {
        let id = identify(Cns::ACTIVE_NAMESPACES, 0);
        assert_eq!((id.opcode(), id.cdw10.get()), (0x06, 2));
        let sf = set_features(FeatureId::NUMBER_OF_QUEUES, 0x0003_0003);
        assert_eq!(
            (sf.opcode(), sf.cdw10.get(), sf.cdw11.get()),
            (0x09, 7, 0x0003_0003)
        );
        assert_eq!(
            get_features(FeatureId::NUMBER_OF_QUEUES, 3).cdw10.get(),
            7 | (3 << 8)
        );
    }
}
