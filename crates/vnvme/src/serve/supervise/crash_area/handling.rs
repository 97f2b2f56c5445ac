//! The crash area's message word and what it keeps of the message (the
//! header page, after the magic, the version and the generation): the
//! vfio-user message the child is handling, and, when handling it again
//! ends as handling it once (`vnvme_vfio_user::handover::may_redo`), its
//! bytes and the id and count of the fds it carries, which the child
//! forwarded to the supervisor before it marked the message (the notes'
//! `message_fd`): the next child handles it again with copies of them.
//!
//! | offset | what |
//! |---|---|
//! | 16 | the word: bit 63 set while a message is handled, its `msg_id` in bits 16-31, its command in bits 0-15 |
//! | 32 | the length of the bytes kept (u64; 0: none) |
//! | 40 | the id of the message's fds at the supervisor (u64; version 4) |
//! | 48 | how many fds it carries (u64; 0: none; version 4) |
//! | 64 | the bytes, header and payload, up to [`MAX_REDO_BYTES`] |

use std::sync::atomic::Ordering;

use vnvme_vfio_user::handover::{Marked, MAX_REDO_BYTES};

use super::{CrashArea, WORDS};

const HANDLING: usize = super::HANDLING;
const REDO_LEN: usize = 32;
const FDS_ID: usize = 40;
const FDS: usize = 48;
const REDO: usize = 64;
/// The word's "handling" bit.
const BUSY: u64 = 1 << 63;

// The kept bytes fit the header page, before the queue words.
const _: () = assert!(REDO + MAX_REDO_BYTES <= WORDS);

/// The message a dead child was handling, kept to handle again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Its header and payload.
    pub bytes: Vec<u8>,
    /// The id its fds were forwarded under (the supervisor hands the fds
    /// it holds under this id), and how many; 0 and 0: it has none.
    pub fds_id: u64,
    pub fds: usize,
}

impl CrashArea {
    /// Says the message `msg` is being handled (`Some`), with its bytes if
    /// it may be handled again ([`Marked::redo`]) and the id its
    /// [`Marked::fds`] were forwarded under (`fds_id`), or none is
    /// (`None`). The bytes and the id go first, the word last, so a word
    /// names what is beside it.
    pub fn set_handling(&self, msg: Option<Marked<'_>>, fds_id: u64) {
        let mut len = 0;
        let mut fds = 0;
        if let Some(m) = msg {
            if let Some([header, payload]) = m.redo {
                len = header.len() + payload.len();
                fds = m.fds.len();
                if len > MAX_REDO_BYTES
                    || !self.region.write(REDO, header)
                    || !self.region.write(REDO + header.len(), payload)
                {
                    (len, fds) = (0, 0);
                }
            }
            for (at, v) in [
                (REDO_LEN, len as u64),
                (FDS_ID, if fds > 0 { fds_id } else { 0 }),
                (FDS, fds as u64),
            ] {
                if let Some(w) = self.region.atomic_u64(at) {
                    w.store(v, Ordering::Relaxed);
                }
            }
        }
        if let Some(w) = self.region.atomic_u64(HANDLING) {
            let v = msg.map_or(0, |m| {
                BUSY | (u64::from(m.msg_id) << 16) | u64::from(m.command)
            });
            w.store(v, Ordering::Release);
        }
    }

    /// The message the child was handling, if it may be handled again
    /// (see [`set_handling`](Self::set_handling)) and the bytes kept are
    /// the message the word names.
    pub fn redo(&self) -> Option<Kept> {
        let (msg_id, command) = self.handling()?;
        let load = |at| {
            self.region
                .atomic_u64(at)
                .map_or(0, |w| w.load(Ordering::Relaxed))
        };
        let len = load(REDO_LEN) as usize;
        if len == 0 || len > MAX_REDO_BYTES {
            return None;
        }
        let mut bytes = vec![0u8; len];
        let named = |b: &[u8]| {
            b.len() >= 4
                && u16::from_le_bytes([b[0], b[1]]) == msg_id
                && u16::from_le_bytes([b[2], b[3]]) == command
        };
        if !(self.region.read(REDO, &mut bytes) && named(&bytes)) {
            return None;
        }
        // A count beyond what a message carries is not one this binary
        // wrote: nothing can be handed for it.
        let fds = usize::try_from(load(FDS))
            .ok()
            .filter(|&n| n <= vnvme_vfio_user::MAX_MSG_FDS)?;
        Some(Kept {
            bytes,
            fds_id: load(FDS_ID),
            fds,
        })
    }

    /// The message the child was handling, if any: `(msg_id, command)`.
    pub fn handling(&self) -> Option<(u16, u16)> {
        let v = self
            .region
            .atomic_u64(HANDLING)
            .map_or(0, |w| w.load(Ordering::Acquire));
        (v & BUSY != 0).then_some((((v >> 16) & 0xffff) as u16, (v & 0xffff) as u16))
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use super::super::tests::area;
    use super::*;

    fn marked<'a>(
        msg_id: u16,
        command: u16,
        redo: Option<[&'a [u8]; 2]>,
        fds: &'a [OwnedFd],
    ) -> Option<Marked<'a>> {
        Some(Marked {
            msg_id,
            command,
            redo,
            fds,
        })
    }

    #[test]
    fn the_message_word_and_a_kept_message_read_back_only_while_marked() {
        let (_fd, a) = area();
        assert_eq!(a.handling(), None);
        a.set_handling(marked(9, 2, None, &[]), 0);
        assert_eq!(a.handling(), Some((9, 2)));
        assert_eq!(a.redo(), None);
        a.set_handling(None, 0);
        assert_eq!(a.handling(), None);
        // A region write kept whole reads back while it is marked, and
        // only then; one marked without bytes hides an older one's.
        let header = [10u8, 0, 10, 0, 36, 0, 0, 0];
        let payload = [1u8; 28];
        a.set_handling(marked(10, 10, Some([&header, &payload]), &[]), 0);
        let kept = Kept {
            bytes: [&header[..], &payload[..]].concat(),
            fds_id: 0,
            fds: 0,
        };
        assert_eq!(a.redo(), Some(kept));
        a.set_handling(None, 0);
        assert_eq!(a.redo(), None);
        a.set_handling(marked(10, 10, None, &[]), 0);
        assert_eq!(a.redo(), None);
    }

    #[test]
    fn a_kept_message_with_fds_names_them_and_its_bytes_are_bounded() {
        let (_fd, a) = area();
        let fds: Vec<OwnedFd> = (0..2)
            .map(|_| std::fs::File::open("/dev/null").unwrap().into())
            .collect();
        // A SET_IRQS of two eventfds (msg_id 3, command 8).
        let header = [3u8, 0, 8, 0];
        let payload = [0u8; 32];
        a.set_handling(marked(3, 8, Some([&header, &payload]), &fds), 77);
        let kept = a.redo().unwrap();
        assert_eq!((kept.bytes.len(), kept.fds_id, kept.fds), (36, 77, 2));
        // The bound: MAX_REDO_BYTES kept whole, one byte more not at all
        // (and the fds of the message before are not named).
        let big = vec![5u8; MAX_REDO_BYTES - header.len()];
        a.set_handling(marked(4, 8, Some([&header[..], &big]), &fds[..1]), 78);
        assert_eq!(a.redo(), None, "the word names msg_id 4, the bytes say 3");
        let header = [4u8, 0, 8, 0];
        a.set_handling(marked(4, 8, Some([&header[..], &big]), &fds[..1]), 78);
        let kept = a.redo().unwrap();
        assert_eq!(
            (kept.bytes.len(), kept.fds_id, kept.fds),
            (MAX_REDO_BYTES, 78, 1)
        );
        let bigger = vec![5u8; MAX_REDO_BYTES - header.len() + 1];
        a.set_handling(marked(4, 8, Some([&header[..], &bigger]), &fds), 79);
        assert_eq!(a.handling(), Some((4, 8)));
        assert_eq!(a.redo(), None);
        // Kept without fds: no id, whatever was asked.
        a.set_handling(marked(4, 8, Some([&header[..], &payload]), &[]), 80);
        assert_eq!(a.redo().map(|k| (k.fds_id, k.fds)), Some((0, 0)));
        // The room ends before the queue words: they are untouched.
        assert_eq!(a.load(0), super::super::QueueWords { sq: None, cq: None });
    }

    #[test]
    fn a_version_3_area_is_read_as_keeping_no_fds() {
        let (fd, a) = area();
        a.region.write(8, &3u32.to_le_bytes());
        let a = CrashArea::open(std::os::fd::AsFd::as_fd(&fd)).unwrap();
        let header = [10u8, 0, 10, 0];
        let payload = [1u8; 28];
        // What a version 3 child leaves: bytes, and zeros where version 4
        // keeps the fds' id and count.
        a.set_handling(marked(10, 10, Some([&header, &payload]), &[]), 0);
        assert_eq!(a.redo().map(|k| (k.bytes.len(), k.fds)), Some((32, 0)));
    }
}
