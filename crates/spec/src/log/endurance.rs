//! Endurance Group Information log page (09h, §5.16.1.10): selected by the
//! Log Specific Identifier (the Endurance Group Identifier).

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// Endurance Group Information log: 512 bytes; 128-bit
/// counters as 16 little-endian bytes, data units in thousands of 512-byte
/// units, as in the SMART / Health log.
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct EnduranceGroupLog {
    pub critical_warning: u8,
    /// Endurance Group Features.
    pub egfeat: u8,
    _rsvd2: u8,
    pub available_spare: u8,
    pub available_spare_threshold: u8,
    pub percentage_used: u8,
    pub domain_identifier: [u8; 2],
    _rsvd8: [u8; 24],
    pub endurance_estimate: [u8; 16],
    pub data_units_read: [u8; 16],
    pub data_units_written: [u8; 16],
    pub media_units_written: [u8; 16],
    pub host_read_commands: [u8; 16],
    pub host_write_commands: [u8; 16],
    pub media_and_data_integrity_errors: [u8; 16],
    pub error_log_entries: [u8; 16],
    /// Total Endurance Group Capacity, bytes.
    pub tegcap: [u8; 16],
    /// Unallocated Endurance Group Capacity, bytes.
    pub uegcap: [u8; 16],
    _rsvd192: [u8; 320],
}

const _: () = assert!(core::mem::size_of::<EnduranceGroupLog>() == 512);

impl EnduranceGroupLog {
    /// An all-zero log, boxed.
    pub fn new_boxed() -> Box<Self> {
        <Self as FromZeros>::new_box_zeroed().unwrap_or_else(|_| std::process::abort())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn endurance_group_log_offsets_match_the_spec() {
        assert_eq!(offset_of!(EnduranceGroupLog, percentage_used), 5);
        assert_eq!(offset_of!(EnduranceGroupLog, endurance_estimate), 32);
        assert_eq!(offset_of!(EnduranceGroupLog, data_units_read), 48);
        assert_eq!(offset_of!(EnduranceGroupLog, host_read_commands), 96);
        assert_eq!(offset_of!(EnduranceGroupLog, error_log_entries), 144);
        assert_eq!(offset_of!(EnduranceGroupLog, tegcap), 160);
        assert_eq!(offset_of!(EnduranceGroupLog, uegcap), 176);
    }
}
