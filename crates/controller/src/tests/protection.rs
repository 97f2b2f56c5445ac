//! End-to-end data protection: Identify DPC/DPS, Format NVM PI and PIL,
//! PRACT generating and stripping PI, PRCHK's guard, application tag and
//! reference tag checks per PI type, escapes, 16- and 64-bit guards.

use vnvme_spec::cdw::Prinfo;

use super::*;
use crate::memory::GuestAddress;
use crate::protection::{Guard, PiType, Protection, Tuple};
use crate::ConfigError;

const PAGE: u64 = DATA + 0x40000;
const BUF: u64 = DATA + 0x50000;
const META: u64 = DATA + 0x70000;
const RBUF: u64 = DATA + 0x80000;
const RMETA: u64 = DATA + 0xA0000;

const GUARD: u8 = 0b0100;
const APP: u8 = 0b0010;
const REF: u8 = 0b0001;
const PRACT: u8 = 0b1000;
const ALL: u8 = GUARD | APP | REF;

fn protected(index: u8, pi_type: PiType, first: bool, extended: bool) -> Host {
    let ns = NamespaceConfig::new(1, 4096, Arc::new(RamDevice::new(1 << 20)))
        .with_format(index)
        .with_extended_metadata(extended)
        .with_protection(Some(Protection { pi_type, first }));
    let mut h = Host::with_namespaces(config(), vec![ns]);
    h.enable();
    h.create_pair(1, 16);
    h
}

/// A Read or Write of `nlb` 4 KiB blocks at `slba` with data at BUF (a
/// PRP list is not needed up to two pages) and metadata at `mptr`.
#[allow(clippy::too_many_arguments)]
fn pi_rw(
    op: NvmOpcode,
    slba: u64,
    nlb: u32,
    prinfo: u8,
    ilbrt: u64,
    lbat: u16,
    lbatm: u16,
    data: u64,
    mptr: u64,
) -> Command {
    let mut c = rw(op, 1, slba, nlb, data, data + 4096);
    c.cdw12 = U32::new(c.cdw12.get() | u32::from(prinfo) << 26);
    c.cdw14 = U32::new(ilbrt as u32);
    c.cdw3 = U32::new((ilbrt >> 32) as u32);
    c.cdw15 = U32::new(u32::from(lbat) | u32::from(lbatm) << 16);
    c.mptr = U64::new(mptr);
    c
}

fn crc(guard: Guard, bytes: &[u8]) -> u64 {
    guard.checksum(bytes)
}

fn block(seed: u8) -> Vec<u8> {
    (0..4096u32).map(|i| (i as u8).wrapping_mul(seed)).collect()
}

/// The 8-byte (16-bit guard) tuple of `data` with tags `app`, `reference`.
fn tuple16(data: &[u8], app: u16, reference: u64) -> Vec<u8> {
    let mut t = vec![0; 8];
    Tuple {
        guard: crc(Guard::Crc16, data),
        app,
        reference,
    }
    .store(Guard::Crc16, &mut t);
    t
}

#[test]
fn identify_reports_capabilities_and_the_configured_settings() {
    let mut h = protected(1, PiType::Type1, true, false);
    h.admin(identify(0x00, 1, PAGE));
    let id = IdentifyNamespace::read_from_bytes(&h.read_mem(PAGE, 4096)).unwrap();
    assert_eq!(id.dpc, 0x1F, "types 1-3, PI first or last");
    assert_eq!(id.dps, 1 | 1 << 3, "type 1, first");
    // Format NVM: 4096 + 8, PI type 2, PIL 0 (last).
    assert_eq!(h.admin(format_nvm(4 | 2 << 5)).status(), Status::SUCCESS);
    h.admin(identify(0x00, 1, PAGE));
    let id = IdentifyNamespace::read_from_bytes(&h.read_mem(PAGE, 4096)).unwrap();
    assert_eq!((id.format_index(), id.dps), (4, 2));
    // PIL 1, type 3, 64-bit guard format.
    assert_eq!(
        h.admin(format_nvm(6 | 3 << 5 | 1 << 8)).status(),
        Status::SUCCESS
    );
    h.admin(identify(0x00, 1, PAGE));
    let id = IdentifyNamespace::read_from_bytes(&h.read_mem(PAGE, 4096)).unwrap();
    assert_eq!((id.format_index(), id.dps), (6, 3 | 1 << 3));
    // No PI: DPS 0.
    assert_eq!(h.admin(format_nvm(4)).status(), Status::SUCCESS);
    h.admin(identify(0x00, 1, PAGE));
    let id = IdentifyNamespace::read_from_bytes(&h.read_mem(PAGE, 4096)).unwrap();
    assert_eq!(id.dps, 0);
}

fn format_nvm(cdw10: u32) -> Command {
    let mut c = cmd(AdminOpcode::FORMAT_NVM.0);
    c.nsid = U32::new(1);
    c.cdw10 = U32::new(cdw10);
    c
}

#[test]
fn format_nvm_refuses_pi_without_room_for_it() {
    let mut h = protected(1, PiType::Type1, false, false);
    let invalid_format = Status::INVALID_FORMAT.with_dnr(true);
    assert_eq!(
        h.admin(format_nvm(3 | 1 << 5)).status(),
        invalid_format,
        "no metadata"
    );
    assert_eq!(
        h.admin(format_nvm(4 | 4 << 5)).status(),
        invalid_format,
        "PI 4"
    );
    assert_eq!(
        h.admin(format_nvm(4 | 7 << 5)).status(),
        invalid_format,
        "PI 7"
    );
}

#[test]
fn configuration_refuses_pi_without_room_for_it() {
    let ns = NamespaceConfig::new(1, 4096, Arc::new(RamDevice::new(1 << 20))).with_protection(
        Some(Protection {
            pi_type: PiType::Type1,
            first: false,
        }),
    );
    let err = Controller::new(config(), vec![ns]).err();
    assert_eq!(
        err,
        Some(ConfigError::ProtectionDoesNotFit {
            nsid: 1,
            index: 3,
            ms: 0,
            pi_size: 8
        })
    );
}

#[test]
fn pract_write_generates_pi_that_reads_back_and_checks() {
    let mut h = protected(4, PiType::Type1, false, false);
    let data: Vec<u8> = [block(3), block(5)].concat();
    h.mem.write(GuestAddress(BUF), &data).unwrap();
    // PRACT with 8 bytes of metadata: none moves; the controller makes it.
    let w = pi_rw(
        NvmOpcode::WRITE,
        7,
        2,
        PRACT | ALL,
        7,
        0x1234,
        0xFFFF,
        BUF,
        0,
    );
    assert_eq!(h.submit(1, w).status(), Status::SUCCESS);
    let r = pi_rw(NvmOpcode::READ, 7, 2, ALL, 7, 0x1234, 0xFFFF, RBUF, RMETA);
    assert_eq!(h.submit(1, r).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(RBUF, 8192), data);
    let want = [
        tuple16(&data[..4096], 0x1234, 7),
        tuple16(&data[4096..], 0x1234, 8),
    ]
    .concat();
    assert_eq!(h.read_mem(RMETA, 16), want);
    // A read with PRACT checks and strips: the metadata buffer is not touched.
    h.mem.write(GuestAddress(RMETA), &[0xEE; 16]).unwrap();
    let r = pi_rw(
        NvmOpcode::READ,
        7,
        2,
        PRACT | ALL,
        7,
        0x1234,
        0xFFFF,
        RBUF,
        RMETA,
    );
    assert_eq!(h.submit(1, r).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(RMETA, 16), vec![0xEE; 16]);
    // Checked against other tags, the same blocks fail.
    let r = pi_rw(NvmOpcode::READ, 7, 2, APP, 7, 0x1235, 0xFFFF, RBUF, RMETA);
    assert_eq!(
        h.submit(1, r).status(),
        Status::APPLICATION_TAG_CHECK_ERROR.with_dnr(true)
    );
    // ... unless the mask leaves out the bit that differs.
    let r = pi_rw(NvmOpcode::READ, 7, 2, APP, 7, 0x1235, 0xFFFE, RBUF, RMETA);
    assert_eq!(h.submit(1, r).status(), Status::SUCCESS);
}

/// Writes one block at `slba` with the PI tuple `pi` (PRACT 0), checking
/// what `prinfo` says.
fn write_with_pi(
    h: &mut Host,
    slba: u64,
    prinfo: u8,
    ilbrt: u64,
    data: &[u8],
    pi: &[u8],
) -> Status {
    h.mem.write(GuestAddress(BUF), data).unwrap();
    h.mem.write(GuestAddress(META), pi).unwrap();
    let w = pi_rw(
        NvmOpcode::WRITE,
        slba,
        1,
        prinfo,
        ilbrt,
        0x0A0B,
        0xFFFF,
        BUF,
        META,
    );
    h.submit(1, w).status()
}

#[test]
fn type1_checks_guard_application_and_reference_tags() {
    let mut h = protected(4, PiType::Type1, false, false);
    let data = block(7);
    let good = tuple16(&data, 0x0A0B, 3);
    assert_eq!(
        write_with_pi(&mut h, 3, ALL, 3, &data, &good),
        Status::SUCCESS
    );
    let mut bad_guard = good.clone();
    bad_guard[0] ^= 1;
    assert_eq!(
        write_with_pi(&mut h, 3, ALL, 3, &data, &bad_guard),
        Status::GUARD_CHECK_ERROR.with_dnr(true)
    );
    // Unchecked, the wrong guard is stored as is (and read back, unchecked).
    assert_eq!(
        write_with_pi(&mut h, 3, APP | REF, 3, &data, &bad_guard),
        Status::SUCCESS
    );
    let r = pi_rw(NvmOpcode::READ, 3, 1, GUARD, 3, 0, 0, RBUF, RMETA);
    assert_eq!(
        h.submit(1, r).status(),
        Status::GUARD_CHECK_ERROR.with_dnr(true)
    );
    let r = pi_rw(
        NvmOpcode::READ,
        3,
        1,
        APP | REF,
        3,
        0x0A0B,
        0xFFFF,
        RBUF,
        RMETA,
    );
    assert_eq!(h.submit(1, r).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(RMETA, 8), bad_guard);
    let wrong_app = tuple16(&data, 0x0A0C, 3);
    assert_eq!(
        write_with_pi(&mut h, 3, ALL, 3, &data, &wrong_app),
        Status::APPLICATION_TAG_CHECK_ERROR.with_dnr(true)
    );
    let wrong_ref = tuple16(&data, 0x0A0B, 4);
    assert_eq!(
        write_with_pi(&mut h, 3, ALL, 3, &data, &wrong_ref),
        Status::REFERENCE_TAG_CHECK_ERROR.with_dnr(true)
    );
    // Type 1: the initial reference tag must be the LBA.
    assert_eq!(
        write_with_pi(&mut h, 3, ALL, 4, &data, &wrong_ref),
        Status::INVALID_PROTECTION_INFORMATION.with_dnr(true)
    );
    // Escape: application tag FFFFh turns every check off.
    let mut escaped = tuple16(&data, 0xFFFF, 99);
    escaped[0] ^= 1;
    assert_eq!(
        write_with_pi(&mut h, 3, ALL, 3, &data, &escaped),
        Status::SUCCESS
    );
}

#[test]
fn type2_reference_tags_count_from_the_commands_initial_tag() {
    let mut h = protected(4, PiType::Type2, false, false);
    let data = block(9);
    // Any initial tag, here not the LBA.
    let pi = tuple16(&data, 0x0A0B, 1000);
    assert_eq!(
        write_with_pi(&mut h, 5, ALL, 1000, &data, &pi),
        Status::SUCCESS
    );
    let r = pi_rw(
        NvmOpcode::READ,
        5,
        1,
        ALL,
        1000,
        0x0A0B,
        0xFFFF,
        RBUF,
        RMETA,
    );
    assert_eq!(h.submit(1, r).status(), Status::SUCCESS);
    let r = pi_rw(NvmOpcode::READ, 5, 1, REF, 5, 0, 0, RBUF, RMETA);
    assert_eq!(
        h.submit(1, r).status(),
        Status::REFERENCE_TAG_CHECK_ERROR.with_dnr(true)
    );
}

#[test]
fn type3_does_not_check_reference_tags_and_escapes_with_both_tags() {
    let mut h = protected(4, PiType::Type3, false, false);
    let data = block(11);
    let pi = tuple16(&data, 0x0A0B, 0x5555);
    assert_eq!(
        write_with_pi(&mut h, 5, ALL, 0x7777, &data, &pi),
        Status::SUCCESS
    );
    // Application tag FFFFh alone is no escape in Type 3 ...
    let mut half = tuple16(&data, 0xFFFF, 0x5555);
    half[0] ^= 1;
    assert_eq!(
        write_with_pi(&mut h, 5, GUARD, 0, &data, &half),
        Status::GUARD_CHECK_ERROR.with_dnr(true)
    );
    // ... both tags all ones are.
    let mut both = tuple16(&data, 0xFFFF, 0xFFFF_FFFF);
    both[0] ^= 1;
    assert_eq!(
        write_with_pi(&mut h, 5, ALL, 0, &data, &both),
        Status::SUCCESS
    );
}

#[test]
fn unwritten_blocks_read_pi_of_ffh_and_pass_every_check() {
    let mut h = protected(4, PiType::Type1, false, false);
    let r = pi_rw(NvmOpcode::READ, 9, 2, ALL, 9, 0x1111, 0xFFFF, RBUF, RMETA);
    assert_eq!(h.submit(1, r).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(RBUF, 8192), vec![0; 8192]);
    assert_eq!(h.read_mem(RMETA, 16), vec![0xFF; 16]);
}

#[test]
fn guard_of_pi_last_covers_the_metadata_before_it() {
    // 4096 + 64, extended LBAs, PI in the last 8 bytes.
    let mut h = protected(5, PiType::Type1, false, true);
    let data = block(13);
    let user_meta = [0x42u8; 56];
    let mut lba = data.clone();
    lba.extend_from_slice(&user_meta);
    let pi = tuple16(&lba, 0x0A0B, 2);
    lba.extend_from_slice(&pi);
    h.mem.write(GuestAddress(BUF), &lba).unwrap();
    let w = pi_rw(NvmOpcode::WRITE, 2, 1, ALL, 2, 0x0A0B, 0xFFFF, BUF, 0);
    assert_eq!(h.submit(1, w).status(), Status::SUCCESS);
    // A guard over the data alone is wrong here.
    let mut data_only = data.clone();
    data_only.extend_from_slice(&user_meta);
    data_only.extend_from_slice(&tuple16(&data, 0x0A0B, 2));
    h.mem.write(GuestAddress(BUF), &data_only).unwrap();
    let w = pi_rw(NvmOpcode::WRITE, 2, 1, ALL, 2, 0x0A0B, 0xFFFF, BUF, 0);
    assert_eq!(
        h.submit(1, w).status(),
        Status::GUARD_CHECK_ERROR.with_dnr(true)
    );
    // PRACT with more metadata than PI: the host's metadata moves, the
    // controller fills in the tuple.
    h.mem.write(GuestAddress(BUF), &lba).unwrap();
    h.mem.write(GuestAddress(BUF + 4096 + 56), &[0; 8]).unwrap();
    let w = pi_rw(NvmOpcode::WRITE, 2, 1, PRACT, 2, 0x0A0B, 0xFFFF, BUF, 0);
    assert_eq!(h.submit(1, w).status(), Status::SUCCESS);
    let r = pi_rw(NvmOpcode::READ, 2, 1, ALL, 2, 0x0A0B, 0xFFFF, RBUF, 0);
    assert_eq!(h.submit(1, r).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(RBUF, 4160), lba);
}

#[test]
fn guard_64b_uses_crc64_and_48_bit_reference_tags() {
    // 4096 + 16, 64-bit guard, separate metadata, type 1 at an LBA with a
    // 48-bit reference tag is not reachable in 1 MiB: Type 2 is.
    let mut h = protected(6, PiType::Type2, true, false);
    let data = block(17);
    let reference = 0x1234_5678_9ABC_u64;
    let mut pi = vec![0; 16];
    Tuple {
        guard: crc(Guard::Crc64, &data),
        app: 0x0A0B,
        reference,
    }
    .store(Guard::Crc64, &mut pi);
    assert_eq!(
        write_with_pi(&mut h, 1, ALL, reference, &data, &pi),
        Status::SUCCESS
    );
    // The upper 16 bits of the tag come from CDW3: without them the tag
    // is wrong.
    assert_eq!(
        write_with_pi(&mut h, 1, ALL, reference & 0xFFFF_FFFF, &data, &pi),
        Status::REFERENCE_TAG_CHECK_ERROR.with_dnr(true)
    );
    let mut bad = pi.clone();
    bad[7] ^= 1;
    assert_eq!(
        write_with_pi(&mut h, 1, ALL, reference, &data, &bad),
        Status::GUARD_CHECK_ERROR.with_dnr(true)
    );
    // PRACT, 16 bytes of metadata: generated, stripped, checked.
    h.mem.write(GuestAddress(BUF), &data).unwrap();
    let w = pi_rw(NvmOpcode::WRITE, 2, 1, PRACT, 77, 0x0C0D, 0, BUF, 0);
    assert_eq!(h.submit(1, w).status(), Status::SUCCESS);
    let r = pi_rw(NvmOpcode::READ, 2, 1, ALL, 77, 0x0C0D, 0xFFFF, RBUF, RMETA);
    assert_eq!(h.submit(1, r).status(), Status::SUCCESS);
    let t = Tuple::load(Guard::Crc64, &h.read_mem(RMETA, 16));
    assert_eq!(
        (t.guard, t.app, t.reference),
        (crc(Guard::Crc64, &data), 0x0C0D, 77)
    );
}

#[test]
fn prinfo_fields_decode() {
    let p = Prinfo::from(PRACT | GUARD);
    assert!(p.pract() && p.prchk_guard() && !p.prchk_app() && !p.prchk_ref());
}
