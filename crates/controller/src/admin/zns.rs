//! The Zoned Namespace Command Set's admin side (ZNS 1.1 §4, §5): its
//! Identify structures (CNS 05h, 06h with CSI 02h) and the Changed Zone
//! List log.

use vnvme_spec::zns::{ozcs, IdentifyControllerZns, IdentifyNamespaceZns, NO_LIMIT};
use vnvme_spec::Status;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::IntoBytes;

use crate::config::LBA_FORMATS;
use crate::namespace::Namespace;
use crate::state::Shared;
use crate::zoned::Zones;

/// Identify Namespace for the Zoned Namespace Command Set (CNS 05h and
/// 1Bh, CSI 02h; §4.1.5.1): the resource limits and each LBA format's zone
/// size. No zone operation characteristics (Linux refuses a namespace
/// with any), reads may cross zone boundaries (OZCS.RAZB), no zone
/// descriptor extensions (ZDES 0), no reset or finish recommendations.
pub(super) fn identify_namespace(zones: &Zones) -> Box<IdentifyNamespaceZns> {
    let mut id = IdentifyNamespaceZns::new_boxed();
    let c = &zones.config;
    id.ozcs = U16::new(ozcs::RAZB);
    // 0's based; a count of N limits to N.
    let limit = |n: Option<u32>| n.map_or(NO_LIMIT, |n| n.saturating_sub(1));
    id.mar = U32::new(limit(c.max_active));
    id.mor = U32::new(limit(c.max_open));
    for (lbafe, f) in id.lbafe.iter_mut().zip(LBA_FORMATS) {
        lbafe.zsze = U64::new(c.zone_size / u64::from(f.data_size));
    }
    id
}

/// Identify Controller for the Zoned Namespace Command Set (CNS 06h, CSI
/// 02h; §4.1.5.2): a Zone Append may be as large as any write (ZASL =
/// MDTS, both powers of two of CAP.MPSMIN pages).
pub(super) fn identify_controller(shared: &Shared) -> Box<IdentifyControllerZns> {
    let mut id = IdentifyControllerZns::new_boxed();
    id.zasl = shared.config.mdts;
    id
}

/// CNS 05h or 1Bh with CSI 02h for `ns`: Invalid Field for a namespace
/// of another command set; zeroes for none (inactive or unallocated).
pub(super) fn identify_namespace_of(ns: Option<&Namespace>) -> Result<Vec<u8>, Status> {
    match ns.map(|ns| ns.zones.as_deref()) {
        Some(Some(zones)) => Ok(identify_namespace(zones).as_bytes().to_vec()),
        Some(None) => Err(Status::INVALID_FIELD.with_dnr(true)),
        None => Ok(vec![0; vnvme_spec::identify::IDENTIFY_SIZE]),
    }
}

/// Changed Zone List (Log Identifier BFh, §4.1.2.1): the zones whose
/// state the controller changed by itself. It never does (no zone goes
/// read only, offline or full on its own), so the list is always empty,
/// for any NSID, and no Zone Descriptor Changed event is ever sent.
pub(super) fn changed_zone_list() -> Vec<u8> {
    // Number of Zone Identifiers (bytes 1:0) 0, then 511 empty entries.
    vec![0; 4096]
}
