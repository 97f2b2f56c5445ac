//! A zoned namespace's zones kept in a crash record as they change
//! (`vnvme serve --supervise`, docs/state-format.md "Crash area"): every
//! write, Zone Append and zone action moves a write pointer or a state,
//! and no checkpoint follows an I/O command, so the record is given each
//! changed zone's word under the zones' lock, before the completion that
//! shows the change is posted. A restore puts the words over the saved
//! zones ([`SavedZones::put_words`]).
//!
//! A Write (Write Zeroes, Write Uncorrectable) moves the write pointer
//! when it is admitted, before its data is written; a crash before its
//! completion is posted makes the host write it again at the same LBA
//! (Command Interrupted, or the command fetched again). So its zone also
//! gets a *write word* (its blocks from..to in the zone) before the zone's
//! word, cleared when the write completes: a restore that finds one whose
//! end is still the zone's write pointer moves the pointer back to its
//! start. A Zone Append is not so undone: it runs whole in its pass and,
//! fetched again after a crash, appends again further on (its first
//! blocks stay written below the write pointer, as on a device that lost
//! power before the completion).

use std::sync::Arc;

use super::saved::SavedZones;
use super::table::{State, Table, Zone};
use super::Zones;

/// A zone word's "set" bit (a word of 0 was never stored).
const SET: u64 = 1 << 63;
/// Bits of a zone word: Zone State (ZS) at 56..59, Zone Attributes at
/// 48..55, blocks written from the zone's start at 0..47.
const ZS_SHIFT: u32 = 56;
const ZA_SHIFT: u32 = 48;
const WRITTEN: u64 = (1 << 48) - 1;
/// A write word: its first block in the zone at 32..62, its end at 0..31.
const FROM_SHIFT: u32 = 32;

/// Zone capacity in logical blocks a crash record can hold (a write
/// word's first block has 31 bits): `vnvme serve --supervise` refuses
/// zones as large or larger.
pub const MAX_RECORDED_ZCAP: u64 = (1 << 31) - 1;

/// Told each zone's change (the crash record of `vnvme serve
/// --supervise`, `crate::crash_record`).
pub trait ZoneRecorder: Send + Sync + std::fmt::Debug {
    /// Zone `zone` of namespace `nsid` now stands as `word` (its state,
    /// attributes and write pointer, this module's encoding), stored
    /// under the zones' lock before any completion showing it is posted.
    fn zone(&self, nsid: u32, zone: u32, word: u64);
    /// The write not yet completed on zone `zone` of namespace `nsid`
    /// (`word`, 0 when none): stored before the zone's word when a write
    /// moves its write pointer, cleared before the write's completion.
    fn zone_write(&self, nsid: u32, zone: u32, word: u64);
}

/// Where a namespace's zones are recorded.
#[derive(Debug, Clone)]
pub(super) struct ZoneRecord {
    rec: Arc<dyn ZoneRecorder>,
    nsid: u32,
}

fn zone_word(z: &Zone) -> u64 {
    SET | u64::from(z.state.zs()) << ZS_SHIFT | u64::from(z.za) << ZA_SHIFT | (z.written & WRITTEN)
}

fn write_word(from: u64, to: u64) -> u64 {
    SET | (from & MAX_RECORDED_ZCAP) << FROM_SHIFT | (to & 0xffff_ffff)
}

impl Zones {
    /// Records every zone of namespace `nsid` to `rec` from now on, and
    /// stores each one's word now (the record then mirrors the table).
    /// Set once.
    pub fn record_to(&self, rec: Arc<dyn ZoneRecorder>, nsid: u32) {
        let mut table = self.table.lock();
        if self.record.set(ZoneRecord { rec, nsid }).is_err() {
            return;
        }
        table.recording = true;
        table.dirty = (0..table.zones.len()).collect();
        self.keep(&mut table, None);
    }

    /// Stores the words of the zones the last step changed (under the
    /// lock it took). `write`: the step was a write of blocks `from..to`
    /// of zone `i`, whose write word goes first; any other zone changed
    /// by an action (not as a write's side effect: a zone it closed to
    /// open its own) loses its write word, before its word is stored.
    pub(super) fn keep(&self, table: &mut Table, write: Option<(usize, u64, u64)>) {
        let Some(r) = self.record.get() else {
            return;
        };
        let mut dirty = std::mem::take(&mut table.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for &i in &dirty {
            let Some(zone) = table.zones.get(i) else {
                continue;
            };
            match write {
                Some((w, from, to)) if w == i => {
                    table.writes.insert(i, (from, to));
                    r.rec.zone_write(r.nsid, i as u32, write_word(from, to));
                }
                Some(_) => {}
                None => {
                    if table.writes.remove(&i).is_some() {
                        r.rec.zone_write(r.nsid, i as u32, 0);
                    }
                }
            }
            r.rec.zone(r.nsid, i as u32, zone_word(zone));
        }
        dirty.clear();
        table.dirty = dirty;
    }

    /// The write of `nlb` blocks at `slba` is done (or failed): its write
    /// word is cleared, before its completion is posted. Nothing without
    /// a record.
    pub fn settled(&self, slba: u64, nlb: u64) {
        let Some(r) = self.record.get() else {
            return;
        };
        let Some(i) = self.index(slba) else {
            return;
        };
        let from = slba % self.zsze;
        let mut table = self.table.lock();
        if table.writes.get(&i) == Some(&(from, from.saturating_add(nlb))) {
            table.writes.remove(&i);
            r.rec.zone_write(r.nsid, i as u32, 0);
        }
    }
}

impl SavedZones {
    /// Puts the recorded words over these zones: `words(i)` is zone `i`'s
    /// word and write word (0: not stored). A zone whose write word's end
    /// is still its write pointer goes back to the write's start: the
    /// write's completion was not posted, and the host writes it again
    /// there. A full zone so undone becomes empty (from block 0) or closed
    /// (if an active resource is free; else it stays full). The implicitly
    /// opened zones keep their order, new ones after them. Not checked
    /// here: the restore checks every zone.
    pub(crate) fn put_words(&mut self, words: impl Fn(u32) -> (u64, u64)) {
        for (i, z) in self.zones.iter_mut().enumerate() {
            let (word, _) = words(i as u32);
            if word & SET != 0 {
                *z = (
                    (word >> ZS_SHIFT & 0xf) as u8,
                    word & WRITTEN,
                    (word >> ZA_SHIFT) as u8,
                );
            }
        }
        let zs = |s: State| s.zs();
        let mut active = self.zones.iter().filter(|z| is_active(z.0)).count() as u64;
        for (i, z) in self.zones.iter_mut().enumerate() {
            let (_, write) = words(i as u32);
            if write & SET == 0 {
                continue;
            }
            let (from, to) = ((write & !SET) >> FROM_SHIFT, write & 0xffff_ffff);
            if from >= to || z.1 != to {
                continue;
            }
            if z.0 == zs(State::Full) {
                if from == 0 {
                    *z = (zs(State::Empty), 0, 0);
                } else if self.max_active.is_none_or(|mar| active < u64::from(mar)) {
                    *z = (zs(State::Closed), from, z.2);
                    active += 1;
                }
            } else if is_active(z.0) {
                z.1 = from;
            }
        }
        let implicit = zs(State::ImplicitlyOpened);
        let zones = &self.zones;
        let mut listed = vec![false; zones.len()];
        let mut order = Vec::new();
        for &i in &self.implicit {
            if zones.get(i).is_some_and(|z| z.0 == implicit) && !listed[i] {
                listed[i] = true;
                order.push(i);
            }
        }
        for (i, z) in zones.iter().enumerate() {
            if z.0 == implicit && !listed[i] {
                order.push(i);
            }
        }
        self.implicit = order;
    }
}

fn is_active(zs: u8) -> bool {
    [
        State::ImplicitlyOpened,
        State::ExplicitlyOpened,
        State::Closed,
    ]
    .iter()
    .any(|s| s.zs() == zs)
}
