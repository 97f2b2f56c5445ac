//! SR-IOV visibility (Virtualization Enhancements, §8): the Primary
//! Controller Capabilities (Identify CNS 14h, §5.17.2). The Secondary
//! Controller List (CNS 15h) is a count (byte 0) then 32-byte entries from
//! byte 32: all zeroes without secondary controllers.

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{zeroed, IDENTIFY_SIZE};

/// Primary Controller Capabilities (CNS 14h): the queue (VQ) and interrupt
/// (VI) resources of a primary controller, private or flexible (assignable
/// to its secondary controllers with Virtualization Management).
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct PrimaryControllerCaps {
    /// Controller Identifier of the primary controller.
    pub cntlid: U16,
    /// Port Identifier of its NVM subsystem port.
    pub portid: U16,
    /// Controller Resource Types: bit 0 VQ, bit 1 VI, the resources
    /// Virtualization Management can move between controllers.
    pub crt: u8,
    _rsvd5: [u8; 27],
    /// VQ Resources Flexible Total.
    pub vqfrt: U32,
    /// VQ Resources Flexible Assigned (to secondary controllers).
    pub vqrfa: U32,
    /// VQ Resources Flexible Allocated to Primary.
    pub vqrfap: U16,
    /// VQ Resources Private Total: the queues (admin included) that are the
    /// primary controller's own.
    pub vqprt: U16,
    /// VQ Resources Flexible Secondary Maximum.
    pub vqfrsm: U16,
    /// VQ Flexible Resource Preferred Granularity.
    pub vqgran: U16,
    _rsvd48: [u8; 16],
    /// VI Resources Flexible Total.
    pub vifrt: U32,
    /// VI Resources Flexible Assigned (to secondary controllers).
    pub virfa: U32,
    /// VI Resources Flexible Allocated to Primary.
    pub virfap: U16,
    /// VI Resources Private Total: the primary controller's own interrupt
    /// vectors.
    pub viprt: U16,
    /// VI Resources Flexible Secondary Maximum.
    pub vifrsm: U16,
    /// VI Flexible Resource Preferred Granularity.
    pub vigran: U16,
    _rsvd80: [u8; 4016],
}

const _: () = assert!(core::mem::size_of::<PrimaryControllerCaps>() == IDENTIFY_SIZE);

zeroed!(PrimaryControllerCaps);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn primary_controller_caps_offsets_match_the_spec() {
        assert_eq!(offset_of!(PrimaryControllerCaps, crt), 4);
        assert_eq!(offset_of!(PrimaryControllerCaps, vqfrt), 32);
        assert_eq!(offset_of!(PrimaryControllerCaps, vqprt), 42);
        assert_eq!(offset_of!(PrimaryControllerCaps, vqgran), 46);
        assert_eq!(offset_of!(PrimaryControllerCaps, vifrt), 64);
        assert_eq!(offset_of!(PrimaryControllerCaps, viprt), 74);
        assert_eq!(offset_of!(PrimaryControllerCaps, vigran), 78);
    }
}
