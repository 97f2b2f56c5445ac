//! Scatter gather list descriptors (§4.1.2): the 16 bytes of SGL Entry 1
//! in a command's data pointer, of each entry of an SGL segment, and of
//! the one descriptor a metadata SGL's MPTR points to (PSDT 10b).

/// What PSDT (CDW0 15:14) selects for a command's transfers.
pub mod psdt {
    /// PRPs for data, MPTR the address of a contiguous metadata buffer.
    pub const PRP: u8 = 0b00;
    /// An SGL for data, MPTR the address of a contiguous metadata buffer.
    pub const SGL_MPTR_CONTIGUOUS: u8 = 0b01;
    /// An SGL for data, MPTR the address of one SGL descriptor (qword
    /// aligned) describing the metadata buffer: Identify Controller SGLS
    /// bit 19 ([`crate::identify::sgls::MSDS`]).
    pub const SGL_MPTR_SGL: u8 = 0b10;
}

/// SGL Descriptor Type (byte 15, bits 7:4).
pub mod kind {
    pub const DATA_BLOCK: u8 = 0x0;
    pub const BIT_BUCKET: u8 = 0x1;
    pub const SEGMENT: u8 = 0x2;
    pub const LAST_SEGMENT: u8 = 0x3;
    /// NVMe over Fabrics only.
    pub const KEYED_DATA_BLOCK: u8 = 0x4;
    pub const TRANSPORT_DATA_BLOCK: u8 = 0x5;
}

/// One SGL descriptor, generic format (Figure 117): address, length, type
/// and sub type (0h: the address is a memory address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub addr: u64,
    pub len: u32,
    pub kind: u8,
    pub subtype: u8,
}

impl Descriptor {
    /// Bytes of a descriptor.
    pub const SIZE: usize = 16;

    /// A Data Block descriptor of `len` bytes at `addr`.
    pub const fn data_block(addr: u64, len: u32) -> Self {
        Self {
            addr,
            len,
            kind: kind::DATA_BLOCK,
            subtype: 0,
        }
    }

    /// A (Last) Segment descriptor: the next segment, `len` bytes of
    /// descriptors at `addr`.
    pub const fn segment(addr: u64, len: u32, last: bool) -> Self {
        Self {
            addr,
            len,
            kind: if last {
                kind::LAST_SEGMENT
            } else {
                kind::SEGMENT
            },
            subtype: 0,
        }
    }

    pub fn from_bytes(b: &[u8; Self::SIZE]) -> Self {
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[..8]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&b[8..12]);
        Self {
            addr: u64::from_le_bytes(addr),
            len: u32::from_le_bytes(len),
            kind: b[15] >> 4,
            subtype: b[15] & 0xF,
        }
    }

    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[15] = (self.kind << 4) | (self.subtype & 0xF);
        b
    }

    pub fn is_segment(&self) -> bool {
        matches!(self.kind, kind::SEGMENT | kind::LAST_SEGMENT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_little_endian_with_the_type_in_byte_15() {
        let d = Descriptor::segment(0x1122_3344_5566_7788, 0x20, true);
        let b = d.to_bytes();
        assert_eq!(b[..8], 0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(b[8..12], [0x20, 0, 0, 0]);
        assert_eq!(b[15], 0x30);
        assert_eq!(Descriptor::from_bytes(&b), d);
    }
}
