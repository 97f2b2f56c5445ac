//! Logical blocks marked invalid by Write Uncorrectable (NVM Command Set
//! 1.0 §3.2.7): reading one (Read, Compare, Verify, a Copy's source) fails
//! with Unrecovered Read Error until the block is written again (Write,
//! Write Zeroes, a Copy's destination) or deallocated, after which it
//! reads as what was written, or zeroes (DLFEAT).
//!
//! One set per namespace, as disjoint ranges. The read and write paths
//! look at one flag first: while nothing is marked, which is almost
//! always, a command pays a plain load, no lock and no read-modify-write.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use vnvme_spec::Status;

pub(crate) mod saved;

/// Ranges kept at most. Each Write Uncorrectable adds at most one, and so
/// does each write into the middle of one (it splits it): without a bound,
/// a guest could grow the set by a range per command.
pub(crate) const MAX_RANGES: usize = 1 << 16;

#[derive(Debug, Default)]
pub(crate) struct Uncorrectable {
    /// Some block is marked. Changed only under the lock. Read without it
    /// (relaxed): the host orders a read after a Write Uncorrectable only
    /// by waiting for the completion, posted after the lock was released.
    marked: AtomicBool,
    ranges: Mutex<Ranges>,
}

#[derive(Debug, Default)]
struct Ranges {
    /// Start LBA -> end LBA (exclusive); disjoint and never adjacent.
    map: BTreeMap<u64, u64>,
    /// A write had to drop a mark to stay within [`MAX_RANGES`] (logged once).
    overflowed: bool,
}

impl Uncorrectable {
    /// Unrecovered Read Error if any of `nlb` blocks at `slba` is marked.
    #[inline]
    pub fn check(&self, slba: u64, nlb: u64) -> Result<(), Status> {
        if self.marked.load(Ordering::Relaxed) {
            self.check_marked(slba, nlb)
        } else {
            Ok(())
        }
    }

    fn check_marked(&self, slba: u64, nlb: u64) -> Result<(), Status> {
        let end = slba.saturating_add(nlb);
        let ranges = self.ranges.lock();
        // The last range starting before `end` is the only one that can
        // reach into `slba..end`: they are disjoint.
        match ranges.map.range(..end).next_back() {
            Some((_, &e)) if e > slba => Err(Status::UNRECOVERED_READ_ERROR.with_dnr(true)),
            _ => Ok(()),
        }
    }

    /// Marks `nlb` blocks at `slba`, merged with the ranges they touch.
    /// Internal Error when that would need more than [`MAX_RANGES`] ranges.
    pub fn mark(&self, slba: u64, nlb: u64) -> Result<(), Status> {
        if nlb == 0 {
            return Ok(());
        }
        let (mut start, mut end) = (slba, slba.saturating_add(nlb));
        let mut ranges = self.ranges.lock();
        // Ranges that overlap or touch `start..end` (start <= end, end >=
        // start): merged into one.
        let touching: Vec<(u64, u64)> = ranges
            .map
            .range(..=end)
            .rev()
            .take_while(|(_, &e)| e >= start)
            .map(|(&s, &e)| (s, e))
            .collect();
        if touching.is_empty() && ranges.map.len() >= MAX_RANGES {
            return Err(Status::INTERNAL_ERROR.with_dnr(true));
        }
        for (s, e) in touching {
            ranges.map.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        ranges.map.insert(start, end);
        self.marked.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Unmarks `nlb` blocks at `slba`: they were written or deallocated.
    /// Returns whether any was marked.
    #[inline]
    pub fn clear(&self, slba: u64, nlb: u64) -> bool {
        self.marked.load(Ordering::Relaxed) && self.clear_marked(slba, nlb)
    }

    fn clear_marked(&self, slba: u64, nlb: u64) -> bool {
        if nlb == 0 {
            return false;
        }
        let end = slba.saturating_add(nlb);
        let mut ranges = self.ranges.lock();
        let overlapping: Vec<(u64, u64)> = ranges
            .map
            .range(..end)
            .rev()
            .take_while(|(_, &e)| e > slba)
            .map(|(&s, &e)| (s, e))
            .collect();
        let unmarked = !overlapping.is_empty();
        for (s, e) in overlapping {
            ranges.map.remove(&s);
            let left = (s < slba).then_some((s, slba));
            let right = (e > end).then_some((end, e));
            match (left, right) {
                (Some(l), Some(r)) if ranges.map.len() + 2 > MAX_RANGES => {
                    // A write cannot fail for this: keep the larger piece
                    // marked; the smaller reads as the data it held.
                    let (keep, drop) = if l.1 - l.0 >= r.1 - r.0 {
                        (l, r)
                    } else {
                        (r, l)
                    };
                    if !ranges.overflowed {
                        ranges.overflowed = true;
                        tracing::warn!(
                            "more than {MAX_RANGES} uncorrectable ranges: blocks {}..{} unmarked",
                            drop.0,
                            drop.1
                        );
                    }
                    ranges.map.insert(keep.0, keep.1);
                }
                _ => {
                    for (s, e) in left.into_iter().chain(right) {
                        ranges.map.insert(s, e);
                    }
                }
            }
        }
        if ranges.map.is_empty() {
            self.marked.store(false, Ordering::Relaxed);
        }
        unmarked
    }

    /// The lowest marked block (a device self-test's failing LBA).
    pub fn first(&self) -> Option<u64> {
        if !self.marked.load(Ordering::Relaxed) {
            return None;
        }
        self.ranges.lock().map.keys().next().copied()
    }

    /// The marked ranges, as (start, end exclusive), for tests.
    #[cfg(test)]
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        self.ranges
            .lock()
            .map
            .iter()
            .map(|(&s, &e)| (s, e))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unrecovered(u: &Uncorrectable, slba: u64, nlb: u64) -> bool {
        u.check(slba, nlb) == Err(Status::UNRECOVERED_READ_ERROR.with_dnr(true))
    }

    #[test]
    fn nothing_marked_reads_clean() {
        let u = Uncorrectable::default();
        assert_eq!(u.check(0, u64::MAX), Ok(()));
        u.clear(0, 10);
        assert!(u.ranges().is_empty());
    }

    #[test]
    fn a_read_touching_any_marked_block_fails() {
        let u = Uncorrectable::default();
        u.mark(10, 5).unwrap();
        assert!(unrecovered(&u, 10, 1));
        assert!(unrecovered(&u, 14, 1));
        assert!(unrecovered(&u, 0, 11));
        assert!(unrecovered(&u, 12, 100));
        assert_eq!(u.check(0, 10), Ok(()));
        assert_eq!(u.check(15, 1), Ok(()));
    }

    #[test]
    fn overlapping_and_adjacent_marks_merge() {
        let u = Uncorrectable::default();
        u.mark(10, 5).unwrap();
        u.mark(20, 5).unwrap();
        u.mark(15, 5).unwrap();
        assert_eq!(u.ranges(), vec![(10, 25)]);
        u.mark(0, 100).unwrap();
        assert_eq!(u.ranges(), vec![(0, 100)]);
    }

    #[test]
    fn clearing_splits_trims_and_empties() {
        let u = Uncorrectable::default();
        u.mark(10, 20).unwrap();
        u.clear(15, 2);
        assert_eq!(u.ranges(), vec![(10, 15), (17, 30)]);
        assert_eq!(u.check(15, 2), Ok(()));
        u.clear(0, 12);
        u.clear(25, 100);
        assert_eq!(u.ranges(), vec![(12, 15), (17, 25)]);
        assert_eq!(u.first(), Some(12));
        u.clear(0, 1000);
        assert!(u.ranges().is_empty());
        assert_eq!(u.first(), None);
        assert!(!u.marked.load(Ordering::Relaxed), "flag down once empty");
        assert_eq!(u.check(0, 1000), Ok(()));
    }

    #[test]
    fn ranges_stay_bounded_whatever_the_guest_does() {
        let u = Uncorrectable::default();
        // Every other block marked: one range each, up to the limit.
        for i in 0..MAX_RANGES as u64 {
            u.mark(i * 2, 1).unwrap();
        }
        assert_eq!(
            u.mark(MAX_RANGES as u64 * 2, 1),
            Err(Status::INTERNAL_ERROR.with_dnr(true))
        );
        // Merging with a marked range needs no new one.
        u.mark(1, 1).unwrap();
        // One large range, then writes splitting it: bounded too.
        let u = Uncorrectable::default();
        u.mark(0, 4 * MAX_RANGES as u64).unwrap();
        for i in 0..2 * MAX_RANGES as u64 {
            u.clear(i * 2 + 1, 1);
        }
        assert!(u.ranges().len() <= MAX_RANGES);
        assert!(u.check(0, 1).is_err(), "the first piece is still marked");
    }
}
