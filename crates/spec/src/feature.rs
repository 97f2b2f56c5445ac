//! Feature identifiers (§5.27.1, Figure 317) and the dword layouts of the
//! features the controller implements, as bitfield types: the Set Features
//! CDW11 value and the Get Features completion dword 0.

use bitfield_struct::bitfield;

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
    VolatileWriteCache,
    NumberOfQueues,
    InterruptCoalescing,
    InterruptVectorConfig,
    WriteAtomicity,
    AsyncEventConfig,
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
    #[bits(16)]
    __: u32,
    /// Discovery Log Page Change Notification.
    pub dlpcn: bool,
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
        assert_eq!(aec::SMART_MASK, 0xFF);
        assert_eq!(aec::NAMESPACE_ATTRIBUTE, 1 << 8);
        assert_eq!(aec::FIRMWARE_ACTIVATION, 1 << 9);
        assert_eq!(aec::TELEMETRY_LOG, 1 << 10);
        assert!(AsyncEventConfig::from(1 << 31).dlpcn());
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
