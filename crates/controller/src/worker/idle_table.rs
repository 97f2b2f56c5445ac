//! A poll group's deep-idle table: what a wake-up of a group whose every
//! member sleeps at its back-off's ceiling reads, in one place.
//!
//! Such a wake-up comes 200 times a second, each after 5 ms asleep, and
//! on a virtual machine everything it touches first is a cache (and often
//! a TLB) miss. Measured on the development machine (`perf`, eight idle
//! controllers in one group), reading each member's card through the
//! group's list (`Served`, 144 bytes each) and each page through its
//! controller (`Shared` for the doorbell generation and the page, then
//! the page's vtable, its object, the shared region, and the dword) was
//! a chain of six dependent misses per member, most of the pass's time.
//! The table holds, side by side, a reference to each page dword its
//! members' cards compare with and the value the card saw: a wake-up reads
//! the table, then one dword per owned SQ, each a load with no pointer to
//! follow first, all independent of each other, and touches no member.
//!
//! Nor the controllers: a card also holds the doorbell generation its
//! dwords are of (a queue opened or closed since), which the table does
//! not read. A first version did, and `perf` put a third of the wake-up's
//! own time on those loads, one cold line in another page per controller
//! (on a virtual machine a page's first touch after 5 ms asleep is a TLB
//! miss too, walked through two page tables). It need not: every change
//! of a worker's SQs reaches the worker through its mailbox (Create and
//! Delete I/O SQ, Doorbell Buffer Config's switch of sources, a reset's
//! stop), which rings its group's bell after the change, and a rung bell
//! ends the table's sleep: the pass that follows reads the members, whose
//! cards still compare the generation. A look from the table between the
//! change and the ring finds at most a stale "nothing came", and the ring
//! ends the next wait at once.
//!
//! It borrows from the group's members (their cards hold the controllers),
//! so it lives while the group sleeps in deep idle and is made again, from
//! the cards, each time the group goes back to it; its two vectors are the
//! only allocations, made then, never per wake-up.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::look::Card;

/// See the module's comment.
pub(super) struct IdleTable<'a> {
    /// Each owned SQ's tail doorbell in the page, and what the card saw
    /// there (little-endian, as the page holds it).
    dwords: Vec<(&'a AtomicU32, u32)>,
    /// Members the table looks for.
    members: u64,
    /// The shortest of their back-offs: the next look comes this long
    /// after this one (one look for all).
    backoff: Duration,
}

impl<'a> IdleTable<'a> {
    /// The table of `cards`, one per member; `None` if a member holds no
    /// card, or its page gives no dword to hold (the group then passes
    /// over its members as before).
    pub fn new(cards: impl ExactSizeIterator<Item = Option<&'a Card>>) -> Option<Self> {
        let mut t = Self {
            dwords: Vec::with_capacity(cards.len()),
            members: 0,
            backoff: Duration::MAX,
        };
        for card in cards {
            let card = card?;
            let page = card.shared().doorbells.page()?;
            for (index, seen) in card.dwords() {
                t.dwords.push((page.dword(index)?, seen.to_le()));
            }
            t.members += 1;
            t.backoff = t.backoff.min(card.backoff);
        }
        (t.members > 0).then_some(t)
    }

    /// As each card's `quiet`, for all of them, but for the generation
    /// (see the module's comment): no page dword moved since the cards
    /// were made. Relaxed loads: a quiet table only lets the group sleep
    /// again, and a moved dword sends it to its members, which read the
    /// page again with the ordering their rounds need.
    pub fn quiet(&self) -> bool {
        self.dwords
            .iter()
            .all(|&(d, v)| d.load(Ordering::Relaxed) == v)
    }

    pub fn members(&self) -> u64 {
        self.members
    }

    /// Page dwords a look reads.
    pub fn dwords(&self) -> u64 {
        self.dwords.len() as u64
    }

    pub fn backoff(&self) -> Duration {
        self.backoff
    }
}
