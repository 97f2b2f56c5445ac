//! NVMe passthrough: any 64-byte command, admin or I/O, with an optional
//! data buffer, synchronous or asynchronous (DESIGN.md, "Passthrough").
//!
//! * Synchronous: [`Controller::admin_passthru`] and [`IoQueue::passthru`]
//!   submit one command, wait for it, and return its
//!   [`PassthruCompletion`] (dword 0, dword 1, status with DNR and More),
//!   like Linux's `NVME_IOCTL_ADMIN_CMD` / `NVME_IOCTL_IO_CMD`. One command
//!   is in flight per caller by construction.
//! * Asynchronous: [`AsyncQueue`] owns an [`IoQueue`] and works like an
//!   io_uring with `uring_cmd` passthrough: [`prepare`](AsyncQueue::prepare)
//!   many commands, each tagged by a caller `u64` token, make them visible
//!   with one doorbell ([`submit`](AsyncQueue::submit)), and reap the
//!   completions later in batches, by polling ([`reap`](AsyncQueue::reap))
//!   or by interrupt when the queue has one ([`wait`](AsyncQueue::wait)).
//!   Data lives in *registered* buffers: DMA memory registered once
//!   ([`register_buffers`](AsyncQueue::register_buffers), already mapped to
//!   the device) and named per command by index, offset and length, so
//!   nothing is allocated or mapped per command. Submission and completion
//!   happen on the owning thread: no lock.
//!
//! Device errors are statuses in the completion, never `Err`. Misuse is
//! refused with an `Err` before anything reaches the device (no SQ entry
//! written, no doorbell, no CID kept): a transfer larger than MDTS
//! ([`Error::TransferTooLarge`]), a buffer whose direction contradicts the
//! opcode's data transfer bits 1:0 ([`Error::WrongDirection`]), a buffer
//! index out of range ([`Error::NoSuchBuffer`]), a range outside its buffer
//! ([`Error::BufferTooSmall`]), a full queue ([`Error::QueueFull`]).
//!
//! The command's CID and PRP1/PRP2 are always replaced by the driver's (the
//! PRPs only when a buffer is given); every other field is sent as given.

use std::time::Duration;

use vnvme_spec::command::Command;
use vnvme_spec::{Completion, Status};

use crate::access::DmaBuffer;
use crate::controller::Controller;
use crate::error::Error;
use crate::io::IoQueue;
use crate::queue::Deadline;

/// Which way a passthrough buffer's data goes, in the terms of the opcode's
/// data transfer bits 1:0 (NVMe 2.0 §5, Figure 138; NVM Command Set Figure 17).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirection {
    /// 01b: host to controller (nvme-cli `--write`).
    HostToController,
    /// 10b: controller to host (nvme-cli `--read`).
    ControllerToHost,
    /// 11b: both ways.
    Bidirectional,
}

impl DataDirection {
    /// The direction bits 1:0 of `opcode` name; `None` for 00b (no data).
    pub fn of_opcode(opcode: u8) -> Option<Self> {
        match opcode & 0x3 {
            0b01 => Some(Self::HostToController),
            0b10 => Some(Self::ControllerToHost),
            0b11 => Some(Self::Bidirectional),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::HostToController => "host to controller",
            Self::ControllerToHost => "controller to host",
            Self::Bidirectional => "both directions",
        }
    }
}

/// The data buffer of a synchronous passthrough command: `len` bytes of
/// `buf` from `offset`.
#[derive(Debug, Clone, Copy)]
pub struct PassthruData<'a> {
    pub buf: &'a DmaBuffer,
    pub offset: usize,
    pub len: usize,
    pub direction: DataDirection,
}

impl<'a> PassthruData<'a> {
    /// The first `len` bytes of `buf`, filled by the controller.
    pub fn read(buf: &'a DmaBuffer, len: usize) -> Self {
        Self {
            buf,
            offset: 0,
            len,
            direction: DataDirection::ControllerToHost,
        }
    }

    /// The first `len` bytes of `buf`, sent to the controller.
    pub fn write(buf: &'a DmaBuffer, len: usize) -> Self {
        Self {
            buf,
            offset: 0,
            len,
            direction: DataDirection::HostToController,
        }
    }
}

/// A completion as passthrough reports it (NVMe 2.0 §4.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassthruCompletion {
    /// Dword 0, command specific (nvme-cli's "result").
    pub result: u32,
    /// Dword 1, command specific.
    pub dw1: u32,
    /// Status code type and code, with DNR and More.
    pub status: Status,
}

impl PassthruCompletion {
    pub fn is_success(&self) -> bool {
        self.status.is_success()
    }

    /// Do Not Retry.
    pub fn dnr(&self) -> bool {
        self.status.dnr()
    }

    /// More information in the Error Information log.
    pub fn more(&self) -> bool {
        self.status.more()
    }

    /// Dword 0 on success, else the status.
    pub fn into_result(self) -> Result<u32, Status> {
        if self.is_success() {
            Ok(self.result)
        } else {
            Err(self.status)
        }
    }
}

impl From<&Completion> for PassthruCompletion {
    fn from(c: &Completion) -> Self {
        Self {
            result: c.dw0.get(),
            dw1: c.dw1.get(),
            status: c.status(),
        }
    }
}

/// Checks a passthrough transfer of `len` bytes from `offset` of `buf`
/// against the opcode and the transfer limit; returns what the PRPs must
/// describe, `None` for no data. Refuses misuse before anything is sent.
fn check_transfer(
    opcode: u8,
    buf: &DmaBuffer,
    offset: usize,
    len: usize,
    direction: DataDirection,
    max_transfer: usize,
) -> Result<Option<(u64, usize)>, Error> {
    if len == 0 {
        return Ok(None);
    }
    match DataDirection::of_opcode(opcode) {
        None => {
            return Err(Error::WrongDirection {
                opcode,
                expected: "no data",
                given: direction.name(),
            })
        }
        Some(DataDirection::Bidirectional) => {}
        Some(expected) if expected == direction => {}
        Some(expected) => {
            return Err(Error::WrongDirection {
                opcode,
                expected: expected.name(),
                given: direction.name(),
            })
        }
    }
    if len > max_transfer {
        return Err(Error::TransferTooLarge {
            len,
            max: max_transfer,
        });
    }
    match offset.checked_add(len) {
        Some(end) if end <= buf.len() => {}
        _ => {
            return Err(Error::BufferTooSmall {
                len: offset.saturating_add(len),
                buffer: buf.len(),
            })
        }
    }
    let iova = buf.iova() + offset as u64;
    // PRP1 may carry an offset, but a dword aligned one (§4.1.1).
    if iova & 3 != 0 {
        return Err(crate::prp::PrpError::Misaligned(iova).into());
    }
    Ok(Some((iova, len)))
}

fn check_data(
    opcode: u8,
    data: Option<&PassthruData<'_>>,
    max_transfer: usize,
) -> Result<Option<(u64, usize)>, Error> {
    match data {
        None => Ok(None),
        Some(d) => check_transfer(opcode, d.buf, d.offset, d.len, d.direction, max_transfer),
    }
}

impl Controller {
    /// Sends any admin command and waits for its completion (synchronous
    /// passthrough). A device error is the completion's status, not an `Err`.
    pub fn admin_passthru(
        &self,
        cmd: Command,
        data: Option<PassthruData<'_>>,
    ) -> Result<PassthruCompletion, Error> {
        let data = check_data(cmd.opcode(), data.as_ref(), self.max_transfer())?;
        Ok(PassthruCompletion::from(&self.admin_raw(cmd, data)?))
    }
}

impl IoQueue {
    /// Sends any I/O command on this queue and waits for its completion
    /// (synchronous passthrough). Completions of other commands reaped
    /// meanwhile are kept for [`poll`](Self::poll). A device error is the
    /// completion's status, not an `Err`.
    pub fn passthru(
        &mut self,
        cmd: Command,
        data: Option<PassthruData<'_>>,
    ) -> Result<PassthruCompletion, Error> {
        let data = check_data(cmd.opcode(), data.as_ref(), self.max_transfer())?;
        let cid = self.enqueue_data(cmd, data)?;
        self.ring()?;
        Ok(PassthruCompletion::from(&self.wait_cid(cid)?))
    }
}

/// Where a command's data is: `len` bytes from `offset` of registered
/// buffer `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferSlice {
    pub index: usize,
    pub offset: usize,
    pub len: usize,
    pub direction: DataDirection,
}

impl BufferSlice {
    /// `len` bytes at the start of buffer `index`, filled by the controller.
    pub fn read(index: usize, len: usize) -> Self {
        Self {
            index,
            offset: 0,
            len,
            direction: DataDirection::ControllerToHost,
        }
    }

    /// `len` bytes at the start of buffer `index`, sent to the controller.
    pub fn write(index: usize, len: usize) -> Self {
        Self {
            index,
            offset: 0,
            len,
            direction: DataDirection::HostToController,
        }
    }
}

/// One reaped asynchronous command: the caller's token and the completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncCompletion {
    pub token: u64,
    pub completion: PassthruCompletion,
}

/// Asynchronous passthrough on one I/O queue pair, owned by one thread.
///
/// ```no_run
/// # use vnvme_driver::{AsyncQueue, BufferSlice, IoQueue, DmaBuffer};
/// # use vnvme_spec::cdw::Cdw12ReadWrite;
/// # use vnvme_spec::command::Command;
/// # fn f(q: IoQueue, bufs: Vec<DmaBuffer>) -> Result<(), vnvme_driver::Error> {
/// let mut aq = AsyncQueue::new(q);
/// let first = aq.register_buffers(bufs);
/// for i in 0..8u64 {
///     let mut read = Command::new(0x02, 0);
///     read.nsid = 1.into();
///     read.set_slba(i * 8);
///     read.cdw12 = Cdw12ReadWrite::new().with_nlb_z(7).into(); // 8 blocks
///     aq.prepare(read, Some(BufferSlice::read(first + i as usize, 4096)), i)?;
/// }
/// aq.submit()?; // one doorbell for the batch
/// let mut done = Vec::new();
/// while aq.in_flight() > 0 {
///     aq.wait(&mut done, 1, std::time::Duration::from_secs(5))?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct AsyncQueue {
    q: IoQueue,
    /// The token of each command in flight, indexed by CID.
    tokens: Vec<u64>,
    buffers: Vec<DmaBuffer>,
    /// Commands prepared since the last doorbell.
    prepared: usize,
}

impl AsyncQueue {
    /// Takes over `q`. Commands already in flight on it complete untagged
    /// (token 0): submit on a quiet queue.
    pub fn new(q: IoQueue) -> Self {
        Self {
            tokens: vec![0; usize::from(q.size())],
            q,
            buffers: Vec::new(),
            prepared: 0,
        }
    }

    /// Gives the queue back, with the registered buffers. Commands still in
    /// flight complete through [`IoQueue::poll`], without their tokens.
    pub fn into_inner(self) -> (IoQueue, Vec<DmaBuffer>) {
        (self.q, self.buffers)
    }

    /// The underlying queue (counters, namespaces, size).
    pub fn queue(&self) -> &IoQueue {
        &self.q
    }

    /// Registers DMA buffers (already reachable by the device) for
    /// [`BufferSlice`]s to name; returns the index of the first one.
    pub fn register_buffers(&mut self, bufs: impl IntoIterator<Item = DmaBuffer>) -> usize {
        let first = self.buffers.len();
        self.buffers.extend(bufs);
        first
    }

    /// Registered buffer `index`.
    pub fn buffer(&self, index: usize) -> Option<&DmaBuffer> {
        self.buffers.get(index)
    }

    /// Buffers registered.
    pub fn registered(&self) -> usize {
        self.buffers.len()
    }

    /// Commands that can be in flight at once (queue size - 1).
    pub fn capacity(&self) -> usize {
        usize::from(self.q.size()).saturating_sub(1)
    }

    /// Commands prepared or submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.q.outstanding()
    }

    /// Commands that can still be prepared before the queue is full.
    pub fn space(&self) -> usize {
        self.capacity().saturating_sub(self.in_flight())
    }

    /// Whether [`wait`](Self::wait) sleeps on an interrupt (else it polls).
    pub fn has_interrupt(&self) -> bool {
        self.q.has_interrupt()
    }

    /// Writes `cmd` to the submission queue, tagged `token`, with its data
    /// in `data`, without ringing the doorbell; returns the CID given to it.
    /// Misuse is refused with nothing written (see the module comment).
    pub fn prepare(
        &mut self,
        cmd: Command,
        data: Option<BufferSlice>,
        token: u64,
    ) -> Result<u16, Error> {
        let prp = match data {
            None => None,
            Some(s) => {
                let buf = self.buffers.get(s.index).ok_or(Error::NoSuchBuffer {
                    index: s.index,
                    count: self.buffers.len(),
                })?;
                check_transfer(
                    cmd.opcode(),
                    buf,
                    s.offset,
                    s.len,
                    s.direction,
                    self.q.max_transfer(),
                )?
            }
        };
        let cid = self.q.enqueue_data(cmd, prp)?;
        match self.tokens.get_mut(usize::from(cid)) {
            Some(t) => *t = token,
            // CIDs are below the queue size, which sized the table.
            None => return Err(Error::InvalidRequest(format!("CID {cid} out of range"))),
        }
        self.prepared += 1;
        Ok(cid)
    }

    /// Rings the doorbell once for every command prepared since the last
    /// call; returns how many that was.
    pub fn submit(&mut self) -> Result<usize, Error> {
        self.q.ring()?;
        Ok(std::mem::take(&mut self.prepared))
    }

    /// [`prepare`](Self::prepare) and [`submit`](Self::submit) one command.
    pub fn submit_one(
        &mut self,
        cmd: Command,
        data: Option<BufferSlice>,
        token: u64,
    ) -> Result<u16, Error> {
        let cid = self.prepare(cmd, data, token)?;
        self.submit()?;
        Ok(cid)
    }

    /// Moves up to `max` completions into `out` without waiting (one CQ head
    /// doorbell for the batch); returns how many.
    pub fn reap(&mut self, out: &mut Vec<AsyncCompletion>, max: usize) -> Result<usize, Error> {
        let mut tagged = Tagged {
            tokens: &self.tokens,
            out,
        };
        self.q.poll_into(&mut tagged, max)
    }

    /// Reaps until at least `min` completions (at most what is in flight)
    /// are in `out`, waiting up to `timeout` on the interrupt, or polling
    /// with backoff on a queue without one. Returns how many were reaped;
    /// [`Error::WaitTimeout`] if none came.
    ///
    /// This is [`IoQueue::wait`]'s loop, with each completion tagged as it
    /// comes off the ring: a completion already posted is reaped without
    /// reading the clock, and one waited for costs the same clock reads and
    /// sleeps as the block API's (it used to cost two more clock reads and
    /// a copy of every completion, issue 37).
    pub fn wait(
        &mut self,
        out: &mut Vec<AsyncCompletion>,
        min: usize,
        timeout: Duration,
    ) -> Result<usize, Error> {
        let min = min.clamp(1, self.in_flight().max(1));
        let mut deadline = Deadline::new(timeout);
        let mut got = 0;
        while got < min {
            let mut tagged = Tagged {
                tokens: &self.tokens,
                out,
            };
            match self.q.wait_until(&mut tagged, usize::MAX, &mut deadline) {
                Ok(n) => got += n,
                Err(Error::WaitTimeout { .. }) if got > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }
}

/// Where reaped completions go: into the caller's vector, each with the
/// token its CID was prepared with.
struct Tagged<'a> {
    /// Indexed by CID.
    tokens: &'a [u64],
    out: &'a mut Vec<AsyncCompletion>,
}

impl Extend<Completion> for Tagged<'_> {
    fn extend<I: IntoIterator<Item = Completion>>(&mut self, reaped: I) {
        for c in reaped {
            // The reap released only CIDs that were in flight, all below
            // the queue size that sized `tokens`.
            let token = self.tokens.get(usize::from(c.cid())).copied().unwrap_or(0);
            self.out.push(AsyncCompletion {
                token,
                completion: PassthruCompletion::from(&c),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_direction_follows_opcode_bits_1_0() {
        assert_eq!(DataDirection::of_opcode(0x00), None);
        assert_eq!(
            DataDirection::of_opcode(0x01),
            Some(DataDirection::HostToController)
        );
        assert_eq!(
            DataDirection::of_opcode(0x06),
            Some(DataDirection::ControllerToHost)
        );
        assert_eq!(
            DataDirection::of_opcode(0xC3),
            Some(DataDirection::Bidirectional)
        );
    }

    #[test]
    fn completion_reports_dnr_and_more() {
        let status = Status::INVALID_FIELD.with_dnr(true).with_more(true);
        let c = Completion::new(7, 0, 1, 3, true, status);
        let p = PassthruCompletion::from(&c);
        assert_eq!(p.result, 7);
        assert!(p.dnr() && p.more() && !p.is_success());
        assert_eq!(p.into_result(), Err(status));
    }
}
