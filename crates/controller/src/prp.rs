//! PRP data pointers (NVMe Base 2.0 §4.1.1): turning PRP1/PRP2 into the
//! guest memory segments of one transfer.
//!
//! Every entry is guest input. The walk is bounded by the transfer length,
//! which the caller has already bounded by MDTS: at most `len / page + 1`
//! data entries and as many list pages as they need are read.

use vnvme_spec::Status;

pub use crate::memory::Segment;
use crate::memory::{DmaError, GuestAddress, GuestMemory};

const ENTRY: u64 = 8;

fn invalid_offset() -> Status {
    Status::INVALID_PRP_OFFSET.with_dnr(true)
}

fn transfer_error() -> Status {
    Status::DATA_TRANSFER_ERROR.with_dnr(true)
}

/// A PRP list or data page that is not guest memory the controller may
/// use: the guest's doing, so traced (a guest could fill the log), not
/// logged; its count is in the completion statuses.
fn dma_error(e: DmaError) -> Status {
    tracing::trace!("PRP transfer: {e}");
    transfer_error()
}

/// Maps a `len`-byte transfer described by `prp1`/`prp2` into `out`
/// (cleared first). `page_size` is CC.MPS's page size (a power of two,
/// >= 4096).
///
/// * PRP1 may have an offset into its page, dword aligned (else Invalid PRP
///   Offset).
/// * If the rest fits in one page, PRP2 is that page (offset 0, else Invalid
///   PRP Offset); otherwise PRP2 points to a PRP list (dword aligned, may have
///   an offset into its page).
/// * List entries are data pages with offset 0 (else Invalid PRP Offset). When
///   more entries are needed than fit in the rest of a list page, the page's
///   last entry points to the next list page (page aligned).
/// * A list that cannot be read is a Data Transfer Error.
pub fn map(
    mem: &dyn GuestMemory,
    prp1: GuestAddress,
    prp2: GuestAddress,
    len: u64,
    page_size: u64,
    out: &mut Vec<Segment>,
) -> Result<(), Status> {
    out.clear();
    if len == 0 {
        return Ok(());
    }
    if !prp1.is_aligned(4) {
        return Err(invalid_offset());
    }
    let first = len.min(page_size - prp1.page_offset(page_size));
    out.push(Segment {
        addr: prp1,
        len: first,
    });
    let mut remaining = len - first;
    if remaining == 0 {
        return Ok(());
    }
    if remaining <= page_size {
        if prp2.page_offset(page_size) != 0 {
            return Err(invalid_offset());
        }
        out.push(Segment {
            addr: prp2,
            len: remaining,
        });
        return Ok(());
    }
    if !prp2.is_aligned(ENTRY) {
        return Err(invalid_offset());
    }
    let mut list = prp2;
    let mut pages_left = remaining.div_ceil(page_size);
    // Each list page but the first is a full page, so this bounds the walk
    // even against a list that chains to itself.
    let mut lists_left = pages_left.div_ceil((page_size / ENTRY).saturating_sub(1).max(1)) + 1;
    let mut entries = [0u8; 512 * ENTRY as usize];
    loop {
        if lists_left == 0 {
            return Err(invalid_offset());
        }
        lists_left -= 1;
        let slots = (page_size - list.page_offset(page_size)) / ENTRY;
        let chained = pages_left > slots;
        // Read at most one 4 KiB window of entries at a time.
        let wanted = if chained { slots } else { pages_left };
        let mut index = 0u64;
        let mut next_list = None;
        while index < wanted {
            let n = (wanted - index).min(512);
            let bytes = (n * ENTRY) as usize;
            let window = entries.get_mut(..bytes).ok_or_else(transfer_error)?;
            let at = list.checked_add(index * ENTRY).ok_or_else(transfer_error)?;
            mem.read(at, window).map_err(dma_error)?;
            for (i, raw) in window.chunks_exact(ENTRY as usize).enumerate() {
                let mut e = [0u8; 8];
                e.copy_from_slice(raw);
                let entry = GuestAddress(u64::from_le_bytes(e));
                if entry.page_offset(page_size) != 0 {
                    return Err(invalid_offset());
                }
                if chained && index + i as u64 == slots - 1 {
                    next_list = Some(entry);
                } else {
                    let seg = remaining.min(page_size);
                    out.push(Segment {
                        addr: entry,
                        len: seg,
                    });
                    remaining -= seg;
                    pages_left -= 1;
                }
            }
            index += n;
        }
        match next_list {
            Some(next) if pages_left > 0 => list = next,
            _ => return Ok(()),
        }
    }
}

/// Copies `data` into the guest segments (controller-to-host transfer);
/// SGL bit buckets take their bytes nowhere.
pub fn write_to_guest(mem: &dyn GuestMemory, segs: &[Segment], data: &[u8]) -> Result<(), Status> {
    let mut done = 0usize;
    for s in segs {
        let end = done.saturating_add(s.len as usize);
        let chunk = data.get(done..end).ok_or_else(transfer_error)?;
        if s.addr != Segment::BIT_BUCKET {
            mem.write(s.addr, chunk).map_err(dma_error)?;
        }
        done = end;
    }
    Ok(())
}

/// Copies the guest segments into `data` (host-to-controller transfer).
pub fn read_from_guest(
    mem: &dyn GuestMemory,
    segs: &[Segment],
    data: &mut [u8],
) -> Result<(), Status> {
    let mut done = 0usize;
    for s in segs {
        let end = done.saturating_add(s.len as usize);
        let chunk = data.get_mut(done..end).ok_or_else(transfer_error)?;
        mem.read(s.addr, chunk).map_err(dma_error)?;
        done = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::VecMemory;
    use proptest::prelude::*;

    const PAGE: u64 = 4096;

    fn write_list(mem: &VecMemory, at: u64, entries: &[u64]) {
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        mem.write(GuestAddress(at), &bytes).unwrap();
    }

    fn run(mem: &VecMemory, prp1: u64, prp2: u64, len: u64) -> Result<Vec<Segment>, Status> {
        let mut out = Vec::new();
        map(
            mem,
            GuestAddress(prp1),
            GuestAddress(prp2),
            len,
            PAGE,
            &mut out,
        )
        .map(|()| out)
    }

    #[test]
    fn prp_table_of_shapes_and_statuses() {
        let mem = VecMemory::new(1 << 20);
        write_list(&mem, 0x8000, &[0x10000, 0x11000, 0x12000]);
        write_list(&mem, 0x9000, &[0x10000, 0x11008]);
        write_list(&mem, 0xAFF8, &[0xB000]); // list ending on a chain pointer
        write_list(&mem, 0xB000, &[0x20000, 0x21000]);
        let seg = |addr, len| Segment {
            addr: GuestAddress(addr),
            len,
        };
        type Case = (&'static str, u64, u64, u64, Result<Vec<Segment>, Status>);
        let cases: &[Case] = &[
            ("one page", 0x1000, 0, 4096, Ok(vec![seg(0x1000, 4096)])),
            (
                "offset within page",
                0x1200,
                0,
                512,
                Ok(vec![seg(0x1200, 512)]),
            ),
            (
                "offset spills into prp2",
                0x1200,
                0x5000,
                4096,
                Ok(vec![seg(0x1200, 0xE00), seg(0x5000, 0x200)]),
            ),
            ("misaligned prp1", 0x1201, 0, 512, Err(invalid_offset())),
            (
                "prp2 data with offset",
                0x1000,
                0x5010,
                8192,
                Err(invalid_offset()),
            ),
            (
                "list of three",
                0x1000,
                0x8000,
                4 * 4096,
                Ok(vec![
                    seg(0x1000, 4096),
                    seg(0x10000, 4096),
                    seg(0x11000, 4096),
                    seg(0x12000, 4096),
                ]),
            ),
            (
                "list entry with offset",
                0x1000,
                0x9000,
                3 * 4096,
                Err(invalid_offset()),
            ),
            (
                "misaligned list pointer",
                0x1000,
                0x8004,
                3 * 4096,
                Err(invalid_offset()),
            ),
            (
                "list chained across pages",
                0x1000,
                0xAFF8,
                3 * 4096,
                Ok(vec![
                    seg(0x1000, 4096),
                    seg(0x20000, 4096),
                    seg(0x21000, 4096),
                ]),
            ),
            (
                "unmapped list",
                0x1000,
                0xFFFF_0000,
                3 * 4096,
                Err(transfer_error()),
            ),
        ];
        for (name, prp1, prp2, len, want) in cases {
            assert_eq!(&run(&mem, *prp1, *prp2, *len), want, "{name}");
        }
    }

    #[test]
    fn prp_list_chaining_to_itself_terminates() {
        let mem = VecMemory::new(1 << 20);
        // A full list page whose last entry points back to itself.
        let mut entries: Vec<u64> = (0..511).map(|i| 0x40000 + i * 0x1000).collect();
        entries.push(0x8000);
        write_list(&mem, 0x8000, &entries);
        let r = run(&mem, 0x1000, 0x8000, 600 * 4096);
        assert!(r.is_ok(), "a long transfer that stays in bounds completes");
        assert_eq!(r.unwrap().len(), 600);
    }

    proptest! {
        #[test]
        fn prp_segments_cover_the_length_within_pages(
            off in 0u64..1024, len in 1u64..(64 * 4096), chain_at in 1u64..512
        ) {
            let mem = VecMemory::new(4 << 20);
            let prp1 = 0x1000 + off * 4;
            // Data pages at 0x200000 + i * PAGE; first list at 0x100000 with
            // `chain_at` slots before its page end, continuing at 0x180000.
            let pages = (len - len.min(PAGE - (prp1 % PAGE))).div_ceil(PAGE);
            let list1 = 0x101000 - chain_at * 8;
            let mut all: Vec<u64> = (0..pages).map(|i| 0x200000 + i * PAGE).collect();
            if pages as usize > chain_at as usize {
                let rest = all.split_off(chain_at as usize - 1);
                all.push(0x180000);
                write_list(&mem, 0x180000, &rest);
            }
            write_list(&mem, list1, &all);
            let prp2 = if pages == 1 { 0x200000 } else { list1 };
            let segs = run(&mem, prp1, prp2, len).unwrap();
            prop_assert_eq!(segs.iter().map(|s| s.len).sum::<u64>(), len);
            for s in &segs {
                prop_assert!(s.len <= PAGE - s.addr.page_offset(PAGE));
            }
        }
    }
}
