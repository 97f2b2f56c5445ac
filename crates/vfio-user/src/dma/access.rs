//! Copies in and out of guest memory, and the atomic dword accesses of
//! shadow doorbells and completion entries: every access walks the maps of
//! this thread's snapshot ([`DmaSpace::walk`]). They are `vnvme-memory`'s
//! [`GuestMemory`] trait, which the controller calls directly.

use std::sync::atomic::{AtomicU32, Ordering};

use super::remote::{remote_read, remote_write};
use vnvme_memory::{DmaError, GuestAddress, GuestMemory, MappedMemory, Segment};

use super::{DmaSpace, Piece};

impl GuestMemory for DmaSpace {
    /// Copies guest memory at `iova` into `buf`.
    fn read(&self, iova: GuestAddress, buf: &mut [u8]) -> Result<(), DmaError> {
        let iova = iova.raw();
        let max_xfer = self.inner.max_xfer;
        self.walk(iova, buf.len() as u64, false, |piece, addr, done, n| {
            let dst = &mut buf[done..done + n];
            match piece {
                // SAFETY: `p` points at `n` readable bytes of a live mapping
                // (the snapshot holds it); `dst` is a distinct Rust buffer.
                // The guest may write the memory concurrently: we treat it like
                // device memory and only copy bytes out, never form references.
                Piece::Local(p) => unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), n) },
                Piece::Remote(conn) => {
                    for (i, chunk) in dst.chunks_mut(max_xfer).enumerate() {
                        remote_read(conn, addr + (i * max_xfer) as u64, chunk)?;
                    }
                }
            }
            Ok(())
        })
    }

    /// Copies `buf` into guest memory at `iova`.
    fn write(&self, iova: GuestAddress, buf: &[u8]) -> Result<(), DmaError> {
        let iova = iova.raw();
        let max_xfer = self.inner.max_xfer;
        self.walk(iova, buf.len() as u64, true, |piece, addr, done, n| {
            let src = &buf[done..done + n];
            match piece {
                // SAFETY: `p` points at `n` writable bytes of a live mapping
                // (snapshot held, PROT_WRITE since the map is writable).
                Piece::Local(p) => unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, n) },
                Piece::Remote(conn) => {
                    for (i, chunk) in src.chunks(max_xfer).enumerate() {
                        remote_write(conn, addr + (i * max_xfer) as u64, chunk)?;
                    }
                }
            }
            Ok(())
        })
    }

    /// Zeroes `len` bytes of guest memory at `iova`.
    fn zero(&self, iova: GuestAddress, len: u64) -> Result<(), DmaError> {
        let iova = iova.raw();
        let max_xfer = self.inner.max_xfer;
        self.walk(iova, len, true, |piece, addr, _done, n| {
            match piece {
                // SAFETY: as in `write`.
                Piece::Local(p) => unsafe { std::ptr::write_bytes(p, 0, n) },
                Piece::Remote(conn) => {
                    let zeros = vec![0u8; n.min(max_xfer)];
                    let mut off = 0usize;
                    while off < n {
                        let k = (n - off).min(max_xfer);
                        remote_write(conn, addr + off as u64, &zeros[..k])?;
                        off += k;
                    }
                }
            }
            Ok(())
        })
    }

    /// Loads a little-endian u32 with Acquire ordering: atomic when `iova` is
    /// 4-byte aligned in an fd-backed map, a plain copy otherwise.
    fn load_u32(&self, iova: GuestAddress) -> Result<u32, DmaError> {
        let iova = iova.raw();
        let mut out = None;
        self.walk(iova, 4, false, |piece, _addr, _done, n| {
            if let Piece::Local(p) = piece {
                if n == 4 && p.cast::<u32>().is_aligned() {
                    // SAFETY: `p` is 4-aligned and points at 4 bytes of a live
                    // shared mapping (snapshot held).
                    let v = unsafe { AtomicU32::from_ptr(p.cast()) }.load(Ordering::Acquire);
                    out = Some(u32::from_le(v));
                }
            }
            Ok(())
        })?;
        match out {
            Some(v) => Ok(v),
            None => {
                // Unaligned, split over two maps, or remote.
                let mut b = [0u8; 4];
                self.read(GuestAddress(iova), &mut b)?;
                std::sync::atomic::fence(Ordering::Acquire);
                Ok(u32::from_le_bytes(b))
            }
        }
    }

    /// Stores a little-endian u32 with Release ordering: atomic when `iova`
    /// is 4-byte aligned in an fd-backed map, a plain copy otherwise.
    fn store_u32(&self, iova: GuestAddress, v: u32) -> Result<(), DmaError> {
        let iova = iova.raw();
        let mut done = false;
        self.walk(iova, 4, true, |piece, _addr, _done, n| {
            if let Piece::Local(p) = piece {
                if n == 4 && p.cast::<u32>().is_aligned() {
                    // SAFETY: as in `load_u32`, and the map is writable.
                    unsafe { AtomicU32::from_ptr(p.cast()) }.store(v.to_le(), Ordering::Release);
                    done = true;
                }
            }
            Ok(())
        })?;
        if !done {
            std::sync::atomic::fence(Ordering::Release);
            self.write(GuestAddress(iova), &v.to_le_bytes())?;
        }
        Ok(())
    }

    /// Copies `head` to `iova`, then stores `last` right after it with
    /// release ordering, in one walk when both lie in one local mapping (a
    /// completion queue entry: one translation instead of two).
    fn write_then_store_u32(
        &self,
        iova: GuestAddress,
        head: &[u8],
        last: u32,
    ) -> Result<(), DmaError> {
        let iova = iova.raw();
        let len = head.len() + 4;
        let mut done = false;
        self.walk(iova, len as u64, true, |piece, _addr, _done, n| {
            match piece {
                Piece::Local(p) if n == len => {
                    // SAFETY: `p` points at `n` writable bytes of a live
                    // mapping (as in `write`), so `head.len() < n` stays in.
                    let tail = unsafe { p.add(head.len()) };
                    if tail.cast::<u32>().is_aligned() {
                        // SAFETY: as in `write` and `store_u32`: in bounds,
                        // writable, the dword aligned.
                        unsafe {
                            std::ptr::copy_nonoverlapping(head.as_ptr(), p, head.len());
                            AtomicU32::from_ptr(tail.cast()).store(last.to_le(), Ordering::Release);
                        }
                        done = true;
                    }
                }
                _ => {}
            }
            Ok(())
        })?;
        if !done {
            let iova = GuestAddress(iova);
            self.write(iova, head)?;
            self.store_u32(iova.wrapping_add(head.len() as u64), last)?;
        }
        Ok(())
    }

    /// Held mapped by a [`DmaPin`](super::DmaPin): an unmap waits for the
    /// transfer.
    fn pin(&self, segs: &[Segment], write: bool) -> Option<Box<dyn MappedMemory>> {
        let pin = DmaSpace::pin(self, segs.iter().map(|s| (s.addr.raw(), s.len)), write)?;
        Some(Box::new(pin))
    }

    fn quiesce(&self) {
        DmaSpace::quiesce(self);
    }
}
