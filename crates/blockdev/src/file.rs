//! The `file` backend: a regular file or a block device, on io_uring.
//!
//! * Requests whose offset and length are multiples of 4 KiB go through a
//!   second descriptor opened with `O_DIRECT` (when the file system allows
//!   it), from a 4 KiB-aligned buffer or from guest memory aligned as the
//!   device wants it (see `backing`); others through the page cache.
//!   Linux keeps the two coherent: a direct write writes back and drops the
//!   cached pages it overlaps. A short transfer's rest is unaligned, so it
//!   goes through the page cache.
//! * The device has a volatile write cache (the page cache, and the disk's
//!   own): [`flush`](BlockDevice::flush) is `fdatasync`, and
//!   [`write_fua`](BlockDevice::write_fua) writes with `RWF_DSYNC`, durable
//!   before it completes.
//! * Deallocate punches a hole (`FALLOC_FL_PUNCH_HOLE | KEEP_SIZE`: on a
//!   block device the kernel zeroes by unmapping, never leaving stale data,
//!   unlike `BLKDISCARD`); where that is not supported it zeroes the range.
//! * The file is locked (`flock(LOCK_EX | LOCK_NB)`, retried for a moment)
//!   for as long as the device or one of its queues has it open, so two
//!   vnvme processes never serve the same file; a block device is also
//!   opened `O_EXCL`, which fails while it is mounted.
//!
//! Two ways in:
//!
//! * [`BlockDevice`]: each call is one io_uring submit-and-wait per piece
//!   of at most 1 MiB, on a lane (ring + bounce buffer) taken from a pool,
//!   so concurrent callers each get their own;
//! * [`AsyncBlockDevice`]: each queue ([`queue`](AsyncBlockDevice::queue),
//!   see the `queue` module) is an io_uring of its own with up to 64
//!   reads, writes and flushes in flight, in the requests' own buffers or
//!   straight to and from the guest memory they carry ([`Data`](crate::Data)).
//!
//! Both go through the same [`Backing`] (descriptors, size, counters),
//! which a queue shares, so a queue keeps working after the device is
//! dropped.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::uring::{Lane, LaneError, Op};
use crate::{check_range, AsyncBlockDevice, BlockDevice, BlockError, BlockQueue, Waker};

mod backing;
mod queue;

use backing::{bump, Backing, Counters, DioAlign};

/// Sizes must be multiples of this (the largest LBA size in use).
pub const SIZE_GRANULE: u64 = 4096;

/// Largest piece one io_uring operation moves: bounds the bounce buffer,
/// and the largest request a queue accepts.
const MAX_IO: usize = 1 << 20;

/// Why a file cannot back a namespace. Each names the path and what to do.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{} does not exist (give a size to create it)", .0.display())]
    NotFound(PathBuf),
    #[error("{} is neither a regular file nor a block device", .0.display())]
    NotAFile(PathBuf),
    #[error("{} is not writable", .0.display())]
    NotWritable(PathBuf, #[source] io::Error),
    #[error("{} is in use by another vnvme, which holds its lock: stop that server or choose another file", .0.display())]
    Locked(PathBuf),
    #[error("{} is busy: mounted, or opened exclusively by another program (or another vnvme)", .0.display())]
    Busy(PathBuf),
    #[error("{} is {size} bytes, smaller than the {needed} bytes requested", path.display())]
    TooSmall {
        path: PathBuf,
        size: u64,
        needed: u64,
    },
    #[error("{} is {size} bytes: a namespace needs a non-zero multiple of {SIZE_GRANULE} bytes", path.display())]
    BadSize { path: PathBuf, size: u64 },
    #[error("opening {}", .0.display())]
    Open(PathBuf, #[source] io::Error),
    #[error("extending {} to {} bytes", .0.display(), .1)]
    Extend(PathBuf, u64, #[source] io::Error),
    /// ENOMEM: the ring does not fit in RLIMIT_MEMLOCK (an unprivileged
    /// process's rings count against it); EPERM: kernel.io_uring_disabled.
    #[error("io_uring is not available (kernel.io_uring_disabled set, or RLIMIT_MEMLOCK too low for its ring: raise `ulimit -l`, LimitMEMLOCK= in a unit)")]
    Uring(#[source] io::Error),
}

/// Operation counts, for tests and statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileCounters {
    /// io_uring reads and writes through the O_DIRECT descriptor.
    pub direct_ops: u64,
    /// io_uring reads and writes through the page cache.
    pub buffered_ops: u64,
    /// Of those (direct or buffered), the ones straight between the file
    /// and mapped guest memory, with no buffer of ours between.
    pub mapped_ops: u64,
    /// Writes with RWF_DSYNC (FUA, or a disabled write cache).
    pub dsync_writes: u64,
    /// fdatasync calls.
    pub flushes: u64,
    /// Ranges deallocated by punching a hole.
    pub holes_punched: u64,
    /// Ranges zeroed by writing zeroes (fallocate unsupported).
    pub zeroes_written: u64,
    /// `io_uring_enter` calls by which the queues hand the kernel their
    /// requests: one per commit (a worker's pass) however many requests
    /// it queued, plus one for each partial submit.
    pub submit_calls: u64,
    /// Commits that failed, completing the requests the kernel did not
    /// take with the error.
    pub submit_failures: u64,
}

/// A namespace stored in a regular file or a block device.
#[derive(Debug)]
pub struct FileDevice {
    path: PathBuf,
    backing: Arc<Backing>,
    block_device: bool,
    lanes: Mutex<Vec<Lane>>,
}

impl FileDevice {
    /// Opens `path` as a namespace.
    ///
    /// * `size: None`: the file must exist; its size (a non-zero multiple of
    ///   4096 bytes) is the namespace's.
    /// * `size: Some(n)`: a missing regular file is created, a smaller one is
    ///   extended (sparsely) to `n` bytes; a larger file or device serves
    ///   its first `n` bytes; a smaller block device is an error.
    pub fn open(path: impl AsRef<Path>, size: Option<u64>) -> Result<Self, FileError> {
        let path = path.as_ref().to_path_buf();
        if let Some(n) = size {
            if n == 0 || !n.is_multiple_of(SIZE_GRANULE) {
                return Err(FileError::BadSize { path, size: n });
            }
        }
        let meta = match std::fs::metadata(&path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(FileError::Open(path, e)),
        };
        let block_device = match &meta {
            None if size.is_none() => return Err(FileError::NotFound(path)),
            None => false,
            Some(m) if m.file_type().is_block_device() => true,
            Some(m) if m.is_file() => false,
            Some(_) => return Err(FileError::NotAFile(path)),
        };
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if block_device {
            // Without O_CREAT, O_EXCL on a block device fails while the
            // kernel (a mounted file system) or another O_EXCL opener has it.
            options.custom_flags(libc::O_EXCL);
        } else {
            options.create(size.is_some());
        }
        let mut file = options.open(&path).map_err(|e| open_error(&path, e))?;
        lock(&file, &path)?;
        let current = if block_device {
            file.seek(SeekFrom::End(0))
                .map_err(|e| FileError::Open(path.clone(), e))?
        } else {
            file.metadata()
                .map_err(|e| FileError::Open(path.clone(), e))?
                .len()
        };
        let size = match size {
            None if current == 0 || !current.is_multiple_of(SIZE_GRANULE) => {
                return Err(FileError::BadSize {
                    path,
                    size: current,
                })
            }
            None => current,
            Some(n) if n <= current => n,
            Some(n) if block_device => {
                return Err(FileError::TooSmall {
                    path,
                    size: current,
                    needed: n,
                })
            }
            Some(n) => {
                file.set_len(n)
                    .map_err(|e| FileError::Extend(path.clone(), n, e))?;
                n
            }
        };
        let direct = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .ok();
        let dio = direct.as_ref().map_or(DioAlign::ASSUMED, DioAlign::of);
        // A ring now, so a kernel without io_uring fails at start, not on
        // the first I/O.
        let lane = Lane::new().map_err(FileError::Uring)?;
        Ok(Self {
            path,
            backing: Arc::new(Backing {
                file,
                direct,
                dio,
                size,
                counters: Counters::default(),
                #[cfg(any(test, feature = "testing"))]
                submit_fault: parking_lot::Mutex::new(None),
            }),
            block_device,
            lanes: Mutex::new(vec![lane]),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// Whether aligned requests bypass the page cache (O_DIRECT).
    pub fn direct_io(&self) -> bool {
        self.backing.direct.is_some()
    }

    /// Counts of the device's operations and its queues'.
    pub fn counters(&self) -> FileCounters {
        let c = &self.backing.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FileCounters {
            direct_ops: get(&c.direct_ops),
            buffered_ops: get(&c.buffered_ops),
            mapped_ops: get(&c.mapped_ops),
            dsync_writes: get(&c.dsync_writes),
            flushes: get(&c.flushes),
            holes_punched: get(&c.holes_punched),
            zeroes_written: get(&c.zeroes_written),
            submit_calls: get(&c.submit_calls),
            submit_failures: get(&c.submit_failures),
        }
    }

    /// Has the next commit of any of this device's queues meet `fault`
    /// (tests: a partial or failed submit).
    #[cfg(any(test, feature = "testing"))]
    pub fn inject_submit_fault(&self, fault: crate::SubmitFault) {
        *self.backing.submit_fault.lock() = Some(fault);
    }

    /// Runs `f` on a lane of its own. A poisoned lane is dropped, not
    /// reused (its ring waits for the kernel or leaks what it may use).
    fn with_lane<R>(
        &self,
        f: impl FnOnce(&mut Lane) -> Result<R, LaneError>,
    ) -> Result<R, BlockError> {
        let popped = self.lanes.lock().pop();
        let mut lane = match popped {
            Some(lane) => lane,
            None => Lane::new().map_err(BlockError::Io)?,
        };
        match f(&mut lane) {
            Ok(r) => {
                self.lanes.lock().push(lane);
                Ok(r)
            }
            Err(LaneError::Op(e)) => {
                self.lanes.lock().push(lane);
                Err(BlockError::Io(e))
            }
            Err(LaneError::Poisoned(e)) => Err(BlockError::Io(e)),
        }
    }

    /// Writes `buf` at `offset` in pieces of at most [`MAX_IO`].
    fn write_all(&self, offset: u64, buf: &[u8], dsync: bool) -> Result<(), BlockError> {
        check_range(offset, buf.len() as u64, self.backing.size)?;
        if dsync {
            bump(&self.backing.counters.dsync_writes);
        }
        for (i, piece) in buf.chunks(MAX_IO).enumerate() {
            let pos = offset + (i * MAX_IO) as u64;
            let mut fd = self.backing.fd_for(pos, piece.len());
            self.with_lane(|lane| {
                lane.buffer(piece.len()).copy_from_slice(piece);
                let mut done = 0usize;
                while done < piece.len() {
                    let n = lane.run(Op::Write {
                        fd,
                        offset: pos + done as u64,
                        at: done,
                        len: (piece.len() - done) as u32,
                        dsync,
                    })?;
                    if n == 0 {
                        return Err(LaneError::Op(io::ErrorKind::WriteZero.into()));
                    }
                    done += n as usize;
                    // A short direct write leaves an unaligned rest.
                    fd = self.backing.buffered_fd();
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn fallocate(&self, offset: u64, len: u64, mode: i32) -> Result<(), BlockError> {
        let fd = self.backing.buffered_fd();
        self.with_lane(|lane| {
            lane.run(Op::Fallocate {
                fd,
                offset,
                len,
                mode,
            })
        })
        .map(drop)
    }

    /// Zeroes by writing zero buffers, for when fallocate cannot.
    fn write_zero_buffers(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        bump(&self.backing.counters.zeroes_written);
        let zeroes = vec![0u8; MAX_IO.min(usize::try_from(len).unwrap_or(MAX_IO))];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(zeroes.len() as u64) as usize;
            self.write_all(offset + done, &zeroes[..n], false)?;
            done += n as u64;
        }
        Ok(())
    }
}

/// fallocate cannot do this here: fall back to writing zeroes.
fn unsupported(e: &BlockError) -> bool {
    matches!(e, BlockError::Io(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)))
}

fn open_error(path: &Path, e: io::Error) -> FileError {
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ETXTBSY) => {
            FileError::NotWritable(path.to_path_buf(), e)
        }
        Some(libc::EBUSY) => FileError::Busy(path.to_path_buf()),
        _ => FileError::Open(path.to_path_buf(), e),
    }
}

/// How long a held lock is retried. A server that was just killed keeps
/// its lock for a moment after it exits: the kernel tears its io_uring
/// down asynchronously, and in-flight operations hold the file open.
const LOCK_WAIT: Duration = Duration::from_secs(2);

fn lock(file: &File, path: &Path) -> Result<(), FileError> {
    use rustix::fs::{flock, FlockOperation};
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match flock(file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::WOULDBLOCK) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(FileError::Locked(path.to_path_buf()))
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(FileError::Open(path.to_path_buf(), e.into())),
        }
    }
}

impl BlockDevice for FileDevice {
    /// The lock (see the module docs) is let go while the next process
    /// opens the file, and taken back if it failed. A block device's
    /// O_EXCL cannot be let go: the next process fails to open it.
    fn hand_over_lock(&self, hold: bool) -> Result<(), BlockError> {
        if hold {
            return lock(&self.backing.file, &self.path)
                .map_err(|e| BlockError::Io(io::Error::other(e)));
        }
        rustix::fs::flock(&self.backing.file, rustix::fs::FlockOperation::Unlock)
            .map_err(|e| BlockError::Io(e.into()))
    }

    fn size(&self) -> u64 {
        self.backing.size
    }

    /// The page cache (and the disk's own cache) holds writes until flush.
    fn volatile_cache(&self) -> bool {
        true
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        check_range(offset, buf.len() as u64, self.backing.size)?;
        for (i, piece) in buf.chunks_mut(MAX_IO).enumerate() {
            let pos = offset + (i * MAX_IO) as u64;
            let mut fd = self.backing.fd_for(pos, piece.len());
            self.with_lane(|lane| {
                lane.buffer(piece.len());
                let mut done = 0usize;
                while done < piece.len() {
                    let n = lane.run(Op::Read {
                        fd,
                        offset: pos + done as u64,
                        at: done,
                        len: (piece.len() - done) as u32,
                    })?;
                    if n == 0 {
                        // The file shrank under us.
                        return Err(LaneError::Op(io::ErrorKind::UnexpectedEof.into()));
                    }
                    done += n as usize;
                    // A short direct read leaves an unaligned rest.
                    fd = self.backing.buffered_fd();
                }
                piece.copy_from_slice(lane.buffer(piece.len()));
                Ok(())
            })?;
        }
        Ok(())
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.write_all(offset, buf, false)
    }

    /// RWF_DSYNC: the write and the metadata needed to read it back are
    /// durable when it completes (a FUA write on a block device).
    fn write_fua(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.write_all(offset, buf, true)
    }

    fn flush(&self) -> Result<(), BlockError> {
        bump(&self.backing.counters.flushes);
        let fd = self.backing.buffered_fd();
        self.with_lane(|lane| lane.run(Op::Datasync { fd }))
            .map(drop)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        check_range(offset, len, self.backing.size)?;
        if len == 0 {
            return Ok(());
        }
        let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        match self.fallocate(offset, len, mode) {
            Err(e) if unsupported(&e) => self.write_zero_buffers(offset, len),
            r => r,
        }
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        check_range(offset, len, self.backing.size)?;
        if len == 0 {
            return Ok(());
        }
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        match self.fallocate(offset, len, mode) {
            Ok(()) => {
                bump(&self.backing.counters.holes_punched);
                Ok(())
            }
            Err(e) if unsupported(&e) => self.write_zeroes(offset, len),
            Err(e) => Err(e),
        }
    }

    fn as_async(&self) -> Option<&dyn AsyncBlockDevice> {
        Some(self)
    }
}

impl AsyncBlockDevice for FileDevice {
    /// An io_uring of its own, and a thread that calls `waker` when it
    /// posts completions. The queue shares the open file, so it may
    /// outlive the device.
    fn queue(&self, waker: Waker) -> Result<Box<dyn BlockQueue>, BlockError> {
        let queue = queue::FileQueue::new(Arc::clone(&self.backing), waker)?;
        Ok(Box::new(queue))
    }
}

#[cfg(test)]
mod tests;
