//! I/O queue pairs: owned by one thread each, no lock on the I/O path.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vnvme_spec::cdw::Cdw12ReadWrite;
use vnvme_spec::command::Command;
use vnvme_spec::{Completion, NvmOpcode};

use crate::access::{DeviceAccess, DmaBuffer};
use crate::error::Error;
use crate::irq::QueueIrq;
use crate::namespace::{Namespace, NamespaceSet};
use crate::queue::{Backoff, Deadline, QueueCounters, QueuePair, REAP_CAP};

mod protected;

pub use protected::MetadataPointer;
use protected::{protect, Meta, MetaBuffers};

/// One I/O submission/completion queue pair (SQ id = CQ id = `qid`).
///
/// Commands are submitted with [`submit`](Self::submit) (one doorbell each)
/// or [`enqueue`](Self::enqueue) + [`ring`](Self::ring) (one doorbell per
/// batch), and reaped with [`poll`](Self::poll) / [`wait`](Self::wait).
/// The data buffer of a command must stay alive until its completion is reaped.
#[derive(Debug)]
pub struct IoQueue {
    qp: QueuePair,
    interrupt: Option<QueueIrq>,
    /// The controller's namespaces as of `ns_version`.
    namespaces: Arc<[Namespace]>,
    ns_set: Arc<NamespaceSet>,
    ns_version: u64,
    /// Completions reaped while a synchronous call waited for another CID.
    pending: VecDeque<Completion>,
    generation: Arc<AtomicU64>,
    my_generation: u64,
    timeout: Duration,
    /// Metadata the queue moves itself, and how protected I/O points at
    /// the caller's.
    meta: MetaBuffers,
}

/// What an I/O queue is made with besides its queue pair.
pub(crate) struct IoQueueParts {
    pub interrupt: Option<QueueIrq>,
    pub ns_set: Arc<NamespaceSet>,
    pub generation: Arc<AtomicU64>,
    pub timeout: Duration,
    pub access: Arc<dyn DeviceAccess>,
    /// Identify Controller SGLS.
    pub sgls: u32,
}

impl IoQueue {
    pub(crate) fn new(qp: QueuePair, parts: IoQueueParts) -> Self {
        let IoQueueParts {
            interrupt,
            ns_set,
            generation,
            timeout,
            access,
            sgls,
        } = parts;
        let my_generation = generation.load(Ordering::Relaxed);
        let (ns_version, namespaces) = ns_set.snapshot();
        Self {
            qp,
            interrupt,
            namespaces,
            ns_set,
            ns_version,
            pending: VecDeque::new(),
            generation,
            my_generation,
            timeout,
            meta: MetaBuffers::new(access, sgls),
        }
    }

    pub fn qid(&self) -> u16 {
        self.qp.qid()
    }

    /// Queue size in entries (at most `size - 1` commands in flight).
    pub fn size(&self) -> u16 {
        self.qp.size()
    }

    /// Commands submitted and not yet reaped.
    pub fn outstanding(&self) -> usize {
        self.qp.outstanding()
    }

    /// Whether completions arrive by interrupt (else [`wait`](Self::wait) polls).
    pub fn has_interrupt(&self) -> bool {
        self.interrupt.is_some()
    }

    /// The MSI-X vector this queue's completions raise, if any.
    pub fn interrupt_vector(&self) -> Option<u16> {
        self.interrupt.as_ref().map(QueueIrq::vector)
    }

    /// Whether that vector is shared with other queues.
    pub fn shares_vector(&self) -> bool {
        self.interrupt.as_ref().is_some_and(QueueIrq::is_shared)
    }

    /// Largest data transfer of one command, in bytes.
    pub fn max_transfer(&self) -> usize {
        self.qp.max_transfer()
    }

    pub fn counters(&self) -> QueueCounters {
        self.qp.counters
    }

    /// Takes the controller's namespace list again if a rescan changed it.
    fn sync_namespaces(&mut self) {
        if self.ns_set.version() != self.ns_version {
            (self.ns_version, self.namespaces) = self.ns_set.snapshot();
        }
    }

    /// A namespace this queue can do I/O to (as of its last read or write,
    /// or [`refresh_namespaces`](Self::refresh_namespaces)).
    pub fn namespace(&self, nsid: u32) -> Result<&Namespace, Error> {
        self.namespaces
            .iter()
            .find(|n| n.nsid == nsid)
            .ok_or(Error::NoSuchNamespace(nsid))
    }

    /// Takes namespaces found by a rescan since this queue last looked
    /// (reads and writes do this themselves).
    pub fn refresh_namespaces(&mut self) {
        self.sync_namespaces();
    }

    fn check_live(&self) -> Result<(), Error> {
        // Relaxed: a reset happens under the controller's `&mut`, which the
        // caller must order with this thread anyway; this only catches misuse.
        if self.generation.load(Ordering::Relaxed) != self.my_generation {
            return Err(Error::StaleQueue(self.qid()));
        }
        Ok(())
    }

    /// Writes `cmd` to the SQ without ringing the doorbell. The command's
    /// CID is replaced by a free one, which is returned; PRPs are as given.
    pub fn enqueue(&mut self, cmd: Command) -> Result<u16, Error> {
        self.enqueue_data(cmd, None)
    }

    fn push_or_free(&mut self, cid: u16, cmd: &Command) -> Result<(), Error> {
        self.qp.push(cmd).inspect_err(|_| self.qp.free_cid(cid))
    }

    /// Like [`enqueue`](Self::enqueue), with PRPs built for `len` bytes at
    /// device address `iova` when `data` is `Some((iova, len))` (the
    /// passthrough path: the caller has checked the buffer). On error
    /// nothing is written and no CID stays reserved.
    pub(crate) fn enqueue_data(
        &mut self,
        mut cmd: Command,
        data: Option<(u64, usize)>,
    ) -> Result<u16, Error> {
        self.check_live()?;
        let cid = self.qp.alloc_cid()?;
        cmd.set_cid(cid);
        if let Some((iova, len)) = data {
            if let Err(e) = self.qp.set_data_at(&mut cmd, cid, iova, len) {
                self.qp.free_cid(cid);
                return Err(e);
            }
        }
        self.push_or_free(cid, &cmd)?;
        Ok(cid)
    }

    /// Rings the SQ tail doorbell for everything enqueued since the last ring.
    pub fn ring(&mut self) -> Result<(), Error> {
        self.qp.ring()
    }

    /// Submits one command (a passthrough: PRPs as given) and rings.
    pub fn submit(&mut self, cmd: Command) -> Result<u16, Error> {
        let cid = self.enqueue(cmd)?;
        self.ring()?;
        Ok(cid)
    }

    /// Submits several commands with a single doorbell write.
    pub fn submit_batch(&mut self, cmds: &[Command]) -> Result<Vec<u16>, Error> {
        let mut cids = Vec::with_capacity(cmds.len());
        for cmd in cmds {
            match self.enqueue(*cmd) {
                Ok(cid) => cids.push(cid),
                Err(e) => {
                    // What was enqueued must still reach the device.
                    self.ring()?;
                    return Err(e);
                }
            }
        }
        self.ring()?;
        Ok(cids)
    }

    /// Enqueues a read or write of `nblocks` blocks at `lba` to/from `buf`
    /// (PRPs built here, bounded by MDTS), without ringing. On a namespace
    /// with protection information the controller generates and checks
    /// the PI (PRACT), whatever the format (see [`MetadataPointer`]'s
    /// module for where the metadata goes).
    pub fn enqueue_rw(
        &mut self,
        opcode: NvmOpcode,
        nsid: u32,
        lba: u64,
        nblocks: u32,
        buf: &DmaBuffer,
    ) -> Result<u16, Error> {
        self.enqueue_rw_pi(opcode, nsid, lba, nblocks, buf, None)
    }

    /// As [`enqueue_rw`](Self::enqueue_rw); with `own_pi` (the metadata
    /// buffer and the application tag) on a namespace with protection
    /// information, the PI moves through that buffer (PRACT 0) and the
    /// controller checks every field the type has.
    fn enqueue_rw_pi(
        &mut self,
        opcode: NvmOpcode,
        nsid: u32,
        lba: u64,
        nblocks: u32,
        buf: &DmaBuffer,
        own_pi: Option<(&DmaBuffer, u16)>,
    ) -> Result<u16, Error> {
        self.check_live()?;
        self.sync_namespaces();
        let ns = self.namespace(nsid)?;
        let (lba_size, protection) = (ns.lba_size, ns.protection);
        if nblocks == 0 || nblocks > 1 << 16 {
            return Err(Error::InvalidRequest(format!(
                "{nblocks} blocks (NLB allows 1 to 65536)"
            )));
        }
        let mut len =
            usize::try_from(u64::from(nblocks) * u64::from(lba_size)).unwrap_or(usize::MAX);
        let mut cmd = Command::new(opcode.0, 0);
        cmd.nsid = nsid.into();
        cmd.set_slba(lba);
        // 1 to 65536 blocks (checked above): NLB, 0's based, fits in 16 bits.
        let nlb_z = u16::try_from(nblocks - 1).unwrap_or(u16::MAX);
        cmd.cdw12 = Cdw12ReadWrite::new().with_nlb_z(nlb_z).into();
        let (meta, meta_len) = match protection {
            Some(pi) => {
                protect(&mut cmd, pi, lba, nlb_z, own_pi.map(|(_, app)| app));
                let meta_len = nblocks as usize * usize::from(pi.ms);
                match own_pi {
                    // Extended LBAs: `buf` holds each block's data and
                    // metadata (the protected calls bounce them so).
                    Some(_) if pi.extended => {
                        len = len.saturating_add(meta_len);
                        (Meta::None, 0)
                    }
                    Some((m, _)) => (Meta::Own(m), meta_len),
                    None if pi.stripped() || pi.extended => (Meta::None, 0),
                    None => (Meta::Queue, meta_len),
                }
            }
            None => (Meta::None, 0),
        };
        let cid = self.qp.alloc_cid()?;
        cmd.set_cid(cid);
        if let Err(e) = self.set_pointers(&mut cmd, cid, (buf, len), meta, meta_len) {
            self.qp.free_cid(cid);
            return Err(e);
        }
        self.push_or_free(cid, &cmd)?;
        Ok(cid)
    }

    /// Submits a read (async: reap with poll/wait).
    pub fn submit_read(
        &mut self,
        nsid: u32,
        lba: u64,
        nblocks: u32,
        buf: &DmaBuffer,
    ) -> Result<u16, Error> {
        let cid = self.enqueue_rw(NvmOpcode::READ, nsid, lba, nblocks, buf)?;
        self.ring()?;
        Ok(cid)
    }

    /// Submits a write (async).
    pub fn submit_write(
        &mut self,
        nsid: u32,
        lba: u64,
        nblocks: u32,
        buf: &DmaBuffer,
    ) -> Result<u16, Error> {
        let cid = self.enqueue_rw(NvmOpcode::WRITE, nsid, lba, nblocks, buf)?;
        self.ring()?;
        Ok(cid)
    }

    /// Reads `nblocks` at `lba` into `buf` and waits for the completion.
    pub fn read(
        &mut self,
        nsid: u32,
        lba: u64,
        nblocks: u32,
        buf: &mut DmaBuffer,
    ) -> Result<Completion, Error> {
        let cid = self.submit_read(nsid, lba, nblocks, buf)?;
        self.complete(cid, NvmOpcode::READ)
    }

    /// Writes `nblocks` at `lba` from `buf` and waits for the completion.
    pub fn write(
        &mut self,
        nsid: u32,
        lba: u64,
        nblocks: u32,
        buf: &DmaBuffer,
    ) -> Result<Completion, Error> {
        let cid = self.submit_write(nsid, lba, nblocks, buf)?;
        self.complete(cid, NvmOpcode::WRITE)
    }

    /// Flushes the volatile write cache of `nsid` and waits.
    pub fn flush(&mut self, nsid: u32) -> Result<Completion, Error> {
        let mut cmd = Command::new(NvmOpcode::FLUSH.0, 0);
        cmd.nsid = nsid.into();
        let cid = self.submit(cmd)?;
        self.complete(cid, NvmOpcode::FLUSH)
    }

    /// Submits `cmd` and waits for its completion (synchronous passthrough).
    /// An error status is returned as the completion, not as an `Err`.
    pub fn execute(&mut self, cmd: Command) -> Result<Completion, Error> {
        let cid = self.submit(cmd)?;
        self.wait_cid(cid)
    }

    fn complete(&mut self, cid: u16, opcode: NvmOpcode) -> Result<Completion, Error> {
        let cqe = self.wait_cid(cid)?;
        if !cqe.status().is_success() {
            return Err(Error::IoCommand {
                qid: self.qid(),
                opcode,
                status: cqe.status(),
            });
        }
        Ok(cqe)
    }

    /// Waits for the completion of `cid`; other completions reaped meanwhile
    /// are kept for the next [`poll`](Self::poll).
    pub fn wait_cid(&mut self, cid: u16) -> Result<Completion, Error> {
        let timeout = self.timeout;
        self.qp
            .wait_for(cid, self.interrupt.as_ref(), &mut self.pending, timeout)?
            .ok_or_else(|| Error::CommandTimeout {
                what: "I/O command".to_string(),
                qid: self.qp.qid(),
                cid,
                timeout,
            })
    }

    /// Moves up to `max` completions into `out` without waiting; writes the
    /// CQ head doorbell once if any were reaped from the ring.
    pub fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize, Error> {
        self.poll_into(out, max)
    }

    /// [`poll`](Self::poll) into any sink: the asynchronous passthrough tags
    /// each completion with its token as it comes off the ring, with no
    /// copy in between.
    pub(crate) fn poll_into(
        &mut self,
        out: &mut impl Extend<Completion>,
        max: usize,
    ) -> Result<usize, Error> {
        let max = max.min(REAP_CAP);
        let mut n = 0;
        while n < max {
            match self.pending.pop_front() {
                Some(c) => out.extend(Some(c)),
                None => break,
            }
            n += 1;
        }
        if n < max {
            n += self.qp.reap(out, max - n)?;
        }
        Ok(n)
    }

    /// Like [`poll`](Self::poll), but waits up to `timeout` (interrupt or
    /// polling with backoff) for at least one completion.
    pub fn wait(
        &mut self,
        out: &mut Vec<Completion>,
        max: usize,
        timeout: Duration,
    ) -> Result<usize, Error> {
        self.wait_until(out, max, &mut Deadline::new(timeout))
    }

    /// [`wait`](Self::wait) until `deadline`. The block and the
    /// asynchronous passthrough waits share this loop (and [`Deadline`]'s
    /// clock reads): a QD 1 command costs both the same.
    pub(crate) fn wait_until(
        &mut self,
        out: &mut impl Extend<Completion>,
        max: usize,
        deadline: &mut Deadline,
    ) -> Result<usize, Error> {
        let mut backoff = Backoff::default();
        loop {
            let ticket = self.interrupt.as_ref().map_or(0, QueueIrq::ticket);
            let n = self.poll_into(out, max)?;
            if n > 0 {
                return Ok(n);
            }
            let left = deadline.left();
            if left.is_zero() {
                return Err(Error::WaitTimeout {
                    qid: self.qid(),
                    timeout: deadline.timeout(),
                });
            }
            self.qp
                .idle(self.interrupt.as_ref(), ticket, left, &mut backoff)?;
        }
    }
}
