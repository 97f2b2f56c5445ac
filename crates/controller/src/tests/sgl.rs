//! I/O data through SGLs (PSDT 01b), end to end through the controller.

use super::*;

/// An SGL descriptor: address, length, type (byte 15, bits 7:4).
fn desc(addr: u64, len: u32, kind: u8) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&addr.to_le_bytes());
    b[8..12].copy_from_slice(&len.to_le_bytes());
    b[15] = kind << 4;
    b
}

/// `rw` with SGL Entry 1 `sgl1` in DPTR and PSDT 01b.
fn rw_sgl(op: NvmOpcode, slba: u64, nlb: u32, sgl1: [u8; 16]) -> Command {
    let mut c = rw(op, 1, slba, nlb, 0, 0);
    c.cdw0 = U32::new(c.cdw0.get() | 1 << 14);
    let mut dptr = [0u8; 8];
    dptr.copy_from_slice(&sgl1[..8]);
    c.prp1 = U64::new(u64::from_le_bytes(dptr));
    dptr.copy_from_slice(&sgl1[8..]);
    c.prp2 = U64::new(u64::from_le_bytes(dptr));
    c
}

const SEGMENT_LIST: u64 = DATA + 0x40000;
const LAST_SEGMENT: u8 = 0x3;

#[test]
fn sgl_write_and_read_with_a_bit_bucket_move_the_right_bytes() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(h.admin(identify(1, 0, DATA)).status(), Status::SUCCESS);
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(id.sgls.get() & 0x3, 1, "SGLS: supported, no alignment");
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 1) as u8).collect();
    // Write 16 blocks from two pieces, the first not page aligned.
    h.mem.write(DATA + 0x123, &data[..3000]).unwrap();
    h.mem.write(DATA + 0x10000, &data[3000..]).unwrap();
    let list = [
        desc(DATA + 0x123, 3000, 0),
        desc(DATA + 0x10000, 8192 - 3000, 0),
    ];
    h.mem.write(SEGMENT_LIST, list.as_flattened()).unwrap();
    let c = h.submit(
        1,
        rw_sgl(
            NvmOpcode::WRITE,
            4,
            16,
            desc(SEGMENT_LIST, 32, LAST_SEGMENT),
        ),
    );
    assert_eq!(c.status(), Status::SUCCESS);
    let mut back = vec![0u8; 8192];
    h.backend.read(4 * 512, &mut back).unwrap();
    assert_eq!(back, data, "the backend holds both pieces in order");

    // Read them back skipping the middle 4 KiB into a bit bucket.
    let out = DATA + 0x20000;
    h.mem.zero(out, 0x3000).unwrap();
    let list = [
        desc(out, 2048, 0),
        desc(0, 4096, 1),
        desc(out + 0x2000, 2048, 0),
    ];
    h.mem.write(SEGMENT_LIST, list.as_flattened()).unwrap();
    let c = h.submit(
        1,
        rw_sgl(NvmOpcode::READ, 4, 16, desc(SEGMENT_LIST, 48, LAST_SEGMENT)),
    );
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(h.read_mem(out, 2048), data[..2048]);
    assert_eq!(
        h.read_mem(out + 2048, 0x2000 - 2048),
        vec![0; 0x2000 - 2048],
        "bucket bytes land nowhere"
    );
    assert_eq!(h.read_mem(out + 0x2000, 2048), data[6144..]);
    assert_eq!(h.ctrl.stats().sgl_commands, 2);
}

#[test]
fn sgl_errors_complete_with_their_status_and_touch_nothing() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    let dnr = |s: Status| s.with_dnr(true);
    // Shorter than the transfer.
    let c = h.submit(1, rw_sgl(NvmOpcode::WRITE, 0, 8, desc(DATA, 512, 0)));
    assert_eq!(c.status(), dnr(Status::DATA_SGL_LENGTH_INVALID));
    // A segment whose length is not a multiple of 16.
    let c = h.submit(
        1,
        rw_sgl(NvmOpcode::READ, 0, 8, desc(SEGMENT_LIST, 20, LAST_SEGMENT)),
    );
    assert_eq!(c.status(), dnr(Status::INVALID_SGL_SEGMENT_DESCRIPTOR));
    // PSDT 10b (metadata SGL) is not offered; admin commands take PRPs only.
    let mut c = rw(NvmOpcode::READ, 1, 0, 8, DATA, 0);
    c.cdw0 = U32::new(c.cdw0.get() | 2 << 14);
    assert_eq!(h.submit(1, c).status(), dnr(Status::INVALID_FIELD));
    let mut c = identify(0x01, 0, DATA);
    c.cdw0 = U32::new(c.cdw0.get() | 1 << 14);
    assert_eq!(h.admin(c).status(), dnr(Status::INVALID_FIELD));
    let mut back = vec![0u8; 4096];
    h.backend.read(0, &mut back).unwrap();
    assert_eq!(back, vec![0; 4096], "nothing written");
}
