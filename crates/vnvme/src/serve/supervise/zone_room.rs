//! Where each zoned namespace's zones are kept in the crash area's zone
//! room (docs/state-format.md, "Crash area"): the zoned namespaces in
//! the order configured, each given as many places as its backend holds
//! whole zones, from the room's start. Every child of a supervisor has
//! the same configuration, so the same places.

use vnvme_controller::{NamespaceConfig, MAX_RECORDED_ZCAP};

use super::crash_area::ZONE_WORDS;

/// The zoned namespaces' places in the room.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZoneRoom {
    /// NSID, first place, places.
    spans: Vec<(u32, usize, usize)>,
}

impl ZoneRoom {
    /// Places for the zones of `namespaces`; `Err` says why they do not
    /// fit the room (more than [`ZONE_WORDS`] zones in all, or a zone
    /// capacity a zone's word cannot hold).
    pub fn plan(namespaces: &[NamespaceConfig]) -> Result<Self, String> {
        let mut spans = Vec::new();
        let mut next = 0usize;
        for ns in namespaces {
            let Some(z) = &ns.zoned else {
                continue;
            };
            let zcap = z.zone_capacity / u64::from(ns.lba_size.max(1));
            if zcap > MAX_RECORDED_ZCAP {
                return Err(format!(
                    "namespace {}'s zones hold {zcap} logical blocks, more than the {} a \
                     --supervise crash area keeps a write pointer of: use smaller zones",
                    ns.nsid, MAX_RECORDED_ZCAP
                ));
            }
            // At least its zone count (the namespace holds whole zones).
            let count = (ns.backend.size() / z.zone_size.max(1)) as usize;
            spans.push((ns.nsid, next, count));
            next = next.saturating_add(count);
        }
        if next > ZONE_WORDS {
            return Err(format!(
                "the zoned namespaces have {next} zones, more than the {ZONE_WORDS} a \
                 --supervise crash area keeps: use larger zones"
            ));
        }
        Ok(Self { spans })
    }

    /// The place of zone `zone` of namespace `nsid`, if it has one.
    pub fn index(&self, nsid: u32, zone: u32) -> Option<usize> {
        let &(_, first, count) = self.spans.iter().find(|(n, _, _)| *n == nsid)?;
        let zone = zone as usize;
        (zone < count).then_some(first + zone)
    }

    /// Every place: NSID, zone, place.
    pub fn places(&self) -> impl Iterator<Item = (u32, u32, usize)> + '_ {
        (self.spans.iter())
            .flat_map(|&(nsid, first, count)| (0..count).map(move |z| (nsid, z as u32, first + z)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vnvme_blockdev::RamDevice;
    use vnvme_controller::ZonedConfig;

    use super::*;

    fn zoned(nsid: u32, size: u64, zone: u64) -> NamespaceConfig {
        NamespaceConfig::new(nsid, 512, Arc::new(RamDevice::new(size)))
            .with_zoned(Some(ZonedConfig::new(zone)))
    }

    #[test]
    fn zoned_namespaces_get_places_one_after_the_other() {
        let plain = NamespaceConfig::new(1, 512, Arc::new(RamDevice::new(1 << 20)));
        let room = ZoneRoom::plan(&[
            plain,
            zoned(3, 1 << 20, 64 << 10),
            zoned(2, 1 << 20, 256 << 10),
        ])
        .unwrap();
        assert_eq!(room.index(3, 0), Some(0));
        assert_eq!(room.index(3, 15), Some(15));
        assert_eq!(room.index(3, 16), None);
        assert_eq!(room.index(2, 3), Some(19));
        assert_eq!(room.index(1, 0), None);
        assert_eq!(room.places().count(), 20);
    }

    #[test]
    fn more_zones_than_the_room_holds_are_refused() {
        let many = zoned(1, (ZONE_WORDS as u64 + 1) * 4096, 4096);
        let e = ZoneRoom::plan(&[many]).unwrap_err();
        assert!(e.contains("more than the 1048576"), "{e}");
    }
}
