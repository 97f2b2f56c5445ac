//! Feature identifiers (§5.27.1, Figure 317) and the dword layouts of the
//! features the controller implements.

/// Feature Identifier, an open newtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FeatureId(pub u8);

impl FeatureId {
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

/// Number of Queues (§5.27.1.5): NSQR (15:0) and NCQR (31:16), both 0's based.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NumberOfQueues {
    pub nsqr_z: u16,
    pub ncqr_z: u16,
}

impl NumberOfQueues {
    pub fn from_dword(dw: u32) -> Self {
        Self {
            nsqr_z: dw as u16,
            ncqr_z: (dw >> 16) as u16,
        }
    }

    pub fn to_dword(self) -> u32 {
        u32::from(self.nsqr_z) | (u32::from(self.ncqr_z) << 16)
    }
}

/// Interrupt Coalescing (§5.27.1.6): THR (7:0, 0's based count of
/// completions), TIME (15:8, in 100 µs units).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct InterruptCoalescing {
    pub thr_z: u8,
    pub time_100us: u8,
}

impl InterruptCoalescing {
    pub fn from_dword(dw: u32) -> Self {
        Self {
            thr_z: dw as u8,
            time_100us: (dw >> 8) as u8,
        }
    }

    pub fn to_dword(self) -> u32 {
        u32::from(self.thr_z) | (u32::from(self.time_100us) << 8)
    }
}

/// Interrupt Vector Configuration (§5.27.1.7): IV (15:0), CD (16) coalescing disable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterruptVectorConfig {
    pub iv: u16,
    pub cd: bool,
}

impl InterruptVectorConfig {
    pub fn from_dword(dw: u32) -> Self {
        Self {
            iv: dw as u16,
            cd: dw & (1 << 16) != 0,
        }
    }

    pub fn to_dword(self) -> u32 {
        u32::from(self.iv) | (u32::from(self.cd) << 16)
    }
}

/// Asynchronous Event Configuration bits (§5.27.1.9).
pub mod aec {
    /// SMART / health critical warnings (7:0).
    pub const SMART_MASK: u32 = 0xFF;
    /// Namespace Attribute Notices.
    pub const NAMESPACE_ATTRIBUTE: u32 = 1 << 8;
    /// Firmware Activation Notices.
    pub const FIRMWARE_ACTIVATION: u32 = 1 << 9;
    /// Telemetry Log Notices.
    pub const TELEMETRY_LOG: u32 = 1 << 10;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_of_queues_round_trips() {
        let n = NumberOfQueues::from_dword(0x0003_0007);
        assert_eq!(
            n,
            NumberOfQueues {
                nsqr_z: 7,
                ncqr_z: 3
            }
        );
        assert_eq!(n.to_dword(), 0x0003_0007);
    }

    #[test]
    fn interrupt_coalescing_round_trips() {
        let c = InterruptCoalescing::from_dword(0x0A05);
        assert_eq!(
            c,
            InterruptCoalescing {
                thr_z: 5,
                time_100us: 10
            }
        );
        assert_eq!(c.to_dword(), 0x0A05);
    }
}
