//! Feature identifiers (§5.27.1, Figure 317) and the dword layouts of the
//! features the controller implements, as bitfield types: the Set Features
//! CDW11 value and the Get Features completion dword 0.

use bitfield_struct::bitfield;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Feature Identifier, an open newtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FeatureId(pub u8);

impl FeatureId {
    /// For bitfield structs that hold a Feature Identifier (`#[bits(8)]`).
    pub const fn from_bits(bits: u8) -> Self {
        Self(bits)
    }

    pub const fn into_bits(self) -> u8 {
        self.0
    }

    pub const ARBITRATION: Self = Self(0x01);
    pub const POWER_MANAGEMENT: Self = Self(0x02);
    pub const LBA_RANGE_TYPE: Self = Self(0x03);
    pub const TEMPERATURE_THRESHOLD: Self = Self(0x04);
    pub const ERROR_RECOVERY: Self = Self(0x05);
    pub const VOLATILE_WRITE_CACHE: Self = Self(0x06);
    pub const NUMBER_OF_QUEUES: Self = Self(0x07);
    pub const INTERRUPT_COALESCING: Self = Self(0x08);
    pub const INTERRUPT_VECTOR_CONFIG: Self = Self(0x09);
    pub const WRITE_ATOMICITY: Self = Self(0x0A);
    pub const ASYNC_EVENT_CONFIG: Self = Self(0x0B);
    pub const AUTONOMOUS_POWER_STATE: Self = Self(0x0C);
    pub const HOST_MEMORY_BUFFER: Self = Self(0x0D);
    pub const TIMESTAMP: Self = Self(0x0E);
    pub const KEEP_ALIVE_TIMER: Self = Self(0x0F);
    pub const HOST_BEHAVIOR_SUPPORT: Self = Self(0x16);
    pub const IO_COMMAND_SET_PROFILE: Self = Self(0x19);
    pub const SOFTWARE_PROGRESS_MARKER: Self = Self(0x80);
    pub const HOST_IDENTIFIER: Self = Self(0x81);
    /// Reservation Persistence (§5.27.1.27): CDW11 bit 0, PTPL.
    pub const RESERVATION_PERSISTENCE: Self = Self(0x83);
    /// Reservation Notification Mask (§5.27.1.26): CDW11 bits 1-3 mask
    /// the notification types of one namespace.
    pub const RESERVATION_NOTIFICATION_MASK: Self = Self(0x82);
}

/// Get/Set Features CDW10 SEL field (Get Features, §5.15): current, default,
/// saved, supported capabilities.
pub mod select {
    pub const CURRENT: u8 = 0;
    pub const DEFAULT: u8 = 1;
    pub const SAVED: u8 = 2;
    pub const SUPPORTED_CAPABILITIES: u8 = 3;
}

dword!(
    FeatureCapabilities,
    PowerManagement,
    ErrorRecovery,
    VolatileWriteCache,
    NumberOfQueues,
    InterruptCoalescing,
    InterruptVectorConfig,
    WriteAtomicity,
    AsyncEventConfig,
    IoCommandSetProfile,
    SoftwareProgressMarker,
    HostIdentifier,
);

/// Get Features dword 0 with SEL = 011b, Supported Capabilities (§5.15).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct FeatureCapabilities {
    /// The feature has a saved value.
    pub saveable: bool,
    /// The feature is namespace specific.
    pub ns_specific: bool,
    /// The feature can be changed.
    pub changeable: bool,
    #[bits(29)]
    __: u32,
}

/// Power Management value (§5.27.1.2).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct PowerManagement {
    /// Power State.
    #[bits(5)]
    pub ps: u8,
    /// Workload Hint.
    #[bits(3)]
    pub wh: u8,
    #[bits(24)]
    __: u32,
}

/// Error Recovery value (NVM Command Set Spec 1.0, its features), a
/// namespace scope feature.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct ErrorRecovery {
    /// Time Limited Error Recovery, in 100 ms units (0: no limit).
    pub tler: u16,
    /// Deallocated or Unwritten Logical Block Error Enable (needs NSFEAT.DAE).
    pub dulbe: bool,
    #[bits(15)]
    __: u16,
}

/// Volatile Write Cache value (§5.27.1.4).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct VolatileWriteCache {
    /// Volatile Write Cache Enable.
    pub wce: bool,
    #[bits(31)]
    __: u32,
}

/// Number of Queues (§5.27.1.5): the Set Features value, NSQR and NCQR,
/// and its completion dword 0, NSQA and NCQA, in the same places. All
/// counts are 0's based.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct NumberOfQueues {
    /// Number of I/O Submission Queues Requested (Allocated in dword 0).
    pub nsqr_z: u16,
    /// Number of I/O Completion Queues Requested (Allocated in dword 0).
    pub ncqr_z: u16,
}

/// Interrupt Coalescing value (§5.27.1.6).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct InterruptCoalescing {
    /// Aggregation Threshold: completions per interrupt, 0's based.
    pub thr_z: u8,
    /// Aggregation Time, in 100 µs units.
    pub time: u8,
    __: u16,
}

/// Interrupt Vector Configuration value (§5.27.1.7); Get Features takes IV
/// in CDW11 too.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct InterruptVectorConfig {
    /// Interrupt Vector.
    pub iv: u16,
    /// Coalescing Disable.
    pub cd: bool,
    #[bits(15)]
    __: u16,
}

/// Write Atomicity Normal value (§5.27.1.8).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct WriteAtomicity {
    /// Disable Normal: only AWUPF applies.
    pub dn: bool,
    #[bits(31)]
    __: u32,
}

/// Asynchronous Event Configuration value (§5.27.1.9): which events the
/// controller reports.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct AsyncEventConfig {
    /// SMART / Health Critical Warnings, one bit per warning.
    pub smart: u8,
    /// Namespace Attribute Notices.
    pub nan: bool,
    /// Firmware Activation Notices.
    pub fan: bool,
    /// Telemetry Log Notices.
    pub tln: bool,
    /// Asymmetric Namespace Access Change Notices.
    pub anacn: bool,
    /// Predictable Latency Event Aggregate Log Change Notices.
    pub plealcn: bool,
    /// LBA Status Information Alert Notices.
    pub lsian: bool,
    /// Endurance Group Event Aggregate Log Change Notices.
    pub egealcn: bool,
    #[bits(12)]
    __: u16,
    /// Zone Descriptor Changed Notices (ZNS 1.1 §5.2).
    pub zdcn: bool,
    #[bits(3)]
    __: u8,
    /// Discovery Log Page Change Notification.
    pub dlpcn: bool,
}

/// Timestamp (§5.27.1.11): the 8 bytes of the data buffer. Set Features
/// sends TSTMP alone (bytes 7:6 reserved); Get Features adds the
/// attributes in byte 6.
#[bitfield(u64)]
#[derive(PartialEq, Eq)]
pub struct Timestamp {
    /// Milliseconds since midnight, 01-Jan-1970 UTC (as the host set it,
    /// plus the time since), or since the last Controller Level Reset.
    #[bits(48)]
    pub tstmp: u64,
    /// Synch: the controller may have stopped counting at times.
    pub synch: bool,
    /// Timestamp Origin ([`timestamp_origin`]).
    #[bits(3)]
    pub origin: u8,
    #[bits(12)]
    __: u16,
}

/// Timestamp Origin values of [`Timestamp::origin`].
pub mod timestamp_origin {
    /// Cleared to 0 by a Controller Level Reset.
    pub const RESET: u8 = 0b000;
    /// Set by the host with Set Features.
    pub const SET_FEATURES: u8 = 0b001;
}

/// Host Behavior Support (§5.27.1.18): the 512-byte data buffer. Each
/// field is 0h (disabled) or 1h (enabled); other values are reserved.
#[repr(C)]
#[derive(Clone, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct HostBehaviorSupport {
    /// Advanced Command Retry Enable.
    pub acre: u8,
    /// Extended Telemetry Data Area 4 Supported.
    pub etdas: u8,
    /// LBA Format Extension Enable.
    pub lbafee: u8,
    _rsvd3: [u8; 509],
}

const _: () = assert!(core::mem::size_of::<HostBehaviorSupport>() == 512);

/// I/O Command Set Profile value (§5.27.1.21).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct IoCommandSetProfile {
    /// I/O Command Set Combination Index into Identify CNS 1Ch.
    #[bits(9)]
    pub iocsci: u16,
    #[bits(23)]
    __: u32,
}

/// Software Progress Marker value (§5.27.1.24).
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct SoftwareProgressMarker {
    /// Pre-boot Software Load Count.
    pub pbslc: u8,
    #[bits(24)]
    __: u32,
}

/// Host Identifier CDW11 (§5.27.1.25); the identifier itself is the data
/// buffer, 8 bytes, or 16 with EXHID.
#[bitfield(u32)]
#[derive(PartialEq, Eq)]
pub struct HostIdentifier {
    /// Enable Extended Host Identifier: 128 bits instead of 64.
    pub exhid: bool,
    #[bits(31)]
    __: u32,
}

impl HostIdentifier {
    /// Bytes of the data buffer.
    pub fn data_len(self) -> usize {
        if self.exhid() {
            16
        } else {
            8
        }
    }
}

/// Asynchronous Event Configuration bits as masks, for code that keeps the
/// value as a `u32`.
pub mod aec {
    use super::AsyncEventConfig;

    /// SMART / health critical warnings (7:0).
    pub const SMART_MASK: u32 = AsyncEventConfig::new().with_smart(0xFF).into_bits();
    /// Namespace Attribute Notices.
    pub const NAMESPACE_ATTRIBUTE: u32 = AsyncEventConfig::new().with_nan(true).into_bits();
    /// Firmware Activation Notices.
    pub const FIRMWARE_ACTIVATION: u32 = AsyncEventConfig::new().with_fan(true).into_bits();
    /// Telemetry Log Notices.
    pub const TELEMETRY_LOG: u32 = AsyncEventConfig::new().with_tln(true).into_bits();
    /// Asymmetric Namespace Access Change Notices.
    pub const ANA_CHANGE: u32 = AsyncEventConfig::new().with_anacn(true).into_bits();
    /// Zone Descriptor Changed Notices.
    pub const ZONE_DESCRIPTOR_CHANGED: u32 = AsyncEventConfig::new().with_zdcn(true).into_bits();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_of_queues_puts_nsqr_low_and_ncqr_high() {
        let n = NumberOfQueues::from(0x0003_0007);
        assert_eq!((n.nsqr_z(), n.ncqr_z()), (7, 3));
        let back: u32 = NumberOfQueues::new().with_nsqr_z(7).with_ncqr_z(3).into();
        assert_eq!(back, 0x0003_0007);
    }

    #[test]
    fn interrupt_coalescing_puts_thr_low_and_time_above() {
        let c = InterruptCoalescing::from(0x0A05);
        assert_eq!((c.thr_z(), c.time()), (5, 10));
        assert_eq!(u32::from(c), 0x0A05);
    }

    #[test]
    fn feature_values_sit_where_the_spec_puts_them() {
        let ivc = InterruptVectorConfig::from(0x0001_0003);
        assert_eq!((ivc.iv(), ivc.cd()), (3, true));
        assert!(VolatileWriteCache::from(1).wce());
        let pm = PowerManagement::from(0xE1);
        assert_eq!((pm.ps(), pm.wh()), (1, 7));
        assert!(WriteAtomicity::from(1).dn());
        let er = ErrorRecovery::from(0x0001_0005);
        assert_eq!((er.tler(), er.dulbe()), (5, true));
        assert_eq!(aec::SMART_MASK, 0xFF);
        assert_eq!(aec::NAMESPACE_ATTRIBUTE, 1 << 8);
        assert_eq!(aec::FIRMWARE_ACTIVATION, 1 << 9);
        assert_eq!(aec::TELEMETRY_LOG, 1 << 10);
        assert_eq!(aec::ANA_CHANGE, 1 << 11);
        assert_eq!(aec::ZONE_DESCRIPTOR_CHANGED, 1 << 27);
        assert!(AsyncEventConfig::from(1 << 31).dlpcn());
        assert_eq!(IoCommandSetProfile::from(0xFFFF_FFFF).iocsci(), 0x1FF);
        assert_eq!(SoftwareProgressMarker::from(0x1234).pbslc(), 0x34);
        assert_eq!(HostIdentifier::from(1).data_len(), 16);
        assert_eq!(HostIdentifier::from(0).data_len(), 8);
        let ts = Timestamp::new()
            .with_tstmp(0x1234)
            .with_origin(timestamp_origin::SET_FEATURES);
        assert_eq!(
            u64::from(ts).to_le_bytes()[6],
            0b10,
            "origin in byte 6 bits 3:1"
        );
        assert_eq!(
            u32::from(FeatureCapabilities::new().with_changeable(true)),
            1 << 2
        );
    }

    #[test]
    fn feature_values_keep_reserved_bits() {
        for raw in [u32::MAX, 0xDEAD_BEEF] {
            assert_eq!(u32::from(InterruptCoalescing::from(raw)), raw);
            assert_eq!(u32::from(AsyncEventConfig::from(raw)), raw);
            assert_eq!(u32::from(PowerManagement::from(raw)), raw);
            assert_eq!(u32::from(FeatureCapabilities::from(raw)), raw);
            assert_eq!(u32::from(VolatileWriteCache::from(raw)), raw);
            assert_eq!(u32::from(WriteAtomicity::from(raw)), raw);
            assert_eq!(u32::from(InterruptVectorConfig::from(raw)), raw);
        }
    }
}
