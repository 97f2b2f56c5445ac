//! The crash area (docs/state-format.md, "Crash area"): a memfd the
//! supervisor makes and every child it starts shares, holding what the
//! next child needs to serve the same client after a crash.
//!
//! * a header page: the magic `VNVMECA1`, the area's version, and the
//!   vfio-user message the child is handling (a word; 0 between messages);
//! * per queue id, two words the queue workers store after each round:
//!   the SQ's head and tail, the CQ's head, tail and phase
//!   ([`QueueWords`]), each with a bit saying it is set;
//! * two slots, written alternately, each holding a whole saved client
//!   (its DMA maps, PCI function and the controller's saved state) behind
//!   a header with a sequence number, a length and a checksum: a child
//!   killed while writing one leaves the other whole, and a slot whose
//!   checksum does not hold is never read.
//!
//! The memfd is sparse: only the pages written cost memory.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use vnvme_controller::crash_record::{CqPosition, SqPosition};
use vnvme_vfio_user::SharedRegion;

/// The header page's first bytes.
pub const MAGIC: &[u8; 8] = b"VNVMECA1";
/// A slot's first bytes.
pub const SLOT_MAGIC: &[u8; 8] = b"VNVMECS1";
/// The layout and slot format this binary writes and reads.
pub const VERSION: u32 = 1;

/// Where the message-being-handled word is in the header page.
const HANDLING: usize = 16;
/// Queue words: from here, 16 bytes per queue id (SQ word, CQ word).
const WORDS: usize = 4096;
/// Queue ids with words: every id a controller can have (16 bits).
pub const QUEUE_IDS: usize = 1 << 16;
const SLOTS: usize = WORDS + QUEUE_IDS * 16;
/// Bytes per slot, its header included.
pub const SLOT_LEN: usize = 16 << 20;
const SLOT_HEADER: usize = 64;
/// The area's size.
pub const AREA_LEN: usize = SLOTS + 2 * SLOT_LEN;

/// A word's "set" bit.
const SET: u64 = 1 << 63;
/// A CQ word's phase bit.
const PHASE: u64 = 1 << 62;
/// A message word's "handling" bit.
const BUSY: u64 = 1 << 63;

/// Why an area or its slots cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CrashAreaError {
    #[error("mapping the crash area")]
    Map(#[source] std::io::Error),
    #[error("the crash area does not start with {MAGIC:?}: not a vnvme crash area")]
    Magic,
    #[error("the crash area is version {found}; this binary reads version {VERSION}")]
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
        if found != VERSION {
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
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        self.region.write(at + SLOT_HEADER, payload);
        let mut head = [0u8; SLOT_HEADER];
        head[8..12].copy_from_slice(&VERSION.to_le_bytes());
        head[16..24].copy_from_slice(&seq.to_le_bytes());
        head[24..32].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        head[32..40].copy_from_slice(&checksum(seq, payload).to_le_bytes());
        self.region.write(at + 8, &head[8..]);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
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
        if version != VERSION {
            return Err(format!(
                "version {version}, this binary reads version {VERSION}"
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
        self.region
            .atomic_u64(WORDS + usize::from(qid) * 16 + if cq { 8 } else { 0 })
    }

    /// Stores SQ `qid`'s position (release: a reader that sees it sees the
    /// CQ entries and guest memory written before).
    pub fn store_sq(&self, qid: u16, p: SqPosition) {
        if let Some(w) = self.word(qid, false) {
            let v = SET | (u64::from(p.head & 0xffff) << 32) | u64::from(p.tail & 0xffff);
            w.store(v, std::sync::atomic::Ordering::Release);
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
            w.store(v, std::sync::atomic::Ordering::Release);
        }
    }

    /// Queue `qid`'s words.
    pub fn load(&self, qid: u16) -> QueueWords {
        let get = |cq| {
            self.word(qid, cq)
                .map_or(0, |w| w.load(std::sync::atomic::Ordering::Acquire))
        };
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

    /// Unsets every queue's words (a new saved state sets its own).
    pub fn clear_words(&self) {
        self.region.fill(WORDS, QUEUE_IDS * 16, 0);
    }

    /// Says the message `(msg_id, command)` is being handled (`Some`), or
    /// none is (`None`).
    pub fn set_handling(&self, msg: Option<(u16, u16)>) {
        if let Some(w) = self.region.atomic_u64(HANDLING) {
            let v = msg.map_or(0, |(id, command)| {
                BUSY | (u64::from(id) << 16) | u64::from(command)
            });
            w.store(v, std::sync::atomic::Ordering::Release);
        }
    }

    /// The message the child was handling, if any: `(msg_id, command)`.
    pub fn handling(&self) -> Option<(u16, u16)> {
        let v = self
            .region
            .atomic_u64(HANDLING)
            .map_or(0, |w| w.load(std::sync::atomic::Ordering::Acquire));
        (v & BUSY != 0).then_some((((v >> 16) & 0xffff) as u16, (v & 0xffff) as u16))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area() -> (OwnedFd, CrashArea) {
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
    fn a_slot_or_an_area_of_another_version_is_refused_by_name() {
        let (fd, a) = area();
        a.write_slot(0, b"x").unwrap();
        a.region.write(SLOTS + 8, &7u32.to_le_bytes());
        assert_eq!(
            a.newest().unwrap_err().to_string(),
            "no whole saved state in the crash area: slot 0: version 7, this binary reads \
             version 1; slot 1: never written"
        );
        a.region.write(8, &2u32.to_le_bytes());
        assert_eq!(
            CrashArea::open(fd.as_fd()).unwrap_err().to_string(),
            "the crash area is version 2; this binary reads version 1"
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
    fn queue_words_and_the_message_word_read_back() {
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
        assert_eq!(a.handling(), None);
        a.set_handling(Some((9, 2)));
        assert_eq!(a.handling(), Some((9, 2)));
        a.set_handling(None);
        assert_eq!(a.handling(), None);
    }
}
