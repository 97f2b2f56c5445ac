//! A namespace's globally unique identifiers: NGUID, EUI-64 and UUID
//! (NVMe Base 2.0 §4.7.1 Namespace Identification Descriptor list; NGUID
//! and EUI64 also in Identify Namespace).
//!
//! They must differ between controllers, not only between the namespaces
//! of one: Linux names disks by them (`/dev/disk/by-id/nvme-*`) and, when
//! two namespaces anywhere on the host share one, clears both ("clearing
//! duplicate IDs"), so a by-id path could reach either disk. They must
//! also stay the same across restarts, or fstab entries by id break. So
//! they are derived, with SHA-1 name-based (version 5) UUIDs, from a name
//! that is unique and stable: the controller's serial number and the NSID
//! by default ([`NamespaceIds::for_controller`]), and what the caller
//! chooses otherwise (`vnvme serve` names a file namespace by its file).

use uuid::Uuid;

/// The namespace all vnvme names live in (a fixed random UUID), so a name
/// never gives another program's identifiers.
const VNVME_NAMES: Uuid = Uuid::from_u128(0x5d1e_7a2c_3f4b_4e8e_9a61_0c2b_7d9f_e310);

/// A namespace's identifiers, as reported to hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NamespaceIds {
    /// Namespace Globally Unique Identifier (NGUID), 128 bits.
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier (EUI64), 64 bits; derived ones are
    /// locally administered (bit 1 of the first byte set), as vnvme has no
    /// OUI of its own.
    pub eui64: [u8; 8],
    /// Namespace UUID (RFC 9562), reported in the descriptor list only.
    pub uuid: [u8; 16],
}

impl NamespaceIds {
    /// The identifiers derived from `name`: the same name always gives the
    /// same identifiers, and different names different ones.
    pub fn from_name(name: &str) -> Self {
        let derive = |what: &str| {
            *Uuid::new_v5(&VNVME_NAMES, format!("{what}:{name}").as_bytes()).as_bytes()
        };
        let mut eui64 = [0; 8];
        eui64.copy_from_slice(&derive("eui64")[..8]);
        // Locally administered, unicast (IEEE 802 U/L and I/G bits).
        eui64[0] = (eui64[0] | 0x02) & !0x01;
        Self {
            nguid: derive("nguid"),
            eui64,
            uuid: derive("uuid"),
        }
    }

    /// The default identifiers of namespace `nsid` of the controller with
    /// serial number `serial`: unique as long as serial numbers are (the
    /// subsystem NQN, derived from the serial, has to be too).
    pub fn for_controller(serial: &str, nsid: u32) -> Self {
        Self::from_name(&format!("controller {serial} namespace {nsid}"))
    }

    /// Identifiers for a namespace created at run time (Namespace
    /// Management): a deleted namespace's NSID can come back, and the new
    /// namespace must not take the old one's identifiers, which a host may
    /// still hold.
    pub fn fresh(serial: &str, nsid: u32) -> Self {
        static CREATED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CREATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        Self::from_name(&format!(
            "controller {serial} namespace {nsid} created {now} #{n} by {}",
            std::process::id()
        ))
    }

    /// The name of an identifier this and `other` share, if any.
    pub fn shared_with(&self, other: &Self) -> Option<&'static str> {
        if self.nguid == other.nguid {
            Some("NGUID")
        } else if self.eui64 == other.eui64 {
            Some("EUI-64")
        } else if self.uuid == other.uuid {
            Some("UUID")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_name_gives_the_same_ids_and_another_name_others() {
        let a = NamespaceIds::for_controller("VNVME-1", 1);
        assert_eq!(a, NamespaceIds::for_controller("VNVME-1", 1));
        for b in [
            NamespaceIds::for_controller("VNVME-2", 1),
            NamespaceIds::for_controller("VNVME-1", 2),
        ] {
            assert_ne!(a.nguid, b.nguid);
            assert_ne!(a.eui64, b.eui64);
            assert_ne!(a.uuid, b.uuid);
            assert_eq!(a.shared_with(&b), None);
        }
        // Three different values, none of them zero (which means "none").
        assert_ne!(a.nguid, a.uuid);
        assert_ne!(a.nguid[..8], a.eui64);
        assert_ne!(a.eui64, [0; 8]);
    }

    #[test]
    fn derived_eui64s_are_locally_administered_unicast() {
        for nsid in 1..64 {
            let e = NamespaceIds::for_controller("S", nsid).eui64;
            assert_eq!(e[0] & 0x03, 0x02, "{e:02x?}");
        }
    }

    #[test]
    fn namespaces_created_at_run_time_never_repeat_ids() {
        let a = NamespaceIds::fresh("S", 3);
        let b = NamespaceIds::fresh("S", 3);
        assert_eq!(a.shared_with(&b), None);
        assert_eq!(a.shared_with(&NamespaceIds::for_controller("S", 3)), None);
    }

    #[test]
    fn derived_uuids_are_version_5() {
        let u = Uuid::from_bytes(NamespaceIds::from_name("x").uuid);
        assert_eq!(u.get_version_num(), 5);
    }
}
