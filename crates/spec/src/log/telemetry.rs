//! Telemetry Host-Initiated (07h, §5.16.1.8) and Telemetry
//! Controller-Initiated (08h, §5.16.1.9) log pages: a 512-byte header, then
//! data blocks of 512 bytes in up to three areas (§8.24).

use bitfield_struct::bitfield;
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// Size of the header and of every telemetry data block.
pub const BLOCK: usize = 512;

/// The header of both telemetry logs. Block 0 of the
/// log; data area 1 starts at block 1 and each Last Block field is the
/// number of the area's last block (equal to the previous one's when the
/// area is empty).
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct TelemetryHeader {
    /// Log Identifier: 07h or 08h.
    pub lid: u8,
    _rsvd1: [u8; 4],
    /// IEEE OUI of the vendor that can interpret the data areas.
    pub ieee: [u8; 3],
    /// Data Area 1, 2 and 3 Last Block.
    pub dalb1: U16,
    pub dalb2: U16,
    pub dalb3: U16,
    _rsvd14: [u8; 2],
    /// Data Area 4 Last Block (only with LPA bit 6).
    pub dalb4: U32,
    _rsvd20: [u8; 361],
    /// Telemetry Host-Initiated Data Generation Number (07h only):
    /// incremented at every host-initiated capture.
    pub hostdgn: u8,
    /// Telemetry Controller-Initiated Data Available: 1 while the
    /// controller holds a capture the host has not released.
    pub ctrlavail: u8,
    /// Telemetry Controller-Initiated Data Generation Number.
    pub ctrldgn: u8,
    /// Reason Identifier: vendor specific, why the data was captured.
    pub rsnident: [u8; 128],
}

const _: () = assert!(core::mem::size_of::<TelemetryHeader>() == BLOCK);

impl TelemetryHeader {
    /// An all-zero header, boxed.
    pub fn new_boxed() -> Box<Self> {
        <Self as FromZeros>::new_box_zeroed().unwrap_or_else(|_| std::process::abort())
    }
}

/// Log Specific Parameter of the Telemetry Host-Initiated log.
#[bitfield(u8)]
#[derive(PartialEq, Eq)]
pub struct TelemetryHostLsp {
    /// Create Telemetry Host-Initiated Data: capture the controller's state
    /// now, then return the log.
    pub cthid: bool,
    /// Maximum Created Data Area (NVMe 2.1): 0 the controller decides,
    /// 1 to 4 create data areas up to that one.
    #[bits(3)]
    pub mcda: u8,
    #[bits(4)]
    __: u8,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn telemetry_header_offsets_match_the_spec() {
        assert_eq!(offset_of!(TelemetryHeader, ieee), 5);
        assert_eq!(offset_of!(TelemetryHeader, dalb1), 8);
        assert_eq!(offset_of!(TelemetryHeader, dalb3), 12);
        assert_eq!(offset_of!(TelemetryHeader, dalb4), 16);
        assert_eq!(offset_of!(TelemetryHeader, hostdgn), 381);
        assert_eq!(offset_of!(TelemetryHeader, ctrlavail), 382);
        assert_eq!(offset_of!(TelemetryHeader, ctrldgn), 383);
        assert_eq!(offset_of!(TelemetryHeader, rsnident), 384);
    }

    #[test]
    fn host_lsp_create_with_mcda() {
        // libnvme's "create, up to data area 3": (3 << 1) | 1.
        let lsp = TelemetryHostLsp::from_bits(7);
        assert!(lsp.cthid());
        assert_eq!(lsp.mcda(), 3);
    }
}
