//! Directives (NVMe Base 2.0 §8.7, Directive Send §5.10, Directive Receive
//! §5.9): the directive types, their operations and the data they return.

use bitfield_struct::bitfield;
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Directive Types (DTYPE, §8.7 Figure 496). Bit `n` of the Identify
/// directive's Supported and Enabled fields is DTYPE `n`.
pub mod dtype {
    pub const IDENTIFY: u8 = 0x00;
    pub const STREAMS: u8 = 0x01;
}

/// Directive Operations (DOPER) of Directive Send.
pub mod send_doper {
    /// Identify: Enable Directive.
    pub const ENABLE_DIRECTIVE: u8 = 0x01;
    /// Streams: Release Identifier (DSPEC names the stream).
    pub const RELEASE_IDENTIFIER: u8 = 0x01;
    /// Streams: Release Resources (of the namespace).
    pub const RELEASE_RESOURCES: u8 = 0x02;
}

/// Directive Operations (DOPER) of Directive Receive.
pub mod receive_doper {
    /// Identify and Streams: Return Parameters.
    pub const RETURN_PARAMETERS: u8 = 0x01;
    /// Streams: Get Status (the open streams).
    pub const GET_STATUS: u8 = 0x02;
    /// Streams: Allocate Resources (CDW12 NSR, dword 0 NAR).
    pub const ALLOCATE_RESOURCES: u8 = 0x03;
}

/// Directive Send and Directive Receive CDW11 (§5.9, §5.10).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw11Directive {
    /// Directive Operation.
    pub doper: u8,
    /// Directive Type.
    pub dtype: u8,
    /// Directive Specific (the stream identifier for Release Identifier).
    pub dspec: u16,
}

/// Enable Directive CDW12 (Identify directive, §8.7.1.2).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw12EnableDirective {
    /// Enable Directive: 1 enables, 0 disables.
    pub endir: bool,
    #[bits(7)]
    __: u8,
    /// Target Directive Type.
    pub tdtype: u8,
    __: u16,
}

/// Allocate Resources CDW12 (Streams directive, §8.7.2.3.3).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw12AllocateResources {
    /// Namespace Streams Requested.
    pub nsr: u16,
    __: u16,
}

dword!(Cdw11Directive, Cdw12EnableDirective, Cdw12AllocateResources);

/// Identify directive Return Parameters (§8.7.1.1): a bit per directive
/// type in each 32-byte field, the rest of the 4 KiB reserved.
pub const IDENTIFY_PARAMETERS_SIZE: usize = 4096;
/// Offset of the Enabled field in the Identify directive's parameters.
pub const IDENTIFY_ENABLED_OFFSET: usize = 32;

/// Streams directive Return Parameters (§8.7.2.3.1), 32 bytes.
#[derive(Debug, Clone, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct StreamsParameters {
    /// Max Streams Limit.
    pub msl: U16,
    /// NVM Subsystem Streams Available.
    pub nssa: U16,
    /// NVM Subsystem Streams Open.
    pub nsso: U16,
    /// NVM Subsystem Stream Capability.
    pub nssc: u8,
    pub rsvd7: [u8; 9],
    /// Stream Write Size, in logical blocks.
    pub sws: U32,
    /// Stream Granularity Size, in units of SWS.
    pub sgs: U16,
    /// Namespace Streams Allocated.
    pub nsa: U16,
    /// Namespace Streams Open.
    pub nso: U16,
    pub rsvd26: [u8; 6],
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn streams_parameters_layout_matches_the_spec() {
        assert_eq!(size_of::<StreamsParameters>(), 32);
        assert_eq!(offset_of!(StreamsParameters, nssc), 6);
        assert_eq!(offset_of!(StreamsParameters, sws), 16);
        assert_eq!(offset_of!(StreamsParameters, nsa), 22);
        assert_eq!(offset_of!(StreamsParameters, nso), 24);
    }

    #[test]
    fn enable_directive_target_type_is_bits_15_to_8() {
        let cdw12 = Cdw12EnableDirective::from_bits(0x0101);
        assert!(cdw12.endir());
        assert_eq!(cdw12.tdtype(), dtype::STREAMS);
    }
}
