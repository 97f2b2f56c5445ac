//! [`IoBuf`]: an owned byte buffer that starts at a 4 KiB boundary, so the
//! kernel can move it with O_DIRECT, and that an asynchronous request owns
//! while it is in flight.

use std::ops::{Deref, DerefMut};

/// Alignment of O_DIRECT buffers, offsets and lengths: 4 KiB covers every
/// logical block size in use (512 and 4096) and the page size.
pub const ALIGN: usize = 4096;

/// A heap buffer of `len` bytes whose first byte is [`ALIGN`]-aligned, made
/// without unsafe code: over-allocate, then start at the first aligned
/// byte. Its length changes without reallocating up to its capacity, so a
/// pool of them serves requests of any size without churn.
#[derive(Default)]
pub struct IoBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
    capacity: usize,
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl IoBuf {
    /// An empty buffer (no allocation).
    pub fn new() -> Self {
        Self::default()
    }

    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        let mut b = Self::new();
        b.set_len(len);
        b
    }

    /// Makes the buffer `len` bytes long. Within the capacity the bytes keep
    /// whatever they held; beyond it the buffer is reallocated (rounded up
    /// to [`ALIGN`]) and zeroed. Never call while the kernel uses the buffer:
    /// reallocating moves it.
    pub fn set_len(&mut self, len: usize) {
        if len > self.capacity {
            let capacity = len.div_ceil(ALIGN) * ALIGN;
            self.storage = vec![0u8; capacity + ALIGN];
            self.start = self.storage.as_ptr().align_offset(ALIGN).min(ALIGN);
            self.capacity = capacity;
        }
        self.len = len;
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Deref for IoBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.storage
            .get(self.start..self.start + self.len)
            .unwrap_or_default()
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.storage
            .get_mut(self.start..self.start + self.len)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_starts_on_a_4k_boundary_at_every_length() {
        let mut b = IoBuf::new();
        assert!(b.is_empty());
        for len in [1, 4096, 5000, 128 * 1024, 512] {
            b.set_len(len);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0, "{len}");
            assert_eq!(b.len(), len);
        }
        assert_eq!(b.capacity(), 128 * 1024, "shrinking keeps the allocation");
    }

    #[test]
    fn growing_within_capacity_keeps_contents() {
        let mut b = IoBuf::zeroed(8192);
        b[..4].copy_from_slice(b"abcd");
        b.set_len(16);
        b.set_len(8192);
        assert_eq!(&b[..4], b"abcd");
    }
}
