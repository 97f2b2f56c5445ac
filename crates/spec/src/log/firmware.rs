//! The Firmware Slot Information log (03h, §5.16.1.4) and the Firmware
//! Commit actions (§5.12) that change what it shows.

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// Firmware Slot Information log (Figure 209): 512 bytes.
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FirmwareSlotLog {
    /// Active Firmware Info: the slot running now (2:0) and the slot
    /// activated at the next Controller Level Reset (6:4, 0 if none).
    pub afi: u8,
    _rsvd1: [u8; 7],
    /// Firmware Revision for Slot 1 to 7, ASCII; all zeroes for an empty
    /// or unsupported slot.
    pub frs: [[u8; 8]; 7],
    _rsvd64: [u8; 448],
}

const _: () = assert!(core::mem::size_of::<FirmwareSlotLog>() == 512);

impl FirmwareSlotLog {
    /// An all-zero log.
    pub fn new() -> Self {
        Self::new_zeroed()
    }

    /// AFI from the running slot and the slot to activate at the next
    /// reset (0: none).
    pub const fn afi(active: u8, next: u8) -> u8 {
        (active & 0x7) | ((next & 0x7) << 4)
    }
}

impl Default for FirmwareSlotLog {
    fn default() -> Self {
        Self::new()
    }
}

/// Firmware Commit Commit Action values (CDW10 bits 5:3).
pub mod commit_action {
    /// The downloaded image replaces the image in the slot; not activated.
    pub const REPLACE: u8 = 0b000;
    /// Replace, and activate the slot at the next Controller Level Reset.
    pub const REPLACE_AND_ACTIVATE: u8 = 0b001;
    /// Activate the image already in the slot at the next Controller
    /// Level Reset.
    pub const ACTIVATE: u8 = 0b010;
    /// Replace (if an image was downloaded) and activate now, without a
    /// reset (FRMW bit 4).
    pub const REPLACE_AND_ACTIVATE_NOW: u8 = 0b011;
    /// Boot partition actions (110b, 111b) need Boot Partitions.
    pub const REPLACE_BOOT_PARTITION: u8 = 0b110;
    pub const ACTIVATE_BOOT_PARTITION: u8 = 0b111;
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn firmware_slot_log_offsets_match_the_spec() {
        assert_eq!(offset_of!(FirmwareSlotLog, frs), 8);
        assert_eq!(FirmwareSlotLog::afi(2, 3), 0x32);
    }
}
