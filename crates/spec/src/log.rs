//! Log pages (§5.16): identifiers and the structures the controller returns.

pub mod firmware;

use bitfield_struct::bitfield;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::cdw::{Cdw10GetLogPage, Cdw11GetLogPage};
pub use crate::log_page_id::LogPageId;

pub mod endurance;
pub mod persistent_event;
pub mod telemetry;

/// Supported Log Pages (00h, §5.16.1.1): one dword per Log Page
/// Identifier, 1 KiB.
pub mod supported_log_pages {
    /// Entries, indexed by Log Page Identifier.
    pub const ENTRIES: usize = 256;
    /// LID Supported.
    pub const LSUPP: u32 = 1 << 0;
    /// Index Offset Supported (CDW14.OT = 1 accepted).
    pub const IOS: u32 = 1 << 1;
}

/// Get Log Page CDW14 (§5.16, Figure 201).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct Cdw14GetLogPage {
    /// UUID Index.
    #[bits(7)]
    pub uuid_index: u8,
    #[bits(16)]
    __: u16,
    /// Offset Type: the Log Page Offset is an index into the log's entries,
    /// not a byte offset.
    pub ot: bool,
    /// Command Set Identifier.
    pub csi: u8,
}

dword!(Cdw14GetLogPage);

/// Get Log Page command fields (§5.16, Figures 197-200).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetLogPage {
    pub lid: LogPageId,
    /// Log Specific Parameter.
    pub lsp: u8,
    /// Retain Asynchronous Event.
    pub rae: bool,
    /// Log Specific Identifier (e.g. the Endurance Group Identifier).
    pub lsi: u16,
    /// Number of dwords to return, 1-based (NUMD + 1).
    pub dwords: u32,
    /// Log Page Offset in bytes.
    pub offset: u64,
}

impl GetLogPage {
    pub fn parse(cdw10: u32, cdw11: u32, cdw12: u32, cdw13: u32) -> Self {
        let (d10, d11) = (Cdw10GetLogPage::from(cdw10), Cdw11GetLogPage::from(cdw11));
        let numd_z = u32::from(d10.numdl()) | (u32::from(d11.numdu()) << 16);
        Self {
            lid: d10.lid(),
            lsp: d10.lsp(),
            rae: d10.rae(),
            lsi: d11.lsi(),
            dwords: numd_z.saturating_add(1),
            offset: u64::from(cdw12) | (u64::from(cdw13) << 32),
        }
    }

    /// Command dwords 10 to 13 for this request (`dwords` must be >= 1).
    pub fn to_cdws(self) -> [u32; 4] {
        let numd_z = self.dwords.saturating_sub(1);
        let cdw10 = Cdw10GetLogPage::new()
            .with_lid(self.lid)
            .with_lsp(self.lsp & 0x7F)
            .with_rae(self.rae)
            .with_numdl(numd_z as u16);
        let cdw11 = Cdw11GetLogPage::new()
            .with_numdu((numd_z >> 16) as u16)
            .with_lsi(self.lsi);
        [
            cdw10.into(),
            cdw11.into(),
            self.offset as u32,
            (self.offset >> 32) as u32,
        ]
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        u64::from(self.dwords) * 4
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Error Information Log Entry (§5.16.1.2, Figure 205): 64 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ErrorLogEntry {
    /// Error Count: unique, increasing; 0 means the entry is invalid.
    pub error_count: U64,
    pub sqid: U16,
    pub cid: U16,
    /// Status Field: phase (bit 0) and status (15:1), as in the CQE.
    pub status: U16,
    /// Parameter Error Location: byte (7:0) and bit (10:8) in the command.
    pub param_error_location: U16,
    pub lba: U64,
    pub nsid: U32,
    pub vendor_info_available: u8,
    pub trtype: u8,
    _rsvd30: [u8; 2],
    pub command_specific: U64,
    pub trtype_specific: U16,
    _rsvd42: [u8; 22],
}

const _: () = assert!(core::mem::size_of::<ErrorLogEntry>() == 64);

/// SMART / Health Information log (§5.16.1.3, Figure 207): 512 bytes.
/// 128-bit counters are stored as 16 little-endian bytes.
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SmartLog {
    pub critical_warning: u8,
    /// Composite Temperature in kelvins.
    pub composite_temperature: U16,
    pub available_spare: u8,
    pub available_spare_threshold: u8,
    pub percentage_used: u8,
    pub endurance_group_summary: u8,
    _rsvd7: [u8; 25],
    /// Data Units Read, in thousands of 512-byte units.
    pub data_units_read: [u8; 16],
    pub data_units_written: [u8; 16],
    pub host_read_commands: [u8; 16],
    pub host_write_commands: [u8; 16],
    pub controller_busy_time: [u8; 16],
    pub power_cycles: [u8; 16],
    pub power_on_hours: [u8; 16],
    pub unsafe_shutdowns: [u8; 16],
    pub media_errors: [u8; 16],
    pub error_log_entries: [u8; 16],
    pub warning_temp_time: U32,
    pub critical_temp_time: U32,
    pub temperature_sensors: [U16; 8],
    pub thermal_transitions: [U32; 4],
    _rsvd232: [u8; 280],
}

const _: () = assert!(core::mem::size_of::<SmartLog>() == 512);

/// Stores a counter into a 128-bit little-endian SMART field.
pub fn set_u128(field: &mut [u8; 16], value: u128) {
    *field = value.to_le_bytes();
}

/// Reads a 128-bit little-endian SMART field.
pub fn get_u128(field: &[u8; 16]) -> u128 {
    u128::from_le_bytes(*field)
}

/// Changed Namespace List log (§5.16.1.5): up to 1024 NSIDs; if more changed,
/// the first entry is 0xFFFF_FFFF and the rest zero.
pub type ChangedNamespaceList = [U32; 1024];

/// Commands Supported and Effects log (§5.16.1.6, Figure 210): 4096 bytes.
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct CommandEffectsLog {
    /// Admin Command Supported, indexed by opcode.
    pub acs: [U32; 256],
    /// I/O Command Supported, indexed by opcode.
    pub iocs: [U32; 256],
    _rsvd2048: [u8; 2048],
}

const _: () = assert!(core::mem::size_of::<CommandEffectsLog>() == 4096);

/// Commands Supported and Effects entry bits (§5.16.1.6, Figure 211).
pub mod effects {
    /// Command Supported.
    pub const CSUPP: u32 = 1 << 0;
    /// Logical Block Content Change.
    pub const LBCC: u32 = 1 << 1;
    /// Namespace Capability Change.
    pub const NCC: u32 = 1 << 2;
    /// Namespace Inventory Change.
    pub const NIC: u32 = 1 << 3;
    /// Controller Capability Change.
    pub const CCC: u32 = 1 << 4;
    /// Command Submission and Execution: 001b no other command to the namespace at once.
    pub const CSE_NAMESPACE: u32 = 1 << 16;
}

/// Asynchronous event completion dword 0 (§5.2, Figure 150): type (2:0),
/// information (15:8), log page identifier (23:16).
pub mod async_event {
    pub const TYPE_ERROR: u8 = 0;
    pub const TYPE_SMART: u8 = 1;
    pub const TYPE_NOTICE: u8 = 2;
    pub const TYPE_IO_COMMAND_SET: u8 = 6;
    pub const TYPE_VENDOR: u8 = 7;
    /// Notice information: Namespace Attribute Changed.
    pub const NOTICE_NS_ATTRIBUTE_CHANGED: u8 = 0x00;
    /// Notice information: Firmware Activation Starting (log page 03h).
    pub const NOTICE_FIRMWARE_ACTIVATION_STARTING: u8 = 0x01;
    /// Notice information: Asymmetric Namespace Access Change (log page 0Ch).
    pub const NOTICE_ANA_CHANGE: u8 = 0x03;
    /// I/O command specific information: Reservation Log Page Available
    /// (log page 80h).
    pub const IO_RESERVATION_LOG_AVAILABLE: u8 = 0x00;
    /// NVM command set specific information: Sanitize Operation Completed
    /// (log page 81h).
    pub const IO_SANITIZE_COMPLETED: u8 = 0x01;
    /// SMART / Health information (§5.2, Figure 146): NVM subsystem
    /// reliability, temperature threshold, spare below threshold.
    pub const SMART_RELIABILITY: u8 = 0x00;
    pub const SMART_TEMPERATURE_THRESHOLD: u8 = 0x01;
    pub const SMART_SPARE_BELOW_THRESHOLD: u8 = 0x02;

    /// Completion dword 0 for an event: type (bits above 2 dropped),
    /// information and log page.
    pub fn dword0(kind: u8, info: u8, lid: u8) -> u32 {
        crate::cdw::AsyncEventCompletion::new()
            .with_aet(kind & 0x7)
            .with_aei(info)
            .with_lid(lid)
            .into()
    }
}

/// Sanitize Status log (§5.16.1.25, Figure 291): 512 bytes.
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SanitizeStatusLog {
    /// Sanitize Progress, in 65536ths; FFFFh when none is in progress.
    pub sprog: U16,
    /// Sanitize Status (see [`sanitize::sstat`]).
    pub sstat: U16,
    /// CDW10 of the Sanitize command that started the operation.
    pub scdw10: U32,
    /// Estimated seconds for an Overwrite (16 passes), Block Erase and
    /// Crypto Erase; FFFFFFFFh: not reported.
    pub eto: U32,
    pub etbe: U32,
    pub etce: U32,
    /// The same with No-Deallocate media modification (SANICAP.NODMMAS 10b).
    pub etond: U32,
    pub etbend: U32,
    pub etcend: U32,
    /// Estimated Time For Post-Verification Deallocation State.
    pub etpvds: U32,
    /// Sanitize State Information.
    pub ssi: u8,
    _rsvd37: [u8; 475],
}

const _: () = assert!(core::mem::size_of::<SanitizeStatusLog>() == 512);

/// Sanitize command and log values (§5.24, §5.16.1.25).
pub mod sanitize {
    /// Sanitize Action (CDW10 2:0).
    pub mod action {
        pub const EXIT_FAILURE_MODE: u8 = 1;
        pub const BLOCK_ERASE: u8 = 2;
        pub const OVERWRITE: u8 = 3;
        pub const CRYPTO_ERASE: u8 = 4;
        pub const EXIT_MEDIA_VERIFICATION: u8 = 5;
    }

    /// Sanitize Status (SSTAT): the most recent operation's status (2:0),
    /// Overwrite passes completed (7:3), Global Data Erased (8).
    pub mod sstat {
        pub const NEVER_SANITIZED: u16 = 0;
        pub const COMPLETED: u16 = 1;
        pub const IN_PROGRESS: u16 = 2;
        pub const FAILED: u16 = 3;
        /// Completed, deallocating although No-Deallocate was asked for.
        pub const COMPLETED_DEALLOCATED: u16 = 4;
        pub const PASSES_SHIFT: u16 = 3;
        pub const GLOBAL_DATA_ERASED: u16 = 1 << 8;
    }

    /// SPROG while no sanitize operation is in progress.
    pub const SPROG_IDLE: u16 = 0xFFFF;
    /// An estimated time that is not reported.
    pub const NOT_REPORTED: u32 = 0xFFFF_FFFF;
}

/// One Self-test Result Data Structure (§5.16.1.7, Figure 214): 28 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SelfTestResult {
    /// Device Self-test Status: the Self-test Code (7:4) and the result
    /// (3:0, [`self_test::result`]).
    pub dsts: u8,
    /// Segment Number of the first failed segment (result 7h).
    pub seg: u8,
    /// Valid Diagnostic Information ([`self_test::vdi`]).
    pub vdi: u8,
    _rsvd3: u8,
    /// Power On Hours when the operation completed or was aborted.
    pub poh: U64,
    /// The namespace of the Failing LBA.
    pub nsid: U32,
    /// Failing LBA.
    pub flba: U64,
    /// Status Code Type and Status Code of the failure.
    pub sct: u8,
    pub sc: u8,
    pub vs: [u8; 2],
}

const _: () = assert!(core::mem::size_of::<SelfTestResult>() == 28);

/// Device Self-test log (§5.16.1.7, Figure 213): the operation in
/// progress and the last 20 results, newest first. 564 bytes.
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SelfTestLog {
    /// Current Device Self-Test Operation: 0 none, else its Self-test Code.
    pub current_operation: u8,
    /// Current Device Self-Test Completion, percent (6:0).
    pub completion: u8,
    _rsvd2: [u8; 2],
    pub results: [SelfTestResult; self_test::RESULTS],
}

const _: () = assert!(core::mem::size_of::<SelfTestLog>() == 564);

/// Device Self-test command and log values (§5.9, §5.16.1.7).
pub mod self_test {
    /// Result entries the log keeps.
    pub const RESULTS: usize = 20;

    /// Self-test Code (CDW10 3:0), and the high nibble of DSTS.
    pub mod code {
        pub const SHORT: u8 = 0x1;
        pub const EXTENDED: u8 = 0x2;
        pub const ABORT: u8 = 0xF;
    }

    /// Self-test result (DSTS 3:0).
    pub mod result {
        pub const NO_ERROR: u8 = 0x0;
        /// Aborted by a Device Self-test command.
        pub const ABORTED: u8 = 0x1;
        /// Aborted by a Controller Level Reset.
        pub const ABORTED_RESET: u8 = 0x2;
        /// Aborted: a namespace was removed from the namespace inventory.
        pub const ABORTED_NS_REMOVED: u8 = 0x3;
        /// Aborted by a Format NVM command.
        pub const ABORTED_FORMAT: u8 = 0x4;
        pub const FATAL_ERROR: u8 = 0x5;
        pub const UNKNOWN_SEGMENT_FAILED: u8 = 0x6;
        /// One or more segments failed: the first in the Segment Number.
        pub const SEGMENT_FAILED: u8 = 0x7;
        pub const ABORTED_UNKNOWN: u8 = 0x8;
        /// Aborted by a sanitize operation.
        pub const ABORTED_SANITIZE: u8 = 0x9;
        /// The entry holds no result.
        pub const NOT_USED: u8 = 0xF;
    }

    /// Valid Diagnostic Information bits.
    pub mod vdi {
        pub const NSID: u8 = 1 << 0;
        pub const FLBA: u8 = 1 << 1;
        pub const SCT: u8 = 1 << 2;
        pub const SC: u8 = 1 << 3;
    }
}

macro_rules! zeroed {
    ($t:ty) => {
        impl $t {
            /// An all-zero structure, boxed.
            pub fn new_boxed() -> Box<Self> {
                <Self as FromZeros>::new_box_zeroed().unwrap_or_else(|_| std::process::abort())
            }
        }
    };
}
zeroed!(SmartLog);
zeroed!(CommandEffectsLog);
zeroed!(SanitizeStatusLog);
zeroed!(SelfTestLog);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn smart_log_offsets_match_the_spec() {
        assert_eq!(offset_of!(SmartLog, composite_temperature), 1);
        assert_eq!(offset_of!(SmartLog, data_units_read), 32);
        assert_eq!(offset_of!(SmartLog, host_read_commands), 64);
        assert_eq!(offset_of!(SmartLog, power_cycles), 112);
        assert_eq!(offset_of!(SmartLog, error_log_entries), 176);
        assert_eq!(offset_of!(SmartLog, temperature_sensors), 200);
    }

    #[test]
    fn sanitize_and_self_test_log_offsets_match_the_spec() {
        assert_eq!(offset_of!(SanitizeStatusLog, scdw10), 4);
        assert_eq!(offset_of!(SanitizeStatusLog, etbe), 12);
        assert_eq!(offset_of!(SanitizeStatusLog, etpvds), 32);
        assert_eq!(offset_of!(SanitizeStatusLog, ssi), 36);
        assert_eq!(offset_of!(SelfTestResult, poh), 4);
        assert_eq!(offset_of!(SelfTestResult, nsid), 12);
        assert_eq!(offset_of!(SelfTestResult, flba), 16);
        assert_eq!(offset_of!(SelfTestResult, sct), 24);
        assert_eq!(offset_of!(SelfTestLog, results), 4);
    }

    #[test]
    fn get_log_page_round_trips() {
        let g = GetLogPage {
            lid: LogPageId::SMART_HEALTH,
            lsp: 0,
            rae: true,
            lsi: 1,
            dwords: 128,
            offset: 8,
        };
        let [a, b, c, d] = g.to_cdws();
        assert_eq!(GetLogPage::parse(a, b, c, d), g);
        assert_eq!(a & 0xFF, 2);
        assert_eq!(a >> 16, 127);
        assert_eq!(b >> 16, 1, "LSI in CDW11 31:16");
    }

    #[test]
    fn get_log_page_with_all_ones_numd_does_not_overflow() {
        let g = GetLogPage::parse(0xFFFF_0002, 0xFFFF, 0, 0);
        assert_eq!(g.dwords, u32::MAX);
    }
}
