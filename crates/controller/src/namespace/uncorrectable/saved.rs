//! Blocks marked by Write Uncorrectable, in the saved state
//! (docs/state-format.md, `namespaces[].uncorrectable`): `[start, end)`
//! LBA ranges, disjoint and in order.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::{Ranges, Uncorrectable, MAX_RANGES};
use crate::saved_check::{at_most, inconsistent, InvalidState};

impl Uncorrectable {
    pub fn save(&self) -> Vec<(u64, u64)> {
        let r = self.ranges.lock();
        r.map.iter().map(|(&s, &e)| (s, e)).collect()
    }

    /// Takes `ranges`, each inside `0..nsze`, in order and disjoint.
    pub fn restore(&self, ranges: &[(u64, u64)], nsze: u64) -> Result<(), InvalidState> {
        at_most(
            "the uncorrectable ranges",
            ranges.len() as u64,
            MAX_RANGES as u64,
        )?;
        let mut map = BTreeMap::new();
        let mut last_end = None;
        for &(start, end) in ranges {
            if start >= end || end > nsze || last_end.is_some_and(|e| start <= e) {
                return Err(inconsistent(format!(
                    "the uncorrectable range {start}..{end} is empty, out of order or beyond the namespace's {nsze} blocks"
                )));
            }
            last_end = Some(end);
            map.insert(start, end);
        }
        let marked = !map.is_empty();
        *self.ranges.lock() = Ranges {
            map,
            overflowed: false,
        };
        self.marked.store(marked, Ordering::Relaxed);
        Ok(())
    }
}
