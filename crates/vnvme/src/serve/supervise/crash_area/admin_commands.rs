//! The crash area's admin commands kept to run again (version 5, in the
//! header page after the kept message): an admin command whose completion
//! is owed (`vnvme_controller`'s `queue::owed`) is recorded in flight with
//! the 64 bytes of its SQ entry beside, so the next child can run it again
//! (`saved_state::rerun`) rather than complete it with Command Interrupted.
//! The SQ entry in guest memory is not safe to read again: the host may
//! reuse it once later completions report the SQ head past it.
//!
//! [`ADMIN_KEPT`] entries of 72 bytes, the one for CID `cid` at
//! `cid % ADMIN_KEPT` (Linux's admin CIDs are its tags, below 32, with a
//! counter above bit 12): a tag word naming the command (the area's
//! generation in bits 32-63, the SQ head after its fetch in bits 16-31,
//! its CID in bits 0-15; 0: none), then its bytes. Two commands in flight
//! together whose CIDs are 32 apart share an entry: the earlier is no
//! longer kept and is interrupted as before. A version 3 or 4 area holds
//! zeros there: nothing kept.

use std::sync::atomic::{fence, Ordering};

use vnvme_vfio_user::handover::MAX_REDO_BYTES;

use super::{CrashArea, WORDS};

const ADMIN: usize = 1024;
/// Admin commands kept at most.
pub const ADMIN_KEPT: usize = 32;
const ENTRY: usize = 8 + 64;

// After the kept message's bytes (from 64), before the queue words.
const _: () = assert!(64 + MAX_REDO_BYTES <= ADMIN && ADMIN + ADMIN_KEPT * ENTRY <= WORDS);

/// The tag naming command `cid` fetched at `head` in generation `gen`.
fn tag(gen: u32, cid: u16, head: u32) -> u64 {
    (u64::from(gen) << 32) | (u64::from(head & 0xffff) << 16) | u64::from(cid)
}

impl CrashArea {
    /// Keeps admin command `sqe` (CID `cid`, in flight at SQ head `head`)
    /// in this generation: the tag is cleared first and set last, so an
    /// entry written in part names no command.
    pub fn store_admin_command(&self, cid: u16, head: u32, sqe: &[u8; 64]) {
        let at = ADMIN + usize::from(cid) % ADMIN_KEPT * ENTRY;
        let Some(t) = self.region.atomic_u64(at) else {
            return;
        };
        t.store(0, Ordering::Release);
        fence(Ordering::Release);
        if self.region.write(at + 8, sqe) {
            fence(Ordering::Release);
            t.store(tag(self.generation(), cid, head), Ordering::Release);
        }
    }

    /// The bytes kept of admin command `cid` in flight at head `head` in
    /// this generation, if its entry still names it.
    pub fn admin_command(&self, cid: u16, head: u32) -> Option<[u8; 64]> {
        let gen = self.generation();
        let at = ADMIN + usize::from(cid) % ADMIN_KEPT * ENTRY;
        let t = self.region.atomic_u64(at)?.load(Ordering::Acquire);
        if gen == 0 || t != tag(gen, cid, head) {
            return None;
        }
        let mut sqe = [0u8; 64];
        self.region.read(at + 8, &mut sqe).then_some(sqe)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::area;
    use super::*;

    #[test]
    fn an_admin_command_reads_back_by_cid_head_and_generation_only() {
        let (_fd, a) = area();
        a.next_generation();
        let sqe = [7u8; 64];
        a.store_admin_command(3, 5, &sqe);
        assert_eq!(a.admin_command(3, 5), Some(sqe));
        assert_eq!(a.admin_command(3, 6), None, "another head");
        assert_eq!(a.admin_command(4, 5), None, "another CID");
        // CID 35 shares the entry: CID 3 is no longer kept.
        a.store_admin_command(35, 6, &[8u8; 64]);
        assert_eq!(a.admin_command(3, 5), None);
        assert_eq!(a.admin_command(35, 6), Some([8u8; 64]));
        // Another generation (a checkpoint, a new child): none kept.
        a.next_generation();
        assert_eq!(a.admin_command(35, 6), None);
    }

    #[test]
    fn an_entry_written_in_part_and_a_version_4_area_keep_nothing() {
        let (fd, a) = area();
        a.next_generation();
        a.store_admin_command(1, 2, &[9u8; 64]);
        // Killed between the tag's clearing and its setting.
        a.region.fill(ADMIN + ENTRY, 8, 0);
        assert_eq!(a.admin_command(1, 2), None);
        // A version 4 area (zeros there) is read: nothing kept.
        a.region.write(8, &4u32.to_le_bytes());
        let a = CrashArea::open(std::os::fd::AsFd::as_fd(&fd)).unwrap();
        a.next_generation();
        assert_eq!(a.admin_command(0, 0), None);
    }
}
