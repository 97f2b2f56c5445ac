//! I/O queue creation at initialisation: the fast way (each queue pair
//! created once, mapped to a thread and an interrupt vector from what the
//! driver already knows) and, for comparison only, the old "learning" way
//! the nvmewin fast-init patch removed (create every queue, send one read
//! per queue to learn which CPU its interrupt lands on, delete every queue,
//! create them all again).
//!
//! Admin commands at initialisation for N I/O queue pairs, fast:
//! Identify Controller, Set Features Number of Queues, Doorbell Buffer
//! Config (when used), N × (Create I/O CQ + Create I/O SQ), Set Features
//! Asynchronous Event Configuration and one Asynchronous Event Request (when
//! the controller offers Namespace Attribute Notices), Identify active
//! namespace list, and per namespace Identify CNS 00h, plus CNS 08h (NSTAT)
//! on an NVMe 2.0 controller: `2N + 6 + #ns` (× 2 for NSTAT), plus retries
//! of namespaces that are not ready yet. Interrupt Coalescing is not sent.
//! Learning adds N reads, N × (Delete I/O SQ + Delete I/O CQ) and N ×
//! (Create I/O CQ + Create I/O SQ): `6N + 6 + …` admin commands, `7N + …`
//! commands in all (the patch's 224 for N = 32).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use vnvme_spec::command::Command;
use vnvme_spec::regs::Doorbell;
use vnvme_spec::NvmOpcode;

use crate::access::DeviceAccess;
use crate::admin::{self, AdminQueue};
use crate::doorbell::ShadowBuffers;
use crate::error::Error;
use crate::irq::{io_vector, QueueIrq};
use crate::namespace::Namespace;
use crate::queue::QueuePair;

/// How I/O queues are set up at initialisation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InitMode {
    /// Each queue pair is created once, on the vector [`io_vector`] gives.
    #[default]
    Fast,
    /// The old way, for comparison only: create, one read per queue to
    /// "learn" the mapping, delete all, create again.
    Learning,
}

/// What queue creation needs to know.
pub(crate) struct QueueSetup<'a> {
    pub access: &'a Arc<dyn DeviceAccess>,
    pub count: u16,
    pub depth: u16,
    pub dstrd: u8,
    pub max_transfer: usize,
    pub shadow: Option<&'a ShadowBuffers>,
    /// Granted MSI-X vectors (0: polled).
    pub vectors: u16,
    pub timeout: Duration,
}

impl QueueSetup<'_> {
    /// Allocates queue pairs `1..=count` and creates each on the device
    /// (CQ, then the SQ completing to it).
    pub fn create(&self, admin: &mut AdminQueue) -> Result<Vec<QueuePair>, Error> {
        let mut pairs = Vec::with_capacity(usize::from(self.count));
        for qid in 1..=self.count {
            let mut qp =
                QueuePair::new(self.access, qid, self.depth, self.dstrd, self.max_transfer)?;
            if let Some(bufs) = self.shadow {
                // The slots start at zero, like the queue's indexes.
                qp.attach_shadow(bufs)?;
            }
            let vector = io_vector(qid, self.count, self.vectors);
            admin.execute(
                admin::create_io_cq(qid, self.depth, qp.cq_iova(), vector),
                None,
                self.timeout,
            )?;
            admin.execute(
                admin::create_io_sq(qid, self.depth, qp.sq_iova(), qid),
                None,
                self.timeout,
            )?;
            pairs.push(qp);
        }
        Ok(pairs)
    }

    /// The learning dance on queues `pairs` (already created): one read of
    /// LBA 0 of `ns` per queue (if there is a usable namespace), then
    /// Delete I/O SQ and Delete I/O CQ of every queue, then create them all
    /// again. Returns the new queue pairs and the reads sent.
    pub fn relearn(
        &self,
        admin: &mut AdminQueue,
        mut pairs: Vec<QueuePair>,
        irqs: &[Option<QueueIrq>],
        ns: Option<&Namespace>,
    ) -> Result<(Vec<QueuePair>, u64), Error> {
        let mut reads = 0;
        if let Some(ns) = ns {
            let buf = self.access.dma_alloc(ns.lba_size as usize)?;
            for (qp, irq) in pairs.iter_mut().zip(irqs) {
                let mut cmd = Command::new(NvmOpcode::READ.0, 0);
                cmd.nsid = ns.nsid.into();
                let cid = qp.alloc_cid()?;
                cmd.set_cid(cid);
                qp.set_data(&mut cmd, cid, &buf, ns.lba_size as usize)?;
                qp.push(&cmd)?;
                qp.ring()?;
                reads += 1;
                let mut stash = VecDeque::new();
                // Only the cost matters here: what the read returns (and
                // which CPU took the interrupt) is not used.
                let done = qp.wait_for(cid, irq.as_ref(), &mut stash, self.timeout)?;
                if done.is_none() {
                    return Err(Error::CommandTimeout {
                        what: "learning read".into(),
                        qid: qp.qid(),
                        cid,
                        timeout: self.timeout,
                    });
                }
            }
        }
        for qid in 1..=self.count {
            admin.execute(admin::delete_io_sq(qid), None, self.timeout)?;
        }
        for qid in 1..=self.count {
            admin.execute(admin::delete_io_cq(qid), None, self.timeout)?;
        }
        // A mapped doorbell page keeps the old queues' last values, which a
        // polling device would take for the new queues' first: zero them
        // (plain stores, no trap).
        for qid in 1..=self.count {
            for db in [Doorbell::SqTail(qid), Doorbell::CqHead(qid)] {
                let at = db.offset(self.dstrd);
                if self.access.is_mapped(at) {
                    self.access.write32(at, 0)?;
                }
            }
        }
        drop(pairs);
        Ok((self.create(admin)?, reads))
    }
}
