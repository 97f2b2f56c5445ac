//! A poll group's cheap look at an idle member: what the page says now
//! against what it said before the member's last round, without a round.
//!
//! An idle member whose client maps the doorbell page wakes after its
//! back-off to learn whether the host rang. A round to learn it takes the
//! mailbox's lock, reaches guest memory (the shadow doorbells: a DMA map
//! snapshot taken and given back) and walks every ring; on the development
//! machine 16 such rounds cost a poll group's wake-up ~50 µs. A look reads
//! one page dword per owned SQ, which is enough where every new command
//! changes the page: its SQs' doorbells are registers (the page is the
//! register file), or shadow doorbells whose EventIdx the worker armed
//! before it slept (a host that moves such a tail then writes the register
//! too, as the need-event test tells it, and through the mapped page that
//! write is a store to the page).

use std::sync::Arc;
use std::time::Duration;

use vnvme_spec::regs::Doorbell;

use super::Local;
use crate::doorbell::Doorbells;
use crate::state::Shared;

/// Most owned SQs a [`Card`] holds (a worker with more is looked at
/// through the worker).
const CARD_SQS: usize = 4;

/// What a look compares against.
#[derive(Debug, Default)]
pub(super) struct PageLook {
    /// The owned SQs and their tail doorbells in the page, read before the
    /// last round polled them: a host's write after that read is a change.
    /// Side by side, so a look touches one small allocation.
    seen: Vec<(u16, u32)>,
    /// The doorbell generation `seen` is of (the owned SQs then).
    generation: u64,
    /// A look may compare against `seen`: the last round started and ended
    /// idle, and every new command rings the page.
    valid: bool,
}

impl PageLook {
    /// Before the round of an idle worker (it slept, waiting for a look):
    /// reads the page's tail doorbells of its owned SQs.
    ///
    /// Where the page dword of an I/O SQ with a shadow doorbell holds a
    /// tail other than the worker's (the host moved on through the shadow
    /// doorbell since it last wrote the register), the worker's tail is
    /// compare-and-swapped in, so that the looks
    /// after this round may trust the page ([`settle`](Self::settle) says
    /// why they need it). Nothing reads such an SQ's register as its tail,
    /// and the host never reads a doorbell. A host write that the swap
    /// overwrites came after the host stored its shadow tail, which this
    /// round reads after the swap; a write after the swap changes the
    /// dword, which is what a look sees. Not the admin SQ: Linux rings its
    /// register only, which the admin worker takes from the page as a trap
    /// (`sync_admin_page`), so there the page is the tail.
    pub fn record(&mut self, doorbells: &Doorbells, local: &Local) {
        self.valid = false;
        self.seen.clear();
        let generation = doorbells.generation();
        if local.generation != Some(generation) {
            return;
        }
        self.generation = generation;
        self.seen.extend(local.owned.iter().map(|&q| {
            let db = Doorbell::SqTail(q);
            let value = doorbells.register_value(db);
            let value = match local.rings.sq(q) {
                Some(sq)
                    if q != 0
                        && sq.source.is_shadow()
                        && value != sq.tail
                        && doorbells.replace_register(db, value, sq.tail) =>
                {
                    sq.tail
                }
                _ => value,
            };
            (q, value)
        }));
        self.valid = true;
    }

    /// After the round: looks may use what [`record`](Self::record) read
    /// if the worker is idle again (`idle`: no work, no kick, and nothing
    /// but a doorbell write may need a round), its SQs are the same, and a
    /// shadow doorbell's host also writes the page (`armed`: the worker
    /// armed EventIdx before it slept).
    pub fn settle(&mut self, idle: bool, armed: bool, doorbells: &Doorbells, local: &Local) {
        let page_rings = armed
            || local
                .owned
                .iter()
                .all(|&q| local.rings.sq(q).is_none_or(|sq| !sq.source.is_shadow()));
        // A host's register write stores its new tail, never the tail the
        // worker is at. So the page must hold that tail: where it still
        // holds an older one (the host moved on through the shadow doorbell
        // meanwhile), its next write may store that very value again (the
        // tail wrapped round to it), which a look cannot tell from no write,
        // and a command would wait for the next round that never comes.
        // (The next idle round's record swaps the worker's tail in.)
        let page_at_tail = self
            .seen
            .iter()
            .all(|&(q, v)| local.rings.sq(q).is_none_or(|sq| sq.tail == v));
        self.valid = self.valid
            && idle
            && page_rings
            && page_at_tail
            && local.generation == Some(self.generation)
            && doorbells.generation() == self.generation;
    }

    /// Whether a round now would find nothing new for a worker with nothing
    /// else to do: no owned SQ's doorbell changed in the page since the
    /// last round read it.
    pub fn quiet(&self, doorbells: &Doorbells) -> bool {
        self.valid
            && doorbells.generation() == self.generation
            && self
                .seen
                .iter()
                .all(|&(q, v)| doorbells.register_value(Doorbell::SqTail(q)) == v)
    }
}

impl PageLook {
    /// What a poll group needs to look for an idle worker whose looks
    /// change nothing but its next deadline (`backoff`: the policy is at
    /// its ceiling); `None` where the page may not be trusted or the worker
    /// owns more SQs than a card holds.
    pub fn card(&self, shared: &Arc<Shared>, backoff: Duration) -> Option<Card> {
        if !self.valid || self.seen.len() > CARD_SQS {
            return None;
        }
        let mut seen = [(0, 0); CARD_SQS];
        seen[..self.seen.len()].copy_from_slice(&self.seen);
        Some(Card {
            shared: Arc::clone(shared),
            generation: self.generation,
            seen,
            len: self.seen.len(),
            backoff,
        })
    }
}

/// A steady idle member's look, kept in its poll group's own list: after
/// 5 ms asleep the worker's state is cold in the caches (its policy, its
/// look, its queues: several misses per member, on every one of 200
/// wake-ups a second), so the group compares the page with this copy and
/// touches the worker only when the page moved. While the card is held the
/// worker has no round and nothing of it changes; any round or look
/// through the worker makes a new card or none.
pub(crate) struct Card {
    shared: Arc<Shared>,
    generation: u64,
    seen: [(u16, u32); CARD_SQS],
    len: usize,
    /// The next look comes this long after this one.
    pub backoff: Duration,
}

impl Card {
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// (page dword index, value seen) of each owned SQ's tail doorbell.
    pub fn dwords(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.seen[..self.len]
            .iter()
            .map(|&(q, v)| (Doorbell::SqTail(q).index(), v))
    }

    /// As [`PageLook::quiet`]: no owned SQ's doorbell changed in the page.
    pub fn quiet(&self) -> bool {
        let doorbells = &self.shared.doorbells;
        doorbells.generation() == self.generation
            && self.seen[..self.len]
                .iter()
                .all(|&(q, v)| doorbells.register_value(Doorbell::SqTail(q)) == v)
    }
}
