//! Physical Region Page entries (NVMe 2.0 §4.1.1): how a command tells the
//! controller where its data is.
//!
//! PRP1 holds the first address (with an offset, dword aligned); PRP2 is the
//! second page when the transfer touches exactly two, else the address of a
//! PRP list. A list page holds 512 entries; when more are needed, its last
//! entry points to the next list page (chaining). All this is pure index math
//! over device addresses, so it is built here and tested without a device.

use crate::access::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;
/// PRP entries in one list page.
pub const ENTRIES_PER_PAGE: usize = PAGE_SIZE / 8;

/// The two data pointer fields of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prp {
    pub prp1: u64,
    pub prp2: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrpError {
    #[error("transfer of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("data address {0:#x} is not dword aligned")]
    Misaligned(u64),
    #[error("transfer needs {needed} PRP list pages but {available} are reserved")]
    ListTooShort { needed: usize, available: usize },
}

/// Memory pages a transfer of `len` bytes at `iova` touches.
pub fn pages_spanned(iova: u64, len: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let first = (iova % PAGE) as usize;
    (first + len).div_ceil(PAGE_SIZE)
}

/// PRP list pages needed to hold `entries` entries, with chaining.
pub fn list_pages_needed(entries: usize) -> usize {
    match entries {
        0 | 1 => 0,
        n if n <= ENTRIES_PER_PAGE => 1,
        n => 1 + (n - ENTRIES_PER_PAGE).div_ceil(ENTRIES_PER_PAGE - 1),
    }
}

/// PRP list pages to reserve per command slot so that any transfer of up to
/// `max_transfer` bytes, at any dword-aligned address, can be described.
pub fn list_pages_for_max_transfer(max_transfer: usize) -> usize {
    // Worst case: an unaligned start touches one page more than the length.
    let pages = max_transfer.div_ceil(PAGE_SIZE) + 1;
    list_pages_needed(pages - 1)
}

/// Builds the data pointer of a transfer of `len` bytes at device address
/// `iova` (contiguous in IOVA space).
///
/// `list_base` is the page-aligned device address of `list_count` contiguous
/// PRP list pages reserved for this command; `write_entry(page, index, value)` stores entry
/// `index` of list page `page`. Requests larger than `max_transfer` (from
/// MDTS) are rejected before anything is written.
pub fn build(
    iova: u64,
    len: usize,
    max_transfer: usize,
    list_base: u64,
    list_count: usize,
    mut write_entry: impl FnMut(usize, usize, u64),
) -> Result<Prp, PrpError> {
    if len > max_transfer {
        return Err(PrpError::TooLarge {
            len,
            max: max_transfer,
        });
    }
    if iova & 3 != 0 {
        return Err(PrpError::Misaligned(iova));
    }
    let first_len = (PAGE - iova % PAGE) as usize;
    if len <= first_len {
        return Ok(Prp {
            prp1: iova,
            prp2: 0,
        });
    }
    let second = (iova & !(PAGE - 1)) + PAGE;
    let entries = (len - first_len).div_ceil(PAGE_SIZE);
    if entries == 1 {
        return Ok(Prp {
            prp1: iova,
            prp2: second,
        });
    }
    let needed = list_pages_needed(entries);
    if needed > list_count {
        return Err(PrpError::ListTooShort {
            needed,
            available: list_count,
        });
    }
    let (mut page, mut slot) = (0usize, 0usize);
    for k in 0..entries {
        let remaining = entries - k;
        if slot == ENTRIES_PER_PAGE - 1 && remaining > 1 {
            page += 1;
            write_entry(page - 1, slot, list_base + (page as u64) * PAGE);
            slot = 0;
        }
        write_entry(page, slot, second + (k as u64) * PAGE);
        slot += 1;
    }
    Ok(Prp {
        prp1: iova,
        prp2: list_base,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const MAX: usize = 8 << 20;
    const DATA: u64 = 0x1_0000_0000;
    const LISTS: [u64; 4] = [0x9000_0000, 0x9000_1000, 0x9000_2000, 0x9000_3000];
    const LIST_BASE: u64 = LISTS[0];

    fn run(iova: u64, len: usize) -> (Result<Prp, PrpError>, BTreeMap<(usize, usize), u64>) {
        let mut entries = BTreeMap::new();
        let prp = build(iova, len, MAX, LIST_BASE, LISTS.len(), |p, i, v| {
            assert!(entries.insert((p, i), v).is_none(), "entry written twice");
        });
        (prp, entries)
    }

    #[test]
    fn single_page_uses_prp1_only() {
        let (prp, entries) = run(DATA, 4096);
        assert_eq!(
            prp.unwrap(),
            Prp {
                prp1: DATA,
                prp2: 0
            }
        );
        assert!(entries.is_empty());
    }

    #[test]
    fn two_pages_put_the_second_page_in_prp2() {
        let (prp, entries) = run(DATA, 8192);
        assert_eq!(
            prp.unwrap(),
            Prp {
                prp1: DATA,
                prp2: DATA + 4096
            }
        );
        assert!(entries.is_empty());
    }

    #[test]
    fn offset_in_first_page_shifts_the_page_count() {
        // 4 KiB starting 512 bytes into a page touches two pages.
        let (prp, _) = run(DATA + 512, 4096);
        assert_eq!(
            prp.unwrap(),
            Prp {
                prp1: DATA + 512,
                prp2: DATA + 4096
            }
        );
        // 3.5 KiB starting 512 bytes in fits in the first page.
        let (prp, _) = run(DATA + 512, 3584);
        assert_eq!(prp.unwrap().prp2, 0);
    }

    #[test]
    fn three_pages_use_a_prp_list() {
        let (prp, entries) = run(DATA, 12288);
        assert_eq!(
            prp.unwrap(),
            Prp {
                prp1: DATA,
                prp2: LISTS[0]
            }
        );
        let want: BTreeMap<_, _> = [((0, 0), DATA + 4096), ((0, 1), DATA + 8192)].into();
        assert_eq!(entries, want);
    }

    #[test]
    fn exactly_one_full_list_page_needs_no_chain() {
        // PRP1 + 512 list entries = 513 pages.
        let (prp, entries) = run(DATA, 513 * 4096);
        assert_eq!(prp.unwrap().prp2, LISTS[0]);
        assert_eq!(entries.len(), 512);
        assert_eq!(entries[&(0, 511)], DATA + 512 * 4096);
        assert!(!entries.keys().any(|&(p, _)| p > 0));
    }

    #[test]
    fn long_transfer_chains_list_pages() {
        // PRP1 + 513 entries: 511 on page 0, a pointer, 2 on page 1.
        let (prp, entries) = run(DATA, 514 * 4096);
        assert_eq!(prp.unwrap().prp2, LISTS[0]);
        assert_eq!(entries[&(0, 510)], DATA + 511 * 4096);
        assert_eq!(entries[&(0, 511)], LISTS[1], "last entry chains");
        assert_eq!(entries[&(1, 0)], DATA + 512 * 4096);
        assert_eq!(entries[&(1, 1)], DATA + 513 * 4096);
        assert_eq!(entries.len(), 514);
    }

    #[test]
    fn list_page_count_matches_chaining() {
        assert_eq!(list_pages_needed(1), 0);
        assert_eq!(list_pages_needed(512), 1);
        assert_eq!(list_pages_needed(513), 2);
        assert_eq!(list_pages_needed(1023), 2);
        assert_eq!(list_pages_needed(1024), 3);
        assert_eq!(list_pages_for_max_transfer(4096), 0);
        assert_eq!(list_pages_for_max_transfer(128 << 10), 1);
        assert_eq!(list_pages_for_max_transfer(2 << 20), 1);
        assert_eq!(list_pages_for_max_transfer(4 << 20), 3);
    }

    #[test]
    fn mdts_limit_rejects_before_writing_anything() {
        let mut wrote = false;
        let err = build(DATA, 128 << 10, 64 << 10, LIST_BASE, 4, |_, _, _| {
            wrote = true
        });
        assert_eq!(
            err,
            Err(PrpError::TooLarge {
                len: 128 << 10,
                max: 64 << 10
            })
        );
        assert!(!wrote);
    }

    #[test]
    fn misaligned_address_and_short_list_are_errors() {
        assert_eq!(run(DATA + 2, 512).0, Err(PrpError::Misaligned(DATA + 2)));
        let err = build(DATA, 12288, MAX, LIST_BASE, 0, |_, _, _| {});
        assert_eq!(
            err,
            Err(PrpError::ListTooShort {
                needed: 1,
                available: 0
            })
        );
    }
}
