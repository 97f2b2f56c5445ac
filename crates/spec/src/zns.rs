//! The Zoned Namespace Command Set (NVMe Zoned Namespace Command Set
//! Specification 1.1, "ZNS"): its Identify structures (CNS 05h and 06h
//! with CSI 02h), the Zone Management Send and Receive command dwords,
//! the zone descriptors of a report, and the Changed Zone List log.
//!
//! Section numbers in this module cite the ZNS specification 1.1.

use bitfield_struct::bitfield;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::identify::{zeroed, IDENTIFY_SIZE};

dword!(Cdw13ZoneMgmtSend, Cdw13ZoneMgmtRecv);

/// I/O Command Set specific Identify Namespace for the Zoned Namespace
/// Command Set (CNS 05h, CSI 02h; §4.1.5.1).
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IdentifyNamespaceZns {
    /// Zone Operation Characteristics: bit 0 variable zone capacity, bit 1
    /// zone active excursions. Linux refuses a namespace with either.
    pub zoc: U16,
    /// Optional Zoned Command Support ([`ozcs`]).
    pub ozcs: U16,
    /// Maximum Active Resources, 0's based; FFFFFFFFh: no limit.
    pub mar: U32,
    /// Maximum Open Resources, 0's based; FFFFFFFFh: no limit.
    pub mor: U32,
    /// Reset Recommended Limit, seconds (0: not reported).
    pub rrl: U32,
    /// Finish Recommended Limit, seconds (0: not reported).
    pub frl: U32,
    _rsvd20: [u8; 2796],
    /// LBA Format Extensions, one per LBA format of CNS 00h.
    pub lbafe: [LbaFormatExtension; 64],
    _vs: [u8; 256],
}

const _: () = assert!(core::mem::size_of::<IdentifyNamespaceZns>() == IDENTIFY_SIZE);

/// Optional Zoned Command Support bits.
pub mod ozcs {
    /// Read Across Zone Boundaries: a read may span zones.
    pub const RAZB: u16 = 1 << 0;
}

/// Every MAR or MOR value meaning "no limit".
pub const NO_LIMIT: u32 = 0xFFFF_FFFF;

/// Zoned LBA Format Extension (§4.1.5.1 Figure 49).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LbaFormatExtension {
    /// Zone Size, in logical blocks.
    pub zsze: U64,
    /// Zone Descriptor Extension Size, in 64-byte units.
    pub zdes: u8,
    _rsvd9: [u8; 7],
}

/// I/O Command Set specific Identify Controller for the Zoned Namespace
/// Command Set (CNS 06h, CSI 02h; §4.1.5.2).
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IdentifyControllerZns {
    /// Zone Append Size Limit: a power of two of CAP.MPSMIN pages; 0:
    /// MDTS.
    pub zasl: u8,
    _rsvd1: [u8; 4095],
}

const _: () = assert!(core::mem::size_of::<IdentifyControllerZns>() == IDENTIFY_SIZE);

zeroed!(IdentifyNamespaceZns);
zeroed!(IdentifyControllerZns);

/// Zone Management Send CDW13 (§3.4.3): the action, and whether it applies
/// to every zone (SLBA ignored).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw13ZoneMgmtSend {
    /// Zone Send Action ([`zsa`]).
    pub zsa: u8,
    /// Select All.
    pub select_all: bool,
    /// Zone Send Action Specific Option (ZRWA allocation on open).
    pub zsaso: bool,
    #[bits(22)]
    __: u32,
}

/// Zone Send Action values.
pub mod zsa {
    pub const CLOSE: u8 = 0x01;
    pub const FINISH: u8 = 0x02;
    pub const OPEN: u8 = 0x03;
    pub const RESET: u8 = 0x04;
    pub const OFFLINE: u8 = 0x05;
    pub const SET_ZONE_DESCRIPTOR_EXTENSION: u8 = 0x10;
    pub const FLUSH_EXPLICIT_ZRWA_RANGE: u8 = 0x11;
}

/// Zone Management Receive CDW13 (§3.4.2): the action, its filter, and
/// whether the count is of what was transferred.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw13ZoneMgmtRecv {
    /// Zone Receive Action ([`zra`]).
    pub zra: u8,
    /// Zone Receive Action Specific Field: the state filter ([`zrasf`]).
    pub zrasf: u8,
    /// Partial Report: Number of Zones counts the descriptors transferred.
    pub partial: bool,
    #[bits(15)]
    __: u16,
}

/// Zone Receive Action values.
pub mod zra {
    pub const REPORT_ZONES: u8 = 0x00;
    pub const EXTENDED_REPORT_ZONES: u8 = 0x01;
}

/// Zone Receive Action Specific Field values of the report actions: which
/// zones are listed.
pub mod zrasf {
    pub const ALL: u8 = 0x00;
    pub const EMPTY: u8 = 0x01;
    pub const IMPLICITLY_OPENED: u8 = 0x02;
    pub const EXPLICITLY_OPENED: u8 = 0x03;
    pub const CLOSED: u8 = 0x04;
    pub const FULL: u8 = 0x05;
    pub const READ_ONLY: u8 = 0x06;
    pub const OFFLINE: u8 = 0x07;
}

/// Zone State values (§2.1.1, Zone Descriptor ZS bits 7:4).
pub mod zone_state {
    pub const EMPTY: u8 = 0x1;
    pub const IMPLICITLY_OPENED: u8 = 0x2;
    pub const EXPLICITLY_OPENED: u8 = 0x3;
    pub const CLOSED: u8 = 0x4;
    pub const READ_ONLY: u8 = 0xD;
    pub const FULL: u8 = 0xE;
    pub const OFFLINE: u8 = 0xF;
}

/// Zone Attributes bits of a Zone Descriptor (§3.4.2.2.3 Figure 37).
pub mod za {
    /// Zone Finished by Controller.
    pub const ZFC: u8 = 1 << 0;
    /// Finish Zone Recommended.
    pub const FZR: u8 = 1 << 1;
    /// Reset Zone Recommended.
    pub const RZR: u8 = 1 << 2;
    /// Zone Random Write Area Valid.
    pub const ZRWAV: u8 = 1 << 3;
    /// Zone Descriptor Extension Valid: Set Zone Descriptor Extension
    /// gave the zone its extension data.
    pub const ZDEV: u8 = 1 << 7;
}

/// Zone Descriptor Extension Size (ZDES) unit: 64 bytes.
pub const ZDES_UNIT: usize = 64;

/// Zone Type 2h: Sequential Write Required, the only type defined.
pub const ZONE_TYPE_SEQUENTIAL_WRITE_REQUIRED: u8 = 0x2;

/// The header of a Report Zones data structure (§3.4.2.2.1).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ReportZonesHeader {
    /// Number of Zones: matching the filter from SLBA on, or (partial
    /// report) the descriptors transferred.
    pub nr_zones: U64,
    _rsvd8: [u8; 56],
}

const _: () = assert!(core::mem::size_of::<ReportZonesHeader>() == 64);

impl ReportZonesHeader {
    pub fn new(nr_zones: u64) -> Self {
        let mut h = <Self as zerocopy::FromZeros>::new_zeroed();
        h.nr_zones = U64::new(nr_zones);
        h
    }
}

/// A Zone Descriptor (§3.4.2.2.3).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct ZoneDescriptor {
    /// Zone Type (bits 3:0).
    pub zt: u8,
    /// Zone State (bits 7:4), see [`zone_state`].
    pub zs: u8,
    /// Zone Attributes.
    pub za: u8,
    /// Zone Attributes Information.
    pub zai: u8,
    _rsvd4: [u8; 4],
    /// Zone Capacity, in logical blocks.
    pub zcap: U64,
    /// Zone Start Logical Block Address.
    pub zslba: U64,
    /// Write Pointer.
    pub wp: U64,
    _rsvd32: [u8; 32],
}

const _: () = assert!(core::mem::size_of::<ZoneDescriptor>() == 64);

impl ZoneDescriptor {
    /// A sequential write required zone in `state`.
    pub fn new(state: u8, zslba: u64, zcap: u64, wp: u64) -> Self {
        Self {
            zt: ZONE_TYPE_SEQUENTIAL_WRITE_REQUIRED,
            zs: state << 4,
            zcap: U64::new(zcap),
            zslba: U64::new(zslba),
            wp: U64::new(wp),
            ..Self::default()
        }
    }

    /// The Zone State (ZS bits 7:4).
    pub fn state(&self) -> u8 {
        self.zs >> 4
    }
}

/// The Changed Zone List log (Log Identifier BFh, §4.1.2.1): up to 511
/// zone identifiers (the ZSLBA of each), or FFFFh in the count when more
/// changed.
pub const CHANGED_ZONE_LIST_LID: u8 = 0xBF;

/// Zone identifiers a Changed Zone List holds.
pub const CHANGED_ZONE_LIST_ENTRIES: usize = 511;

/// Number of Zone Identifiers when more zones changed than the list holds
/// (the list is then empty: the host reports every zone).
pub const CHANGED_ZONE_LIST_OVERFLOW: u16 = 0xFFFF;

/// The Changed Zone List log page (§4.1.2.1 Figure 36): 4 KiB.
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ChangedZoneList {
    /// Number of Zone Identifiers ([`CHANGED_ZONE_LIST_OVERFLOW`]: more
    /// than fit).
    pub nrzid: U16,
    _rsvd2: [u8; 6],
    /// Zone Identifiers: the ZSLBA of each zone that changed.
    pub zid: [U64; CHANGED_ZONE_LIST_ENTRIES],
}

const _: () = assert!(core::mem::size_of::<ChangedZoneList>() == 4096);

zeroed!(ChangedZoneList);

/// Asynchronous Event Information "Zone Descriptor Changed" (type Notice,
/// §5.2): the Changed Zone List log has entries.
pub const NOTICE_ZONE_DESCRIPTOR_CHANGED: u8 = 0xEF;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_descriptor_holds_state_in_the_high_nibble() {
        let d = ZoneDescriptor::new(zone_state::FULL, 0x4000, 0x3000, 0x7000);
        let bytes = d.as_bytes();
        assert_eq!(bytes[0], 0x02);
        assert_eq!(bytes[1], 0xE0);
        assert_eq!(&bytes[8..16], &0x3000u64.to_le_bytes());
        assert_eq!(&bytes[16..24], &0x4000u64.to_le_bytes());
        assert_eq!(&bytes[24..32], &0x7000u64.to_le_bytes());
        assert_eq!(d.state(), zone_state::FULL);
    }

    #[test]
    fn zone_mgmt_dwords_put_fields_where_linux_does() {
        // Linux: zsa in CDW13 byte 0, select_all in byte 1 bit 0.
        let send = Cdw13ZoneMgmtSend::from_bits(0x0000_0104);
        assert_eq!((send.zsa(), send.select_all()), (zsa::RESET, true));
        // Linux: zra byte 0, zrasf byte 1, pr byte 2 bit 0.
        let recv = Cdw13ZoneMgmtRecv::from_bits(0x0001_0500);
        assert_eq!(
            (recv.zra(), recv.zrasf(), recv.partial()),
            (zra::REPORT_ZONES, zrasf::FULL, true)
        );
    }

    #[test]
    fn identify_namespace_zns_places_lba_format_extensions_at_2816() {
        let mut id = IdentifyNamespaceZns::new_boxed();
        id.lbafe[1].zsze = U64::new(0x1234);
        id.mor = U32::new(7);
        let bytes = id.as_bytes();
        assert_eq!(&bytes[2816 + 16..2816 + 24], &0x1234u64.to_le_bytes());
        assert_eq!(&bytes[8..12], &7u32.to_le_bytes());
    }
}
