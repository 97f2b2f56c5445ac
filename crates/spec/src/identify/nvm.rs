//! The NVM Command Set's I/O Command Set specific Identify data structures
//! (NVM Command Set Spec 1.0 §4.1.5): Identify CNS 05h and 06h with CSI 00h.

use bitfield_struct::bitfield;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{zeroed, IDENTIFY_SIZE};

/// I/O Command Set specific Identify Namespace for the NVM Command Set
/// (CNS 05h, CSI 00h; NVM Command Set Spec 1.0 §4.1.5.2): protection
/// information capabilities, and one Extended LBA Format per LBA format of
/// the Identify Namespace data structure (CNS 00h).
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IdentifyNamespaceNvm {
    /// Logical Block Storage Tag Mask.
    pub lbstm: U64,
    /// Protection Information Capabilities.
    pub pic: u8,
    _rsvd9: [u8; 3],
    /// Extended LBA Formats 0 to 63 ([`ExtendedLbaFormat`] values), in the
    /// order of the LBA formats of CNS 00h.
    pub elbaf: [U32; 64],
    _rsvd268: [u8; 3828],
}

const _: () = assert!(core::mem::size_of::<IdentifyNamespaceNvm>() == IDENTIFY_SIZE);

/// Extended LBA Format (NVM Command Set Spec 1.0 §4.1.5.2).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct ExtendedLbaFormat {
    /// Storage Tag Size, in bits of the protection information.
    #[bits(7)]
    pub sts: u8,
    /// Protection Information Format ([`pif`]).
    #[bits(2)]
    pub pif: u8,
    #[bits(23)]
    __: u32,
}

/// Protection Information Format values of [`ExtendedLbaFormat::pif`].
pub mod pif {
    /// 16b Guard Protection Information (the format of NVMe 1.4 and before).
    pub const GUARD_16B: u8 = 0b00;
    pub const GUARD_32B: u8 = 0b01;
    pub const GUARD_64B: u8 = 0b10;
}

/// I/O Command Set specific Identify Controller for the NVM Command Set
/// (CNS 06h, CSI 00h; NVM Command Set Spec 1.0 §4.1.5.3): per-command size
/// limits. A zero field reports no limit beyond MDTS or the command's own
/// fields.
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IdentifyControllerNvm {
    /// Verify Size Limit, a power of two of CAP.MPSMIN pages.
    pub vsl: u8,
    /// Write Zeroes Size Limit, a power of two of CAP.MPSMIN pages.
    pub wzsl: u8,
    /// Write Uncorrectable Size Limit, a power of two of CAP.MPSMIN pages.
    pub wusl: u8,
    /// Dataset Management Ranges Limit.
    pub dmrl: u8,
    /// Dataset Management Range Size Limit, in logical blocks.
    pub dmrsl: U32,
    /// Dataset Management Size Limit, in logical blocks.
    pub dmsl: U64,
    _rsvd16: [u8; 4080],
}

const _: () = assert!(core::mem::size_of::<IdentifyControllerNvm>() == IDENTIFY_SIZE);

zeroed!(IdentifyNamespaceNvm);
zeroed!(IdentifyControllerNvm);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn nvm_identify_offsets_match_the_spec() {
        assert_eq!(offset_of!(IdentifyNamespaceNvm, pic), 8);
        assert_eq!(offset_of!(IdentifyNamespaceNvm, elbaf), 12);
        assert_eq!(offset_of!(IdentifyControllerNvm, dmrl), 3);
        assert_eq!(offset_of!(IdentifyControllerNvm, dmrsl), 4);
        assert_eq!(offset_of!(IdentifyControllerNvm, dmsl), 8);
    }

    #[test]
    fn extended_lba_format_puts_pif_above_sts() {
        let e = ExtendedLbaFormat::new()
            .with_sts(48)
            .with_pif(pif::GUARD_64B);
        assert_eq!(u32::from(e), 48 | (0b10 << 7));
    }
}
