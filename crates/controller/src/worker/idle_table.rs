//! A poll group's deep-idle table: what a wake-up of a group whose every
//! member sleeps at its back-off's ceiling reads, in one place.
//!
//! Such a wake-up comes 200 times a second, each after 5 ms asleep, and
//! on a virtual machine everything it touches first is a cache (and often
//! a TLB) miss: measured on the development machine, reading each member's
//! card through the group's list (`Served`, 144 bytes each) and each
//! page through its controller (`Shared`, then the page's vtable, its
//! object, the shared region, then the dword) was a chain of six
//! dependent misses per member, most of the 3-4 µs the pass took. The
//! table holds, per controller page, the page itself, the doorbell
//! generation and every dword its members' cards compare with, side by
//! side: a wake-up reads the table and, per controller, the page's dwords
//! and its generation (independent loads, which the processor overlaps),
//! and touches no member. It is built from the cards when the group goes
//! to sleep with every member holding one, and dropped as soon as a
//! wake-up needs the members (the bell rang, or a page moved).

use std::sync::Arc;
use std::time::Duration;

use super::look::Card;
use crate::doorbell::DoorbellPage;
use crate::state::Shared;

/// One controller page's dwords, as its members' cards last saw them.
struct Row {
    /// Held here so a look reaches the page without going through the
    /// controller.
    page: Arc<dyn DoorbellPage>,
    /// For the doorbell generation only (a queue opened or closed).
    shared: Arc<Shared>,
    generation: u64,
    /// `dwords[start..end]`.
    start: usize,
    end: usize,
}

/// See the module's comment.
#[derive(Default)]
pub(super) struct IdleTable {
    rows: Vec<Row>,
    /// (page dword index, value seen) of every row, row after row.
    dwords: Vec<(u32, u32)>,
    /// Members the table looks for.
    members: u64,
    /// The shortest of their back-offs: the next look comes this long
    /// after this one (one look for all).
    backoff: Duration,
}

impl IdleTable {
    /// Refills the table from the cards of every member (`None`: a member
    /// holds none, and the group must pass over its members). Keeps its
    /// allocations: a group that goes in and out of deep idle allocates
    /// once.
    pub fn fill<'a>(&mut self, cards: impl Iterator<Item = Option<&'a Card>>) -> bool {
        self.clear();
        self.backoff = Duration::MAX;
        for card in cards {
            let Some(card) = card else {
                return false;
            };
            // A controller's members in this group (its admin worker, its
            // I/O worker) join together, so sit side by side: they share
            // a row, their dwords being in one page.
            let fresh = self.rows.last().is_none_or(|r| {
                !Arc::ptr_eq(&r.shared, card.shared()) || r.generation != card.generation()
            });
            if fresh {
                let Some(page) = card.shared().doorbells.page_arc() else {
                    return false;
                };
                let at = self.dwords.len();
                self.rows.push(Row {
                    page: Arc::clone(page),
                    shared: Arc::clone(card.shared()),
                    generation: card.generation(),
                    start: at,
                    end: at,
                });
            }
            self.dwords.extend(card.dwords());
            if let Some(r) = self.rows.last_mut() {
                r.end = self.dwords.len();
            }
            self.members += 1;
            self.backoff = self.backoff.min(card.backoff);
        }
        self.members > 0
    }

    /// As each card's `quiet`, for all of them: no doorbell generation
    /// changed and no page dword moved since the cards were made.
    pub fn quiet(&self) -> bool {
        self.rows.iter().all(|r| {
            r.shared.doorbells.generation() == r.generation
                && self.dwords[r.start..r.end]
                    .iter()
                    .all(|&(i, v)| r.page.load(i) == v)
        })
    }

    /// Empties it, letting go of its controllers (a member may leave on
    /// the next pass); keeps its allocations.
    pub fn clear(&mut self) {
        self.rows.clear();
        self.dwords.clear();
        self.members = 0;
    }

    pub fn members(&self) -> u64 {
        self.members
    }

    /// Controller pages a look reads.
    pub fn rows(&self) -> u64 {
        self.rows.len() as u64
    }

    pub fn backoff(&self) -> Duration {
        self.backoff
    }
}
