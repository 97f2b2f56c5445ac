//! The crash area (docs/state-format.md, "Crash area"): a memfd the
//! supervisor makes and every child it starts shares, holding what the
//! next child needs to serve the same client after a crash.
//!
//! * a header page: the magic `VNVMECA1`, the area's version, and the
//!   vfio-user message the child is handling (a word; 0 once its effect
//!   is kept, before its reply, staged in the supervisor's reply pipe, is
//!   sent: see `vnvme_vfio_user::ReplyPipe`), with its bytes and the id
//!   of its fds when it may be handled again (`handling.rs`)
//!   and the admin commands in flight with their completion owed, kept
//!   to run again after a crash (`admin_commands.rs`);
//! * per queue id, two words the queue workers store after each round:
//!   the SQ's head and tail, the CQ's head, tail and phase
//!   ([`QueueWords`]), each with a bit saying it is set (the SQ's also
//!   when a command goes in flight); and the two doorbell values a trap
//!   last stored (in `trap` mode nothing else holds them until a worker
//!   takes them);
//! * per SQ, a table of the commands in flight by CID, each entry the
//!   area's generation (a checkpoint, which saves with none in flight,
//!   starts a new one, and so does each child) and the SQ head after its
//!   fetch;
//! * per zone of the zoned namespaces, its word (state, attributes,
//!   write pointer) and the write not yet completed on it, stored as
//!   they change (`vnvme_controller`'s zone record);
//! * two slots, written alternately, each holding a whole saved client
//!   (its DMA maps, PCI function and the controller's saved state) behind
//!   a header with a sequence number, a length and a checksum: a child
//!   killed while writing one leaves the other whole, and a slot whose
//!   checksum does not hold is never read.
//!
//! The memfd is sparse: only the pages written cost memory.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use std::sync::atomic::Ordering;

use vnvme_controller::crash_record::{CqPosition, Open, SqPosition};
use vnvme_spec::regs::Doorbell;
use vnvme_vfio_user::SharedRegion;

mod admin_commands;
mod handling;
pub use handling::Kept;

/// The header page's first bytes.
pub const MAGIC: &[u8; 8] = b"VNVMECA1";
/// A slot's first bytes.
pub const SLOT_MAGIC: &[u8; 8] = b"VNVMECS1";
/// The layout this binary writes. Version 5 added the admin commands
/// kept to run again (`admin_commands.rs`); it reads versions 3 and 4,
/// whose bytes there are zero (nothing kept: those commands are
/// interrupted, as their children did). Version 4 added the id and count of
/// the kept message's fds (`handling.rs`); it reads version 3 too, whose
/// bytes there are zero (a version 3 child kept no message with fds).
/// Version 3 added the zone room (a longer area): version 2 is refused.
pub const VERSION: u32 = 5;
/// The oldest layout this binary reads.
pub const OLDEST_VERSION: u32 = 3;
/// The slot format this binary writes and reads (its own number since
/// version 4: the area's header may change without it).
pub const SLOT_VERSION: u32 = 3;

/// Where the message-being-handled word is in the header page.
const HANDLING: usize = 16;
/// Where the generation word is in the header page.
const GENERATION: usize = 24;
/// Queue words: from here, 32 bytes per queue id (SQ word, CQ word, SQ
/// tail doorbell word, CQ head doorbell word).
const WORDS: usize = 4096;
const WORDS_PER_QID: usize = 32;
/// Queue ids with words: every id a controller can have (16 bits).
pub const QUEUE_IDS: usize = 1 << 16;
const SLOTS: usize = WORDS + QUEUE_IDS * WORDS_PER_QID;
/// Bytes per slot, its header included.
pub const SLOT_LEN: usize = 16 << 20;
const SLOT_HEADER: usize = 64;
/// The tables of commands in flight: one per SQ id below [`TABLE_QIDS`]
/// (BAR0's doorbell page holds 512 queue pairs), 8 bytes per CID.
const TABLES: usize = SLOTS + 2 * SLOT_LEN;
pub const TABLE_QIDS: usize = 512;
const TABLE_LEN: usize = (1 << 16) * 8;
/// The zone room: two words per zone of the zoned namespaces
/// ([`zone_room`](super::zone_room) places each namespace's zones).
const ZONES: usize = TABLES + TABLE_QIDS * TABLE_LEN;
/// Zones the room holds, all zoned namespaces together.
pub const ZONE_WORDS: usize = 1 << 20;
/// The area's size.
pub const AREA_LEN: usize = ZONES + ZONE_WORDS * 16;

/// A word's "set" bit.
const SET: u64 = 1 << 63;
/// A CQ word's phase bit.
const PHASE: u64 = 1 << 62;
/// A SQ word's serial: counts the commands gone in flight, so an entry
/// stored just before the word (a crash between the two) is told apart.
const SERIAL_SHIFT: u32 = 48;
const SERIAL_MASK: u64 = 0x7fff;

/// Why an area or its slots cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CrashAreaError {
    #[error("mapping the crash area")]
    Map(#[source] std::io::Error),
    #[error("the supervisor's reply pipe")]
    Replies(#[source] std::io::Error),
    #[error("the crash area does not start with {MAGIC:?}: not a vnvme crash area")]
    Magic,
    #[error("the crash area is version {found}; this binary reads versions {OLDEST_VERSION} to {VERSION}")]
    Version { found: u32 },
    #[error("no whole saved state in the crash area: slot 0: {0}; slot 1: {1}")]
    NoSlot(String, String),
    #[error("the saved client ({0} bytes) does not fit a crash area slot ({max} bytes)", max = SLOT_LEN - SLOT_HEADER)]
    TooBig(usize),
}

/// A mapped crash area.
#[derive(Debug)]
pub struct CrashArea {
    region: SharedRegion,
}

/// Makes a new, empty area (the supervisor, at its start).
pub fn create() -> std::io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create("vnvme-crash-area", rustix::fs::MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, AREA_LEN as u64)?;
    let region = SharedRegion::map(fd.as_fd(), 0, AREA_LEN as u64)?;
    let mut head = [0u8; 12];
    head[..8].copy_from_slice(MAGIC);
    head[8..].copy_from_slice(&VERSION.to_le_bytes());
    region.write(0, &head);
    Ok(fd)
}

/// FNV-1a over the slot's sequence number, length and payload: detects a
/// slot written in part (it guards against torn writes, not attackers:
/// only this binary writes the area).
fn checksum(seq: u64, payload: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let len = payload.len() as u64;
    for b in seq
        .to_le_bytes()
        .iter()
        .chain(&len.to_le_bytes())
        .chain(payload)
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A SQ word without its serial.
fn sq_word(p: SqPosition) -> u64 {
    SET | (u64::from(p.head & 0xffff) << 32) | u64::from(p.tail & 0xffff)
}

/// A queue's two words as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueWords {
    pub sq: Option<SqPosition>,
    pub cq: Option<CqPosition>,
}

impl CrashArea {
    /// Maps the area in `fd` and checks its header.
    pub fn open(fd: BorrowedFd<'_>) -> Result<Self, CrashAreaError> {
        let region = SharedRegion::map(fd, 0, AREA_LEN as u64).map_err(CrashAreaError::Map)?;
        let mut head = [0u8; 12];
        region.read(0, &mut head);
        if &head[..8] != MAGIC {
            return Err(CrashAreaError::Magic);
        }
        let found = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if !(OLDEST_VERSION..=VERSION).contains(&found) {
            return Err(CrashAreaError::Version { found });
        }
        Ok(Self { region })
    }

    /// Writes `payload` as slot `seq % 2` with sequence number `seq`: the
    /// header's magic is cleared first, so a slot written in part is never
    /// taken for whole, and written last.
    pub fn write_slot(&self, seq: u64, payload: &[u8]) -> Result<(), CrashAreaError> {
        if payload.len() > SLOT_LEN - SLOT_HEADER {
            return Err(CrashAreaError::TooBig(payload.len()));
        }
        let at = SLOTS + (seq % 2) as usize * SLOT_LEN;
        self.region.fill(at, 8, 0);
        std::sync::atomic::fence(Ordering::Release);
        self.region.write(at + SLOT_HEADER, payload);
        let mut head = [0u8; SLOT_HEADER];
        head[8..12].copy_from_slice(&SLOT_VERSION.to_le_bytes());
        head[16..24].copy_from_slice(&seq.to_le_bytes());
        head[24..32].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        head[32..40].copy_from_slice(&checksum(seq, payload).to_le_bytes());
        self.region.write(at + 8, &head[8..]);
        std::sync::atomic::fence(Ordering::Release);
        self.region.write(at, SLOT_MAGIC);
        Ok(())
    }

    /// Slot `i`: its sequence number and payload, or why it is not whole.
    fn slot(&self, i: usize) -> Result<(u64, Vec<u8>), String> {
        let at = SLOTS + i * SLOT_LEN;
        let mut head = [0u8; SLOT_HEADER];
        self.region.read(at, &mut head);
        if head == [0u8; SLOT_HEADER] {
            return Err("never written".into());
        }
        if &head[..8] != SLOT_MAGIC {
            return Err("written in part (no magic)".into());
        }
        let word = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[r]);
            u64::from_le_bytes(b)
        };
        let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if version != SLOT_VERSION {
            return Err(format!(
                "version {version}, this binary reads version {SLOT_VERSION}"
            ));
        }
        let (seq, len, sum) = (word(16..24), word(24..32), word(32..40));
        if len > (SLOT_LEN - SLOT_HEADER) as u64 {
            return Err(format!("a length of {len} bytes, beyond the slot"));
        }
        let mut payload = vec![0u8; len as usize];
        self.region.read(at + SLOT_HEADER, &mut payload);
        if checksum(seq, &payload) != sum {
            return Err("its checksum does not hold".into());
        }
        Ok((seq, payload))
    }

    /// The newest whole slot: its sequence number and payload.
    pub fn newest(&self) -> Result<(u64, Vec<u8>), CrashAreaError> {
        match (self.slot(0), self.slot(1)) {
            (Ok(a), Ok(b)) => Ok(if a.0 >= b.0 { a } else { b }),
            (Ok(a), Err(_)) => Ok(a),
            (Err(_), Ok(b)) => Ok(b),
            (Err(a), Err(b)) => Err(CrashAreaError::NoSlot(a, b)),
        }
    }

    /// The sequence number the next slot takes.
    pub fn next_seq(&self) -> u64 {
        self.newest().map_or(0, |(seq, _)| seq + 1)
    }

    fn word(&self, qid: u16, cq: bool) -> Option<&std::sync::atomic::AtomicU64> {
        self.word_at(qid, if cq { 8 } else { 0 })
    }

    fn word_at(&self, qid: u16, at: usize) -> Option<&std::sync::atomic::AtomicU64> {
        self.region
            .atomic_u64(WORDS + usize::from(qid) * WORDS_PER_QID + at)
    }

    /// Stores SQ `qid`'s position (release: a reader that sees it sees the
    /// CQ entries and guest memory written before), keeping its serial.
    /// Only the SQ's worker stores it.
    pub fn store_sq(&self, qid: u16, p: SqPosition) {
        if let Some(w) = self.word(qid, false) {
            let serial = w.load(Ordering::Relaxed) & (SERIAL_MASK << SERIAL_SHIFT);
            w.store(sq_word(p) | serial, Ordering::Release);
        }
    }

    pub fn store_cq(&self, qid: u16, p: CqPosition) {
        if let Some(w) = self.word(qid, true) {
            let phase = if p.phase { PHASE } else { 0 };
            let v = SET
                | phase
                | (u64::from(p.head & 0xffff) << 32)
                | (u64::from(p.reserved.min(0xffff)) << 16)
                | u64::from(p.tail & 0xffff);
            w.store(v, Ordering::Release);
        }
    }

    /// The area's generation: table entries of another are not in flight.
    pub fn generation(&self) -> u32 {
        self.region
            .atomic_u64(GENERATION)
            .map_or(0, |w| w.load(Ordering::Acquire) as u32)
    }

    /// Starts a new generation (a checkpoint with none in flight, a new
    /// child): every table entry stored before is void.
    pub fn next_generation(&self) {
        if let Some(w) = self.region.atomic_u64(GENERATION) {
            // Never 0: an entry of generation 0 is an empty one.
            let next = (w.load(Ordering::Acquire) as u32).wrapping_add(1).max(1);
            w.store(u64::from(next), Ordering::Release);
        }
    }

    fn entry(&self, qid: u16, cid: u16) -> Option<&std::sync::atomic::AtomicU64> {
        if usize::from(qid) >= TABLE_QIDS {
            return None;
        }
        self.region
            .atomic_u64(TABLES + usize::from(qid) * TABLE_LEN + usize::from(cid) * 8)
    }

    /// Command `cid` of SQ `qid` went in flight at `p`: its entry, then
    /// the SQ word with the serial both carry.
    pub fn store_fetched(&self, qid: u16, cid: u16, p: SqPosition) {
        let (Some(w), Some(e)) = (self.word(qid, false), self.entry(qid, cid)) else {
            return;
        };
        let serial = ((w.load(Ordering::Relaxed) >> SERIAL_SHIFT) + 1) & SERIAL_MASK;
        let gen = u64::from(self.generation());
        e.store(
            (gen << 32) | (serial << 16) | u64::from(p.head & 0xffff),
            Ordering::Release,
        );
        w.store(sq_word(p) | (serial << SERIAL_SHIFT), Ordering::Release);
    }

    /// Command `cid` of SQ `qid` is in flight since its head stood at
    /// `head`, as the SQ word already says (a keeper's checkpoint, for a
    /// completion owed): its entry only, with the word's serial.
    pub fn store_open(&self, qid: u16, cid: u16, head: u32) {
        let (Some(w), Some(e)) = (self.word(qid, false), self.entry(qid, cid)) else {
            return;
        };
        let serial = (w.load(Ordering::Relaxed) >> SERIAL_SHIFT) & SERIAL_MASK;
        let gen = u64::from(self.generation());
        e.store(
            (gen << 32) | (serial << 16) | u64::from(head & 0xffff),
            Ordering::Release,
        );
    }

    /// Command `cid` of SQ `qid` is done.
    pub fn store_completed(&self, qid: u16, cid: u16) {
        if let Some(e) = self.entry(qid, cid) {
            e.store(0, Ordering::Release);
        }
    }

    /// Command `cid` of SQ `qid`'s head after its fetch, if it is in
    /// flight in this generation.
    pub fn open_head(&self, qid: u16, cid: u16) -> Option<u32> {
        let gen = u64::from(self.generation());
        let v = self.entry(qid, cid)?.load(Ordering::Acquire);
        (gen != 0 && v >> 32 == gen).then_some((v & 0xffff) as u32)
    }

    /// The commands of SQ `qid` in flight in this generation.
    pub fn in_flight(&self, qid: u16) -> Vec<Open> {
        let gen = u64::from(self.generation());
        let serial = self.word(qid, false).map_or(0, |w| {
            (w.load(Ordering::Acquire) >> SERIAL_SHIFT) & SERIAL_MASK
        });
        let mut open = Vec::new();
        if gen == 0 {
            return open;
        }
        for cid in 0..=u16::MAX {
            let Some(e) = self.entry(qid, cid) else {
                break;
            };
            let v = e.load(Ordering::Acquire);
            if v >> 32 == gen {
                open.push(Open {
                    cid,
                    head: (v & 0xffff) as u32,
                    late: (v >> 16) & SERIAL_MASK == (serial + 1) & SERIAL_MASK,
                });
            }
        }
        open
    }

    /// A trap stored `value` in doorbell `db`.
    pub fn store_doorbell(&self, db: Doorbell, value: u32) {
        let (qid, at) = match db {
            Doorbell::SqTail(q) => (q, 16),
            Doorbell::CqHead(q) => (q, 24),
        };
        if let Some(w) = self.word_at(qid, at) {
            w.store(SET | u64::from(value), Ordering::Release);
        }
    }

    /// The value a trap last stored in doorbell `db` since the words were
    /// cleared.
    pub fn doorbell(&self, db: Doorbell) -> Option<u32> {
        let (qid, at) = match db {
            Doorbell::SqTail(q) => (q, 16),
            Doorbell::CqHead(q) => (q, 24),
        };
        let v = self.word_at(qid, at)?.load(Ordering::Acquire);
        (v & SET != 0).then_some(v as u32)
    }

    /// Queue `qid`'s words.
    pub fn load(&self, qid: u16) -> QueueWords {
        let get = |cq| self.word(qid, cq).map_or(0, |w| w.load(Ordering::Acquire));
        let (s, c) = (get(false), get(true));
        QueueWords {
            sq: (s & SET != 0).then_some(SqPosition {
                head: ((s >> 32) & 0xffff) as u32,
                tail: (s & 0xffff) as u32,
            }),
            cq: (c & SET != 0).then_some(CqPosition {
                head: ((c >> 32) & 0xffff) as u32,
                tail: (c & 0xffff) as u32,
                phase: c & PHASE != 0,
                reserved: ((c >> 16) & 0xffff) as u32,
            }),
        }
    }

    /// Zone `i` of the room's words: its word, and its write word.
    fn zone_words(&self, i: usize) -> Option<[&std::sync::atomic::AtomicU64; 2]> {
        if i >= ZONE_WORDS {
            return None;
        }
        let at = ZONES + i * 16;
        Some([self.region.atomic_u64(at)?, self.region.atomic_u64(at + 8)?])
    }

    /// Stores zone `i`'s word (`write`: its write word), release: a
    /// reader that sees it sees what was stored before.
    pub fn store_zone(&self, i: usize, write: bool, word: u64) {
        if let Some(w) = self.zone_words(i) {
            w[usize::from(write)].store(word, Ordering::Release);
        }
    }

    /// Zone `i`'s word and write word (0: never stored).
    pub fn zone(&self, i: usize) -> (u64, u64) {
        self.zone_words(i).map_or((0, 0), |[z, w]| {
            (z.load(Ordering::Acquire), w.load(Ordering::Acquire))
        })
    }

    /// Unsets every queue's words (a new saved state sets its own).
    pub fn clear_words(&self) {
        self.region.fill(WORDS, QUEUE_IDS * WORDS_PER_QID, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn area() -> (OwnedFd, CrashArea) {
        let fd = create().unwrap();
        let a = CrashArea::open(fd.as_fd()).unwrap();
        (fd, a)
    }

    #[test]
    fn the_newest_whole_slot_wins_and_a_torn_one_leaves_the_other() {
        let (_fd, a) = area();
        assert!(matches!(a.newest(), Err(CrashAreaError::NoSlot(..))));
        assert_eq!(a.next_seq(), 0);
        a.write_slot(0, b"first").unwrap();
        a.write_slot(1, b"second").unwrap();
        assert_eq!(a.newest().unwrap(), (1, b"second".to_vec()));
        a.write_slot(2, b"third").unwrap();
        assert_eq!(a.newest().unwrap(), (2, b"third".to_vec()));
        assert_eq!(a.next_seq(), 3);
        // Slot 0 (seq 2) torn: one payload byte changed after its header.
        a.region.write(SLOTS + SLOT_HEADER, b"X");
        assert_eq!(a.newest().unwrap(), (1, b"second".to_vec()));
        // Slot 1 left without its magic (killed before the last write).
        a.region.fill(SLOTS + SLOT_LEN, 8, 0);
        let e = a.newest().unwrap_err().to_string();
        assert_eq!(
            e,
            "no whole saved state in the crash area: slot 0: its checksum does not hold; \
             slot 1: written in part (no magic)"
        );
    }

    #[test]
    fn zone_words_are_kept_by_place_and_the_last_place_is_the_last() {
        let (_fd, a) = area();
        assert_eq!(a.zone(7), (0, 0));
        a.store_zone(7, true, 0x8000_0000_0000_0004);
        a.store_zone(7, false, 0x8200_0000_0000_0006);
        a.store_zone(ZONE_WORDS - 1, false, 1);
        a.store_zone(ZONE_WORDS, false, 1);
        assert_eq!(a.zone(7), (0x8200_0000_0000_0006, 0x8000_0000_0000_0004));
        assert_eq!(a.zone(ZONE_WORDS - 1), (1, 0));
        assert_eq!(a.zone(ZONE_WORDS), (0, 0), "beyond the room");
    }

    #[test]
    fn a_slot_or_an_area_of_another_version_is_refused_by_name() {
        let (fd, a) = area();
        a.write_slot(0, b"x").unwrap();
        a.region.write(SLOTS + 8, &7u32.to_le_bytes());
        assert_eq!(
            a.newest().unwrap_err().to_string(),
            "no whole saved state in the crash area: slot 0: version 7, this binary reads \
             version 3; slot 1: never written"
        );
        a.region.write(8, &1u32.to_le_bytes());
        assert_eq!(
            CrashArea::open(fd.as_fd()).unwrap_err().to_string(),
            "the crash area is version 1; this binary reads versions 3 to 5"
        );
        a.region.write(0, b"NOTVNVME");
        assert!(matches!(
            CrashArea::open(fd.as_fd()),
            Err(CrashAreaError::Magic)
        ));
        assert!(matches!(
            a.write_slot(1, &vec![0u8; SLOT_LEN]),
            Err(CrashAreaError::TooBig(_))
        ));
    }

    #[test]
    fn queue_words_read_back() {
        let (_fd, a) = area();
        assert_eq!(a.load(3), QueueWords { sq: None, cq: None });
        a.store_sq(
            3,
            SqPosition {
                head: 65535,
                tail: 7,
            },
        );
        a.store_cq(
            3,
            CqPosition {
                head: 1,
                tail: 2,
                phase: true,
                reserved: 70000,
            },
        );
        a.store_cq(
            65535,
            CqPosition {
                head: 0,
                tail: 0,
                phase: false,
                reserved: 0,
            },
        );
        assert_eq!(
            a.load(3),
            QueueWords {
                sq: Some(SqPosition {
                    head: 65535,
                    tail: 7
                }),
                cq: Some(CqPosition {
                    head: 1,
                    tail: 2,
                    phase: true,
                    reserved: 65535
                }),
            }
        );
        assert_eq!(
            a.load(65535).cq,
            Some(CqPosition {
                head: 0,
                tail: 0,
                phase: false,
                reserved: 0
            })
        );
        a.clear_words();
        assert_eq!(a.load(3), QueueWords { sq: None, cq: None });
    }

    #[test]
    fn the_commands_in_flight_are_those_of_this_generation_and_a_late_one_is_told_apart() {
        let (_fd, a) = area();
        let at = |head, tail| SqPosition { head, tail };
        // Generation 0: nothing is kept in flight.
        a.store_fetched(1, 7, at(3, 9));
        assert_eq!(a.in_flight(1), vec![]);
        a.next_generation();
        a.store_fetched(1, 7, at(3, 9));
        a.store_fetched(1, 65535, at(4, 9));
        a.store_fetched(511, 2, at(1, 1));
        // Beyond the tables: not kept (and no panic).
        a.store_fetched(512, 2, at(1, 1));
        let open = |head, late| Open { cid: 0, head, late };
        assert_eq!(
            a.in_flight(1),
            vec![
                Open {
                    cid: 7,
                    ..open(3, false)
                },
                Open {
                    cid: 65535,
                    ..open(4, false)
                }
            ]
        );
        // The SQ word moved with them, its tail too.
        assert_eq!(a.load(1).sq, Some(at(4, 9)));
        a.store_completed(1, 7);
        assert_eq!(
            a.in_flight(1),
            vec![Open {
                cid: 65535,
                ..open(4, false)
            }]
        );
        assert_eq!(
            a.in_flight(511),
            vec![Open {
                cid: 2,
                ..open(1, false)
            }]
        );
        assert_eq!(a.in_flight(512), vec![]);
        // A round's store keeps the serial: nothing turns late.
        a.store_sq(1, at(5, 9));
        assert_eq!(
            a.in_flight(1),
            vec![Open {
                cid: 65535,
                ..open(4, false)
            }]
        );
        // An entry stored and the word not (a crash between the two).
        let word = a.word(1, false).unwrap();
        let before = word.load(Ordering::Relaxed);
        a.store_fetched(1, 9, at(6, 9));
        word.store(before, Ordering::Relaxed);
        assert_eq!(
            a.in_flight(1),
            vec![
                Open {
                    cid: 9,
                    ..open(6, true)
                },
                Open {
                    cid: 65535,
                    ..open(4, false)
                }
            ]
        );
        // A new generation voids them all.
        a.next_generation();
        assert_eq!(a.in_flight(1), vec![]);
        assert_eq!(a.in_flight(511), vec![]);
    }

    #[test]
    fn trapped_doorbells_read_back_until_the_words_are_cleared() {
        let (_fd, a) = area();
        assert_eq!(a.doorbell(Doorbell::SqTail(3)), None);
        a.store_doorbell(Doorbell::SqTail(3), 0);
        a.store_doorbell(Doorbell::CqHead(3), 65535);
        a.store_doorbell(Doorbell::SqTail(65535), 17);
        assert_eq!(a.doorbell(Doorbell::SqTail(3)), Some(0));
        assert_eq!(a.doorbell(Doorbell::CqHead(3)), Some(65535));
        assert_eq!(a.doorbell(Doorbell::SqTail(65535)), Some(17));
        assert_eq!(a.doorbell(Doorbell::CqHead(65535)), None);
        // The queue words beside them are untouched.
        assert_eq!(a.load(3), QueueWords { sq: None, cq: None });
        a.clear_words();
        assert_eq!(a.doorbell(Doorbell::SqTail(3)), None);
        assert_eq!(a.doorbell(Doorbell::SqTail(65535)), None);
    }
}
