//! Range entries that NVM commands carry in their data buffer: Dataset
//! Management ranges and Copy source ranges. Little-endian, alignment 1,
//! so a list read from guest memory is parsed in place.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// One Dataset Management range (NVM Command Set 1.0 §3.2.3, Figure 38).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct DsmRange {
    /// Context Attributes (access frequency, latency...): hints.
    pub cattr: U32,
    /// Length in logical blocks (not 0's based: 0 is an empty range).
    pub nlb: U32,
    /// Starting LBA.
    pub slba: U64,
}

const _: () = assert!(core::mem::size_of::<DsmRange>() == 16);

/// One Copy source range entry in descriptor format 0h (NVM Command Set
/// 1.0 §3.2.2): a range of the namespace the Copy is sent to.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct CopyRangeF0 {
    _rsvd0: [u8; 8],
    /// Starting LBA.
    pub slba: U64,
    /// Number of Logical Blocks, 0's based.
    pub nlb_z: U16,
    _rsvd18: [u8; 2],
    /// Expected Initial Logical Block Reference Tag (protection information).
    pub eilbrt: U32,
    /// Expected Logical Block Application Tag.
    pub elbat: U16,
    /// Expected Logical Block Application Tag Mask.
    pub elbatm: U16,
    _rsvd28: [u8; 4],
}

const _: () = assert!(core::mem::size_of::<CopyRangeF0>() == 32);

impl CopyRangeF0 {
    /// An entry for `nlb` blocks (at least 1) at `slba`.
    pub fn new(slba: u64, nlb: u16) -> Self {
        Self {
            slba: U64::new(slba),
            nlb_z: U16::new(nlb.saturating_sub(1)),
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn range_fields_sit_where_the_spec_puts_them() {
        assert_eq!(offset_of!(DsmRange, nlb), 4);
        assert_eq!(offset_of!(DsmRange, slba), 8);
        assert_eq!(offset_of!(CopyRangeF0, slba), 8);
        assert_eq!(offset_of!(CopyRangeF0, nlb_z), 16);
        assert_eq!(offset_of!(CopyRangeF0, eilbrt), 20);
        assert_eq!(offset_of!(CopyRangeF0, elbatm), 26);
        let r = CopyRangeF0::new(0x1122_3344_5566, 8);
        let bytes = r.as_bytes();
        assert_eq!(&bytes[8..16], &0x1122_3344_5566u64.to_le_bytes());
        assert_eq!(&bytes[16..18], &7u16.to_le_bytes());
    }
}
