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
//! The table holds, side by side, a reference to each controller's
//! doorbell generation and to each page dword its members' cards compare
//! with, and the values the cards saw: a wake-up reads the table, then
//! one word per controller and one dword per owned SQ, each a load with
//! no pointer to follow first, all independent of each other (the
//! processor overlaps their misses), and touches no member.
//!
//! It borrows from the group's members (their cards hold the controllers),
//! so it lives while the group sleeps in deep idle and is made again, from
//! the cards, each time the group goes back to it; its two vectors are the
//! only allocations, made then, never per wake-up.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::look::Card;

/// See the module's comment.
pub(super) struct IdleTable<'a> {
    /// Each controller's doorbell generation, and the one its cards are
    /// of (a queue opened or closed since: its members must look).
    generations: Vec<(&'a AtomicU64, u64)>,
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
            generations: Vec::with_capacity(cards.len()),
            dwords: Vec::with_capacity(cards.len()),
            members: 0,
            backoff: Duration::MAX,
        };
        let mut last: Option<(&AtomicU64, u64)> = None;
        for card in cards {
            let card = card?;
            let doorbells = &card.shared().doorbells;
            let generation = (doorbells.generation_word(), card.generation());
            // A controller's members in this group (its admin worker, its
            // I/O worker) join together, so sit side by side: one
            // generation read serves both.
            if last.is_none_or(|(w, g)| !std::ptr::eq(w, generation.0) || g != generation.1) {
                t.generations.push(generation);
                last = Some(generation);
            }
            let page = doorbells.page()?;
            for (index, seen) in card.dwords() {
                t.dwords.push((page.dword(index)?, seen.to_le()));
            }
            t.members += 1;
            t.backoff = t.backoff.min(card.backoff);
        }
        (t.members > 0).then_some(t)
    }

    /// As each card's `quiet`, for all of them: no doorbell generation
    /// changed and no page dword moved since the cards were made. Relaxed
    /// loads: a quiet table only lets the group sleep again, and anything
    /// else sends it to its members, which read the page and the
    /// generation again with the ordering their rounds need.
    pub fn quiet(&self) -> bool {
        self.generations
            .iter()
            .all(|&(w, g)| w.load(Ordering::Relaxed) == g)
            && self
                .dwords
                .iter()
                .all(|&(d, v)| d.load(Ordering::Relaxed) == v)
    }

    pub fn members(&self) -> u64 {
        self.members
    }

    /// Controllers a look reads the generation of (one per controller,
    /// whatever the number of its members in the group).
    pub fn controllers(&self) -> u64 {
        self.generations.len() as u64
    }

    /// Page dwords a look reads.
    pub fn dwords(&self) -> u64 {
        self.dwords.len() as u64
    }

    pub fn backoff(&self) -> Duration {
        self.backoff
    }
}
