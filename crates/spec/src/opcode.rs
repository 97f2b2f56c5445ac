//! Admin (§5) and NVM command set (NVM Command Set Spec §3) opcodes, as open
//! newtypes: an unknown opcode from a guest is kept and answered with
//! Invalid Command Opcode, never a panic.

use core::fmt;

macro_rules! opcodes {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $konst:ident = $val:expr, $text:expr;)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub u8);

        impl $name {
            $($(#[$vm])* pub const $konst: Self = Self($val);)*

            /// The spec's name ("identify"), or `None` for an opcode this crate does not know.
            pub fn name(self) -> Option<&'static str> {
                match self {
                    $(Self::$konst => Some($text),)*
                    _ => None,
                }
            }

            /// Every opcode this crate names, in numeric order.
            pub const ALL: &'static [Self] = &[$(Self::$konst),*];

            /// Vendor specific opcodes are 0xC0 to 0xFF.
            pub fn is_vendor_specific(self) -> bool {
                self.0 >= 0xC0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(n) => write!(f, "{}({:#04x} {})", stringify!($name), self.0, n),
                    None => write!(f, "{}({:#04x})", stringify!($name), self.0),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, "opcode-{:#04x}", self.0),
                }
            }
        }
    };
}

opcodes! {
    /// Admin command opcodes (§5, Figure 138).
    AdminOpcode {
        DELETE_IO_SQ = 0x00, "delete-io-sq";
        CREATE_IO_SQ = 0x01, "create-io-sq";
        GET_LOG_PAGE = 0x02, "get-log-page";
        DELETE_IO_CQ = 0x04, "delete-io-cq";
        CREATE_IO_CQ = 0x05, "create-io-cq";
        IDENTIFY = 0x06, "identify";
        ABORT = 0x08, "abort";
        SET_FEATURES = 0x09, "set-features";
        GET_FEATURES = 0x0A, "get-features";
        ASYNC_EVENT_REQUEST = 0x0C, "async-event-request";
        NAMESPACE_MANAGEMENT = 0x0D, "namespace-management";
        FIRMWARE_COMMIT = 0x10, "firmware-commit";
        FIRMWARE_IMAGE_DOWNLOAD = 0x11, "firmware-image-download";
        DEVICE_SELF_TEST = 0x14, "device-self-test";
        NAMESPACE_ATTACHMENT = 0x15, "namespace-attachment";
        KEEP_ALIVE = 0x18, "keep-alive";
        DIRECTIVE_SEND = 0x19, "directive-send";
        DIRECTIVE_RECEIVE = 0x1A, "directive-receive";
        /// Doorbell Buffer Config (§5.8): shadow doorbell and EventIdx buffers.
        DOORBELL_BUFFER_CONFIG = 0x7C, "doorbell-buffer-config";
        FORMAT_NVM = 0x80, "format-nvm";
        SECURITY_SEND = 0x81, "security-send";
        SECURITY_RECEIVE = 0x82, "security-receive";
        SANITIZE = 0x84, "sanitize";
    }
}

opcodes! {
    /// NVM command set I/O opcodes (NVM Command Set Spec 1.0 §3, Figure 17).
    NvmOpcode {
        FLUSH = 0x00, "flush";
        WRITE = 0x01, "write";
        READ = 0x02, "read";
        WRITE_UNCORRECTABLE = 0x04, "write-uncorrectable";
        COMPARE = 0x05, "compare";
        WRITE_ZEROES = 0x08, "write-zeroes";
        DATASET_MANAGEMENT = 0x09, "dataset-management";
        VERIFY = 0x0C, "verify";
        /// Reservations (§7.3–§7.6).
        RESERVATION_REGISTER = 0x0D, "reservation-register";
        RESERVATION_REPORT = 0x0E, "reservation-report";
        RESERVATION_ACQUIRE = 0x11, "reservation-acquire";
        RESERVATION_RELEASE = 0x15, "reservation-release";
        COPY = 0x19, "copy";
        /// Zoned Namespace Command Set 1.1 §3.4: zone actions, zone reports,
        /// and writes at a zone's write pointer chosen by the controller.
        ZONE_MGMT_SEND = 0x79, "zone-mgmt-send";
        ZONE_MGMT_RECV = 0x7A, "zone-mgmt-recv";
        ZONE_APPEND = 0x7D, "zone-append";
    }
}

impl AdminOpcode {
    /// Data transfer direction encoded in opcode bits 1:0 (§5, Figure 138):
    /// 00b none, 01b host to controller, 10b controller to host, 11b both.
    pub fn data_transfer(self) -> u8 {
        self.0 & 0x3
    }
}

impl NvmOpcode {
    /// Data transfer direction encoded in opcode bits 1:0.
    pub fn data_transfer(self) -> u8 {
        self.0 & 0x3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_opcode_is_kept_and_printable() {
        let op = AdminOpcode(0x3F);
        assert_eq!(op.name(), None);
        assert_eq!(op.to_string(), "opcode-0x3f");
        assert_eq!(
            AdminOpcode::DOORBELL_BUFFER_CONFIG.to_string(),
            "doorbell-buffer-config"
        );
        assert!(NvmOpcode(0xC1).is_vendor_specific());
    }
}
