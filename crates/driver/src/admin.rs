//! The admin queue and builders of the admin commands the driver sends
//! (NVMe 2.0 §5).

use std::collections::VecDeque;
use std::time::Duration;

use vnvme_spec::command::Command;
use vnvme_spec::feature::FeatureId;
use vnvme_spec::identify::Cns;
use vnvme_spec::{AdminOpcode, Completion};

use crate::access::{DmaBuffer, Interrupt};
use crate::error::Error;
use crate::queue::QueuePair;

/// Identify (§5.17): CNS in CDW10 7:0, CNTID in 31:16.
pub fn identify(cns: Cns, nsid: u32) -> Command {
    let mut c = Command::new(AdminOpcode::IDENTIFY.0, 0);
    c.nsid = nsid.into();
    c.cdw10 = u32::from(cns.0).into();
    c
}

/// Set Features (§5.27): FID in CDW10 7:0, value in CDW11.
pub fn set_features(fid: FeatureId, cdw11: u32) -> Command {
    let mut c = Command::new(AdminOpcode::SET_FEATURES.0, 0);
    c.cdw10 = u32::from(fid.0).into();
    c.cdw11 = cdw11.into();
    c
}

/// Get Features (§5.15): FID in CDW10 7:0, SEL in 10:8.
pub fn get_features(fid: FeatureId, sel: u8) -> Command {
    let mut c = Command::new(AdminOpcode::GET_FEATURES.0, 0);
    c.cdw10 = (u32::from(fid.0) | (u32::from(sel & 7) << 8)).into();
    c
}

/// Create I/O Completion Queue (§5.4): physically contiguous (PC = 1);
/// interrupts enabled on `vector` if given (IEN, IV).
pub fn create_io_cq(qid: u16, size: u16, iova: u64, vector: Option<u16>) -> Command {
    let mut c = Command::new(AdminOpcode::CREATE_IO_CQ.0, 0);
    c.prp1 = iova.into();
    c.cdw10 = (u32::from(qid) | (u32::from(size - 1) << 16)).into();
    let (ien, iv) = match vector {
        Some(v) => (1u32, u32::from(v)),
        None => (0, 0),
    };
    c.cdw11 = (1 | (ien << 1) | (iv << 16)).into();
    c
}

/// Create I/O Submission Queue (§5.5): physically contiguous, medium
/// priority (ignored under round robin), completing to `cqid`.
pub fn create_io_sq(qid: u16, size: u16, iova: u64, cqid: u16) -> Command {
    let mut c = Command::new(AdminOpcode::CREATE_IO_SQ.0, 0);
    c.prp1 = iova.into();
    c.cdw10 = (u32::from(qid) | (u32::from(size - 1) << 16)).into();
    c.cdw11 = (1 | (u32::from(cqid) << 16)).into();
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

/// Delete I/O Submission Queue (§5.7).
pub fn delete_io_sq(qid: u16) -> Command {
    let mut c = Command::new(AdminOpcode::DELETE_IO_SQ.0, 0);
    c.cdw10 = u32::from(qid).into();
    c
}

/// Delete I/O Completion Queue (§5.6).
pub fn delete_io_cq(qid: u16) -> Command {
    let mut c = Command::new(AdminOpcode::DELETE_IO_CQ.0, 0);
    c.cdw10 = u32::from(qid).into();
    c
}

/// Admin queue state, kept behind the controller's mutex.
#[derive(Debug)]
pub(crate) struct AdminQueue {
    pub qp: QueuePair,
    pub interrupt: Option<Interrupt>,
    stash: VecDeque<Completion>,
    /// Admin commands submitted since initialisation began.
    pub commands: u64,
}

impl AdminQueue {
    pub fn new(qp: QueuePair, interrupt: Option<Interrupt>) -> Self {
        Self {
            qp,
            interrupt,
            stash: VecDeque::new(),
            commands: 0,
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

    /// Submits `cmd` with PRPs for `len` bytes at device address `iova`
    /// when `data` is `Some((iova, len))`, and waits for its completion,
    /// whatever its status. On an error before submission nothing is sent.
    pub fn submit_wait(
        &mut self,
        mut cmd: Command,
        data: Option<(u64, usize)>,
        timeout: Duration,
    ) -> Result<Completion, Error> {
        // Completions of commands that timed out earlier are of no use now.
        self.stash.clear();
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
        self.qp.ring()?;
        let opcode = AdminOpcode(cmd.opcode());
        self.qp
            .wait_for(cid, self.interrupt.as_ref(), &mut self.stash, timeout)?
            .ok_or_else(|| Error::CommandTimeout {
                what: format!("admin command {opcode}"),
                qid: 0,
                cid,
                timeout,
            })
    }
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
