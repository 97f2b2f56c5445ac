//! SGL data pointers (NVMe Base 2.0 §4.1.2): turning the command's SGL
//! Entry 1, or the one descriptor a metadata SGL's MPTR points to, and the
//! segments it leads to into the guest memory segments of one transfer, as
//! [`crate::prp::map`] does for PRPs.
//!
//! Hosts use SGLs for I/O commands only: PSDT 01b (data SGL, metadata in
//! the contiguous buffer at MPTR; Linux does so when a request's segments
//! average 32 KiB or more, `nvme.sgl_threshold`) and PSDT 10b (data SGL,
//! and MPTR the address of one qword-aligned descriptor of a metadata SGL,
//! offered in SGLS bit 19; Linux 6.14 and later). Every descriptor is
//! guest input: a walk reads at most [`MAX_DESCRIPTORS`] of them, whatever
//! the segments chain to.

use vnvme_spec::sgl::{kind, Descriptor};
use vnvme_spec::Status;

use crate::memory::{GuestAddress, GuestMemory};
use crate::prp::Segment;

/// Descriptors one command's SGL may hold in all. Linux puts at most 256
/// in a segment; a 2 MiB transfer of 512-byte blocks needs 4096.
const MAX_DESCRIPTORS: usize = 8192;

/// Descriptors read from guest memory at a time (one 4 KiB window).
const WINDOW: usize = 256;

const DESCRIPTOR: usize = Descriptor::SIZE;
const PAGE: u64 = 4096;

/// Which way the data goes: a bit bucket discards what the controller
/// sends; in a host-to-controller transfer it describes nothing and is
/// skipped, as QEMU's nvme does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    ToHost,
    FromHost,
}

/// What an SGL describes: the data buffer, or the metadata buffer, which
/// takes no bit bucket (SGLS bit 16 offers them for data) and whose wrong
/// length has a status of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Data,
    Metadata,
}

impl Target {
    fn length_invalid(self) -> Status {
        dnr(match self {
            Target::Data => Status::DATA_SGL_LENGTH_INVALID,
            Target::Metadata => Status::METADATA_SGL_LENGTH_INVALID,
        })
    }
}

fn dnr(s: Status) -> Status {
    s.with_dnr(true)
}

/// Maps a `len`-byte transfer described by SGL Entry 1 (the command's
/// DPTR, `sgl1`) into `out` (cleared first). Pieces never cross a 4 KiB
/// page, as PRP segments do.
///
/// * Entry 1 is a Data Block or Bit Bucket (the whole SGL), or a Segment or
///   Last Segment descriptor pointing to a segment (16-byte multiple, not
///   empty, else Invalid SGL Segment Descriptor).
/// * In a segment, only the last descriptor of a (non-last) Segment may
///   point to the next segment; a segment descriptor elsewhere is Invalid
///   Number of SGL Descriptors; types other than Data Block and Bit Bucket
///   (keyed or transport data blocks: fabrics only) and subtypes other than
///   Address are SGL Descriptor Type Invalid.
/// * The SGL must describe exactly `len` bytes (SGLS does not offer excess
///   length): less or more is Data SGL Length Invalid.
/// * A segment that cannot be read is a Data Transfer Error.
pub fn map(
    mem: &dyn GuestMemory,
    sgl1: [u8; DESCRIPTOR],
    len: u64,
    dir: Direction,
    out: &mut Vec<Segment>,
) -> Result<(), Status> {
    walk(
        mem,
        Descriptor::from_bytes(&sgl1),
        len,
        dir,
        Target::Data,
        out,
    )
}

/// Maps `len` bytes of metadata described by the metadata SGL whose one
/// descriptor is at `mptr` (PSDT 10b) into `out` (cleared first), by the
/// rules of [`map`] but for these:
///
/// * `mptr` must be qword aligned (the only MPTR SGL segment SGLS bit 19
///   offers): else Invalid Field in Command;
/// * a descriptor that cannot be read at `mptr` is a Data Transfer Error;
/// * a Bit Bucket is SGL Descriptor Type Invalid;
/// * less or more than `len` bytes is Metadata SGL Length Invalid.
pub fn map_metadata(
    mem: &dyn GuestMemory,
    mptr: GuestAddress,
    len: u64,
    dir: Direction,
    out: &mut Vec<Segment>,
) -> Result<(), Status> {
    out.clear();
    if !mptr.is_aligned(8) {
        return Err(dnr(Status::INVALID_FIELD));
    }
    let mut first = [0u8; DESCRIPTOR];
    mem.read(mptr, &mut first).map_err(|e| {
        tracing::trace!("metadata SGL descriptor: {e}");
        dnr(Status::DATA_TRANSFER_ERROR)
    })?;
    let first = Descriptor::from_bytes(&first);
    walk(mem, first, len, dir, Target::Metadata, out)
}

/// The walk of [`map`] and [`map_metadata`] from their first descriptor.
fn walk(
    mem: &dyn GuestMemory,
    first: Descriptor,
    len: u64,
    dir: Direction,
    target: Target,
    out: &mut Vec<Segment>,
) -> Result<(), Status> {
    out.clear();
    let mut walk = Walk {
        remaining: len,
        dir,
        target,
        out,
        budget: MAX_DESCRIPTORS,
    };
    let mut desc = first;
    if !desc.is_segment() {
        walk.data(&desc)?;
        return walk.finish();
    }
    let mut window = [0u8; WINDOW * DESCRIPTOR];
    loop {
        if desc.subtype != 0 {
            return Err(dnr(Status::INVALID_SGL_DESCRIPTOR_TYPE));
        }
        let seg_len = desc.len as usize;
        if seg_len == 0 || !seg_len.is_multiple_of(DESCRIPTOR) {
            return Err(dnr(Status::INVALID_SGL_SEGMENT_DESCRIPTOR));
        }
        let last_segment = desc.kind == kind::LAST_SEGMENT;
        let count = seg_len / DESCRIPTOR;
        let mut next = None;
        let mut index = 0;
        while index < count {
            let n = (count - index).min(WINDOW);
            let bytes = window
                .get_mut(..n * DESCRIPTOR)
                .ok_or(dnr(Status::DATA_TRANSFER_ERROR))?;
            let at = GuestAddress(desc.addr)
                .checked_add((index * DESCRIPTOR) as u64)
                .ok_or(dnr(Status::DATA_TRANSFER_ERROR))?;
            mem.read(at, bytes).map_err(|e| {
                tracing::trace!("SGL segment: {e}");
                dnr(Status::DATA_TRANSFER_ERROR)
            })?;
            for (i, raw) in bytes.chunks_exact(DESCRIPTOR).enumerate() {
                let mut b = [0u8; DESCRIPTOR];
                b.copy_from_slice(raw);
                let d = Descriptor::from_bytes(&b);
                let is_last = index + i + 1 == count;
                if d.is_segment() {
                    if !is_last || last_segment {
                        return Err(dnr(Status::INVALID_NUMBER_OF_SGL_DESCRIPTORS));
                    }
                    next = Some(d);
                } else {
                    walk.data(&d)?;
                }
            }
            index += n;
        }
        match next {
            Some(d) => desc = d,
            None => return walk.finish(),
        }
    }
}

struct Walk<'a> {
    remaining: u64,
    dir: Direction,
    target: Target,
    out: &'a mut Vec<Segment>,
    budget: usize,
}

impl Walk<'_> {
    /// One Data Block or Bit Bucket descriptor.
    fn data(&mut self, d: &Descriptor) -> Result<(), Status> {
        self.budget = self
            .budget
            .checked_sub(1)
            .ok_or(dnr(Status::INVALID_NUMBER_OF_SGL_DESCRIPTORS))?;
        let bucket = d.kind == kind::BIT_BUCKET && self.target == Target::Data;
        if !(d.kind == kind::DATA_BLOCK || bucket) || d.subtype != 0 {
            return Err(dnr(Status::INVALID_SGL_DESCRIPTOR_TYPE));
        }
        if d.len == 0 || (bucket && self.dir == Direction::FromHost) {
            return Ok(());
        }
        let len = u64::from(d.len);
        if len > self.remaining {
            return Err(self.target.length_invalid());
        }
        self.remaining -= len;
        if bucket {
            self.out.push(Segment {
                addr: Segment::BIT_BUCKET,
                len,
            });
            return Ok(());
        }
        let start = GuestAddress(d.addr);
        if start.checked_add(len).is_none() {
            return Err(self.target.length_invalid());
        }
        let (mut addr, mut left) = (start, len);
        while left > 0 {
            let piece = left.min(PAGE - addr.page_offset(PAGE));
            self.out.push(Segment { addr, len: piece });
            // Cannot wrap: `start + len` was checked above.
            addr = addr.wrapping_add(piece);
            left -= piece;
        }
        Ok(())
    }

    fn finish(self) -> Result<(), Status> {
        if self.remaining != 0 {
            return Err(self.target.length_invalid());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::VecMemory;

    const SEGMENT: u8 = kind::SEGMENT;
    const LAST_SEGMENT: u8 = kind::LAST_SEGMENT;

    fn desc(addr: u64, len: u32, kind: u8) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&addr.to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[15] = kind << 4;
        b
    }

    fn put(mem: &VecMemory, at: u64, descs: &[[u8; 16]]) {
        let bytes: Vec<u8> = descs.iter().flatten().copied().collect();
        mem.write(GuestAddress(at), &bytes).unwrap();
    }

    fn run(
        mem: &VecMemory,
        sgl1: [u8; 16],
        len: u64,
        dir: Direction,
    ) -> Result<Vec<Segment>, Status> {
        let mut out = Vec::new();
        map(mem, sgl1, len, dir, &mut out).map(|()| out)
    }

    fn seg(addr: u64, len: u64) -> Segment {
        Segment {
            addr: GuestAddress(addr),
            len,
        }
    }

    #[test]
    fn sgl_table_of_shapes_and_statuses() {
        let mem = VecMemory::new(1 << 20);
        // A last segment of two data blocks, the second across a page.
        put(
            &mem,
            0x8000,
            &[desc(0x10000, 512, 0), desc(0x11F00, 0x300, 0)],
        );
        // A segment chaining to that last segment after one data block.
        put(
            &mem,
            0x9000,
            &[desc(0x20000, 4096, 0), desc(0x8000, 32, LAST_SEGMENT)],
        );
        // A bit bucket between two blocks.
        put(
            &mem,
            0xA000,
            &[
                desc(0x30000, 512, 0),
                desc(0, 1024, 1),
                desc(0x31000, 512, 0),
            ],
        );
        // A segment descriptor in the middle of a segment.
        put(
            &mem,
            0xB000,
            &[desc(0x8000, 32, LAST_SEGMENT), desc(0x30000, 512, 0)],
        );
        // A keyed data block (fabrics only).
        put(&mem, 0xC000, &[desc(0x30000, 512, 4)]);
        // A last segment that tries to chain on.
        put(
            &mem,
            0xD000,
            &[desc(0x30000, 512, 0), desc(0x8000, 32, LAST_SEGMENT)],
        );
        use Direction::{FromHost, ToHost};
        type Case = (
            &'static str,
            [u8; 16],
            u64,
            Direction,
            Result<Vec<Segment>, Status>,
        );
        let bad = |s: Status| Err(s.with_dnr(true));
        let cases: &[Case] = &[
            (
                "one data block",
                desc(0x1000, 4096, 0),
                4096,
                ToHost,
                Ok(vec![seg(0x1000, 4096)]),
            ),
            (
                "data block across pages",
                desc(0x1800, 4096, 0),
                4096,
                FromHost,
                Ok(vec![seg(0x1800, 0x800), seg(0x2000, 0x800)]),
            ),
            (
                "last segment",
                desc(0x8000, 32, LAST_SEGMENT),
                0x500,
                ToHost,
                Ok(vec![
                    seg(0x10000, 512),
                    seg(0x11F00, 0x100),
                    seg(0x12000, 0x200),
                ]),
            ),
            (
                "segment chained to a last segment",
                desc(0x9000, 32, SEGMENT),
                4096 + 0x500,
                ToHost,
                Ok(vec![
                    seg(0x20000, 4096),
                    seg(0x10000, 512),
                    seg(0x11F00, 0x100),
                    seg(0x12000, 0x200),
                ]),
            ),
            (
                "bit bucket on a read",
                desc(0xA000, 48, LAST_SEGMENT),
                2048,
                ToHost,
                Ok(vec![
                    seg(0x30000, 512),
                    seg(Segment::BIT_BUCKET.raw(), 1024),
                    seg(0x31000, 512),
                ]),
            ),
            (
                "bit bucket ignored on a write",
                desc(0xA000, 48, LAST_SEGMENT),
                1024,
                FromHost,
                Ok(vec![seg(0x30000, 512), seg(0x31000, 512)]),
            ),
            (
                "too short",
                desc(0x1000, 512, 0),
                4096,
                ToHost,
                bad(Status::DATA_SGL_LENGTH_INVALID),
            ),
            (
                "too long",
                desc(0x1000, 8192, 0),
                4096,
                ToHost,
                bad(Status::DATA_SGL_LENGTH_INVALID),
            ),
            (
                "wrapping data block",
                desc(u64::MAX - 100, 512, 0),
                512,
                ToHost,
                bad(Status::DATA_SGL_LENGTH_INVALID),
            ),
            (
                "segment length not a multiple of 16",
                desc(0x8000, 24, LAST_SEGMENT),
                0x500,
                ToHost,
                bad(Status::INVALID_SGL_SEGMENT_DESCRIPTOR),
            ),
            (
                "empty segment",
                desc(0x8000, 0, SEGMENT),
                0x500,
                ToHost,
                bad(Status::INVALID_SGL_SEGMENT_DESCRIPTOR),
            ),
            (
                "segment descriptor mid-segment",
                desc(0xB000, 32, SEGMENT),
                0x500,
                ToHost,
                bad(Status::INVALID_NUMBER_OF_SGL_DESCRIPTORS),
            ),
            (
                "last segment chaining on",
                desc(0xD000, 32, LAST_SEGMENT),
                512 + 0x500,
                ToHost,
                bad(Status::INVALID_NUMBER_OF_SGL_DESCRIPTORS),
            ),
            (
                "keyed data block",
                desc(0xC000, 16, LAST_SEGMENT),
                512,
                ToHost,
                bad(Status::INVALID_SGL_DESCRIPTOR_TYPE),
            ),
            (
                "unreadable segment",
                desc(0xFFFF_0000, 32, LAST_SEGMENT),
                512,
                ToHost,
                bad(Status::DATA_TRANSFER_ERROR),
            ),
        ];
        for (name, sgl1, len, dir, want) in cases {
            assert_eq!(&run(&mem, *sgl1, *len, *dir), want, "{name}");
        }
    }

    #[test]
    fn sgl_segments_chaining_to_themselves_terminate() {
        let mem = VecMemory::new(1 << 20);
        // A segment of a zero-length block and a pointer back to itself.
        put(
            &mem,
            0x8000,
            &[desc(0x10000, 0, 0), desc(0x8000, 32, SEGMENT)],
        );
        let r = run(&mem, desc(0x8000, 32, SEGMENT), 4096, Direction::ToHost);
        assert_eq!(
            r,
            Err(Status::INVALID_NUMBER_OF_SGL_DESCRIPTORS.with_dnr(true))
        );
    }

    fn run_meta(
        mem: &VecMemory,
        mptr: u64,
        len: u64,
        dir: Direction,
    ) -> Result<Vec<Segment>, Status> {
        let mut out = vec![seg(1, 1)];
        map_metadata(mem, GuestAddress(mptr), len, dir, &mut out).map(|()| out)
    }

    #[test]
    fn metadata_sgl_table_of_shapes_and_statuses() {
        let mem = VecMemory::new(1 << 20);
        // What MPTR points to, one descriptor each.
        put(&mem, 0x1000, &[desc(0x20000, 64, 0)]);
        put(&mem, 0x1010, &[desc(0x8000, 32, LAST_SEGMENT)]);
        put(&mem, 0x1020, &[desc(0x9000, 32, SEGMENT)]);
        put(&mem, 0x1030, &[desc(0, 64, 1)]);
        put(&mem, 0x1040, &[desc(0xA000, 32, LAST_SEGMENT)]);
        put(&mem, 0x1050, &[desc(0x20000, 64, 4)]);
        put(&mem, 0x1060, &[desc(0xB000, 32, LAST_SEGMENT)]);
        // Two blocks' metadata, the second across a page.
        put(&mem, 0x8000, &[desc(0x20000, 8, 0), desc(0x21FFC, 8, 0)]);
        // A segment of one block chaining to the last segment above.
        put(
            &mem,
            0x9000,
            &[desc(0x30000, 16, 0), desc(0x8000, 32, LAST_SEGMENT)],
        );
        // A bit bucket in a metadata segment.
        put(&mem, 0xA000, &[desc(0x20000, 8, 0), desc(0, 8, 1)]);
        // A segment descriptor mid-segment.
        put(
            &mem,
            0xB000,
            &[desc(0x8000, 32, LAST_SEGMENT), desc(0x20000, 8, 0)],
        );
        use Direction::{FromHost, ToHost};
        type Case = (
            &'static str,
            u64,
            u64,
            Direction,
            Result<Vec<Segment>, Status>,
        );
        let bad = |s: Status| Err(s.with_dnr(true));
        let cases: &[Case] = &[
            (
                "one data block",
                0x1000,
                64,
                FromHost,
                Ok(vec![seg(0x20000, 64)]),
            ),
            (
                "last segment of two blocks",
                0x1010,
                16,
                ToHost,
                Ok(vec![seg(0x20000, 8), seg(0x21FFC, 4), seg(0x22000, 4)]),
            ),
            (
                "segment chained to a last segment",
                0x1020,
                32,
                FromHost,
                Ok(vec![
                    seg(0x30000, 16),
                    seg(0x20000, 8),
                    seg(0x21FFC, 4),
                    seg(0x22000, 4),
                ]),
            ),
            (
                "bit bucket at MPTR",
                0x1030,
                64,
                ToHost,
                bad(Status::INVALID_SGL_DESCRIPTOR_TYPE),
            ),
            (
                "bit bucket in a segment",
                0x1040,
                16,
                ToHost,
                bad(Status::INVALID_SGL_DESCRIPTOR_TYPE),
            ),
            (
                "keyed data block",
                0x1050,
                64,
                ToHost,
                bad(Status::INVALID_SGL_DESCRIPTOR_TYPE),
            ),
            (
                "segment descriptor mid-segment",
                0x1060,
                16,
                ToHost,
                bad(Status::INVALID_NUMBER_OF_SGL_DESCRIPTORS),
            ),
            (
                "too short",
                0x1000,
                128,
                ToHost,
                bad(Status::METADATA_SGL_LENGTH_INVALID),
            ),
            (
                "too long",
                0x1010,
                8,
                FromHost,
                bad(Status::METADATA_SGL_LENGTH_INVALID),
            ),
            (
                "MPTR not qword aligned",
                0x1004,
                64,
                ToHost,
                bad(Status::INVALID_FIELD),
            ),
            (
                "MPTR unreadable",
                0xFFFF_0000,
                64,
                ToHost,
                bad(Status::DATA_TRANSFER_ERROR),
            ),
        ];
        for (name, mptr, len, dir, want) in cases {
            assert_eq!(&run_meta(&mem, *mptr, *len, *dir), want, "{name}");
        }
    }

    #[test]
    fn a_metadata_sgl_chaining_to_itself_terminates() {
        let mem = VecMemory::new(1 << 20);
        put(&mem, 0x1000, &[desc(0x8000, 32, SEGMENT)]);
        put(
            &mem,
            0x8000,
            &[desc(0x10000, 0, 0), desc(0x8000, 32, SEGMENT)],
        );
        assert_eq!(
            run_meta(&mem, 0x1000, 64, Direction::FromHost),
            Err(Status::INVALID_NUMBER_OF_SGL_DESCRIPTORS.with_dnr(true))
        );
    }
}
