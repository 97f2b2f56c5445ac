//! Verify and Write Uncorrectable: what reads see of marked blocks, what
//! clears the marks, and the limits of both commands.

use vnvme_blockdev::NullDevice;

use crate::vendor::CHECKSUM_LBA_RANGE;

use super::*;
use crate::memory::GuestAddress;

fn unrecovered() -> Status {
    Status::UNRECOVERED_READ_ERROR.with_dnr(true)
}

fn out_of_range() -> Status {
    Status::LBA_OUT_OF_RANGE.with_dnr(true)
}

/// Verify or Write Uncorrectable of `nlb` blocks at `slba`: no data pointer.
fn blocks(op: NvmOpcode, slba: u64, nlb: u32) -> Command {
    rw(op, 1, slba, nlb, 0, 0)
}

/// SMART / Health log Media and Data Integrity Errors (bytes 175:160).
fn media_errors(h: &mut Host) -> u64 {
    let log = DATA + 0x80000;
    assert!(h.admin(get_log(0x02, 128, 0, log)).status().is_success());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.read_mem(log + 160, 8));
    u64::from_le_bytes(b)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn verify_checks_written_blocks_and_transfers_nothing() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    h.backend.write(0, &pattern(8192, 1)).unwrap();
    // A host buffer the command must not touch, though PRP1 points at it.
    h.mem.write(GuestAddress(DATA), &[0x5A; 8192]).unwrap();
    let mut v = rw(NvmOpcode::VERIFY, 1, 0, 16, DATA, DATA + 4096);
    assert_eq!(h.submit(1, v).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA, 8192), vec![0x5A; 8192]);
    // The whole namespace, the largest NLB there is.
    v = blocks(NvmOpcode::VERIFY, 0, NS_BLOCKS as u32);
    assert_eq!(h.submit(1, v).status(), Status::SUCCESS);
    assert_eq!(h.ctrl.stats().io_commands.get("verify"), Some(&2));
}

#[test]
fn verify_and_write_uncorrectable_past_the_end_are_lba_out_of_range() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    for op in [NvmOpcode::VERIFY, NvmOpcode::WRITE_UNCORRECTABLE] {
        let last = blocks(op, NS_BLOCKS - 1, 1);
        assert_eq!(h.submit(1, last).status(), Status::SUCCESS, "{op}");
        let past = blocks(op, NS_BLOCKS - 1, 2);
        assert_eq!(h.submit(1, past).status(), out_of_range(), "{op}");
        let wraps = blocks(op, u64::MAX, 2);
        assert_eq!(h.submit(1, wraps).status(), out_of_range(), "{op}");
    }
    // The one Write Uncorrectable that succeeded marked only the last block.
    let v = blocks(NvmOpcode::VERIFY, NS_BLOCKS - 2, 1);
    assert_eq!(h.submit(1, v).status(), Status::SUCCESS);
    let v = blocks(NvmOpcode::VERIFY, NS_BLOCKS - 2, 2);
    assert_eq!(h.submit(1, v).status(), unrecovered());
}

#[test]
fn uncorrectable_blocks_fail_every_read_until_written() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    let data = pattern(64 * 512, 7);
    h.mem.write(GuestAddress(DATA), &data[..16 * 512]).unwrap();
    assert!(h
        .submit(1, rw(NvmOpcode::WRITE, 1, 0, 16, DATA, DATA + 4096))
        .status()
        .is_success());
    let before = media_errors(&mut h);
    // Blocks 4..8 marked.
    let wu = blocks(NvmOpcode::WRITE_UNCORRECTABLE, 4, 4);
    assert_eq!(h.submit(1, wu).status(), Status::SUCCESS);

    let read = |slba, nlb| rw(NvmOpcode::READ, 1, slba, nlb, DATA + 0x10000, 0);
    assert_eq!(h.submit(1, read(6, 1)).status(), unrecovered());
    assert_eq!(h.submit(1, read(0, 5)).status(), unrecovered(), "touches 4");
    assert_eq!(h.submit(1, read(7, 2)).status(), unrecovered(), "touches 7");
    assert_eq!(h.submit(1, read(0, 4)).status(), Status::SUCCESS);
    assert_eq!(h.submit(1, read(8, 8)).status(), Status::SUCCESS);
    let compare = rw(NvmOpcode::COMPARE, 1, 4, 1, DATA, 0);
    assert_eq!(h.submit(1, compare).status(), unrecovered());
    let verify = blocks(NvmOpcode::VERIFY, 0, 16);
    assert_eq!(h.submit(1, verify).status(), unrecovered());
    // A vendor command reading blocks: the built-in CRC32C of a range.
    let checksum = rw(NvmOpcode(CHECKSUM_LBA_RANGE), 1, 0, 16, 0, 0);
    assert_eq!(h.submit(1, checksum).status(), unrecovered());
    assert_eq!(media_errors(&mut h), before + 6, "each failed read counted");

    // Write block 5: it reads back what was written; 4, 6 and 7 still fail.
    h.mem
        .write(GuestAddress(DATA + 0x20000), &[0xC3; 512])
        .unwrap();
    let write = rw(NvmOpcode::WRITE, 1, 5, 1, DATA + 0x20000, 0);
    assert_eq!(h.submit(1, write).status(), Status::SUCCESS);
    assert_eq!(h.submit(1, read(5, 1)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA + 0x10000, 512), vec![0xC3; 512]);
    assert_eq!(h.submit(1, read(4, 1)).status(), unrecovered());
    assert_eq!(h.submit(1, read(6, 1)).status(), unrecovered());
    // Write Zeroes clears 4; deallocation (Write Zeroes DEAC) clears 6.
    let wz = rw(NvmOpcode::WRITE_ZEROES, 1, 4, 1, 0, 0);
    assert_eq!(h.submit(1, wz).status(), Status::SUCCESS);
    let mut deac = rw(NvmOpcode::WRITE_ZEROES, 1, 6, 1, 0, 0);
    deac.cdw12 = U32::new(1 << 25);
    assert_eq!(h.submit(1, deac).status(), Status::SUCCESS);
    assert_eq!(h.submit(1, read(4, 1)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA + 0x10000, 512), vec![0; 512]);
    assert_eq!(h.submit(1, read(6, 1)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA + 0x10000, 512), vec![0; 512]);
    assert_eq!(h.submit(1, verify).status(), unrecovered(), "7 still");

    // Dataset Management deallocate clears 7: everything verifies again.
    let mut range = [0u8; 16];
    range[4..8].copy_from_slice(&1u32.to_le_bytes());
    range[8..16].copy_from_slice(&7u64.to_le_bytes());
    h.mem.write(GuestAddress(DATA + 0x30000), &range).unwrap();
    let mut dsm = rw(NvmOpcode::DATASET_MANAGEMENT, 1, 0, 1, DATA + 0x30000, 0);
    dsm.cdw10 = U32::new(0);
    dsm.cdw11 = U32::new(1 << 2);
    dsm.cdw12 = U32::new(0);
    assert_eq!(h.submit(1, dsm).status(), Status::SUCCESS);
    assert_eq!(h.submit(1, verify).status(), Status::SUCCESS);
    assert_eq!(h.submit(1, checksum).status(), Status::SUCCESS);
    // The blocks never written since stay as they were.
    assert_eq!(h.submit(1, read(0, 4)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA + 0x10000, 2048), data[..2048]);
}

#[test]
fn null_backend_verifies_unless_marked() {
    let backend = Arc::new(NullDevice::new(NS_BLOCKS * 512));
    let mut h = Host::enabled_on(config(), backend);
    h.create_pair(1, 16);
    let verify = blocks(NvmOpcode::VERIFY, 0, 64);
    assert_eq!(h.submit(1, verify).status(), Status::SUCCESS);
    let wu = blocks(NvmOpcode::WRITE_UNCORRECTABLE, 63, 1);
    assert_eq!(h.submit(1, wu).status(), Status::SUCCESS);
    assert_eq!(h.submit(1, verify).status(), unrecovered());
    let read = rw(NvmOpcode::READ, 1, 60, 4, DATA, 0);
    assert_eq!(h.submit(1, read).status(), unrecovered());
    // A write moves no data on the null device, but the block is written.
    let write = rw(NvmOpcode::WRITE, 1, 63, 1, DATA, 0);
    assert_eq!(h.submit(1, write).status(), Status::SUCCESS);
    assert_eq!(h.submit(1, verify).status(), Status::SUCCESS);
    assert_eq!(h.submit(1, read).status(), Status::SUCCESS);
}

#[test]
fn identify_and_effects_log_report_verify_copy_and_write_uncorrectable() {
    let mut h = Host::new();
    h.enable();
    assert!(h.admin(identify(1, 0, DATA)).status().is_success());
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    let oncs = id.oncs.get();
    assert_eq!(oncs & (1 << 1), 1 << 1, "ONCS Write Uncorrectable");
    assert_eq!(oncs & (1 << 7), 1 << 7, "ONCS Verify");
    assert_eq!(oncs & (1 << 8), 1 << 8, "ONCS Copy");
    assert_eq!(id.ocfs.get(), 1, "OCFS: source range format 0h only");
    assert!(h.admin(identify(0, 1, DATA)).status().is_success());
    let ns = IdentifyNamespace::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(ns.mssrl.get(), crate::namespace::MSSRL);
    assert_eq!(ns.mcl.get(), crate::namespace::MCL);
    assert_eq!(ns.msrc_z, crate::namespace::MSRC_Z);
    // Commands Supported and Effects (05h): I/O command dwords at 1024.
    assert!(h.admin(get_log(0x05, 1024, 0, DATA)).status().is_success());
    let effects = |op: NvmOpcode| {
        let at = DATA + 1024 + u64::from(op.0) * 4;
        u32::from_le_bytes(h.read_mem(at, 4).try_into().unwrap())
    };
    // CSUPP (bit 0), LBCC (bit 1): content changes, but not for Verify.
    assert_eq!(effects(NvmOpcode::WRITE_UNCORRECTABLE), 0b11);
    assert_eq!(effects(NvmOpcode::COPY), 0b11);
    assert_eq!(effects(NvmOpcode::VERIFY), 0b01);
}
