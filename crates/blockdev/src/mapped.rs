//! Memory a request reads into or writes from in place: guest memory
//! mapped into this process, which the kernel moves data to and from
//! without a copy through a buffer of ours ([`MappedBuf`]), and the
//! [`Data`] a request carries, that or an [`IoBuf`] of its own.
//!
//! Whoever maps the memory promises, by implementing the unsafe trait
//! [`MappedMemory`] (`vnvme-memory`'s, with [`Region`]), that it stays mapped for as long as the value lives;
//! a request keeps the value until the kernel is done with it (see
//! `uring`). The memory is shared with another process that may change it
//! at any time, so it is never seen through a Rust reference: the kernel
//! reads and writes it, and the copies here are raw.
#![allow(unsafe_code)]

use vnvme_memory::{MappedMemory, Region};

use crate::IoBuf;

/// The memory of one transfer, in place ([`MappedMemory`]) with its total
/// length.
#[derive(Debug)]
pub struct MappedBuf {
    mem: Box<dyn MappedMemory>,
    len: usize,
}

impl MappedBuf {
    pub fn new(mem: Box<dyn MappedMemory>) -> Self {
        let len = mem
            .regions()
            .iter()
            .fold(0usize, |sum, r| sum.saturating_add(r.len));
        Self { mem, len }
    }

    /// Total bytes over all regions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn regions(&self) -> &[Region] {
        self.mem.regions()
    }

    pub fn writable(&self) -> bool {
        self.mem.writable()
    }

    pub fn intact(&self) -> bool {
        self.mem.intact()
    }

    /// The regions covering bytes `at..at + len` of the transfer, cut to
    /// them; `None` if the range is past the end.
    pub(crate) fn slice(&self, at: usize, len: usize) -> Option<impl Iterator<Item = Region> + '_> {
        let end = at.checked_add(len).filter(|&end| end <= self.len)?;
        let mut start = 0usize;
        Some(self.regions().iter().filter_map(move |r| {
            let (r_start, r_end) = (start, start + r.len);
            start = r_end;
            let (from, to) = (at.max(r_start), end.min(r_end));
            (from < to).then(|| Region {
                addr: r.addr + (from - r_start),
                len: to - from,
            })
        }))
    }

    /// Copies `src` into the memory (the synchronous path's read).
    pub(crate) fn copy_from(&mut self, src: &[u8]) -> std::io::Result<()> {
        if !self.writable() || src.len() != self.len {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        let mut done = 0;
        for r in self.regions() {
            // SAFETY: `r` is mapped and writable while `self.mem` lives
            // (`MappedMemory`'s promise, and `writable` checked above);
            // `src[done..done + r.len]` is in bounds as the lengths sum to
            // `src.len()`, and a Rust slice never overlaps mapped guest
            // memory, which is never handed out as a reference.
            unsafe {
                std::ptr::copy_nonoverlapping(src[done..].as_ptr(), r.addr as *mut u8, r.len)
            };
            done += r.len;
        }
        Ok(())
    }

    /// Copies the memory into `dst` (the synchronous path's write).
    pub(crate) fn copy_to(&self, dst: &mut [u8]) -> std::io::Result<()> {
        if dst.len() != self.len {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        let mut done = 0;
        for r in self.regions() {
            // SAFETY: as in `copy_from`: `r` is mapped and readable while
            // `self.mem` lives, and the destination is in bounds.
            unsafe {
                std::ptr::copy_nonoverlapping(r.addr as *const u8, dst[done..].as_mut_ptr(), r.len)
            };
            done += r.len;
        }
        Ok(())
    }
}

/// Where a read puts its data or a write takes it from.
#[derive(Debug)]
pub enum Data {
    /// A buffer of the request's own.
    Buf(IoBuf),
    /// Mapped memory, in place.
    Mapped(MappedBuf),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::Buf(b) => b.len(),
            Data::Mapped(m) => m.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer, if the data is one.
    pub fn into_buf(self) -> Option<IoBuf> {
        match self {
            Data::Buf(b) => Some(b),
            Data::Mapped(_) => None,
        }
    }
}

impl From<IoBuf> for Data {
    fn from(buf: IoBuf) -> Self {
        Data::Buf(buf)
    }
}

impl From<MappedBuf> for Data {
    fn from(mem: MappedBuf) -> Self {
        Data::Mapped(mem)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Heap memory standing in for guest memory: a buffer per region.
    #[derive(Debug)]
    pub(crate) struct HeapMemory {
        // Never read through: the regions point into the buffers.
        _bufs: Vec<IoBuf>,
        regions: Vec<Region>,
        pub(crate) writable: bool,
    }

    // SAFETY: the regions are the buffers' heap memory, which lives (and
    // does not move) as long as the value; nothing hands it out as a
    // reference.
    unsafe impl MappedMemory for HeapMemory {
        fn regions(&self) -> &[Region] {
            &self.regions
        }
        fn writable(&self) -> bool {
            self.writable
        }
    }

    impl HeapMemory {
        /// Regions of the given lengths, each filled from `fill` and
        /// starting `skew` bytes past a 4 KiB boundary.
        pub(crate) fn new(lens: &[usize], skew: usize, fill: &[u8]) -> Self {
            let mut bufs = Vec::new();
            let mut regions = Vec::new();
            let mut at = 0;
            for &len in lens {
                let mut b = IoBuf::zeroed(skew + len);
                b[skew..].copy_from_slice(&fill[at..at + len]);
                regions.push(Region {
                    addr: b[skew..].as_mut_ptr() as usize,
                    len,
                });
                bufs.push(b);
                at += len;
            }
            Self {
                _bufs: bufs,
                regions,
                writable: true,
            }
        }
    }

    /// The memory's bytes, in order.
    pub(crate) fn contents(m: &MappedBuf) -> Vec<u8> {
        let mut out = vec![0u8; m.len()];
        m.copy_to(&mut out).unwrap();
        out
    }

    #[test]
    fn slice_cuts_the_regions_to_the_range() {
        let m = MappedBuf::new(Box::new(HeapMemory::new(&[100, 50, 200], 0, &[0; 350])));
        let r = m.regions().to_vec();
        let got: Vec<Region> = m.slice(120, 150).unwrap().collect();
        assert_eq!(
            got,
            vec![
                Region {
                    addr: r[1].addr + 20,
                    len: 30
                },
                Region {
                    addr: r[2].addr,
                    len: 120
                },
            ]
        );
        assert_eq!(m.slice(0, 350).unwrap().count(), 3);
        assert!(m.slice(300, 51).is_none(), "past the end");
        assert!(m.slice(usize::MAX, 2).is_none(), "overflow");
    }

    #[test]
    fn copies_in_and_out_follow_region_order() {
        let data: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let mut m = MappedBuf::new(Box::new(HeapMemory::new(&[10, 290], 0, &[0; 300])));
        m.copy_from(&data).unwrap();
        assert_eq!(contents(&m), data);
        assert!(m.copy_from(&data[1..]).is_err(), "length must match");
        let mut ro = HeapMemory::new(&[300], 0, &[0; 300]);
        ro.writable = false;
        let mut ro = MappedBuf::new(Box::new(ro));
        assert!(ro.copy_from(&data).is_err(), "not writable");
    }
}
