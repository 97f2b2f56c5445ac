//! Firmware slots and the image being downloaded: what Firmware Image
//! Download (§5.13) and Firmware Commit (§5.12) change, what the Firmware
//! Slot Information log (§5.16.1.4) and Identify Controller FR show, and
//! what a Controller Level Reset activates.
//!
//! [`SLOTS`] slots. Slot 1 holds the factory image (the configured
//! revision) and is read only, as on SSDs that keep a recovery image; the
//! others start empty. An image is not firmware we could run, so a slot
//! keeps only the image's revision, derived from its content by
//! [`revision`]. Slots, the running image and a pending activation live as
//! long as the server: they survive controller resets and client
//! reconnects, and are not persisted.
//!
//! A download is kept piece by piece, each piece where its offset puts it
//! (in any order), at most [`MAX_IMAGE_BYTES`] in all. Commit takes the
//! pieces as one image if they cover it from byte 0 without a gap; a
//! Controller Level Reset discards an uncommitted download (§5.13).

use std::collections::BTreeMap;

use vnvme_spec::identify::fill_ascii;
use vnvme_spec::log::firmware::{commit_action, FirmwareSlotLog};
use vnvme_spec::status::invalid_field;
use vnvme_spec::Status;

mod saved;
pub(crate) use saved::SavedFirmware;

/// Firmware slots (FRMW.NOFS).
pub(crate) const SLOTS: u8 = 3;
/// Firmware Update Granularity (FWUG), 4 KiB units: every piece starts on
/// a 4 KiB boundary (Linux's nvme-cli sends FWUG-sized pieces).
pub(crate) const FWUG: u8 = 1;
const GRANULE: u64 = FWUG as u64 * 4096;
/// The largest image a host can download: what it can make the server hold.
pub(crate) const MAX_IMAGE_BYTES: u64 = 16 << 20;

/// A firmware revision as Identify Controller FR shows it: 8 ASCII bytes.
pub(crate) type Revision = [u8; 8];

/// What a Firmware Commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Committed {
    /// The image is in the slot, not activated (Commit Action 000b).
    Placed,
    /// The slot is activated at the next Controller Level Reset.
    AtNextReset,
    /// The slot's image runs now (Commit Action 011b).
    Activated,
}

/// The slots and the download in progress.
#[derive(Debug)]
pub(crate) struct Firmware {
    /// Revision of the image in slot `i + 1`, `None` if empty.
    slots: [Option<Revision>; SLOTS as usize],
    /// The revision running (FR): the image loaded from `active` at the
    /// last activation. Replacing the active slot's image changes the slot,
    /// not what runs, until the next reset loads it.
    running: Revision,
    /// The slot `running` came from (AFI bits 2:0).
    active: u8,
    /// The slot the next Controller Level Reset activates (AFI bits 6:4).
    next: Option<u8>,
    /// The slot last written, which Commit Action 010b or 011b without a
    /// download activates when the host lets the controller choose.
    newest: Option<u8>,
    /// Downloaded pieces by byte offset; they never overlap.
    pieces: BTreeMap<u64, Vec<u8>>,
}

impl Firmware {
    /// Slot 1 holding the factory image `revision`, running.
    pub fn new(revision: &str) -> Self {
        let mut factory = [b' '; 8];
        fill_ascii(&mut factory, revision);
        let mut slots = [None; SLOTS as usize];
        slots[0] = Some(factory);
        Self {
            slots,
            running: factory,
            active: 1,
            next: None,
            newest: None,
            pieces: BTreeMap::new(),
        }
    }

    /// Identify Controller FR.
    pub fn running(&self) -> Revision {
        self.running
    }

    /// Whether a piece of `len` bytes at byte `offset` can be downloaded:
    /// inside [`MAX_IMAGE_BYTES`] and on the granularity (Invalid Field in
    /// Command), clear of the pieces already there (Overlapping Range).
    pub fn check_piece(&self, offset: u64, len: u64) -> Result<(), Status> {
        let end = offset.saturating_add(len);
        if len == 0 || end > MAX_IMAGE_BYTES || !offset.is_multiple_of(GRANULE) {
            return Err(invalid_field());
        }
        // Pieces do not overlap one another, so only the last one starting
        // before `end` can reach into this one.
        if let Some((&start, piece)) = self.pieces.range(..end).next_back() {
            if start + piece.len() as u64 > offset {
                return Err(Status::OVERLAPPING_RANGE.with_dnr(true));
            }
        }
        Ok(())
    }

    /// Firmware Image Download: keeps `data` at byte `offset`.
    pub fn download(&mut self, offset: u64, data: Vec<u8>) -> Result<(), Status> {
        self.check_piece(offset, data.len() as u64)?;
        self.pieces.insert(offset, data);
        Ok(())
    }

    /// Firmware Commit of slot `fs` (0: the controller chooses) with
    /// Commit Action `ca`; with what it did, the revision in the slot.
    pub fn commit(&mut self, fs: u8, ca: u8) -> Result<(Committed, Revision), Status> {
        let downloaded = !self.pieces.is_empty();
        let replace = match ca {
            commit_action::REPLACE | commit_action::REPLACE_AND_ACTIVATE => true,
            commit_action::ACTIVATE => false,
            // Activate immediately: the downloaded image if there is one,
            // else the one already in the slot.
            commit_action::REPLACE_AND_ACTIVATE_NOW => downloaded,
            // No Boot Partitions; 100b and 101b are reserved.
            _ => return Err(invalid_field()),
        };
        let slot = match fs {
            0 if replace => self.slot_to_replace(),
            0 => self.newest.unwrap_or(self.active),
            1..=SLOTS => fs,
            _ => return Err(invalid_slot()),
        };
        if replace {
            if slot == 1 {
                return Err(invalid_slot());
            }
            let revision = self.take_image()?;
            self.set_slot(slot, Some(revision));
            self.newest = Some(slot);
        }
        let revision = self
            .slot(slot)
            .ok_or(Status::INVALID_FIRMWARE_IMAGE.with_dnr(true))?;
        let committed = match ca {
            commit_action::REPLACE => Committed::Placed,
            commit_action::REPLACE_AND_ACTIVATE_NOW => {
                self.running = revision;
                self.active = slot;
                // What the host asked for last wins over an earlier
                // activation that was waiting for a reset.
                self.next = None;
                Committed::Activated
            }
            _ => {
                self.next = Some(slot);
                Committed::AtNextReset
            }
        };
        Ok((committed, revision))
    }

    /// A Controller Level Reset: the pending slot becomes active and its
    /// image runs; an uncommitted download is discarded. Returns whether a
    /// different revision now runs.
    pub fn reset(&mut self) -> bool {
        self.pieces.clear();
        let before = self.running;
        let slot = self.next.take().unwrap_or(self.active);
        if let Some(revision) = self.slot(slot) {
            self.active = slot;
            self.running = revision;
        }
        self.running != before
    }

    /// The Firmware Slot Information log.
    pub fn slot_log(&self) -> FirmwareSlotLog {
        let mut log = FirmwareSlotLog::new();
        log.afi = FirmwareSlotLog::afi(self.active, self.next.unwrap_or(0));
        for (frs, slot) in log.frs.iter_mut().zip(&self.slots) {
            *frs = slot.unwrap_or_default();
        }
        log
    }

    fn slot(&self, slot: u8) -> Option<Revision> {
        let i = usize::from(slot).checked_sub(1)?;
        self.slots.get(i).copied().flatten()
    }

    fn set_slot(&mut self, slot: u8, revision: Option<Revision>) {
        if let Some(s) = usize::from(slot)
            .checked_sub(1)
            .and_then(|i| self.slots.get_mut(i))
        {
            *s = revision;
        }
    }

    /// The writable slot the controller picks for a new image: not the
    /// running one, not the one waiting for a reset, an empty one before
    /// a full one, the lowest first.
    fn slot_to_replace(&self) -> u8 {
        (2..=SLOTS)
            .min_by_key(|&s| {
                (
                    s == self.active,
                    Some(s) == self.next,
                    self.slot(s).is_some(),
                    s,
                )
            })
            .unwrap_or(SLOTS)
    }

    /// The downloaded image's revision, the download consumed. No image,
    /// or one with a gap (a piece missing), is Invalid Firmware Image; a
    /// gap discards the pieces, so the host can download again.
    fn take_image(&mut self) -> Result<Revision, Status> {
        let invalid = Status::INVALID_FIRMWARE_IMAGE.with_dnr(true);
        let mut end = 0u64;
        for (&start, piece) in &self.pieces {
            if start != end {
                self.pieces.clear();
                return Err(invalid);
            }
            end += piece.len() as u64;
        }
        if end == 0 {
            return Err(invalid);
        }
        let pieces = std::mem::take(&mut self.pieces);
        Ok(revision(pieces.values().map(Vec::as_slice)))
    }
}

fn invalid_slot() -> Status {
    Status::INVALID_FIRMWARE_SLOT.with_dnr(true)
}

/// The revision an image reports: its first 8 bytes if they are printable
/// ASCII not starting with a space (an image that names itself), else "VN"
/// and six hex digits of the image's 32-bit FNV-1a hash (so two different
/// unnamed images almost surely differ).
pub(crate) fn revision<'a>(pieces: impl Iterator<Item = &'a [u8]> + Clone) -> Revision {
    let mut head = pieces.clone().flatten().take(8);
    let mut named = [0u8; 8];
    let mut len = 0;
    for (b, byte) in named.iter_mut().zip(&mut head) {
        *b = *byte;
        len += 1;
    }
    if len == 8 && named[0] != b' ' && named.iter().all(|b| (0x20..=0x7E).contains(b)) {
        return named;
    }
    let hash = pieces.flatten().fold(0x811C_9DC5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let mut out = [0u8; 8];
    out.copy_from_slice(format!("VN{:06X}", hash & 0xFF_FFFF).as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_image_reports_its_first_eight_bytes() {
        let image = b"GUEST-02 and the rest";
        assert_eq!(
            &revision([&image[..5], &image[5..]].into_iter()),
            b"GUEST-02"
        );
    }

    #[test]
    fn an_unnamed_image_reports_a_hash_revision() {
        let zeros = [0u8; 64];
        let r = revision([&zeros[..]].into_iter());
        assert_eq!(&r[..2], b"VN");
        assert!(r[2..].iter().all(u8::is_ascii_hexdigit));
        // FNV-1a of 64 zero bytes, by the reference definition.
        let mut h = 0x811C_9DC5u32;
        for _ in 0..64 {
            h = h.wrapping_mul(0x0100_0193);
        }
        assert_eq!(r[2..], *format!("{:06X}", h & 0xFF_FFFF).as_bytes());
        // Short, or led by a space: not a name either.
        assert_eq!(&revision([&b"ABCD"[..]].into_iter())[..2], b"VN");
        assert_eq!(&revision([&b" ABCDEFGH"[..]].into_iter())[..2], b"VN");
        assert_ne!(r, revision([&[1u8; 64][..]].into_iter()));
    }
}
