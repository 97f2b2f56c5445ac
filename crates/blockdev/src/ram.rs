//! The `ram` backend: data in memory, sharded into chunks with one lock each
//! so that queue workers on different LBAs never contend.

use parking_lot::RwLock;

use crate::{check_range, BlockDevice, BlockError};

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
}

impl RamDevice {
    /// A zero-filled RAM disk of `size` bytes.
    pub fn new(size: u64) -> Self {
        let n = size.div_ceil(CHUNK);
        let chunks = (0..n).map(|_| RwLock::new(None)).collect();
        Self {
            size,
            chunks,
            volatile_cache: false,
        }
    }

    /// Advertise a volatile write cache (flush is still a no-op: RAM is as
    /// durable as it gets). Useful to exercise hosts' flush paths.
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

    fn chunk(&self, index: usize) -> Result<&RwLock<Option<Box<[u8]>>>, BlockError> {
        self.chunks.get(index).ok_or(BlockError::OutOfRange {
            offset: index as u64 * CHUNK,
            len: 0,
            size: self.size,
        })
    }
}

impl BlockDevice for RamDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn volatile_cache(&self) -> bool {
        self.volatile_cache
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        check_range(offset, buf.len() as u64, self.size)?;
        Self::for_each_piece(offset, buf.len() as u64, |c, at, n, done| {
            let out = buf.get_mut(done..done + n).ok_or(BlockError::OutOfRange {
                offset,
                len: 0,
                size: self.size,
            })?;
            match &*self.chunk(c)?.read() {
                Some(data) => {
                    out.copy_from_slice(data.get(at..at + n).ok_or(BlockError::OutOfRange {
                        offset,
                        len: 0,
                        size: self.size,
                    })?)
                }
                None => out.fill(0),
            }
            Ok(())
        })
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        check_range(offset, buf.len() as u64, self.size)?;
        Self::for_each_piece(offset, buf.len() as u64, |c, at, n, done| {
            let oob = || BlockError::OutOfRange {
                offset,
                len: 0,
                size: self.size,
            };
            let src = buf.get(done..done + n).ok_or_else(oob)?;
            let mut guard = self.chunk(c)?.write();
            let data = guard.get_or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            data.get_mut(at..at + n)
                .ok_or_else(oob)?
                .copy_from_slice(src);
            Ok(())
        })
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
