//! The Zoned Namespace Command Set's admin side (ZNS 1.1 §4, §5): its
//! Identify structures (CNS 05h, 06h with CSI 02h) and the Changed Zone
//! List log.

use vnvme_spec::status::invalid_field;
use vnvme_spec::zns::{ozcs, IdentifyControllerZns, IdentifyNamespaceZns, NO_LIMIT, ZDES_UNIT};
use vnvme_spec::Status;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::IntoBytes;

use crate::config::{ControllerConfig, LBA_FORMATS};
use crate::namespace::Namespace;
use crate::subsystem::Subsystem;
use crate::zoned::Zones;

/// Identify Namespace for the Zoned Namespace Command Set (CNS 05h and
/// 1Bh, CSI 02h; §4.1.5.1): the resource limits and each LBA format's zone
/// size and zone descriptor extension size (ZDES, in 64-byte units; the
/// same for every format). No zone operation characteristics (Linux
/// refuses a namespace with any), reads may cross zone boundaries
/// (OZCS.RAZB); RRL and FRL 0 (not reported): the controller recommends
/// a reset or a finish only when the operator says so.
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
        // At most 255: ZonedConfig::validate bounds the size.
        lbafe.zdes = (c.extension_size as usize / ZDES_UNIT) as u8;
    }
    id
}

/// Identify Controller for the Zoned Namespace Command Set (CNS 06h, CSI
/// 02h; §4.1.5.2): a Zone Append may be as large as any write (ZASL =
/// MDTS, both powers of two of CAP.MPSMIN pages).
pub(super) fn identify_controller(config: &ControllerConfig) -> Box<IdentifyControllerZns> {
    let mut id = IdentifyControllerZns::new_boxed();
    id.zasl = config.mdts;
    id
}

/// CNS 05h or 1Bh with CSI 02h for `ns`: Invalid Field for a namespace
/// of another command set; zeroes for none (inactive or unallocated).
pub(super) fn identify_namespace_of(ns: Option<&Namespace>) -> Result<Vec<u8>, Status> {
    match ns.map(|ns| ns.zones.as_deref()) {
        Some(Some(zones)) => Ok(identify_namespace(zones).as_bytes().to_vec()),
        Some(None) => Err(invalid_field()),
        None => Ok(vec![0; vnvme_spec::identify::IDENTIFY_SIZE]),
    }
}

/// Changed Zone List (Log Identifier BFh, §4.1.2.1) of namespace `nsid`:
/// the zones the controller changed by itself (when the operator said
/// so, [`crate::Controller::zone_set_state`]). A namespace with
/// no zones (conventional, none at that NSID, or the broadcast NSID) has
/// none that changed: an empty list.
pub(super) fn changed_zone_list(subsystem: &Subsystem, nsid: u32) -> Vec<u8> {
    match zones_of(subsystem, nsid) {
        Some(zones) => zones.changed_zone_list(),
        // Number of Zone Identifiers (bytes 1:0) 0, then 511 empty entries.
        None => vec![0; 4096],
    }
}

/// The host read `page` of namespace `nsid`'s Changed Zone List without
/// RAE: the zones it lists are forgotten.
pub(super) fn changed_zone_list_seen(subsystem: &Subsystem, nsid: u32, page: &[u8]) {
    if let Some(zones) = zones_of(subsystem, nsid) {
        zones.changed_zone_list_seen(page);
    }
}

fn zones_of(subsystem: &Subsystem, nsid: u32) -> Option<std::sync::Arc<Zones>> {
    subsystem.namespaces.active(nsid)?.zones.clone()
}
