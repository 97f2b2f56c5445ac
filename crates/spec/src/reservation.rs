//! Reservations (NVMe Base 2.0 §8.19; NVM Command Set 1.0 §3.2.4–§3.2.7
//! does not repeat them): the command dwords and data structures of
//! Reservation Register (0Dh), Report (0Eh), Acquire (11h) and Release
//! (15h), the reservation types and the namespace's RESCAP bits; the
//! Reservation Notification log page (80h) and its mask (feature 82h).

use bitfield_struct::bitfield;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

dword!(
    Cdw10ResvRegister,
    Cdw10ResvAcquire,
    Cdw10ResvRelease,
    Cdw11ResvReport
);

/// Reservation Type (RTYPE, §8.19 Figure 515 / command Figure 562).
/// An open newtype: a reserved value from a host is kept and refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReservationType(pub u8);

impl ReservationType {
    /// No reservation is held (Report only).
    pub const NONE: Self = Self(0);
    pub const WRITE_EXCLUSIVE: Self = Self(1);
    pub const EXCLUSIVE_ACCESS: Self = Self(2);
    pub const WRITE_EXCLUSIVE_REGISTRANTS_ONLY: Self = Self(3);
    pub const EXCLUSIVE_ACCESS_REGISTRANTS_ONLY: Self = Self(4);
    pub const WRITE_EXCLUSIVE_ALL_REGISTRANTS: Self = Self(5);
    pub const EXCLUSIVE_ACCESS_ALL_REGISTRANTS: Self = Self(6);

    /// Types 1h to 6h; 0h and 7h..FFh are reserved in a command.
    pub fn is_valid(self) -> bool {
        (1..=6).contains(&self.0)
    }

    /// All Registrants types: every registrant holds the reservation.
    pub fn all_registrants(self) -> bool {
        self == Self::WRITE_EXCLUSIVE_ALL_REGISTRANTS
            || self == Self::EXCLUSIVE_ACCESS_ALL_REGISTRANTS
    }

    /// Registrants Only types: one holder, registrants have access.
    pub fn registrants_only(self) -> bool {
        matches!(self.0, 3 | 4)
    }

    /// Write Exclusive types: reads are allowed to every host.
    pub fn write_exclusive(self) -> bool {
        matches!(self.0, 1 | 3 | 5)
    }
}

/// RESCAP — Reservation Capabilities of Identify Namespace (byte 31).
pub mod rescap {
    /// Persist Through Power Loss supported.
    pub const PTPLS: u8 = 1 << 0;
    /// Reservation types 1h..6h supported, bits 1..6.
    pub const ALL_TYPES: u8 = 0x7E;
    /// Ignore Existing Key behaves as NVMe 1.3 and later define it.
    pub const IEKEY13: u8 = 1 << 7;
}

/// Reservation Register CDW10 (§7.3 / Figure 565).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10ResvRegister {
    /// Reservation Register Action: 000b register, 001b unregister,
    /// 010b replace.
    #[bits(3)]
    pub rrega: u8,
    /// Ignore Existing Key: CRKEY is not checked.
    pub iekey: bool,
    #[bits(26)]
    __: u32,
    /// Change Persist Through Power Loss State: 00b no change, 01b
    /// reserved, 10b clear PTPL, 11b set PTPL.
    #[bits(2)]
    pub cptpl: u8,
}

/// RREGA values.
pub mod rrega {
    pub const REGISTER: u8 = 0;
    pub const UNREGISTER: u8 = 1;
    pub const REPLACE: u8 = 2;
}

/// CPTPL values.
pub mod cptpl {
    pub const NO_CHANGE: u8 = 0;
    pub const CLEAR: u8 = 2;
    pub const SET: u8 = 3;
}

/// Reservation Acquire CDW10.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10ResvAcquire {
    /// Reservation Acquire Action: 000b acquire, 001b preempt, 010b
    /// preempt and abort.
    #[bits(3)]
    pub racqa: u8,
    pub iekey: bool,
    #[bits(4)]
    __: u8,
    pub rtype: u8,
    __: u16,
}

/// RACQA values.
pub mod racqa {
    pub const ACQUIRE: u8 = 0;
    pub const PREEMPT: u8 = 1;
    pub const PREEMPT_AND_ABORT: u8 = 2;
}

/// Reservation Release CDW10.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw10ResvRelease {
    /// Reservation Release Action: 000b release, 001b clear.
    #[bits(3)]
    pub rrela: u8,
    pub iekey: bool,
    #[bits(4)]
    __: u8,
    pub rtype: u8,
    __: u16,
}

/// RRELA values.
pub mod rrela {
    pub const RELEASE: u8 = 0;
    pub const CLEAR: u8 = 1;
}

/// Reservation Report CDW11 (CDW10 is NUMD, 0's based dwords).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw11ResvReport {
    /// Extended Data Structure: 128-bit host identifiers.
    pub eds: bool,
    #[bits(31)]
    __: u32,
}

/// Reservation Register data: Current and New Reservation Key.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ResvRegisterData {
    pub crkey: U64,
    pub nrkey: U64,
}

/// Reservation Acquire data: Current and Preempt Reservation Key.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ResvAcquireData {
    pub crkey: U64,
    pub prkey: U64,
}

/// Reservation Release data: the Current Reservation Key.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ResvReleaseData {
    pub crkey: U64,
}

/// Reservation Status data structure header (Report, 24 bytes; 64 with
/// EDS, the rest reserved).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ReservationStatus {
    /// Generation: counts Register, Preempt and Clear.
    pub gen: U32,
    pub rtype: u8,
    /// Number of Registrants (REGSTRNT in 2.0; REGCTL before).
    pub regctl: U16,
    pub rsvd7: [u8; 2],
    /// Persist Through Power Loss State.
    pub ptpls: u8,
    pub rsvd10: [u8; 14],
}

/// Registrant data structure (Report with EDS = 0): 64-bit host id.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RegisteredController {
    /// FFFFh: the registrant's host is not associated with a controller.
    pub cntlid: U16,
    /// Reservation Status: bit 0 holds the reservation.
    pub rcsts: u8,
    pub rsvd3: [u8; 5],
    pub hostid: [u8; 8],
    pub rkey: U64,
}

/// Registrant data structure (Report with EDS = 1): 128-bit host id.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RegisteredControllerExt {
    pub cntlid: U16,
    pub rcsts: u8,
    pub rsvd3: [u8; 5],
    pub rkey: U64,
    pub hostid: [u8; 16],
    pub rsvd32: [u8; 32],
}

/// Bytes of the Reservation Status header with EDS = 1.
pub const EXTENDED_HEADER_SIZE: usize = 64;

/// Reservation Notification log page (80h, Base 2.0 §5.16.1.24): one
/// notification, the oldest the controller holds for the host.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ReservationNotificationLog {
    /// Log Page Count: the notification's number since the last
    /// Controller Level Reset; 0h: an empty page. A notification lost for
    /// want of room still takes a number (the host sees the gap).
    pub count: U64,
    /// Reservation Notification Log Page Type ([`notification`]).
    pub kind: u8,
    /// Number of Available Log Pages after this one (255 at most).
    pub available: u8,
    pub rsvd10: [u8; 2],
    pub nsid: U32,
    pub rsvd16: [u8; 48],
}

/// Reservation Notification Log Page Types; Reservation Notification
/// Mask (82h) CDW11 masks type `t` with bit `t` (REGPRE, RESREL, RESPRE).
pub mod notification {
    pub const EMPTY: u8 = 0;
    /// The host's registration was removed by another host's Preempt.
    pub const REGISTRATION_PREEMPTED: u8 = 1;
    /// A Registrants Only or All Registrants reservation was released.
    pub const RESERVATION_RELEASED: u8 = 2;
    /// The reservation was cleared (Clear) by another host.
    pub const RESERVATION_PREEMPTED: u8 = 3;
    /// The mask bits feature 82h keeps (bits 1 to 3).
    pub const MASK_BITS: u32 = 0b1110;
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn report_structures_have_the_spec_layout() {
        assert_eq!(size_of::<ReservationStatus>(), 24);
        assert_eq!(offset_of!(ReservationStatus, regctl), 5);
        assert_eq!(offset_of!(ReservationStatus, ptpls), 9);
        assert_eq!(size_of::<RegisteredController>(), 24);
        assert_eq!(offset_of!(RegisteredController, hostid), 8);
        assert_eq!(size_of::<RegisteredControllerExt>(), 64);
        assert_eq!(offset_of!(RegisteredControllerExt, hostid), 16);
        assert_eq!(size_of::<ReservationNotificationLog>(), 64);
        assert_eq!(offset_of!(ReservationNotificationLog, nsid), 12);
    }

    #[test]
    fn command_dwords_decode_their_fields() {
        let r = Cdw10ResvRegister::from_bits(0xC000_000A);
        assert_eq!((r.rrega(), r.iekey(), r.cptpl()), (2, true, 3));
        let a = Cdw10ResvAcquire::from_bits(0x0000_0601);
        assert_eq!((a.racqa(), a.iekey(), a.rtype()), (1, false, 6));
        assert!(ReservationType(a.rtype()).all_registrants());
        assert!(!ReservationType(7).is_valid());
    }
}
