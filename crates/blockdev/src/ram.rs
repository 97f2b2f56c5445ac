//! The `ram` backend: data in memory, sharded into chunks with one lock each
//! so that queue workers on different LBAs never contend.
//!
//! With a volatile write cache ([`RamDevice::with_volatile_cache`]) the
//! device keeps, for every chunk written since the last flush, what the
//! chunk held at that flush (its durable image): a power loss
//! ([`BlockDevice::power_loss`]) puts those back, so every write not yet
//! flushed vanishes and every flushed one stays, as a drive's cache would
//! lose them. A FUA write goes into the durable image too. The first write
//! to a chunk after a flush copies it (64 KiB), and each write takes one
//! lock over the images: the price of testing hosts' flush discipline.

use std::collections::HashMap;

use parking_lot::{Mutex, RwLock};

use crate::{check_range, BlockDevice, BlockError, CopyOnly, ReadFill};

/// Bytes per chunk (and per lock). 64 KiB: a 4 KiB I/O touches one chunk,
/// and a large device needs few locks.
const CHUNK: u64 = 64 * 1024;

/// A RAM disk. Chunks are allocated on first write and freed by discard, so
/// a large, mostly unused device costs little memory. Contents persist for
/// the lifetime of the value (across vfio-user clients).
#[derive(Debug)]
pub struct RamDevice {
    size: u64,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
    volatile_cache: bool,
    /// With a volatile cache: chunk index -> its content at the last flush
    /// (`None`: unallocated then), for the chunks written since.
    durable: Mutex<HashMap<usize, Option<Box<[u8]>>>>,
}

type Chunk = Option<Box<[u8]>>;

impl RamDevice {
    /// A zero-filled RAM disk of `size` bytes.
    pub fn new(size: u64) -> Self {
        let n = size.div_ceil(CHUNK);
        let chunks = (0..n).map(|_| RwLock::new(None)).collect();
        Self {
            size,
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

    /// Before chunk `index`, whose content is `current`, changes: keeps its
    /// durable image if this is its first change since the last flush.
    fn keep_durable(&self, index: usize, current: &Chunk) {
        if self.volatile_cache {
            self.durable
                .lock()
                .entry(index)
                .or_insert_with(|| current.clone());
        }
    }

    /// A FUA write of `src` at `at` in chunk `index` reaches its durable
    /// image too (if the chunk has changed since the last flush; else the
    /// chunk itself is the durable image).
    fn write_durable(&self, index: usize, at: usize, src: &[u8]) {
        let mut durable = self.durable.lock();
        let Some(image) = durable.get_mut(&index) else {
            return;
        };
        let data = image.get_or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
        if let Some(dst) = data.get_mut(at..at + src.len()) {
            dst.copy_from_slice(src);
        }
    }

    /// Writes `buf` at `offset`; `fua`: into the durable images as well.
    fn write_at(&self, offset: u64, buf: &[u8], fua: bool) -> Result<(), BlockError> {
        check_range(offset, buf.len() as u64, self.size)?;
        Self::for_each_piece(offset, buf.len() as u64, |c, at, n, done| {
            let oob = || BlockError::OutOfRange {
                offset,
                len: 0,
                size: self.size,
            };
            let src = buf.get(done..done + n).ok_or_else(oob)?;
            let mut guard = self.chunk(c)?.write();
            self.keep_durable(c, &guard);
            if fua {
                self.write_durable(c, at, src);
            }
            let data = guard.get_or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            data.get_mut(at..at + n)
                .ok_or_else(oob)?
                .copy_from_slice(src);
            Ok(())
        })
    }

    fn chunk(&self, index: usize) -> Result<&RwLock<Option<Box<[u8]>>>, BlockError> {
        self.chunks.get(index).ok_or(BlockError::OutOfRange {
            offset: index as u64 * CHUNK,
            len: 0,
            size: self.size,
        })
    }
}

impl BlockDevice for RamDevice {
    /// The data lives in this process only.
    fn outlives_process(&self) -> bool {
        false
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
            let out = buf.get_mut(done..done + n).ok_or(BlockError::OutOfRange {
                offset,
                len: 0,
                size: self.size,
            })?;
            match &*self.chunk(c)?.read() {
                Some(data) => fill.copy(
                    data.get(at..at + n).ok_or(BlockError::OutOfRange {
                        offset,
                        len: 0,
                        size: self.size,
                    })?,
                    out,
                ),
                None => {
                    out.fill(0);
                    fill.filled(out);
                }
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
            if let Some(chunk) = self.chunks.get(index) {
                *chunk.write() = image;
            }
        }
        true
    }

    /// Copies the chunks that hold data (unwritten ones stay unallocated);
    /// a shrink zeroes what is past the new end in the last chunk, so a
    /// later grow reads zeroes there.
    fn resized(&self, size: u64) -> Option<std::sync::Arc<dyn BlockDevice>> {
        let new = Self::new(size).with_volatile_cache(self.volatile_cache);
        for (i, (dst, src)) in new.chunks.iter().zip(&self.chunks).enumerate() {
            let Some(mut data) = src.read().clone() else {
                continue;
            };
            let chunk_start = i as u64 * CHUNK;
            let keep = size.saturating_sub(chunk_start).min(CHUNK) as usize;
            if let Some(tail) = data.get_mut(keep..) {
                tail.fill(0);
            }
            *dst.write() = Some(data);
        }
        Some(std::sync::Arc::new(new))
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        check_range(offset, len, self.size)?;
        Self::for_each_piece(offset, len, |c, at, n, _| {
            let mut guard = self.chunk(c)?.write();
            self.keep_durable(c, &guard);
            if at == 0 && n as u64 == CHUNK {
                *guard = None;
            } else if let Some(dst) = guard.as_mut().and_then(|d| d.get_mut(at..at + n)) {
                dst.fill(0);
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
