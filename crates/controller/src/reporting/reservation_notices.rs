//! One controller's Reservation Notifications (NVMe Base 2.0 §8.19,
//! log page 80h §5.16.1.24, mask feature 82h §5.27.1.26): what the
//! reservation commands of other hosts did to its host's registrations and
//! reservations, one log page per notification, read oldest first.
//!
//! * A notification of a type its namespace's mask (82h) masks creates no
//!   page and no event.
//! * Each page has a Log Page Count, counted from 1 after a Controller
//!   Level Reset (0h is the empty page). At most [`MAX_PAGES`] are kept
//!   unread; a notification beyond them is lost, and the newest kept page
//!   takes its count, so the host sees the gap.
//! * Reading the log returns the oldest page and removes it (its Number
//!   of Available Log Pages says how many are left); with none, the empty
//!   page (all zeroes).
//! * Everything here returns to its default at a Controller Level Reset,
//!   and is in a saved controller state (docs/state-format.md,
//!   `reporting.reservation_notices`).

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};
use vnvme_spec::reservation::{notification, ReservationNotificationLog};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::saved_check::{at_most, inconsistent, InvalidState};

/// Unread pages kept: as many as a host has registrations worth telling
/// of without reading, bounded so no host can grow it.
pub(crate) const MAX_PAGES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Page {
    count: u64,
    kind: u8,
    nsid: u32,
}

#[derive(Debug, Default)]
pub(crate) struct ReservationNotices {
    /// The Log Page Count of the newest notification, kept or lost.
    count: u64,
    /// Unread pages, oldest first.
    pages: VecDeque<Page>,
    /// Reservation Notification Mask (82h) by NSID, bits 1-3; absent: 0.
    /// At most one entry per NSID the host can name (NN).
    masks: BTreeMap<u32, u32>,
}

impl ReservationNotices {
    /// A notification of `kind` for namespace `nsid`: `true` if it made a
    /// page (the host is to be told by an asynchronous event).
    pub fn add(&mut self, nsid: u32, kind: u8) -> bool {
        if self.mask(nsid) & (1 << kind) != 0 {
            return false;
        }
        // Wraps past 0h, which is the empty page's.
        self.count = self.count.wrapping_add(1).max(1);
        if self.pages.len() >= MAX_PAGES {
            // Lost: the newest kept page takes its count (Base 2.1
            // §5.2.12.1.35), so the host sees the gap.
            if let Some(last) = self.pages.back_mut() {
                last.count = self.count;
            }
            return false;
        }
        let count = self.count;
        self.pages.push_back(Page { count, kind, nsid });
        true
    }

    /// The log page: the oldest unread notification, or the empty page.
    pub fn page(&self) -> Vec<u8> {
        let mut log = ReservationNotificationLog::new_zeroed();
        if let Some(p) = self.pages.front() {
            log.count = U64::new(p.count);
            log.kind = p.kind;
            let after = self.pages.len() - 1;
            log.available = u8::try_from(after).unwrap_or(u8::MAX);
            log.nsid = U32::new(p.nsid);
        }
        log.as_bytes().to_vec()
    }

    /// The host has read `page`: it is removed if it is still the oldest.
    /// Returns whether unread pages remain.
    pub fn seen(&mut self, page: &[u8]) -> bool {
        let read = ReservationNotificationLog::read_from_bytes(page)
            .map(|log| log.count.get())
            .ok();
        if read.is_some() && self.pages.front().map(|p| p.count) == read {
            self.pages.pop_front();
        }
        !self.pages.is_empty()
    }

    /// Namespace `nsid`'s Reservation Notification Mask.
    pub fn mask(&self, nsid: u32) -> u32 {
        self.masks.get(&nsid).copied().unwrap_or(0)
    }

    /// Sets namespace `nsid`'s mask to the bits of `value` it has.
    pub fn set_mask(&mut self, nsid: u32, value: u32) {
        let bits = value & notification::MASK_BITS;
        if bits == 0 {
            self.masks.remove(&nsid);
        } else {
            self.masks.insert(nsid, bits);
        }
    }
}

/// The saved form: absent from states saved before it existed (none
/// unread, no masks).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedReservationNotices {
    /// The newest Log Page Count, kept or lost.
    pub count: u64,
    /// Unread pages, oldest first: (Log Page Count, type, NSID).
    pub pages: Vec<(u64, u8, u32)>,
    /// Reservation Notification Mask by NSID.
    pub masks: BTreeMap<u32, u32>,
}

impl ReservationNotices {
    pub fn save(&self) -> SavedReservationNotices {
        SavedReservationNotices {
            count: self.count,
            pages: (self.pages.iter())
                .map(|p| (p.count, p.kind, p.nsid))
                .collect(),
            masks: self.masks.clone(),
        }
    }

    /// The notices of `saved`, checked: at most [`MAX_PAGES`] pages of the
    /// three types, numbered upwards to `count` at most, masks of the
    /// mask bits for NSIDs a host can name.
    pub fn restore(saved: &SavedReservationNotices) -> Result<Self, InvalidState> {
        at_most(
            "the unread reservation notifications",
            saved.pages.len() as u64,
            MAX_PAGES as u64,
        )?;
        let mut last = 0;
        let mut pages = VecDeque::new();
        for &(count, kind, nsid) in &saved.pages {
            let fits = count > last
                && count <= saved.count
                && (notification::REGISTRATION_PREEMPTED..=notification::RESERVATION_PREEMPTED)
                    .contains(&kind)
                && nsid != 0
                && nsid != u32::MAX;
            if !fits {
                return Err(inconsistent(format!(
                    "a reservation notification (count {count}, type {kind}, NSID {nsid}) after count {last} of {}",
                    saved.count
                )));
            }
            last = count;
            pages.push_back(Page { count, kind, nsid });
        }
        for (&nsid, &mask) in &saved.masks {
            if nsid == 0 || nsid == u32::MAX || mask == 0 || mask & !notification::MASK_BITS != 0 {
                return Err(inconsistent(format!(
                    "reservation notification mask {mask:#x} of NSID {nsid}"
                )));
            }
        }
        Ok(Self {
            count: saved.count,
            pages,
            masks: saved.masks.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(n: &mut ReservationNotices) -> ReservationNotificationLog {
        let page = n.page();
        n.seen(&page);
        ReservationNotificationLog::read_from_bytes(&page).unwrap()
    }

    #[test]
    fn pages_read_oldest_first_masked_ones_never_made_lost_ones_counted() {
        let mut n = ReservationNotices::default();
        assert_eq!(read(&mut n).count.get(), 0, "empty");
        n.set_mask(2, 1 << notification::RESERVATION_RELEASED);
        assert!(!n.add(2, notification::RESERVATION_RELEASED), "masked");
        assert!(n.add(1, notification::RESERVATION_RELEASED));
        assert!(n.add(2, notification::REGISTRATION_PREEMPTED));
        let first = read(&mut n);
        assert_eq!((first.count.get(), first.kind, first.nsid.get()), (1, 2, 1));
        assert_eq!(first.available, 1);
        let second = read(&mut n);
        assert_eq!(
            (second.count.get(), second.kind, second.available),
            (2, 1, 0)
        );
        assert_eq!(read(&mut n).kind, notification::EMPTY);
        for _ in 0..MAX_PAGES + 3 {
            n.add(1, notification::RESERVATION_PREEMPTED);
        }
        assert_eq!(
            n.pages.back().unwrap().count,
            3 + MAX_PAGES as u64 + 2,
            "the newest kept page has the last lost one's count"
        );
        let oldest = read(&mut n);
        assert_eq!(
            (oldest.count.get(), oldest.available),
            (3, MAX_PAGES as u8 - 1)
        );
        assert!(n.add(1, notification::RESERVATION_PREEMPTED));
        assert_eq!(
            n.pages.back().unwrap().count,
            3 + MAX_PAGES as u64 + 3,
            "3 lost, counted"
        );
        n.set_mask(2, 0xFFFF_FFFF);
        assert_eq!(n.mask(2), notification::MASK_BITS);
    }

    #[test]
    fn the_saved_form_round_trips_and_bad_ones_are_refused() {
        let mut n = ReservationNotices::default();
        n.set_mask(3, 1 << notification::RESERVATION_PREEMPTED);
        n.add(1, notification::REGISTRATION_PREEMPTED);
        n.add(2, notification::RESERVATION_RELEASED);
        read(&mut n);
        let saved = n.save();
        assert_eq!(saved.pages, [(2, 2, 2)]);
        let mut back = ReservationNotices::restore(&saved).unwrap();
        assert_eq!(back.page(), n.page());
        assert_eq!(back.mask(3), 1 << notification::RESERVATION_PREEMPTED);
        assert!(back.add(1, notification::RESERVATION_PREEMPTED));
        assert_eq!(back.pages.back().unwrap().count, 3, "numbering goes on");
        let bad = [
            SavedReservationNotices {
                count: 1,
                pages: vec![(2, 1, 1)],
                ..saved.clone()
            },
            SavedReservationNotices {
                pages: vec![(2, 4, 1)],
                ..saved.clone()
            },
            SavedReservationNotices {
                pages: vec![(2, 1, 1), (2, 1, 1)],
                ..saved.clone()
            },
            SavedReservationNotices {
                masks: BTreeMap::from([(1, 1)]),
                ..saved.clone()
            },
            SavedReservationNotices {
                count: u64::MAX,
                pages: (1..=MAX_PAGES as u64 + 1).map(|c| (c, 1, 1)).collect(),
                ..saved.clone()
            },
        ];
        for b in &bad {
            assert!(ReservationNotices::restore(b).is_err(), "{b:?}");
        }
    }
}
