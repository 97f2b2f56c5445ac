//! Completion status (§4.6.1): Status Code Type, Status Code, More, DNR.

use core::fmt;

/// The 15-bit status field of a completion (DW3 bits 31:17), without the
/// phase tag: SC (7:0), SCT (10:8), CRD (12:11), M (13), DNR (14).
///
/// An open newtype: any value read from a device is kept as it is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Status(u16);

/// Status Code Type values (§4.6.1.1).
pub mod sct {
    pub const GENERIC: u8 = 0;
    pub const COMMAND_SPECIFIC: u8 = 1;
    pub const MEDIA: u8 = 2;
    pub const PATH: u8 = 3;
    pub const VENDOR: u8 = 7;
}

impl Status {
    const fn code(sct: u8, sc: u8) -> Self {
        Self(((sct as u16 & 0x7) << 8) | sc as u16)
    }

    pub const fn from_raw(raw: u16) -> Self {
        Self(raw & 0x7FFF)
    }

    pub const fn raw(self) -> u16 {
        self.0
    }

    /// Status Code.
    pub const fn sc(self) -> u8 {
        self.0 as u8
    }

    /// Status Code Type.
    pub const fn sct(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }

    /// More: more status information is in the Error Information log.
    pub const fn more(self) -> bool {
        self.0 & (1 << 13) != 0
    }

    /// Do Not Retry.
    pub const fn dnr(self) -> bool {
        self.0 & (1 << 14) != 0
    }

    pub const fn with_dnr(self, dnr: bool) -> Self {
        if dnr {
            Self(self.0 | (1 << 14))
        } else {
            Self(self.0 & !(1 << 14))
        }
    }

    pub const fn with_more(self, more: bool) -> Self {
        if more {
            Self(self.0 | (1 << 13))
        } else {
            Self(self.0 & !(1 << 13))
        }
    }

    /// The same status code (type and code), ignoring CRD, More and DNR.
    pub const fn same_code(self, other: Status) -> bool {
        (self.0 & 0x7FF) == (other.0 & 0x7FF)
    }

    pub const fn is_success(self) -> bool {
        self.0 & 0x7FF == 0
    }

    // Generic Command Status (SCT 0, §4.6.1.2.1).
    pub const SUCCESS: Self = Self::code(sct::GENERIC, 0x00);
    pub const INVALID_OPCODE: Self = Self::code(sct::GENERIC, 0x01);
    pub const INVALID_FIELD: Self = Self::code(sct::GENERIC, 0x02);
    pub const CID_CONFLICT: Self = Self::code(sct::GENERIC, 0x03);
    pub const DATA_TRANSFER_ERROR: Self = Self::code(sct::GENERIC, 0x04);
    pub const ABORTED_POWER_LOSS: Self = Self::code(sct::GENERIC, 0x05);
    pub const INTERNAL_ERROR: Self = Self::code(sct::GENERIC, 0x06);
    pub const ABORTED_BY_REQUEST: Self = Self::code(sct::GENERIC, 0x07);
    pub const ABORTED_SQ_DELETION: Self = Self::code(sct::GENERIC, 0x08);
    pub const INVALID_NAMESPACE_OR_FORMAT: Self = Self::code(sct::GENERIC, 0x0B);
    pub const COMMAND_SEQUENCE_ERROR: Self = Self::code(sct::GENERIC, 0x0C);
    pub const INVALID_PRP_OFFSET: Self = Self::code(sct::GENERIC, 0x13);
    pub const INVALID_SGL_SEGMENT_DESCRIPTOR: Self = Self::code(sct::GENERIC, 0x0D);
    pub const INVALID_NUMBER_OF_SGL_DESCRIPTORS: Self = Self::code(sct::GENERIC, 0x0E);
    pub const DATA_SGL_LENGTH_INVALID: Self = Self::code(sct::GENERIC, 0x0F);
    pub const METADATA_SGL_LENGTH_INVALID: Self = Self::code(sct::GENERIC, 0x10);
    pub const INVALID_SGL_DESCRIPTOR_TYPE: Self = Self::code(sct::GENERIC, 0x11);
    /// Reservation Report without EDS while a registrant has a 128-bit
    /// Host Identifier (§7.4).
    pub const HOST_ID_INCONSISTENT_FORMAT: Self = Self::code(sct::GENERIC, 0x18);
    /// Recorded in the Error Information log when the Keep Alive Timer
    /// expires (§3.9).
    pub const KEEP_ALIVE_TIMEOUT_EXPIRED: Self = Self::code(sct::GENERIC, 0x19);
    pub const KEEP_ALIVE_TIMEOUT_INVALID: Self = Self::code(sct::GENERIC, 0x1A);
    /// A command of a host whose registration a Reservation Acquire
    /// Preempt and Abort removed, aborted (§8.19.7).
    pub const ABORTED_PREEMPT_AND_ABORT: Self = Self::code(sct::GENERIC, 0x1B);
    /// The most recent sanitize operation failed and no recovery action
    /// has completed (§8.21).
    pub const SANITIZE_FAILED: Self = Self::code(sct::GENERIC, 0x1C);
    pub const SANITIZE_IN_PROGRESS: Self = Self::code(sct::GENERIC, 0x1D);
    /// The controller stopped the command before it finished (NVMe 1.4);
    /// with DNR clear the host retries it (a supervised server's commands
    /// in flight at a crash, `vnvme serve --supervise`).
    pub const COMMAND_INTERRUPTED: Self = Self::code(sct::GENERIC, 0x21);
    pub const ADMIN_COMMAND_MEDIA_NOT_READY: Self = Self::code(sct::GENERIC, 0x24);
    pub const LBA_OUT_OF_RANGE: Self = Self::code(sct::GENERIC, 0x80);
    pub const CAPACITY_EXCEEDED: Self = Self::code(sct::GENERIC, 0x81);
    pub const NAMESPACE_NOT_READY: Self = Self::code(sct::GENERIC, 0x82);
    pub const RESERVATION_CONFLICT: Self = Self::code(sct::GENERIC, 0x83);
    pub const FORMAT_IN_PROGRESS: Self = Self::code(sct::GENERIC, 0x84);

    // Command Specific Status (SCT 1, §4.6.1.2.2 and per command).
    pub const INVALID_CQ: Self = Self::code(sct::COMMAND_SPECIFIC, 0x00);
    pub const INVALID_QID: Self = Self::code(sct::COMMAND_SPECIFIC, 0x01);
    pub const INVALID_QUEUE_SIZE: Self = Self::code(sct::COMMAND_SPECIFIC, 0x02);
    pub const ABORT_LIMIT_EXCEEDED: Self = Self::code(sct::COMMAND_SPECIFIC, 0x03);
    pub const AER_LIMIT_EXCEEDED: Self = Self::code(sct::COMMAND_SPECIFIC, 0x05);
    /// Firmware Commit: the slot is invalid (beyond FRMW.NOFS) or read only.
    pub const INVALID_FIRMWARE_SLOT: Self = Self::code(sct::COMMAND_SPECIFIC, 0x06);
    /// Firmware Commit: no valid image to place or activate.
    pub const INVALID_FIRMWARE_IMAGE: Self = Self::code(sct::COMMAND_SPECIFIC, 0x07);
    pub const INVALID_INTERRUPT_VECTOR: Self = Self::code(sct::COMMAND_SPECIFIC, 0x08);
    pub const INVALID_LOG_PAGE: Self = Self::code(sct::COMMAND_SPECIFIC, 0x09);
    pub const INVALID_FORMAT: Self = Self::code(sct::COMMAND_SPECIFIC, 0x0A);
    pub const INVALID_QUEUE_DELETION: Self = Self::code(sct::COMMAND_SPECIFIC, 0x0C);
    pub const FEATURE_NOT_SAVEABLE: Self = Self::code(sct::COMMAND_SPECIFIC, 0x0D);
    pub const FEATURE_NOT_CHANGEABLE: Self = Self::code(sct::COMMAND_SPECIFIC, 0x0E);
    pub const FEATURE_NOT_NAMESPACE_SPECIFIC: Self = Self::code(sct::COMMAND_SPECIFIC, 0x0F);
    /// Firmware Activation Requires Controller Level Reset ("Requires
    /// Reset" before 2.0): the commit succeeded and the image becomes active
    /// at the next Controller Level Reset. An outcome, not a failure.
    pub const FIRMWARE_ACTIVATION_REQUIRES_RESET: Self = Self::code(sct::COMMAND_SPECIFIC, 0x11);
    /// Firmware Image Download: the piece overlaps one already downloaded.
    pub const OVERLAPPING_RANGE: Self = Self::code(sct::COMMAND_SPECIFIC, 0x14);
    pub const NAMESPACE_INSUFFICIENT_CAPACITY: Self = Self::code(sct::COMMAND_SPECIFIC, 0x15);
    pub const NAMESPACE_ID_UNAVAILABLE: Self = Self::code(sct::COMMAND_SPECIFIC, 0x16);
    pub const NAMESPACE_ALREADY_ATTACHED: Self = Self::code(sct::COMMAND_SPECIFIC, 0x18);
    pub const NAMESPACE_IS_PRIVATE: Self = Self::code(sct::COMMAND_SPECIFIC, 0x19);
    pub const NAMESPACE_NOT_ATTACHED: Self = Self::code(sct::COMMAND_SPECIFIC, 0x1A);
    pub const CONTROLLER_LIST_INVALID: Self = Self::code(sct::COMMAND_SPECIFIC, 0x1C);
    /// I/O Command Set Profile names a combination that is not supported.
    pub const IOCS_COMBINATION_REJECTED: Self = Self::code(sct::COMMAND_SPECIFIC, 0x2B);
    /// Device Self-test: one is already running (§5.9).
    pub const SELF_TEST_IN_PROGRESS: Self = Self::code(sct::COMMAND_SPECIFIC, 0x1D);
    /// NVM command set: Conflicting Attributes (e.g. DSM range count).
    pub const CONFLICTING_ATTRIBUTES: Self = Self::code(sct::COMMAND_SPECIFIC, 0x80);
    /// NVM command set: Command Size Limit Exceeded (Copy beyond MSSRL,
    /// MCL or MSRC; NVM Command Set 1.0 §3.2.2).
    pub const COMMAND_SIZE_LIMIT_EXCEEDED: Self = Self::code(sct::COMMAND_SPECIFIC, 0x83);
    /// NVM command set: Invalid Protection Information (PRINFO, or a
    /// Type 1 initial reference tag that is not the SLBA; §5.3.2).
    pub const INVALID_PROTECTION_INFORMATION: Self = Self::code(sct::COMMAND_SPECIFIC, 0x81);
    // Zoned Namespace Command Set 1.1 §3.3 (command specific).
    /// The LBA range crosses a zone boundary or a zone's writable capacity.
    pub const ZONE_BOUNDARY_ERROR: Self = Self::code(sct::COMMAND_SPECIFIC, 0xB8);
    pub const ZONE_IS_FULL: Self = Self::code(sct::COMMAND_SPECIFIC, 0xB9);
    pub const ZONE_IS_READ_ONLY: Self = Self::code(sct::COMMAND_SPECIFIC, 0xBA);
    pub const ZONE_IS_OFFLINE: Self = Self::code(sct::COMMAND_SPECIFIC, 0xBB);
    /// A write not at the zone's write pointer.
    pub const ZONE_INVALID_WRITE: Self = Self::code(sct::COMMAND_SPECIFIC, 0xBC);
    pub const TOO_MANY_ACTIVE_ZONES: Self = Self::code(sct::COMMAND_SPECIFIC, 0xBD);
    pub const TOO_MANY_OPEN_ZONES: Self = Self::code(sct::COMMAND_SPECIFIC, 0xBE);
    pub const INVALID_ZONE_STATE_TRANSITION: Self = Self::code(sct::COMMAND_SPECIFIC, 0xBF);

    // Media and Data Integrity Errors (SCT 2, §4.6.1.2.3).
    pub const WRITE_FAULT: Self = Self::code(sct::MEDIA, 0x80);
    pub const UNRECOVERED_READ_ERROR: Self = Self::code(sct::MEDIA, 0x81);
    /// End-to-end Guard Check Error (NVM Command Set 1.0 §5.3).
    pub const GUARD_CHECK_ERROR: Self = Self::code(sct::MEDIA, 0x82);
    /// End-to-end Application Tag Check Error.
    pub const APPLICATION_TAG_CHECK_ERROR: Self = Self::code(sct::MEDIA, 0x83);
    /// End-to-end Reference Tag Check Error.
    pub const REFERENCE_TAG_CHECK_ERROR: Self = Self::code(sct::MEDIA, 0x84);
    pub const COMPARE_FAILURE: Self = Self::code(sct::MEDIA, 0x85);

    // Path Related Status (SCT 3, §4.6.1.2.4): the host may retry the
    // command on another path (controller) to the namespace.
    /// The namespace's ANA group is in the persistent loss state on this
    /// controller.
    pub const ASYMMETRIC_ACCESS_PERSISTENT_LOSS: Self = Self::code(sct::PATH, 0x01);
    /// The namespace's ANA group is inaccessible through this controller.
    pub const ASYMMETRIC_ACCESS_INACCESSIBLE: Self = Self::code(sct::PATH, 0x02);
    /// The namespace's ANA group is changing state on this controller.
    pub const ASYMMETRIC_ACCESS_TRANSITION: Self = Self::code(sct::PATH, 0x03);

    /// A short name for logs, counters and JSON ("invalid-field"), or the
    /// numeric form for codes this crate does not name.
    pub fn name(self) -> &'static str {
        const NAMES: &[(Status, &str)] = &[
            (Status::SUCCESS, "success"),
            (Status::INVALID_OPCODE, "invalid-opcode"),
            (Status::INVALID_FIELD, "invalid-field"),
            (Status::CID_CONFLICT, "cid-conflict"),
            (Status::DATA_TRANSFER_ERROR, "data-transfer-error"),
            (Status::ABORTED_POWER_LOSS, "aborted-power-loss"),
            (Status::INTERNAL_ERROR, "internal-error"),
            (Status::ABORTED_BY_REQUEST, "aborted-by-request"),
            (Status::ABORTED_SQ_DELETION, "aborted-sq-deletion"),
            (
                Status::INVALID_NAMESPACE_OR_FORMAT,
                "invalid-namespace-or-format",
            ),
            (Status::COMMAND_SEQUENCE_ERROR, "command-sequence-error"),
            (Status::INVALID_PRP_OFFSET, "invalid-prp-offset"),
            (
                Status::INVALID_SGL_SEGMENT_DESCRIPTOR,
                "invalid-sgl-segment-descriptor",
            ),
            (
                Status::INVALID_NUMBER_OF_SGL_DESCRIPTORS,
                "invalid-number-of-sgl-descriptors",
            ),
            (Status::DATA_SGL_LENGTH_INVALID, "data-sgl-length-invalid"),
            (
                Status::METADATA_SGL_LENGTH_INVALID,
                "metadata-sgl-length-invalid",
            ),
            (
                Status::INVALID_SGL_DESCRIPTOR_TYPE,
                "invalid-sgl-descriptor-type",
            ),
            (
                Status::HOST_ID_INCONSISTENT_FORMAT,
                "host-id-inconsistent-format",
            ),
            (Status::SANITIZE_FAILED, "sanitize-failed"),
            (Status::SANITIZE_IN_PROGRESS, "sanitize-in-progress"),
            (
                Status::KEEP_ALIVE_TIMEOUT_EXPIRED,
                "keep-alive-timeout-expired",
            ),
            (
                Status::KEEP_ALIVE_TIMEOUT_INVALID,
                "keep-alive-timeout-invalid",
            ),
            (
                Status::ABORTED_PREEMPT_AND_ABORT,
                "aborted-preempt-and-abort",
            ),
            (
                Status::ADMIN_COMMAND_MEDIA_NOT_READY,
                "admin-command-media-not-ready",
            ),
            (Status::LBA_OUT_OF_RANGE, "lba-out-of-range"),
            (Status::CAPACITY_EXCEEDED, "capacity-exceeded"),
            (Status::NAMESPACE_NOT_READY, "namespace-not-ready"),
            (Status::RESERVATION_CONFLICT, "reservation-conflict"),
            (Status::FORMAT_IN_PROGRESS, "format-in-progress"),
            (Status::INVALID_CQ, "invalid-cq"),
            (Status::INVALID_QID, "invalid-qid"),
            (Status::INVALID_QUEUE_SIZE, "invalid-queue-size"),
            (Status::ABORT_LIMIT_EXCEEDED, "abort-limit-exceeded"),
            (Status::AER_LIMIT_EXCEEDED, "aer-limit-exceeded"),
            (Status::INVALID_FIRMWARE_SLOT, "invalid-firmware-slot"),
            (Status::INVALID_FIRMWARE_IMAGE, "invalid-firmware-image"),
            (Status::INVALID_INTERRUPT_VECTOR, "invalid-interrupt-vector"),
            (Status::INVALID_LOG_PAGE, "invalid-log-page"),
            (Status::INVALID_FORMAT, "invalid-format"),
            (Status::INVALID_QUEUE_DELETION, "invalid-queue-deletion"),
            (Status::FEATURE_NOT_SAVEABLE, "feature-not-saveable"),
            (Status::FEATURE_NOT_CHANGEABLE, "feature-not-changeable"),
            (
                Status::FEATURE_NOT_NAMESPACE_SPECIFIC,
                "feature-not-namespace-specific",
            ),
            (
                Status::FIRMWARE_ACTIVATION_REQUIRES_RESET,
                "firmware-activation-requires-reset",
            ),
            (Status::OVERLAPPING_RANGE, "overlapping-range"),
            (
                Status::NAMESPACE_INSUFFICIENT_CAPACITY,
                "namespace-insufficient-capacity",
            ),
            (Status::NAMESPACE_ID_UNAVAILABLE, "namespace-id-unavailable"),
            (
                Status::NAMESPACE_ALREADY_ATTACHED,
                "namespace-already-attached",
            ),
            (Status::NAMESPACE_IS_PRIVATE, "namespace-is-private"),
            (Status::NAMESPACE_NOT_ATTACHED, "namespace-not-attached"),
            (Status::CONTROLLER_LIST_INVALID, "controller-list-invalid"),
            (
                Status::IOCS_COMBINATION_REJECTED,
                "iocs-combination-rejected",
            ),
            (Status::SELF_TEST_IN_PROGRESS, "self-test-in-progress"),
            (Status::CONFLICTING_ATTRIBUTES, "conflicting-attributes"),
            (
                Status::COMMAND_SIZE_LIMIT_EXCEEDED,
                "command-size-limit-exceeded",
            ),
            (Status::ZONE_BOUNDARY_ERROR, "zone-boundary-error"),
            (Status::ZONE_IS_FULL, "zone-is-full"),
            (Status::ZONE_IS_READ_ONLY, "zone-is-read-only"),
            (Status::ZONE_IS_OFFLINE, "zone-is-offline"),
            (Status::ZONE_INVALID_WRITE, "zone-invalid-write"),
            (Status::TOO_MANY_ACTIVE_ZONES, "too-many-active-zones"),
            (Status::TOO_MANY_OPEN_ZONES, "too-many-open-zones"),
            (
                Status::INVALID_ZONE_STATE_TRANSITION,
                "invalid-zone-state-transition",
            ),
            (Status::WRITE_FAULT, "write-fault"),
            (Status::UNRECOVERED_READ_ERROR, "unrecovered-read-error"),
            (Status::COMPARE_FAILURE, "compare-failure"),
            (
                Status::INVALID_PROTECTION_INFORMATION,
                "invalid-protection-information",
            ),
            (Status::GUARD_CHECK_ERROR, "guard-check-error"),
            (
                Status::APPLICATION_TAG_CHECK_ERROR,
                "application-tag-check-error",
            ),
            (
                Status::REFERENCE_TAG_CHECK_ERROR,
                "reference-tag-check-error",
            ),
            (
                Status::ASYMMETRIC_ACCESS_PERSISTENT_LOSS,
                "asymmetric-access-persistent-loss",
            ),
            (
                Status::ASYMMETRIC_ACCESS_INACCESSIBLE,
                "asymmetric-access-inaccessible",
            ),
            (
                Status::ASYMMETRIC_ACCESS_TRANSITION,
                "asymmetric-access-transition",
            ),
        ];
        NAMES
            .iter()
            .find(|(s, _)| s.same_code(self))
            .map_or("unknown", |(_, n)| n)
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Status(sct={:#x}, sc={:#04x} {}",
            self.sct(),
            self.sc(),
            self.name()
        )?;
        if self.more() {
            f.write_str(", more")?;
        }
        if self.dnr() {
            f.write_str(", dnr")?;
        }
        f.write_str(")")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (sct {:#x}, sc {:#04x}{})",
            self.name(),
            self.sct(),
            self.sc(),
            if self.dnr() { ", dnr" } else { "" }
        )
    }
}

/// Invalid Field in Command with Do Not Retry: the answer to a command
/// field the controller cannot take (retrying the same command cannot
/// help). The one place it is built; controller handlers return it.
pub const fn invalid_field() -> Status {
    Status::INVALID_FIELD.with_dnr(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_not_ready_is_generic_0x82_and_distinct_from_media_0x82() {
        assert_eq!(Status::NAMESPACE_NOT_READY.sct(), sct::GENERIC);
        assert_eq!(Status::NAMESPACE_NOT_READY.sc(), 0x82);
        let guard_check = Status::from_raw((u16::from(sct::MEDIA) << 8) | 0x82);
        assert!(!guard_check.same_code(Status::NAMESPACE_NOT_READY));
        assert_eq!(guard_check, Status::GUARD_CHECK_ERROR);
        assert_eq!(guard_check.name(), "guard-check-error");
    }

    #[test]
    fn dnr_and_more_do_not_change_the_code() {
        let s = Status::INVALID_FIELD.with_dnr(true).with_more(true);
        assert!(s.dnr() && s.more());
        assert!(s.same_code(Status::INVALID_FIELD));
        assert!(!s.with_dnr(false).dnr());
    }
}
