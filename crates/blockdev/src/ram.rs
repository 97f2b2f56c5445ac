//! The `ram` backend: data in memory, sharded into chunks with one lock each
//! so that queue workers on different LBAs never contend.
//!
//! The memory is a memfd ([`crate::shared_memory`]) so that it can outlive
//! the process: a live upgrade passes it to the new process, and a
//! supervisor (`vnvme serve --supervise`) keeps it for the server it
//! starts after a crash ([`RamDevice::memory_fd`], [`RamDevice::adopt`]).
//! Pages take memory when first written and a discard of whole chunks
//! gives them back (a hole punched in the memfd); which chunks hold data
//! is known here, so a read of one never written copies nothing and maps
//! no page. The chunk locks stay in the process: one process serves the
//! namespace at a time.
//!
//! With a volatile write cache ([`RamDevice::with_volatile_cache`]) the
//! device keeps, for every chunk written since the last flush, what the
//! chunk held at that flush (its durable image): a power loss
//! ([`BlockDevice::power_loss`]) puts those back, so every write not yet
//! flushed vanishes and every flushed one stays, as a drive's cache would
//! lose them. A FUA write goes into the durable image too. The first write
//! to a chunk after a flush copies it (64 KiB), and each write takes one
//! lock over the images: the price of testing hosts' flush discipline.
//! The images are in this process's memory only: a process that adopts
//! the memfd (after an upgrade or a crash, neither of which is a power
//! loss) takes every write made so far as flushed.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};

use parking_lot::{Mutex, RwLock};

use crate::shared_memory::{SharedMemory, SharedMemoryError};
use crate::{check_range, BlockDevice, BlockError, CopyOnly, ReadFill};

/// Bytes per chunk (and per lock). 64 KiB: a 4 KiB I/O touches one chunk,
/// and a large device needs few locks.
const CHUNK: u64 = 64 * 1024;

/// A RAM disk. Pages are taken on first write and given back by a discard
/// of whole chunks, so a large, mostly unused device costs little memory.
/// Contents persist for the lifetime of the memfd (across vfio-user
/// clients, and across processes it is passed to).
#[derive(Debug)]
pub struct RamDevice {
    size: u64,
    memory: SharedMemory,
    /// Per chunk: its lock, over whether it holds data (`false`: a hole,
    /// which reads as zeroes).
    chunks: Vec<RwLock<bool>>,
    volatile_cache: bool,
    /// With a volatile cache: chunk index -> its content at the last flush
    /// (`None`: unwritten then), for the chunks written since.
    durable: Mutex<HashMap<usize, Option<Box<[u8]>>>>,
}

impl RamDevice {
    /// A zero-filled RAM disk of `size` bytes.
    ///
    /// # Panics
    /// If the kernel cannot make or map the memfd (out of fds or address
    /// space): for tests and tools; a server takes [`RamDevice::create`].
    pub fn new(size: u64) -> Self {
        match Self::create(size) {
            Ok(dev) => dev,
            Err(e) => panic!("a ram device of {size} bytes: {e}"),
        }
    }

    /// A zero-filled RAM disk of `size` bytes in a new memfd.
    pub fn create(size: u64) -> Result<Self, SharedMemoryError> {
        Ok(Self::over(size, SharedMemory::create(size)?, false))
    }

    /// The RAM disk of `size` bytes whose memfd `fd` another process
    /// passed (a live upgrade's old process, a supervisor after a crash):
    /// its data as that process left it. Refused unless `fd` is a memfd
    /// sealed against shrinking of at least `size` bytes.
    pub fn adopt(fd: OwnedFd, size: u64) -> Result<Self, SharedMemoryError> {
        Ok(Self::over(size, SharedMemory::adopt(fd, size)?, true))
    }

    /// `memory` as a device; `written`: it may hold data (else it is new,
    /// all holes).
    fn over(size: u64, memory: SharedMemory, written: bool) -> Self {
        let n = size.div_ceil(CHUNK) as usize;
        let mut has_data = vec![false; n];
        if written {
            for (start, end) in memory.data_extents(size) {
                let first = (start / CHUNK) as usize;
                let last = end.div_ceil(CHUNK) as usize;
                for d in has_data.iter_mut().take(last).skip(first) {
                    *d = true;
                }
            }
        }
        let chunks = has_data.into_iter().map(RwLock::new).collect();
        Self {
            size,
            memory,
            chunks,
            volatile_cache: false,
            durable: Mutex::default(),
        }
    }

    /// A volatile write cache (Identify Controller VWC): writes are durable
    /// only once flushed (or written with FUA), and a power loss drops the
    /// others (see the module's notes).
    pub fn with_volatile_cache(mut self, on: bool) -> Self {
        self.volatile_cache = on;
        self
    }

    /// Calls `f(chunk index, offset in chunk, length, offset in the request)`
    /// for each chunk piece of `offset..offset+len` (already range checked).
    fn for_each_piece(
        offset: u64,
        len: u64,
        mut f: impl FnMut(usize, usize, usize, usize) -> Result<(), BlockError>,
    ) -> Result<(), BlockError> {
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let in_chunk = pos % CHUNK;
            let n = (CHUNK - in_chunk).min(len - done);
            f(
                (pos / CHUNK) as usize,
                in_chunk as usize,
                n as usize,
                done as usize,
            )?;
            done += n;
        }
        Ok(())
    }

    /// Where chunk `index` starts in the memory, and its length (the last
    /// one may be short).
    fn span(&self, index: usize) -> (usize, usize) {
        let start = index as u64 * CHUNK;
        (
            start as usize,
            CHUNK.min(self.size.saturating_sub(start)) as usize,
        )
    }

    fn oob(&self, offset: u64) -> BlockError {
        BlockError::OutOfRange {
            offset,
            len: 0,
            size: self.size,
        }
    }

    /// Chunk `index`'s bytes `at..at + n`, to read.
    ///
    /// # Safety
    /// The caller holds chunk `index`'s lock while the slice lives.
    unsafe fn piece(&self, index: usize, at: usize, n: usize) -> Option<&[u8]> {
        let (start, len) = self.span(index);
        if at.checked_add(n)? > len {
            return None;
        }
        // SAFETY: the bytes lie in chunk `index`, whose lock the caller
        // holds, and every writer takes it exclusively.
        unsafe { self.memory.bytes(start + at, n) }
    }

    /// Chunk `index`'s bytes `at..at + n`, to write.
    ///
    /// # Safety
    /// The caller holds chunk `index`'s lock exclusively while the slice
    /// lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn piece_mut(&self, index: usize, at: usize, n: usize) -> Option<&mut [u8]> {
        let (start, len) = self.span(index);
        if at.checked_add(n)? > len {
            return None;
        }
        // SAFETY: the bytes lie in chunk `index`, whose lock the caller
        // holds exclusively.
        unsafe { self.memory.bytes_mut(start + at, n) }
    }

    /// Before chunk `index` (its lock held exclusively, `written` its
    /// state) changes: keeps its durable image if this is its first change
    /// since the last flush.
    fn keep_durable(&self, index: usize, written: bool) {
        if self.volatile_cache {
            self.durable.lock().entry(index).or_insert_with(|| {
                let len = self.span(index).1;
                // SAFETY: the caller holds chunk `index`'s lock.
                let now = unsafe { self.piece(index, 0, len) };
                written.then(|| now.map(Box::from)).flatten()
            });
        }
    }

    /// A FUA write of `src` at `at` in chunk `index` reaches its durable
    /// image too (if the chunk has changed since the last flush; else the
    /// chunk itself is the durable image).
    fn write_durable(&self, index: usize, at: usize, src: &[u8]) {
        let len = self.span(index).1;
        let mut durable = self.durable.lock();
        let Some(image) = durable.get_mut(&index) else {
            return;
        };
        let data = image.get_or_insert_with(|| vec![0u8; len].into_boxed_slice());
        if let Some(dst) = data.get_mut(at..at + src.len()) {
            dst.copy_from_slice(src);
        }
    }

    /// Writes `buf` at `offset`; `fua`: into the durable images as well.
    fn write_at(&self, offset: u64, buf: &[u8], fua: bool) -> Result<(), BlockError> {
        check_range(offset, buf.len() as u64, self.size)?;
        Self::for_each_piece(offset, buf.len() as u64, |c, at, n, done| {
            let src = buf.get(done..done + n).ok_or_else(|| self.oob(offset))?;
            let mut written = self.chunk(c)?.write();
            self.keep_durable(c, *written);
            if fua {
                self.write_durable(c, at, src);
            }
            // SAFETY: chunk `c`'s lock is held exclusively (`written`).
            let dst = unsafe { self.piece_mut(c, at, n) }.ok_or_else(|| self.oob(offset))?;
            dst.copy_from_slice(src);
            *written = true;
            Ok(())
        })
    }

    /// Chunk `index` (its lock held exclusively) becomes zeroes: a hole
    /// punched (its memory given back) or, if that fails, zeroes written.
    fn clear_chunk(&self, index: usize, written: &mut bool) {
        if !*written {
            return;
        }
        let (start, len) = self.span(index);
        if self.memory.punch(start as u64, len as u64).is_err() {
            // SAFETY: the caller holds chunk `index`'s lock exclusively.
            if let Some(dst) = unsafe { self.piece_mut(index, 0, len) } {
                dst.fill(0);
            }
        }
        *written = false;
    }

    fn chunk(&self, index: usize) -> Result<&RwLock<bool>, BlockError> {
        self.chunks
            .get(index)
            .ok_or_else(|| self.oob(index as u64 * CHUNK))
    }
}

impl BlockDevice for RamDevice {
    /// The memfd the data lives in, for a process that serves it next
    /// ([`RamDevice::adopt`]).
    fn memory_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.memory.fd())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn volatile_cache(&self) -> bool {
        self.volatile_cache
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        self.read_with(offset, buf, &mut CopyOnly)
    }

    fn read_with(
        &self,
        offset: u64,
        buf: &mut [u8],
        fill: &mut dyn ReadFill,
    ) -> Result<(), BlockError> {
        check_range(offset, buf.len() as u64, self.size)?;
        Self::for_each_piece(offset, buf.len() as u64, |c, at, n, done| {
            let out = buf
                .get_mut(done..done + n)
                .ok_or_else(|| self.oob(offset))?;
            let written = self.chunk(c)?.read();
            if *written {
                // SAFETY: chunk `c`'s lock is held (`written`).
                let src = unsafe { self.piece(c, at, n) }.ok_or_else(|| self.oob(offset))?;
                fill.copy(src, out);
            } else {
                out.fill(0);
                fill.filled(out);
            }
            Ok(())
        })
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.write_at(offset, buf, false)
    }

    fn write_fua(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.write_at(offset, buf, self.volatile_cache)
    }

    /// The cache's content becomes durable: the images are forgotten.
    fn flush(&self) -> Result<(), BlockError> {
        if self.volatile_cache {
            self.durable.lock().clear();
        }
        Ok(())
    }

    fn power_loss(&self) -> bool {
        if !self.volatile_cache {
            return false;
        }
        let images = std::mem::take(&mut *self.durable.lock());
        for (index, image) in images {
            let Some(chunk) = self.chunks.get(index) else {
                continue;
            };
            let mut written = chunk.write();
            match image {
                None => self.clear_chunk(index, &mut written),
                Some(data) => {
                    // SAFETY: chunk `index`'s lock is held exclusively.
                    if let Some(dst) = unsafe { self.piece_mut(index, 0, data.len()) } {
                        dst.copy_from_slice(&data);
                        *written = true;
                    }
                }
            }
        }
        true
    }

    /// Copies the chunks that hold data into a new memfd of `size` bytes
    /// (unwritten ones stay holes; a shrink cuts the last chunk, so a
    /// later grow reads zeroes there).
    fn resized(&self, size: u64) -> Option<std::sync::Arc<dyn BlockDevice>> {
        let new = match Self::create(size) {
            Ok(d) => d.with_volatile_cache(self.volatile_cache),
            Err(e) => {
                tracing::error!("resizing a ram namespace to {size} bytes: {e}");
                return None;
            }
        };
        let common = self.chunks.len().min(new.chunks.len());
        for c in 0..common {
            let written = self.chunks.get(c)?.read();
            if !*written {
                continue;
            }
            let n = self.span(c).1.min(new.span(c).1);
            let mut dst_written = new.chunks.get(c)?.write();
            // SAFETY: chunk `c`'s locks are held, this device's shared and
            // the new one's exclusively.
            let (src, dst) = unsafe { (self.piece(c, 0, n)?, new.piece_mut(c, 0, n)?) };
            dst.copy_from_slice(src);
            *dst_written = true;
        }
        Some(std::sync::Arc::new(new))
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        check_range(offset, len, self.size)?;
        Self::for_each_piece(offset, len, |c, at, n, _| {
            let mut written = self.chunk(c)?.write();
            self.keep_durable(c, *written);
            if at == 0 && n == self.span(c).1 {
                self.clear_chunk(c, &mut written);
            } else if *written {
                // SAFETY: chunk `c`'s lock is held exclusively (`written`).
                if let Some(dst) = unsafe { self.piece_mut(c, at, n) } {
                    dst.fill(0);
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn power_loss_drops_unflushed_writes_and_keeps_flushed_and_fua_ones() {
        let ram = RamDevice::new(4 * CHUNK).with_volatile_cache(true);
        let read = |at: u64| {
            let mut b = [0u8; 4];
            ram.read(at, &mut b).unwrap();
            b
        };
        ram.write(0, &[1; 4]).unwrap();
        ram.flush().unwrap();
        ram.write(0, &[2; 4]).unwrap(); // same chunk, not flushed
        ram.write_fua(8, &[3; 4]).unwrap(); // same chunk, durable
        ram.write(CHUNK, &[4; 4]).unwrap(); // a chunk never flushed
        ram.write_zeroes(2 * CHUNK, CHUNK).unwrap();
        assert!(ram.power_loss());
        assert_eq!(read(0), [1; 4], "flushed write kept, later one dropped");
        assert_eq!(read(8), [3; 4], "FUA write kept");
        assert_eq!(read(CHUNK), [0; 4], "unflushed write dropped");
        assert!(
            !RamDevice::new(CHUNK).power_loss(),
            "no cache, nothing to lose"
        );
    }

    #[test]
    fn resized_keeps_data_up_to_the_new_end_and_zeroes_past_it() {
        let ram = RamDevice::new(4 * CHUNK);
        ram.write(CHUNK - 4, &[1; 8]).unwrap();
        ram.write(3 * CHUNK, &[2; 4]).unwrap();
        let small = ram.resized(CHUNK).unwrap();
        assert_eq!(small.size(), CHUNK);
        let mut b = [9u8; 4];
        small.read(CHUNK - 4, &mut b).unwrap();
        assert_eq!(b, [1; 4]);
        let big = small.resized(4 * CHUNK).unwrap();
        let mut b = [9u8; 8];
        big.read(CHUNK - 4, &mut b).unwrap();
        assert_eq!(b, [1, 1, 1, 1, 0, 0, 0, 0], "the shrink cut the write");
        big.read(3 * CHUNK, &mut b).unwrap();
        assert_eq!(b, [0; 8], "nothing comes back from past the shrink");
    }

    /// Records what a read passes through it.
    #[derive(Default)]
    struct Recorder {
        copied: Vec<u8>,
        filled: Vec<u8>,
        /// Bytes each piece, `true` for a copy.
        pieces: Vec<(bool, usize)>,
    }

    impl ReadFill for Recorder {
        fn copy(&mut self, src: &[u8], dst: &mut [u8]) {
            dst.copy_from_slice(src);
            self.copied.extend_from_slice(src);
            self.pieces.push((true, src.len()));
        }

        fn filled(&mut self, buf: &[u8]) {
            self.filled.extend_from_slice(buf);
            self.pieces.push((false, buf.len()));
        }
    }

    #[test]
    fn read_with_copies_written_chunks_through_the_fill_and_shows_it_the_rest() {
        let dev = RamDevice::new(4 * CHUNK);
        let data: Vec<u8> = (0..CHUNK + 100).map(|i| (i % 251) as u8 + 1).collect();
        dev.write(CHUNK - 50, &data).unwrap();
        // From chunk 0 across chunks 1 and 2 (written, chunk 2 in part) into
        // chunk 3, which was never written.
        let start = CHUNK - 50;
        let mut buf = vec![0xEEu8; 2 * CHUNK as usize + 100];
        let mut fill = Recorder::default();
        dev.read_with(start, &mut buf, &mut fill).unwrap();
        let mut plain = vec![0u8; buf.len()];
        dev.read(start, &mut plain).unwrap();
        assert_eq!(buf, plain, "read_with reads what read does");
        assert_eq!(&buf[..data.len()], &data[..]);
        let chunk = CHUNK as usize;
        assert_eq!(
            fill.pieces,
            [(true, 50), (true, chunk), (true, chunk), (false, 50)],
            "a piece per chunk: copied where written, shown once zeroed where not"
        );
        assert_eq!(fill.copied, buf[..50 + 2 * chunk]);
        assert_eq!(fill.filled, [0; 50]);
    }

    /// Another process's view: the memfd copied (as SCM_RIGHTS or exec
    /// would) and adopted.
    fn adopted(dev: &RamDevice, size: u64) -> Result<RamDevice, SharedMemoryError> {
        RamDevice::adopt(rustix::io::dup(dev.memory_fd().unwrap()).unwrap(), size)
    }

    #[test]
    fn an_adopted_memfd_reads_what_was_written_and_knows_the_holes() {
        let dev = RamDevice::new(4 * CHUNK + 512);
        dev.write(CHUNK + 10, &[5; 100]).unwrap();
        dev.write(4 * CHUNK, &[6; 512]).unwrap();
        let next = adopted(&dev, 4 * CHUNK + 512).unwrap();
        let mut b = [0u8; 100];
        next.read(CHUNK + 10, &mut b).unwrap();
        assert_eq!(b, [5; 100]);
        let mut tail = [0u8; 512];
        next.read(4 * CHUNK, &mut tail).unwrap();
        assert_eq!(tail, [6; 512]);
        let written: Vec<bool> = next.chunks.iter().map(|c| *c.read()).collect();
        assert_eq!(written, [false, true, false, false, true]);
        // Both map the same pages: a write in one is seen by the other.
        next.write(0, &[7; 4]).unwrap();
        let mut b = [0u8; 4];
        dev.read(0, &mut b).unwrap_or_default();
        assert_eq!(b, [0; 4], "the first one did not know chunk 0 was written");
        dev.write(4, &[8; 4]).unwrap();
        next.read(4, &mut b).unwrap();
        assert_eq!(b, [8; 4]);
    }

    #[test]
    fn a_discard_of_whole_chunks_punches_holes_in_the_memfd() {
        let dev = RamDevice::new(3 * CHUNK);
        dev.write(0, &vec![1u8; 3 * CHUNK as usize]).unwrap();
        assert_eq!(dev.memory.data_extents(3 * CHUNK), [(0, 3 * CHUNK)]);
        dev.write_zeroes(100, 2 * CHUNK).unwrap();
        assert_eq!(
            dev.memory.data_extents(3 * CHUNK),
            [(0, CHUNK), (2 * CHUNK, 3 * CHUNK)],
            "chunk 1, discarded whole, is a hole; chunks 0 and 2 in part hold data"
        );
    }

    #[test]
    fn an_adopted_memfd_smaller_than_the_namespace_or_not_sealed_is_refused() {
        let dev = RamDevice::new(CHUNK);
        let err = adopted(&dev, CHUNK + 1).unwrap_err();
        assert!(
            matches!(
                err,
                SharedMemoryError::TooSmall {
                    actual: CHUNK,
                    needed
                } if needed == CHUNK + 1
            ),
            "{err}"
        );
        // A memfd that could be cut under the mapping.
        let loose =
            rustix::fs::memfd_create("loose", rustix::fs::MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&loose, CHUNK).unwrap();
        let err = RamDevice::adopt(loose, CHUNK).unwrap_err();
        assert!(matches!(err, SharedMemoryError::NotSealed(_)), "{err}");
        // Not a memfd at all.
        let (pipe, _w) = rustix::pipe::pipe().unwrap();
        let err = RamDevice::adopt(pipe, CHUNK).unwrap_err();
        assert!(matches!(err, SharedMemoryError::NotSealed(_)), "{err}");
        assert!(err.to_string().contains("not a memfd"), "{err}");
    }

    #[test]
    fn ram_write_then_read_across_chunks() {
        let dev = RamDevice::new(4 * CHUNK);
        let data: Vec<u8> = (0..CHUNK as usize + 8192).map(|i| i as u8).collect();
        dev.write(CHUNK - 4096, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        dev.read(CHUNK - 4096, &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn ram_unwritten_reads_zero_and_discard_zeroes() {
        let dev = RamDevice::new(3 * CHUNK);
        let mut buf = vec![1u8; 4096];
        dev.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        dev.write(0, &vec![7u8; 3 * CHUNK as usize]).unwrap();
        dev.discard(512, 2 * CHUNK).unwrap();
        let mut all = vec![0u8; 3 * CHUNK as usize];
        dev.read(0, &mut all).unwrap();
        assert!(all[..512].iter().all(|&b| b == 7));
        assert!(all[512..512 + 2 * CHUNK as usize].iter().all(|&b| b == 0));
        assert!(all[512 + 2 * CHUNK as usize..].iter().all(|&b| b == 7));
    }

    #[test]
    fn ram_rejects_out_of_range_and_overflow() {
        let dev = RamDevice::new(CHUNK + 100);
        assert!(dev.read(CHUNK, &mut [0u8; 101]).is_err());
        assert!(dev.write(u64::MAX - 1, &[0u8; 4]).is_err());
        assert!(dev.write_zeroes(0, u64::MAX).is_err());
        dev.write(CHUNK + 99, &[1]).unwrap();
    }

    #[test]
    fn ram_concurrent_writers_on_distinct_blocks() {
        let dev = Arc::new(RamDevice::new(16 * CHUNK));
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let dev = dev.clone();
                std::thread::spawn(move || {
                    for i in 0..64u64 {
                        let off = (u64::from(t) * 64 + i) * 4096;
                        dev.write(off, &[t + 1; 4096]).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for t in 0..4u8 {
            let mut buf = [0u8; 4096];
            dev.read(u64::from(t) * 64 * 4096, &mut buf).unwrap();
            assert!(buf.iter().all(|&b| b == t + 1));
        }
    }
}
