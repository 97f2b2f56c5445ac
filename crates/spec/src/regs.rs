//! Controller registers (§3.1.4) as bitfield structs, and their offsets in BAR0.

use std::ops::Range;

use bitfield_struct::bitfield;

/// Register offsets in BAR0 (§3.1.4, Figure 33).
pub mod offset {
    pub const CAP: u64 = 0x00;
    pub const VS: u64 = 0x08;
    pub const INTMS: u64 = 0x0C;
    pub const INTMC: u64 = 0x10;
    pub const CC: u64 = 0x14;
    pub const CSTS: u64 = 0x1C;
    pub const NSSR: u64 = 0x20;
    pub const AQA: u64 = 0x24;
    pub const ASQ: u64 = 0x28;
    pub const ACQ: u64 = 0x30;
    pub const CMBLOC: u64 = 0x38;
    pub const CMBSZ: u64 = 0x3C;
    pub const CRTO: u64 = 0x68;
    /// First doorbell register: SQ 0 tail.
    pub const DOORBELLS: u64 = 0x1000;
}

/// Where everything lives in vnvme's BAR0 (16 KiB, one page each): the
/// controller registers (§3.1.4) from 0, the doorbell array from
/// [`offset::DOORBELLS`] to the end of that page, then the PCI layer's MSI-X
/// table and Pending Bit Array (PCI Express Base §7.7.2). The controller,
/// the PCI function and the driver all read the layout from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bar0Layout;

impl Bar0Layout {
    /// The controller registers.
    pub const REGISTERS: Range<u64> = 0..offset::DOORBELLS;
    /// The doorbell page: SQ y tail and CQ y head doorbells at DSTRD 0 for
    /// qids up to [`MAX_QID`](Self::MAX_QID). Mmap-poll offers it for mmap.
    pub const DOORBELLS: Range<u64> = offset::DOORBELLS..0x2000;
    /// The MSI-X table: one page of 16-byte entries.
    pub const MSIX_TABLE: Range<u64> = 0x2000..0x3000;
    /// The MSI-X Pending Bit Array.
    pub const MSIX_PBA: Range<u64> = 0x3000..0x4000;
    /// BAR0's size (a power of two, as a BAR must be).
    pub const SIZE: u64 = 0x4000;
    /// The highest queue id whose two doorbells (8 bytes at DSTRD 0) fit the
    /// doorbell page: 511, so at most 511 I/O queue pairs besides admin.
    pub const MAX_QID: u16 = ((Self::DOORBELLS.end - Self::DOORBELLS.start) / 8 - 1) as u16;
}

/// NSSR value that triggers an NVM Subsystem Reset ("NVMe").
pub const NSSR_RESET: u32 = 0x4E56_4D65;

/// Which doorbell a BAR0 offset at or above [`offset::DOORBELLS`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doorbell {
    /// Submission queue `qid` tail doorbell.
    SqTail(u16),
    /// Completion queue `qid` head doorbell.
    CqHead(u16),
}

impl Doorbell {
    /// Decodes a BAR0 offset into a doorbell, given CAP.DSTRD. Returns `None`
    /// for offsets that are not the start of a doorbell or beyond qid 65535.
    pub fn decode(bar_offset: u64, dstrd: u8) -> Option<Self> {
        let rel = bar_offset.checked_sub(offset::DOORBELLS)?;
        let stride = 4u64 << dstrd;
        if rel % stride != 0 {
            return None;
        }
        let index = rel / stride;
        let qid = u16::try_from(index / 2).ok()?;
        Some(if index.is_multiple_of(2) {
            Doorbell::SqTail(qid)
        } else {
            Doorbell::CqHead(qid)
        })
    }

    /// Index of this doorbell in the doorbell array (and in the shadow
    /// doorbell / EventIdx buffers, §5.8): `2y` for SQ y, `2y + 1` for CQ y.
    pub fn index(self) -> u32 {
        match self {
            Doorbell::SqTail(q) => 2 * u32::from(q),
            Doorbell::CqHead(q) => 2 * u32::from(q) + 1,
        }
    }

    /// BAR0 offset of this doorbell, given CAP.DSTRD.
    pub fn offset(self, dstrd: u8) -> u64 {
        offset::DOORBELLS + u64::from(self.index()) * (4u64 << dstrd)
    }
}

/// CAP — Controller Capabilities (§3.1.4.1).
#[bitfield(u64)]
#[derive(PartialEq, Eq)]
pub struct Cap {
    /// Maximum Queue Entries Supported, 0's based.
    pub mqes_z: u16,
    /// Contiguous Queues Required.
    pub cqr: bool,
    /// Arbitration Mechanism Supported.
    #[bits(2)]
    pub ams: u8,
    #[bits(5)]
    __: u8,
    /// Timeout, in 500 ms units: worst case time to set CSTS.RDY.
    pub to: u8,
    /// Doorbell Stride: doorbells are `4 << dstrd` bytes apart.
    #[bits(4)]
    pub dstrd: u8,
    /// NVM Subsystem Reset Supported.
    pub nssrs: bool,
    /// Command Sets Supported (bit 0: NVM command set).
    pub css: u8,
    /// Boot Partition Support.
    pub bps: bool,
    /// Controller Power Scope.
    #[bits(2)]
    pub cps: u8,
    /// Memory Page Size Minimum: `2 ^ (12 + mpsmin)`.
    #[bits(4)]
    pub mpsmin: u8,
    /// Memory Page Size Maximum: `2 ^ (12 + mpsmax)`.
    #[bits(4)]
    pub mpsmax: u8,
    /// Persistent Memory Region Supported.
    pub pmrs: bool,
    /// Controller Memory Buffer Supported.
    pub cmbs: bool,
    /// NVM Subsystem Shutdown Supported.
    pub nsss: bool,
    /// Controller Ready With Media Support (CRMS.CRWMS).
    pub crwms: bool,
    /// Controller Ready Independent of Media Support (CRMS.CRIMS).
    pub crims: bool,
    #[bits(3)]
    __: u8,
}

/// VS — Version (§3.1.4.2).
pub const fn version(major: u16, minor: u8, tertiary: u8) -> u32 {
    ((major as u32) << 16) | ((minor as u32) << 8) | tertiary as u32
}

/// CC — Controller Configuration (§3.1.4.5).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cc {
    /// Enable.
    pub en: bool,
    #[bits(3)]
    __: u8,
    /// I/O Command Set Selected.
    #[bits(3)]
    pub css: u8,
    /// Memory Page Size: `2 ^ (12 + mps)`.
    #[bits(4)]
    pub mps: u8,
    /// Arbitration Mechanism Selected.
    #[bits(3)]
    pub ams: u8,
    /// Shutdown Notification: 0 none, 1 normal, 2 abrupt.
    #[bits(2)]
    pub shn: u8,
    /// I/O Submission Queue Entry Size, as a power of two.
    #[bits(4)]
    pub iosqes: u8,
    /// I/O Completion Queue Entry Size, as a power of two.
    #[bits(4)]
    pub iocqes: u8,
    /// Controller Ready Independent of Media Enable.
    pub crime: bool,
    #[bits(7)]
    __: u8,
}

/// CAP.CSS bits and CC.CSS values (§3.1.4.1, §3.1.4.5): the I/O command
/// sets a controller supports, and the ones the host selects.
pub mod css {
    /// CAP.CSS.NCSS: the NVM Command Set.
    pub const CAP_NVM: u8 = 1 << 0;
    /// CAP.CSS.IOCSS: I/O Command Set specific selection, CC.CSS = 110b,
    /// with the combinations in Identify CNS 1Ch.
    pub const CAP_IOCS: u8 = 1 << 6;
    /// CC.CSS: the NVM Command Set.
    pub const NVM: u8 = 0b000;
    /// CC.CSS: All Supported I/O Command Sets, the combination chosen by
    /// the I/O Command Set Profile feature.
    pub const ALL_IOCS: u8 = 0b110;
}

/// CSTS — Controller Status (§3.1.4.6).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Csts {
    /// Ready.
    pub rdy: bool,
    /// Controller Fatal Status.
    pub cfs: bool,
    /// Shutdown Status: 0 normal operation, 1 occurring, 2 complete.
    #[bits(2)]
    pub shst: u8,
    /// NVM Subsystem Reset Occurred.
    pub nssro: bool,
    /// Processing Paused.
    pub pp: bool,
    /// Shutdown Type.
    pub st: bool,
    #[bits(25)]
    __: u32,
}

/// CSTS.SHST / CC.SHN values.
pub mod shutdown {
    pub const NONE: u8 = 0;
    pub const NORMAL: u8 = 1;
    pub const ABRUPT: u8 = 2;
    /// CSTS.SHST: shutdown processing occurring.
    pub const OCCURRING: u8 = 1;
    /// CSTS.SHST: shutdown processing complete.
    pub const COMPLETE: u8 = 2;
}

/// AQA — Admin Queue Attributes (§3.1.4.8).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Aqa {
    /// Admin Submission Queue Size, 0's based.
    #[bits(12)]
    pub asqs_z: u16,
    #[bits(4)]
    __: u8,
    /// Admin Completion Queue Size, 0's based.
    #[bits(12)]
    pub acqs_z: u16,
    #[bits(4)]
    __: u8,
}

/// CRTO — Controller Ready Timeouts (§3.1.4.21), both in 500 ms units.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Crto {
    /// Controller Ready With Media Timeout.
    pub crwmt: u16,
    /// Controller Ready Independent of Media Timeout.
    pub crimt: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar0_layout_tiles_the_bar_and_the_last_doorbell_fits() {
        let regions = [
            Bar0Layout::REGISTERS,
            Bar0Layout::DOORBELLS,
            Bar0Layout::MSIX_TABLE,
            Bar0Layout::MSIX_PBA,
        ];
        assert_eq!(regions[0].start, 0);
        for pair in regions.windows(2) {
            assert_eq!(pair[0].end, pair[1].start);
        }
        assert_eq!(regions[3].end, Bar0Layout::SIZE);
        assert!(Bar0Layout::SIZE.is_power_of_two());
        let last = Doorbell::CqHead(Bar0Layout::MAX_QID).offset(0);
        assert_eq!(last + 4, Bar0Layout::DOORBELLS.end);
    }

    #[test]
    fn cap_fields_land_on_spec_bits() {
        let cap = Cap::new()
            .with_mqes_z(1023)
            .with_to(20)
            .with_dstrd(1)
            .with_css(1)
            .with_mpsmax(4);
        let raw = u64::from(cap);
        assert_eq!(raw & 0xFFFF, 1023);
        assert_eq!((raw >> 24) & 0xFF, 20);
        assert_eq!((raw >> 32) & 0xF, 1);
        assert_eq!((raw >> 37) & 0xFF, 1);
        assert_eq!((raw >> 52) & 0xF, 4);
    }

    #[test]
    fn cc_fields_land_on_spec_bits() {
        let cc = Cc::from(0x0046_0001);
        assert!(cc.en());
        assert_eq!(cc.iosqes(), 6);
        assert_eq!(cc.iocqes(), 4);
        assert_eq!(cc.mps(), 0);
        assert_eq!(u32::from(Cc::new().with_shn(1)), 1 << 14);
    }

    #[test]
    fn doorbell_decode_round_trips() {
        for dstrd in [0u8, 2] {
            for db in [
                Doorbell::SqTail(0),
                Doorbell::CqHead(0),
                Doorbell::SqTail(7),
                Doorbell::CqHead(65535),
            ] {
                assert_eq!(Doorbell::decode(db.offset(dstrd), dstrd), Some(db));
            }
        }
        assert_eq!(Doorbell::decode(0x1002, 0), None);
        assert_eq!(Doorbell::decode(0xFFC, 0), None);
    }
}
