//! [`GuestAddress`]: an address in the guest's physical memory as the
//! device sees it (an IOVA the client mapped with DMA_MAP), kept apart
//! from lengths, offsets and host addresses so neither is taken for the
//! other.

use std::fmt;

/// An address in guest memory. It comes from the guest (a PRP entry, an
/// SGL descriptor, a queue's base, a Doorbell Buffer Config pointer) and is
/// hostile: arithmetic on it is checked or says why it cannot overflow.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GuestAddress(pub u64);

impl GuestAddress {
    /// The address as a number (for the wire, a log line, a map lookup).
    #[inline]
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// `self + offset`, or `None` past the end of the address space.
    #[inline]
    pub const fn checked_add(self, offset: u64) -> Option<Self> {
        match self.0.checked_add(offset) {
            Some(a) => Some(Self(a)),
            None => None,
        }
    }

    /// `self + offset` modulo 2^64: for an address whose access is bounds
    /// checked as a whole by the memory anyway (a wrapped range is never
    /// mapped), where a separate failure would say nothing more.
    #[inline]
    pub const fn wrapping_add(self, offset: u64) -> Self {
        Self(self.0.wrapping_add(offset))
    }

    /// The offset into its page of `page_size` bytes (a power of two, as
    /// CC.MPS's page size is).
    #[inline]
    pub const fn page_offset(self, page_size: u64) -> u64 {
        self.0 & page_size.wrapping_sub(1)
    }

    /// Whether the address is a multiple of `align` (a power of two).
    #[inline]
    pub const fn is_aligned(self, align: u64) -> bool {
        self.page_offset(align) == 0
    }
}

impl fmt::Debug for GuestAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GuestAddress({:#x})", self.0)
    }
}

impl fmt::LowerHex for GuestAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_add_fails_past_the_end() {
        assert_eq!(
            GuestAddress(0x1000).checked_add(8),
            Some(GuestAddress(0x1008))
        );
        assert_eq!(GuestAddress(u64::MAX).checked_add(1), None);
        assert_eq!(GuestAddress(u64::MAX).wrapping_add(1), GuestAddress(0));
    }

    #[test]
    fn page_offset_and_alignment() {
        let a = GuestAddress(0x1_2345);
        assert_eq!(a.page_offset(4096), 0x345);
        assert_eq!(a.page_offset(65536), 0x2345);
        assert!(GuestAddress(0x2000).is_aligned(4096));
        assert!(!a.is_aligned(4) && a.is_aligned(1));
        assert!(GuestAddress(0x1_2344).is_aligned(4));
    }

    #[test]
    fn formats_as_hex() {
        assert_eq!(
            format!("{:?}", GuestAddress(0x1000)),
            "GuestAddress(0x1000)"
        );
        assert_eq!(format!("{:#x}", GuestAddress(0x1000)), "0x1000");
    }
}
