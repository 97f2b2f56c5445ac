//! The Log Page Identifier, in a module of its own because both the command
//! dwords ([`crate::cdw`]: Get Log Page CDW10.LID) and the log pages
//! ([`crate::log`], which builds on `cdw`) read it; it is re-exported as
//! `log::LogPageId`.

/// Log Page Identifier, an open newtype (§5.16, Figure 202).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogPageId(pub u8);

impl LogPageId {
    /// For bitfield structs that hold a Log Page Identifier (`#[bits(8)]`).
    pub const fn from_bits(bits: u8) -> Self {
        Self(bits)
    }

    pub const fn into_bits(self) -> u8 {
        self.0
    }

    pub const ERROR_INFORMATION: Self = Self(0x01);
    pub const SMART_HEALTH: Self = Self(0x02);
    pub const FIRMWARE_SLOT: Self = Self(0x03);
    pub const CHANGED_NAMESPACES: Self = Self(0x04);
    pub const COMMANDS_SUPPORTED_AND_EFFECTS: Self = Self(0x05);
    pub const SUPPORTED_LOG_PAGES: Self = Self(0x00);
    pub const TELEMETRY_HOST_INITIATED: Self = Self(0x07);
    pub const TELEMETRY_CONTROLLER_INITIATED: Self = Self(0x08);
    pub const ENDURANCE_GROUP_INFORMATION: Self = Self(0x09);
    /// Asymmetric Namespace Access (§5.16.1.12).
    pub const ANA: Self = Self(0x0C);
    pub const PERSISTENT_EVENT: Self = Self(0x0D);
    pub const DEVICE_SELF_TEST: Self = Self(0x06);
    pub const SANITIZE_STATUS: Self = Self(0x81);
    /// Reservation Notification (§5.16.1.24).
    pub const RESERVATION_NOTIFICATION: Self = Self(0x80);
}
