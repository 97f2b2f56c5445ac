//! Persistent Event Log (0Dh, §5.16.1.14): a 512-byte header, then events,
//! each a 24-byte event header and its data.

use bitfield_struct::bitfield;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// Log Revision of the NVMe 2.0 header (with GN and RCI).
pub const LOG_REVISION: u8 = 1;
/// Log Header Length: bytes of the header after byte 19.
pub const LOG_HEADER_LENGTH: u16 = 512 - 20;
/// Event Header Length: bytes of an event header after byte 2.
pub const EVENT_HEADER_LENGTH: u8 = 24 - 3;

/// Persistent Event Log header.
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct PersistentEventLogHeader {
    /// Log Identifier (0Dh).
    pub lid: u8,
    _rsvd1: [u8; 3],
    /// Total Number of Events.
    pub tnev: U32,
    /// Total Log Length: bytes of the header and every event.
    pub tll: U64,
    /// Log Revision.
    pub rv: u8,
    _rsvd17: u8,
    /// Log Header Length.
    pub lhl: U16,
    /// Timestamp (Timestamp feature format) when the context was taken.
    pub ts: U64,
    /// Power on Hours, 128 bits.
    pub poh: [u8; 16],
    /// Power Cycle Count.
    pub pcc: U64,
    pub vid: U16,
    pub ssvid: U16,
    pub sn: [u8; 20],
    pub mn: [u8; 40],
    pub subnqn: [u8; 256],
    /// Generation Number.
    pub gn: U16,
    /// Reporting Context Information ([`ReportingContext`]).
    pub rci: U32,
    _rsvd378: [u8; 102],
    /// Supported Events Bitmap: bit N set if event type N is reported.
    pub seb: [u8; 32],
}

const _: () = assert!(core::mem::size_of::<PersistentEventLogHeader>() == 512);

/// Persistent Event Log event header: 24 bytes before each event's data.
#[repr(C)]
#[derive(Clone, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct PersistentEventHeader {
    /// Event Type ([`EventType`]).
    pub etype: u8,
    /// Event Type Revision.
    pub etype_rev: u8,
    /// Event Header Length: [`EVENT_HEADER_LENGTH`].
    pub ehl: u8,
    /// Event Header Additional Information: port identifier type (1:0).
    pub ehai: u8,
    /// Controller Identifier of the controller the event is about.
    pub cntlid: U16,
    /// Event Timestamp (Timestamp feature format).
    pub ets: U64,
    /// Port Identifier.
    pub pelpid: U16,
    _rsvd16: [u8; 4],
    /// Vendor Specific Information Length.
    pub vsil: U16,
    /// Event Length: bytes after the event header (vendor specific
    /// information and event data).
    pub el: U16,
}

const _: () = assert!(core::mem::size_of::<PersistentEventHeader>() == 24);

/// Event Type, an open newtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventType(pub u8);

impl EventType {
    pub const SMART_HEALTH_SNAPSHOT: Self = Self(0x01);
    pub const FIRMWARE_COMMIT: Self = Self(0x02);
    pub const TIMESTAMP_CHANGE: Self = Self(0x03);
    pub const POWER_ON_OR_RESET: Self = Self(0x04);
    pub const NVM_SUBSYSTEM_HARDWARE_ERROR: Self = Self(0x05);
    pub const CHANGE_NAMESPACE: Self = Self(0x06);
    pub const FORMAT_NVM_START: Self = Self(0x07);
    pub const FORMAT_NVM_COMPLETION: Self = Self(0x08);
    pub const SANITIZE_START: Self = Self(0x09);
    pub const SANITIZE_COMPLETION: Self = Self(0x0A);
    pub const SET_FEATURE: Self = Self(0x0B);
    pub const TELEMETRY_LOG_CREATE: Self = Self(0x0C);
    pub const THERMAL_EXCURSION: Self = Self(0x0D);
}

/// Controller Reset Information descriptor of a Power-on or Reset event,
/// after the event's 8-byte Firmware Revision.
#[repr(C)]
#[derive(Clone, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ResetInformation {
    pub cntlid: U16,
    /// Firmware Activation: a firmware image was activated by this reset.
    pub fa: u8,
    /// Operation in Progress (e.g. a sanitize) at the reset.
    pub oip: u8,
    _rsvd4: [u8; 12],
    /// Controller Power Cycle: the Power Cycle Count at the reset.
    pub cpc: U32,
    /// Power on milliseconds at the reset.
    pub pwrontime: U64,
    /// Controller Timestamp at the reset.
    pub ctime: U64,
}

const _: () = assert!(core::mem::size_of::<ResetInformation>() == 36);

/// Change Namespace event data: a Namespace Management command's result.
#[repr(C)]
#[derive(Clone, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ChangeNamespaceEvent {
    /// Namespace Management CDW10 (SEL: 0 create, 1 delete).
    pub nsmgt_cdw10: U32,
    _rsvd4: [u8; 4],
    pub nsze: U64,
    _rsvd16: [u8; 8],
    pub nscap: U64,
    pub flbas: u8,
    pub dps: u8,
    pub nmic: u8,
    _rsvd35: u8,
    pub anagrpid: U32,
    pub nvmsetid: U16,
    _rsvd42: U16,
    pub nsid: U32,
}

const _: () = assert!(core::mem::size_of::<ChangeNamespaceEvent>() == 48);

/// Format NVM Start event data.
#[repr(C)]
#[derive(Clone, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FormatStartEvent {
    /// NSID of the Format NVM command (FFFFFFFFh: every namespace).
    pub nsid: U32,
    /// Format NVM Attributes (Identify Controller FNA).
    pub fna: u8,
    _rsvd5: [u8; 3],
    /// The Format NVM command's CDW10.
    pub format_cdw10: U32,
}

const _: () = assert!(core::mem::size_of::<FormatStartEvent>() == 12);

/// Format NVM Completion event data.
#[repr(C)]
#[derive(Clone, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FormatCompletionEvent {
    pub nsid: U32,
    /// Smallest Format Progress Indicator seen (0: FPI not reported).
    pub smallest_fpi: u8,
    /// Format NVM Status: 0 completed, 1 failed.
    pub status: u8,
    /// Completion Information.
    pub ci: U16,
    /// Status Field of the Format NVM command's completion (SCT and SC).
    pub sf: U32,
}

const _: () = assert!(core::mem::size_of::<FormatCompletionEvent>() == 12);

/// Firmware Commit event data: a Firmware Commit command and its result.
#[repr(C)]
#[derive(Clone, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FirmwareCommitEvent {
    /// Firmware revision running when the command arrived.
    pub old_fr: [u8; 8],
    /// Firmware revision in the slot the command committed (zeroes when
    /// it failed before one was chosen).
    pub new_fr: [u8; 8],
    /// Commit Action (CA) of the command.
    pub ca: u8,
    /// Firmware Slot (FS) of the command.
    pub fs: u8,
    /// Status Code Type and Status Code the command completed with.
    pub sct: u8,
    pub sc: u8,
    /// Vendor Assigned Firmware Commit Result Code.
    pub vafcrc: U16,
}

const _: () = assert!(core::mem::size_of::<FirmwareCommitEvent>() == 22);

/// Sanitize Start event data.
#[repr(C)]
#[derive(Clone, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SanitizeStartEvent {
    /// Identify Controller SANICAP.
    pub sanicap: U32,
    /// The Sanitize command's CDW10 and CDW11.
    pub sanitize_cdw10: U32,
    pub sanitize_cdw11: U32,
}

const _: () = assert!(core::mem::size_of::<SanitizeStartEvent>() == 12);

/// Sanitize Completion event data: the Sanitize Status log's fields when
/// the operation ended.
#[repr(C)]
#[derive(Clone, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SanitizeCompletionEvent {
    pub sprog: U16,
    pub sstat: U16,
    /// Completion Information (unused: no media verification).
    pub cmpln_info: U16,
    _rsvd6: [u8; 2],
}

const _: () = assert!(core::mem::size_of::<SanitizeCompletionEvent>() == 8);

/// Persistent Event Log Log Specific Parameter.
#[bitfield(u8)]
#[derive(PartialEq, Eq)]
pub struct PersistentEventLsp {
    /// [`action`] to take.
    #[bits(2)]
    pub action: u8,
    #[bits(6)]
    __: u8,
}

/// Persistent Event Log actions (LSP bits 1:0).
pub mod action {
    /// Read Log Data from the established reporting context.
    pub const READ: u8 = 0;
    /// Establish a reporting context (a snapshot of the log), then read.
    pub const ESTABLISH_CONTEXT_AND_READ: u8 = 1;
    /// Release the reporting context; no data is returned.
    pub const RELEASE_CONTEXT: u8 = 2;
}

/// Reporting Context Information field of the header.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct ReportingContext {
    /// Reporting Context Port Identifier.
    pub rcpid: u16,
    /// Reporting Context Port Identifier Type: 1 an NVM subsystem port.
    #[bits(2)]
    pub rcpit: u8,
    /// Reporting Context Exists.
    pub rce: bool,
    #[bits(13)]
    __: u16,
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
zeroed!(PersistentEventLogHeader);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn header_offsets_match_the_spec() {
        assert_eq!(offset_of!(PersistentEventLogHeader, tnev), 4);
        assert_eq!(offset_of!(PersistentEventLogHeader, tll), 8);
        assert_eq!(offset_of!(PersistentEventLogHeader, lhl), 18);
        assert_eq!(offset_of!(PersistentEventLogHeader, ts), 20);
        assert_eq!(offset_of!(PersistentEventLogHeader, pcc), 44);
        assert_eq!(offset_of!(PersistentEventLogHeader, sn), 56);
        assert_eq!(offset_of!(PersistentEventLogHeader, subnqn), 116);
        assert_eq!(offset_of!(PersistentEventLogHeader, gn), 372);
        assert_eq!(offset_of!(PersistentEventLogHeader, rci), 374);
        assert_eq!(offset_of!(PersistentEventLogHeader, seb), 480);
        assert_eq!(offset_of!(PersistentEventHeader, ets), 6);
        assert_eq!(offset_of!(PersistentEventHeader, vsil), 20);
        assert_eq!(offset_of!(ResetInformation, cpc), 16);
        assert_eq!(offset_of!(ChangeNamespaceEvent, nsid), 44);
    }

    #[test]
    fn reporting_context_bits() {
        let rci = ReportingContext::new().with_rce(true).with_rcpit(1);
        assert_eq!(rci.into_bits(), (1 << 18) | (1 << 16));
    }
}
