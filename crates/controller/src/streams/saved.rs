//! The Streams directive's saved form (docs/state-format.md,
//! `features.streams`): per namespace, enabled, allocated and open streams.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{NsStreams, Streams, MSL};
use crate::saved_check::{at_most, inconsistent, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedStreams {
    pub enabled: bool,
    pub allocated: u16,
    pub open: BTreeSet<u16>,
}

impl Streams {
    pub fn save(&self) -> BTreeMap<u32, SavedStreams> {
        (self.namespaces.iter())
            .map(|(&nsid, s)| {
                let saved = SavedStreams {
                    enabled: s.enabled,
                    allocated: s.allocated,
                    open: s.open.clone(),
                };
                (nsid, saved)
            })
            .collect()
    }

    /// The streams of `saved`: at most [`MSL`] allocated in all, each open
    /// one among its namespace's allocated ones.
    pub fn restored(saved: &BTreeMap<u32, SavedStreams>) -> Result<Self, InvalidState> {
        let allocated: u64 = saved.values().map(|s| u64::from(s.allocated)).sum();
        at_most("the streams allocated", allocated, u64::from(MSL))?;
        let mut namespaces = BTreeMap::new();
        for (&nsid, s) in saved {
            if s.open.iter().any(|&sid| sid == 0 || sid > s.allocated) {
                return Err(inconsistent(format!(
                    "namespace {nsid} has an open stream beyond the {} allocated",
                    s.allocated
                )));
            }
            let ns = NsStreams {
                enabled: s.enabled,
                allocated: s.allocated,
                open: s.open.clone(),
            };
            namespaces.insert(nsid, ns);
        }
        Ok(Self { namespaces })
    }
}
