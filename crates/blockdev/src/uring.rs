//! io_uring plumbing for the `file` backend, and the only module allowed
//! `unsafe`: an operation that points at a buffer is sound only if the
//! buffer stays where it is until the kernel is done with it.
//!
//! * A [`Ring`] is one io_uring and a fixed table of slots. Starting an
//!   operation moves its [`Data`] (an [`IoBuf`], or a [`MappedBuf`] that
//!   holds guest memory mapped) into a slot, and the ring hands it back
//!   only after the operation's completion has been reaped
//!   ([`Ring::finish`]): nothing outside this module can move, resize or
//!   free a buffer the kernel may use, nor let go of mapped memory it
//!   writes. Dropping a ring waits for every operation still in the
//!   kernel; if the ring fails so that this cannot be known, the ring and
//!   its buffers are leaked instead (mapped memory then stays mapped).
//! * Mapped memory in one region is read or written with one plain
//!   operation; across several, with a vectored one whose iovec array is
//!   the slot's own, kept as long as the data.
//! * A [`Lane`] is a one-slot ring and a bounce buffer, for the synchronous
//!   path: each operation is submitted and waited for.
//!
//! Operations are queued, then handed to the kernel together with one
//! `io_uring_enter` ([`Ring::commit`]); one the kernel did not take when
//! it took others (a partial submit) is given again. A submit that fails
//! leaves its entries in the submission queue, where the next
//! `io_uring_enter` would start them. The ring then marks itself broken
//! and never submits again (waiting submits nothing), so those entries
//! never run: their buffers can be handed back unused, and their
//! operations complete with the error, as any other completion.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use io_uring::{opcode, squeue, types, EnterFlags, IoUring};

use crate::{Data, IoBuf, MappedBuf};

/// One io_uring operation. For reads and writes, `at..at+len` is the part
/// of the operation's data read into or written from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Read {
        fd: RawFd,
        offset: u64,
        at: usize,
        len: u32,
    },
    Write {
        fd: RawFd,
        offset: u64,
        at: usize,
        len: u32,
        /// RWF_DSYNC: durable when it completes.
        dsync: bool,
    },
    /// fdatasync (IORING_OP_FSYNC with IORING_FSYNC_DATASYNC).
    Datasync { fd: RawFd },
    Fallocate {
        fd: RawFd,
        offset: u64,
        len: u64,
        mode: i32,
    },
}

/// The submission entry for `op`; a read or write points at `at..at+len`
/// of `data`, checked to lie inside it, through `iovecs` if that takes
/// more than one region of mapped memory.
fn entry(op: Op, data: &mut Data, iovecs: &mut Iovecs) -> io::Result<squeue::Entry> {
    Ok(match op {
        Op::Read {
            fd,
            offset,
            at,
            len,
        } => match target(data, at, len, true, iovecs)? {
            Target::One(ptr) => opcode::Read::new(types::Fd(fd), ptr, len)
                .offset(offset)
                .build(),
            Target::Vector(iov, n) => opcode::Readv::new(types::Fd(fd), iov, n)
                .offset(offset)
                .build(),
        },
        Op::Write {
            fd,
            offset,
            at,
            len,
            dsync,
        } => {
            let flags = if dsync { libc::RWF_DSYNC } else { 0 };
            match target(data, at, len, false, iovecs)? {
                Target::One(ptr) => opcode::Write::new(types::Fd(fd), ptr.cast_const(), len)
                    .offset(offset)
                    .rw_flags(flags)
                    .build(),
                Target::Vector(iov, n) => opcode::Writev::new(types::Fd(fd), iov, n)
                    .offset(offset)
                    .rw_flags(flags)
                    .build(),
            }
        }
        Op::Datasync { fd } => opcode::Fsync::new(types::Fd(fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
        Op::Fallocate {
            fd,
            offset,
            len,
            mode,
        } => opcode::Fallocate::new(types::Fd(fd), len)
            .offset(offset)
            .mode(mode)
            .build(),
    })
}

/// Where a read or write goes: one run of memory, or `n` iovecs.
enum Target {
    One(*mut u8),
    Vector(*const libc::iovec, u32),
}

fn past_the_end() -> io::Error {
    io::Error::other("operation past the end of its buffer")
}

/// The memory of `at..at+len` of `data`, checked to lie in it; `write`:
/// the kernel writes it (a read), so mapped memory must allow that.
fn target(
    data: &mut Data,
    at: usize,
    len: u32,
    write: bool,
    iovecs: &mut Iovecs,
) -> io::Result<Target> {
    match data {
        Data::Buf(buf) => at
            .checked_add(len as usize)
            .and_then(|end| buf.get_mut(at..end))
            .map(|b| Target::One(b.as_mut_ptr()))
            .ok_or_else(past_the_end),
        Data::Mapped(mem) => mapped_target(mem, at, len as usize, write, iovecs),
    }
}

fn mapped_target(
    mem: &MappedBuf,
    at: usize,
    len: usize,
    write: bool,
    iovecs: &mut Iovecs,
) -> io::Result<Target> {
    if write && !mem.writable() {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    iovecs.0.clear();
    iovecs.0.extend(
        mem.slice(at, len)
            .ok_or_else(past_the_end)?
            .map(|r| libc::iovec {
                iov_base: r.addr as *mut libc::c_void,
                iov_len: r.len,
            }),
    );
    match iovecs.0.as_slice() {
        [one] => Ok(Target::One(one.iov_base.cast())),
        many => {
            let n = u32::try_from(many.len())
                .ok()
                .filter(|&n| n <= IOV_MAX)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
            Ok(Target::Vector(many.as_ptr(), n))
        }
    }
}

/// Most iovecs in one operation (the kernel's UIO_MAXIOV).
const IOV_MAX: u32 = 1024;

/// A slot's iovec array: the kernel may read it until the operation
/// completes, so it lives beside the slot and is only rewritten when the
/// slot starts another operation.
#[derive(Debug, Default)]
struct Iovecs(Vec<libc::iovec>);

// SAFETY: the iovecs hold addresses for the kernel; nothing here
// dereferences them, so moving the array to another thread is as safe as
// moving the numbers.
unsafe impl Send for Iovecs {}

/// Who owns a slot's data.
#[derive(Debug)]
enum Slot {
    Free,
    /// Its entry is in the submission queue: the kernel may take it at the
    /// next `io_uring_enter` that submits, so the data is treated as the
    /// kernel's already.
    Queued(Data),
    /// Submitted, completion not reaped: the kernel may read or write the
    /// data, which must not move, change size, be freed or (mapped
    /// memory) be let go of.
    InKernel(Data),
    /// Completion reaped (or its entry failed to be submitted, and never
    /// will be): the data is ours until the slot is restarted or finished.
    Reaped(Data),
}

/// A fault a test injects into the next [`Ring::commit`]: the kernel is
/// asked to take only `take` of the queued entries (a partial submit),
/// and then, if `errno` is set, the call fails with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubmitFault {
    pub take: usize,
    pub errno: Option<i32>,
}

/// What one [`Ring::commit`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Committed {
    /// `io_uring_enter` calls that submitted (one, unless the kernel took
    /// fewer entries than given).
    pub enters: u64,
    /// Entries that failed to be submitted: their slots complete with
    /// the error (see [`Ring::reap`]).
    pub failed: usize,
}

/// An io_uring with at most `depth` operations in flight, one per slot; an
/// operation's `user_data` is its slot index.
///
/// Operations are queued ([`queue`](Self::queue)) and handed to the kernel
/// together by [`commit`](Self::commit), one `io_uring_enter` for all. An
/// entry the kernel did not take (the call failed) completes with the
/// error through [`reap`](Self::reap), like any other, and the ring is
/// then broken (see the module doc).
pub(crate) struct Ring {
    /// Dropped by hand, after every operation has completed, or leaked.
    ring: ManuallyDrop<IoUring>,
    slots: Box<[Slot]>,
    /// Indexed by slot.
    iovecs: Box<[Iovecs]>,
    in_kernel: usize,
    /// Slots whose entries are in the submission queue, in queue order
    /// (the kernel takes entries in that order).
    queued: VecDeque<usize>,
    /// Slots whose entries failed to be submitted, with the negated errno,
    /// reaped before the kernel's completions.
    failed: VecDeque<(usize, i32)>,
    /// A failed submit left entries in the submission queue: never enter
    /// the kernel with submissions again, so that they never run.
    broken: bool,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("depth", &self.slots.len())
            .field("in_kernel", &self.in_kernel)
            .field("queued", &self.queued.len())
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl Ring {
    /// A ring for `depth` operations in flight. The submission queue holds
    /// them all, and the completion queue (twice as large) can never
    /// overflow, since each slot has at most one completion pending.
    pub(crate) fn new(depth: usize) -> io::Result<Self> {
        // A depth beyond u32 is the conversion's only failure.
        let entries = u32::try_from(depth.max(1)).map_err(|_| io::ErrorKind::InvalidInput)?;
        Ok(Self {
            ring: ManuallyDrop::new(IoUring::new(entries)?),
            slots: (0..depth.max(1)).map(|_| Slot::Free).collect(),
            iovecs: (0..depth.max(1)).map(|_| Iovecs::default()).collect(),
            in_kernel: 0,
            queued: VecDeque::with_capacity(depth.max(1)),
            failed: VecDeque::new(),
            broken: false,
        })
    }

    /// Has the kernel signal `eventfd` whenever it posts a completion.
    pub(crate) fn register_eventfd(&self, eventfd: BorrowedFd<'_>) -> io::Result<()> {
        self.ring.submitter().register_eventfd(eventfd.as_raw_fd())
    }

    /// Turns the registered eventfd's signals on or off
    /// (IORING_CQ_EVENTFD_DISABLED, Linux 5.8). A completion posted while
    /// they are off signals nothing, even after: turn them on, then look.
    pub(crate) fn set_eventfd_enabled(&mut self, on: bool) {
        let cq = self.ring.completion();
        if on {
            cq.enable_eventfd();
        } else {
            cq.disable_eventfd();
        }
    }

    /// Whether a failed submit broke the ring: it takes nothing more.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Whether no slot holds data (nothing queued, in the kernel or
    /// waiting to be finished).
    pub(crate) fn is_idle(&self) -> bool {
        self.slots.iter().all(|s| matches!(s, Slot::Free))
    }

    /// Starts `op` on `data` in a free slot and returns the slot; `wait`
    /// also waits for a completion (any slot's) in the same system call.
    /// Gives `data` back when no slot is free, the operation does not fit
    /// the data or the kernel did not take it. Commits whatever else was
    /// queued too.
    pub(crate) fn start(
        &mut self,
        op: Op,
        data: Data,
        wait: bool,
    ) -> Result<usize, (Data, io::Error)> {
        let slot = self.queue(op, data)?;
        self.enter_queued(wait, None);
        let Some(at) = self.failed.iter().position(|&(s, _)| s == slot) else {
            return Ok(slot);
        };
        let res = self.failed.remove(at).map_or(-libc::EIO, |(_, res)| res);
        Err((
            self.finish(slot).unwrap_or_else(|| Data::Buf(IoBuf::new())),
            io::Error::from_raw_os_error(res.saturating_neg()),
        ))
    }

    /// Queues `op` on `data` in a free slot and returns the slot; the
    /// kernel gets it at the next [`commit`](Self::commit). Gives `data`
    /// back when no slot is free, the operation does not fit the data or
    /// the ring is broken.
    pub(crate) fn queue(&mut self, op: Op, data: Data) -> Result<usize, (Data, io::Error)> {
        let Some(slot) = self.slots.iter().position(|s| matches!(s, Slot::Free)) else {
            return Err((data, io::Error::other("every io_uring slot is in use")));
        };
        self.slots[slot] = Slot::Reaped(data);
        match self.push(slot, op) {
            Ok(()) => Ok(slot),
            Err(e) => Err((
                self.finish(slot).unwrap_or_else(|| Data::Buf(IoBuf::new())),
                e,
            )),
        }
    }

    /// Queues `op` on the buffer of `slot`, whose completion was reaped
    /// (the rest of a short transfer). On failure the slot stays reaped.
    pub(crate) fn requeue(&mut self, slot: usize, op: Op) -> io::Result<()> {
        self.push(slot, op)
    }

    /// Pushes the entry for `op` on the reaped `slot` into the submission
    /// queue; the slot is then queued.
    fn push(&mut self, slot: usize, op: Op) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::other("io_uring failed earlier"));
        }
        let (Some(Slot::Reaped(data)), Some(iovecs)) =
            (self.slots.get_mut(slot), self.iovecs.get_mut(slot))
        else {
            return Err(io::Error::other("io_uring slot is not reaped"));
        };
        let entry = entry(op, data, iovecs)?.user_data(slot as u64);
        // SAFETY: the entry points, if at all, into the heap storage of the
        // `IoBuf` in `self.slots[slot]` (`target` checked the range), or
        // into the memory its `MappedBuf` holds mapped (checked the same
        // way, and writable for a read), possibly through the slot's
        // iovec array. From here the slot is `Queued`, then `InKernel`
        // once the kernel takes the entry, and data leaves those only
        // through `reap` (its completion has been posted), through
        // `enter_queued` failing it (the kernel did not take the entry,
        // and `broken` is set so the ring never submits again), or by
        // being leaked in `drop`; nothing resizes it meanwhile, moving the
        // `IoBuf` value does not move its storage, the `MappedBuf` keeps
        // its memory mapped while it lives, and the iovec array is only
        // rewritten by the slot's next push.
        let mut pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            // Full (cannot happen: it holds an entry per slot): hand the
            // kernel what is there, then try once more.
            self.enter_queued(false, None);
            if self.broken {
                return Err(io::Error::other("io_uring failed earlier"));
            }
            // SAFETY: as above.
            pushed = unsafe { self.ring.submission().push(&entry) };
        }
        if pushed.is_err() {
            return Err(io::Error::other("io_uring submission queue full"));
        }
        if let Some(s) = self.slots.get_mut(slot) {
            if let Slot::Reaped(data) = std::mem::replace(s, Slot::Free) {
                *s = Slot::Queued(data);
                self.queued.push_back(slot);
            }
        }
        Ok(())
    }

    /// Hands the kernel every queued entry with one `io_uring_enter` (more
    /// only if it takes fewer than given, a partial submit: the rest are
    /// given again). If a call fails, the entries not taken complete with
    /// its error and the ring is broken. `fault`: see [`SubmitFault`].
    pub(crate) fn commit(&mut self, fault: Option<SubmitFault>) -> Committed {
        self.enter_queued(false, fault)
    }

    fn enter_queued(&mut self, wait: bool, mut fault: Option<SubmitFault>) -> Committed {
        let mut done = Committed::default();
        while !self.queued.is_empty() && !self.broken {
            let before = self.ring.submission().len();
            let (give, injected) = match fault.take() {
                Some(f) => (f.take.min(before), f.errno),
                None => (before, None),
            };
            let (min_complete, flags) = if wait {
                (1, EnterFlags::GETEVENTS.bits())
            } else {
                (0, 0)
            };
            // SAFETY: the entries given are those pushed by `push`, whose
            // buffers stay put (see there); no argument is passed.
            let entered = unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(
                    u32::try_from(give).unwrap_or(u32::MAX),
                    min_complete,
                    flags,
                    None,
                )
            };
            done.enters += 1;
            // Whatever the result, the kernel has an entry iff it consumed
            // it, in queue order.
            let taken = before.saturating_sub(self.ring.submission().len());
            for slot in self.queued.drain(..taken.min(self.queued.len())) {
                if let Some(s) = self.slots.get_mut(slot) {
                    if let Slot::Queued(data) = std::mem::replace(s, Slot::Free) {
                        *s = Slot::InKernel(data);
                        self.in_kernel += 1;
                    }
                }
            }
            let error = match (entered, injected) {
                (_, Some(errno)) => io::Error::from_raw_os_error(errno),
                // Interrupted before taking anything: nothing lost, again.
                (Err(e), None) if e.raw_os_error() == Some(libc::EINTR) && taken == 0 => continue,
                (Err(e), None) => e,
                (Ok(_), None) if taken == 0 && give > 0 => {
                    io::Error::other("io_uring took none of the entries")
                }
                // All taken, or a partial submit: give the rest again.
                (Ok(_), None) => continue,
            };
            done.failed += self.fail_queued(&error);
        }
        done
    }

    /// The entries still queued failed to be submitted with `error`: they
    /// stay in the submission queue, so the ring breaks and never submits
    /// again (they never run), and their slots complete with the error.
    fn fail_queued(&mut self, error: &io::Error) -> usize {
        if self.queued.is_empty() {
            return 0;
        }
        self.broken = true;
        let res = error.raw_os_error().unwrap_or(libc::EIO).saturating_neg();
        let mut failed = 0;
        for slot in std::mem::take(&mut self.queued) {
            if let Some(s) = self.slots.get_mut(slot) {
                if let Slot::Queued(data) = std::mem::replace(s, Slot::Free) {
                    *s = Slot::Reaped(data);
                    self.failed.push_back((slot, res));
                    failed += 1;
                }
            }
        }
        failed
    }

    /// The next completion, as `(slot, result)`, without blocking. The
    /// slot's data stays in the ring until [`finish`](Self::finish).
    pub(crate) fn reap(&mut self) -> Option<(usize, i32)> {
        if let Some(failed) = self.failed.pop_front() {
            return Some(failed);
        }
        loop {
            let cqe = self.ring.completion().next()?;
            let slot = usize::try_from(cqe.user_data()).unwrap_or(usize::MAX);
            let Some(s) = self.slots.get_mut(slot) else {
                continue;
            };
            if let Slot::InKernel(data) = std::mem::replace(s, Slot::Free) {
                *s = Slot::Reaped(data);
                self.in_kernel -= 1;
                return Some((slot, cqe.result()));
            }
        }
    }

    /// Whether completions are waiting to be reaped.
    pub(crate) fn has_completions(&mut self) -> bool {
        !self.failed.is_empty() || !self.ring.completion().is_empty()
    }

    /// Frees a reaped slot and hands its data back; `None` if the slot
    /// was not reaped (the kernel may still own its data).
    pub(crate) fn finish(&mut self, slot: usize) -> Option<Data> {
        let s = self.slots.get_mut(slot)?;
        match std::mem::replace(s, Slot::Free) {
            Slot::Reaped(data) => Some(data),
            other => {
                *s = other;
                None
            }
        }
    }

    /// Blocks until a completion is posted (any slot's). Submits nothing:
    /// safe on a broken ring.
    pub(crate) fn wait(&mut self) -> io::Result<()> {
        loop {
            // SAFETY: no entries are submitted (to_submit is 0) and no
            // argument is passed: the call only waits for a completion.
            let entered = unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(
                    0,
                    1,
                    EnterFlags::GETEVENTS.bits(),
                    None,
                )
            };
            match entered {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until the kernel holds no buffer, discarding the results.
    fn drain(&mut self) -> io::Result<()> {
        while self.in_kernel > 0 {
            if self.reap().is_none() {
                self.wait()?;
            }
        }
        Ok(())
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.drain().is_err() {
            // The kernel may still use some data: leak it (buffers, mapped
            // memory still held mapped, iovecs), and the ring
            // (`ManuallyDrop`, so left undropped).
            std::mem::forget(std::mem::take(&mut self.slots));
            std::mem::forget(std::mem::take(&mut self.iovecs));
            return;
        }
        // SAFETY: `self.ring` is dropped once, here, and not used after;
        // every operation has completed, so the buffers (dropped next) are
        // ours alone.
        unsafe { ManuallyDrop::drop(&mut self.ring) }
    }
}

/// Why a [`Lane`] operation failed.
#[derive(Debug)]
pub(crate) enum LaneError {
    /// The operation ran and failed (its negated errno), or never started
    /// because it did not fit the bounce buffer.
    Op(io::Error),
    /// The ring failed: drop the lane (its ring waits for the kernel, or
    /// leaks what the kernel may still use) rather than reuse it.
    Poisoned(io::Error),
}

/// A one-slot ring and its bounce buffer, used by one caller at a time.
#[derive(Debug)]
pub(crate) struct Lane {
    ring: Ring,
    /// Empty (unallocated) while the ring holds it.
    buf: IoBuf,
}

impl Lane {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            ring: Ring::new(1)?,
            buf: IoBuf::new(),
        })
    }

    /// The bounce buffer, `len` bytes long.
    pub(crate) fn buffer(&mut self, len: usize) -> &mut IoBuf {
        self.buf.set_len(len);
        &mut self.buf
    }

    /// Runs `op` on the bounce buffer and waits for it; returns the
    /// operation's non-negative result (bytes transferred for reads and
    /// writes).
    pub(crate) fn run(&mut self, op: Op) -> Result<u32, LaneError> {
        let buf = Data::Buf(std::mem::take(&mut self.buf));
        let slot = match self.ring.start(op, buf, true) {
            Ok(slot) => slot,
            Err((buf, e)) => {
                self.buf = buf.into_buf().unwrap_or_default();
                return Err(if self.ring.broken {
                    LaneError::Poisoned(e)
                } else {
                    LaneError::Op(e)
                });
            }
        };
        let res = loop {
            if let Some((_, res)) = self.ring.reap() {
                break res;
            }
            // On failure the buffer stays in the ring, which keeps it
            // until the kernel is done with it.
            self.ring.wait().map_err(LaneError::Poisoned)?;
        };
        self.buf = self
            .ring
            .finish(slot)
            .and_then(Data::into_buf)
            .unwrap_or_default();
        // A negative result is the kernel's -errno: that is the error.
        u32::try_from(res).map_err(|_| LaneError::Op(io::Error::from_raw_os_error(-res)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_past_its_buffer_is_refused_and_the_buffer_given_back() {
        let mut ring = Ring::new(2).unwrap();
        let op = Op::Read {
            fd: 0,
            offset: 0,
            at: 4000,
            len: 200,
        };
        let (buf, _) = ring
            .start(op, IoBuf::zeroed(4096).into(), false)
            .unwrap_err();
        assert_eq!(buf.len(), 4096);
        assert!(ring.reap().is_none());
        assert!(!ring.broken);
    }

    #[test]
    fn a_full_ring_gives_the_buffer_back() {
        let file = std::fs::File::open("/dev/zero").unwrap();
        let read = Op::Read {
            fd: file.as_raw_fd(),
            offset: 0,
            at: 0,
            len: 4096,
        };
        let mut ring = Ring::new(1).unwrap();
        let slot = ring.start(read, IoBuf::zeroed(4096).into(), false).unwrap();
        let (buf, _) = ring
            .start(read, IoBuf::zeroed(8192).into(), false)
            .unwrap_err();
        assert_eq!(buf.len(), 8192);
        assert_eq!(ring.finish(slot).map(|b| b.len()), None, "still in flight");
        while ring.reap().is_none() {
            ring.wait().unwrap();
        }
        assert_eq!(ring.finish(slot).map(|b| b.len()), Some(4096));
    }
}
