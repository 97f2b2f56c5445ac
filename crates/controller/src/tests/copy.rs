//! Copy: source ranges to one destination, the limits Identify Namespace
//! reports, ranges past the end, uncorrectable sources, every backend.

use vnvme_blockdev::{FileDevice, NullDevice};
use vnvme_spec::range::CopyRangeF0;

use super::*;
use crate::memory::GuestAddress;
use crate::namespace::{MCL, MSRC_Z, MSSRL};

/// Where the source range entries go.
const RANGES: u64 = DATA + 0x40000;

fn size_limit() -> Status {
    Status::COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr(true)
}

/// Copy of `ranges` (slba, nlb) to `sdlba`, entries written at [`RANGES`].
fn copy(h: &Host, sdlba: u64, ranges: &[(u64, u16)]) -> Command {
    let entries: Vec<u8> = ranges
        .iter()
        .flat_map(|&(slba, nlb)| CopyRangeF0::new(slba, nlb).as_bytes().to_vec())
        .collect();
    h.mem.write(GuestAddress(RANGES), &entries).unwrap();
    let mut c = cmd(NvmOpcode::COPY.0);
    c.nsid = U32::new(1);
    c.prp1 = U64::new(RANGES);
    // 128 entries fill one page: PRP2 for more.
    c.prp2 = U64::new(RANGES + 4096);
    c.set_slba(sdlba);
    c.cdw12 = U32::new(u32::try_from(ranges.len()).unwrap().saturating_sub(1));
    c
}

fn blocks_of(h: &Host, slba: u64, nlb: u64) -> Vec<u8> {
    let mut b = vec![0u8; (nlb * 512) as usize];
    h.backend.read(slba * 512, &mut b).unwrap();
    b
}

/// Block `i` of the RAM namespace filled with `i as u8`, blocks 0..n.
fn fill(h: &Host, n: u64) {
    for i in 0..n {
        h.backend.write(i * 512, &[i as u8; 512]).unwrap();
    }
}

fn host() -> Host {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    h
}

#[test]
fn copy_concatenates_the_sources_into_the_destination() {
    let mut h = host();
    fill(&h, 64);
    let c = copy(&h, 1000, &[(10, 2), (3, 1), (40, 5)]);
    let done = h.submit(1, c);
    assert_eq!(done.status(), Status::SUCCESS);
    assert_eq!(done.dw0.get(), 0);
    let mut want = blocks_of(&h, 10, 2);
    want.extend(blocks_of(&h, 3, 1));
    want.extend(blocks_of(&h, 40, 5));
    assert_eq!(blocks_of(&h, 1000, 8), want);
    assert_eq!(blocks_of(&h, 1008, 1), vec![0; 512], "nothing past it");
    // The sources are unchanged.
    assert_eq!(blocks_of(&h, 40, 1), vec![40; 512]);
}

#[test]
fn copy_with_nr_zero_copies_one_range() {
    let mut h = host();
    fill(&h, 8);
    let c = copy(&h, 500, &[(7, 1)]);
    assert_eq!(c.cdw12.get() & 0xFF, 0, "NR is 0's based");
    assert_eq!(h.submit(1, c).status(), Status::SUCCESS);
    assert_eq!(blocks_of(&h, 500, 1), vec![7; 512]);
}

#[test]
fn copy_onto_overlapping_ranges_writes_the_sources_as_they_were() {
    let mut h = host();
    fill(&h, 32);
    let before = blocks_of(&h, 0, 32);
    // Destination 4..16 overlaps source 0..8 and lies over source 10..14.
    let c = copy(&h, 4, &[(0, 8), (10, 4)]);
    assert_eq!(h.submit(1, c).status(), Status::SUCCESS);
    let mut want = before[..8 * 512].to_vec();
    want.extend_from_slice(&before[10 * 512..14 * 512]);
    assert_eq!(blocks_of(&h, 4, 12), want);
    assert_eq!(blocks_of(&h, 0, 4), before[..4 * 512]);
    // A source repeated, onto itself: unchanged.
    let c = copy(&h, 20, &[(20, 2), (20, 2)]);
    assert_eq!(h.submit(1, c).status(), Status::SUCCESS);
    assert_eq!(blocks_of(&h, 20, 2), before[20 * 512..22 * 512]);
    assert_eq!(blocks_of(&h, 22, 2), before[20 * 512..22 * 512]);
}

#[test]
fn copy_beyond_msrc_mssrl_or_mcl_is_command_size_limit_exceeded() {
    const DEST: u64 = 512;
    let mut h = host();
    fill(&h, 8);
    let before = blocks_of(&h, DEST, u64::from(MCL));
    let entries = usize::from(MSRC_Z) + 1;
    // One entry more than MSRC allows.
    let c = copy(&h, DEST, &vec![(0, 1); entries + 1]);
    assert_eq!(h.submit(1, c).status(), size_limit(), "MSRC");
    // One range one block longer than MSSRL.
    let c = copy(&h, DEST, &[(0, 1), (0, MSSRL + 1)]);
    assert_eq!(h.submit(1, c).status(), size_limit(), "MSSRL");
    // MSSRL-long ranges adding up to one block past MCL.
    let mut ranges = vec![(0, MSSRL); (MCL / u32::from(MSSRL)) as usize];
    ranges.push((0, 1));
    let c = copy(&h, DEST, &ranges);
    assert_eq!(h.submit(1, c).status(), size_limit(), "MCL");
    assert_eq!(
        blocks_of(&h, DEST, u64::from(MCL)),
        before,
        "nothing written"
    );
    // At every limit at once: MSRC + 1 entries, MCL blocks, MSSRL-long
    // ranges, then short ones, each from block 1.
    let full = (MCL / u32::from(MSSRL)) as usize - 1;
    let rest = MCL - full as u32 * u32::from(MSSRL);
    let short = rest / (entries - full) as u32;
    let last = rest - short * (entries - full - 1) as u32;
    assert!(short >= 1 && last <= u32::from(MSSRL) && last < 16);
    let mut ranges = vec![(1, MSSRL); full];
    ranges.extend(vec![(1, short as u16); entries - full - 1]);
    ranges.push((1, last as u16));
    assert_eq!(ranges.len(), entries);
    fill(&h, 16);
    let c = copy(&h, DEST, &ranges);
    assert_eq!(h.submit(1, c).status(), Status::SUCCESS);
    assert_eq!(blocks_of(&h, DEST, 1), vec![1; 512]);
    let end = DEST + u64::from(MCL);
    assert_eq!(blocks_of(&h, end - 1, 1), vec![last as u8; 512]);
    assert_eq!(blocks_of(&h, end, 1), vec![0; 512]);
}

#[test]
fn copy_ranges_past_the_end_are_lba_out_of_range_and_write_nothing() {
    let mut h = host();
    fill(&h, 8);
    let out_of_range = Status::LBA_OUT_OF_RANGE.with_dnr(true);
    let c = copy(&h, 100, &[(0, 1), (NS_BLOCKS - 1, 2)]);
    assert_eq!(h.submit(1, c).status(), out_of_range, "source");
    let c = copy(&h, 100, &[(u64::MAX, 1)]);
    assert_eq!(h.submit(1, c).status(), out_of_range, "source wraps");
    let c = copy(&h, NS_BLOCKS - 2, &[(0, 1), (1, 2)]);
    assert_eq!(h.submit(1, c).status(), out_of_range, "destination");
    let c = copy(&h, u64::MAX, &[(1, 1)]);
    assert_eq!(h.submit(1, c).status(), out_of_range, "destination wraps");
    assert_eq!(blocks_of(&h, 100, 1), vec![0; 512]);
    assert_eq!(blocks_of(&h, NS_BLOCKS - 2, 2), vec![0; 1024]);
    // The last blocks exactly: fine.
    let c = copy(&h, NS_BLOCKS - 3, &[(1, 1), (2, 2)]);
    assert_eq!(h.submit(1, c).status(), Status::SUCCESS);
    assert_eq!(
        blocks_of(&h, NS_BLOCKS - 3, 3),
        [[1u8; 512], [2; 512], [3; 512]].concat()
    );
}

#[test]
fn copy_with_another_descriptor_format_or_bad_entries_pointer_fails() {
    let mut h = host();
    for format in [1u32, 2, 3, 0xF] {
        let mut c = copy(&h, 100, &[(0, 1)]);
        c.cdw12 = U32::new(format << 8);
        let done = h.submit(1, c);
        assert_eq!(
            done.status(),
            Status::INVALID_FIELD.with_dnr(true),
            "{format}"
        );
    }
    let mut c = copy(&h, 100, &[(0, 1)]);
    c.prp1 = U64::new(MEM_SIZE as u64 + 0x1000);
    let done = h.submit(1, c);
    assert_eq!(done.status(), Status::DATA_TRANSFER_ERROR.with_dnr(true));
    // Entries across a page: PRP1 at the page's last 32 bytes, PRP2 next.
    fill(&h, 8);
    let mut c = copy(&h, 200, &[(5, 1), (6, 1)]);
    let entries = h.read_mem(RANGES, 64);
    h.mem
        .write(GuestAddress(RANGES + 0x10000 - 32), &entries[..32])
        .unwrap();
    h.mem
        .write(GuestAddress(RANGES + 0x20000), &entries[32..])
        .unwrap();
    c.prp1 = U64::new(RANGES + 0x10000 - 32);
    c.prp2 = U64::new(RANGES + 0x20000);
    assert_eq!(h.submit(1, c).status(), Status::SUCCESS);
    assert_eq!(blocks_of(&h, 200, 2), [[5u8; 512], [6; 512]].concat());
}

#[test]
fn copy_from_an_uncorrectable_block_fails_and_onto_one_clears_it() {
    let mut h = host();
    fill(&h, 16);
    let wu = rw(NvmOpcode::WRITE_UNCORRECTABLE, 1, 5, 1, 0, 0);
    assert_eq!(h.submit(1, wu).status(), Status::SUCCESS);
    let c = copy(&h, 300, &[(0, 2), (4, 2)]);
    let done = h.submit(1, c);
    assert_eq!(done.status(), Status::UNRECOVERED_READ_ERROR.with_dnr(true));
    assert_eq!(done.dw0.get(), 0, "no source range entry copied");
    assert_eq!(blocks_of(&h, 300, 4), vec![0; 2048], "nothing written");
    // Block 5 as a destination: written, so readable again.
    let c = copy(&h, 5, &[(9, 1)]);
    assert_eq!(h.submit(1, c).status(), Status::SUCCESS);
    let read = rw(NvmOpcode::READ, 1, 5, 1, DATA, 0);
    assert_eq!(h.submit(1, read).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA, 512), vec![9; 512]);
}

#[test]
fn copy_on_the_null_backend_checks_everything_and_moves_nothing() {
    let mut h = Host::enabled_on(config(), Arc::new(NullDevice::new(NS_BLOCKS * 512)));
    h.create_pair(1, 16);
    let c = copy(&h, 10, &[(0, 4)]);
    assert_eq!(h.submit(1, c).status(), Status::SUCCESS);
    let c = copy(&h, NS_BLOCKS, &[(0, 4)]);
    assert_eq!(
        h.submit(1, c).status(),
        Status::LBA_OUT_OF_RANGE.with_dnr(true)
    );
    let wu = rw(NvmOpcode::WRITE_UNCORRECTABLE, 1, 2, 1, 0, 0);
    assert_eq!(h.submit(1, wu).status(), Status::SUCCESS);
    let c = copy(&h, 10, &[(0, 4)]);
    assert_eq!(
        h.submit(1, c).status(),
        Status::UNRECOVERED_READ_ERROR.with_dnr(true)
    );
}

#[test]
fn copy_and_verify_on_the_file_backend_read_and_write_the_file() {
    let path = std::env::temp_dir().join(format!("vnvme-copy-test-{}.img", std::process::id()));
    let file = Arc::new(FileDevice::open(&path, Some(NS_BLOCKS * 512)).unwrap());
    let mut h = Host::enabled_on(config(), file.clone());
    h.create_pair(1, 16);
    let data: Vec<u8> = (0..8 * 512).map(|i| (i * 13 % 251) as u8).collect();
    h.mem.write(GuestAddress(DATA), &data).unwrap();
    let write = rw(NvmOpcode::WRITE, 1, 16, 8, DATA, DATA + 4096);
    assert_eq!(h.submit(1, write).status(), Status::SUCCESS);
    let c = copy(&h, 1000, &[(20, 4), (16, 4)]);
    assert_eq!(h.submit(1, c).status(), Status::SUCCESS);
    let verify = rw(NvmOpcode::VERIFY, 1, 0, NS_BLOCKS as u32, 0, 0);
    assert_eq!(h.submit(1, verify).status(), Status::SUCCESS);
    let mut back = vec![0u8; 8 * 512];
    file.read(1000 * 512, &mut back).unwrap();
    drop(h);
    drop(file);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(back[..2048], data[2048..]);
    assert_eq!(back[2048..], data[..2048]);
}
