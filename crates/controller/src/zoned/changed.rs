//! One namespace's Changed Zone List (ZNS 1.1 §4.1.2.1, log page BFh):
//! the zones whose state the controller changed by itself (read only,
//! offline) since the host last read the log.

use std::collections::BTreeSet;

use vnvme_spec::zns::{ChangedZoneList, CHANGED_ZONE_LIST_ENTRIES, CHANGED_ZONE_LIST_OVERFLOW};
use zerocopy::little_endian::{U16, U64};
use zerocopy::{FromBytes, IntoBytes};

/// The zones changed, by ZSLBA, or "more than the log holds".
#[derive(Debug, Default)]
pub(super) struct ChangedZones {
    pub(super) zslbas: BTreeSet<u64>,
    /// More than [`CHANGED_ZONE_LIST_ENTRIES`] zones changed: the log says
    /// FFFFh and lists none, so the host looks at every zone.
    pub(super) overflow: bool,
}

impl ChangedZones {
    pub fn add(&mut self, zslba: u64) {
        if self.overflow || self.zslbas.contains(&zslba) {
            return;
        }
        if self.zslbas.len() >= CHANGED_ZONE_LIST_ENTRIES {
            self.zslbas.clear();
            self.overflow = true;
            return;
        }
        self.zslbas.insert(zslba);
    }

    /// The 4 KiB log page.
    pub fn page(&self) -> Vec<u8> {
        let mut log = ChangedZoneList::new_boxed();
        if self.overflow {
            log.nrzid = U16::new(CHANGED_ZONE_LIST_OVERFLOW);
        } else {
            // At most 511 entries: the count fits.
            log.nrzid = U16::new(self.zslbas.len() as u16);
            for (slot, &zslba) in log.zid.iter_mut().zip(&self.zslbas) {
                *slot = U64::new(zslba);
            }
        }
        log.as_bytes().to_vec()
    }

    /// The host read `page` without RAE: forget what it reported. A zone
    /// that changed after the page was taken stays for the next read.
    /// Zone identifiers count from 0 (zone 0's ZSLBA is 0), so the count,
    /// not a zero entry, ends the list.
    pub fn acknowledge(&mut self, page: &[u8]) {
        let Ok((log, _)) = ChangedZoneList::read_from_prefix(page) else {
            return;
        };
        let n = log.nrzid.get();
        if n == CHANGED_ZONE_LIST_OVERFLOW {
            *self = Self::default();
            return;
        }
        for zid in log.zid.iter().take(usize::from(n)) {
            self.zslbas.remove(&zid.get());
        }
    }
}
