//! The firmware slots in the saved state (docs/state-format.md,
//! `subsystem.firmware`): each slot's revision, the one running, the
//! active and next slots, and the pieces of an image being downloaded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Firmware, GRANULE, MAX_IMAGE_BYTES, SLOTS};
use crate::saved_check::{array, at_most, hex, inconsistent, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedFirmware {
    /// Slot 1 to 3's revision (8 ASCII bytes, hex), `None` if empty.
    pub slots: Vec<Option<String>>,
    /// The revision running (FR), hex.
    pub running: String,
    /// The slot it came from (AFI 2:0).
    pub active: u8,
    /// The slot the next reset activates (AFI 6:4).
    pub next: Option<u8>,
    /// The slot last written.
    pub newest: Option<u8>,
    /// Downloaded pieces by byte offset (hex).
    pub pieces: BTreeMap<u64, SavedPiece>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedPiece(#[serde(with = "hex")] pub Vec<u8>);

fn to_hex(r: &[u8]) -> String {
    r.iter().map(|b| format!("{b:02x}")).collect()
}

fn revision(what: &str, s: &str) -> Result<[u8; 8], InvalidState> {
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|p| u8::from_str_radix(p, 16).ok()))
        .collect();
    let bytes = bytes.ok_or_else(|| inconsistent(format!("{what} is not hex")))?;
    array(what, &bytes)
}

impl Firmware {
    pub fn save(&self) -> SavedFirmware {
        SavedFirmware {
            slots: self.slots.iter().map(|s| s.map(|r| to_hex(&r))).collect(),
            running: to_hex(&self.running),
            active: self.active,
            next: self.next,
            newest: self.newest,
            pieces: (self.pieces.iter())
                .map(|(&o, p)| (o, SavedPiece(p.clone())))
                .collect(),
        }
    }

    pub fn restore(&mut self, saved: &SavedFirmware) -> Result<(), InvalidState> {
        if saved.slots.len() != usize::from(SLOTS) {
            return Err(inconsistent(format!(
                "{} firmware slots are saved, the controller has {SLOTS}",
                saved.slots.len()
            )));
        }
        let mut slots = [None; SLOTS as usize];
        for (slot, s) in slots.iter_mut().zip(&saved.slots) {
            *slot = s
                .as_deref()
                .map(|r| revision("a slot's revision", r))
                .transpose()?;
        }
        let slot_ok = |what: &str, s: u8| {
            at_most(what, u64::from(s), u64::from(SLOTS))?;
            if s == 0 || slots.get(usize::from(s) - 1).is_none_or(Option::is_none) {
                return Err(inconsistent(format!("{what} {s} is an empty slot")));
            }
            Ok(())
        };
        slot_ok("the active firmware slot", saved.active)?;
        if let Some(n) = saved.next {
            slot_ok("the next firmware slot", n)?;
        }
        if let Some(n) = saved.newest {
            slot_ok("the newest firmware slot", n)?;
        }
        let mut pieces = BTreeMap::new();
        let mut end = 0u64;
        for (&offset, p) in &saved.pieces {
            let len = p.0.len() as u64;
            if len == 0 || offset < end || !offset.is_multiple_of(GRANULE) {
                return Err(inconsistent(
                    "the firmware image's pieces are empty, unaligned or overlap",
                ));
            }
            end = offset.saturating_add(len);
            at_most("the firmware image's end", end, MAX_IMAGE_BYTES)?;
            pieces.insert(offset, p.0.clone());
        }
        let running = revision("the running revision", &saved.running)?;
        self.slots = slots;
        self.running = running;
        self.active = saved.active;
        self.next = saved.next;
        self.newest = saved.newest;
        self.pieces = pieces;
        Ok(())
    }
}
