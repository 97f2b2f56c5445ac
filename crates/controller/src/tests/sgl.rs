//! I/O data through SGLs (PSDT 01b), and data and metadata through SGLs
//! (PSDT 10b), end to end through the controller.

use vnvme_spec::identify::sgls;

use super::*;
use crate::memory::GuestAddress;

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
    h.mem
        .write(GuestAddress(DATA + 0x123), &data[..3000])
        .unwrap();
    h.mem
        .write(GuestAddress(DATA + 0x10000), &data[3000..])
        .unwrap();
    let list = [
        desc(DATA + 0x123, 3000, 0),
        desc(DATA + 0x10000, 8192 - 3000, 0),
    ];
    h.mem
        .write(GuestAddress(SEGMENT_LIST), list.as_flattened())
        .unwrap();
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
    h.mem.zero(GuestAddress(out), 0x3000).unwrap();
    let list = [
        desc(out, 2048, 0),
        desc(0, 4096, 1),
        desc(out + 0x2000, 2048, 0),
    ];
    h.mem
        .write(GuestAddress(SEGMENT_LIST), list.as_flattened())
        .unwrap();
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
    // PSDT 11b is reserved; admin commands take PRPs only.
    let mut c = rw(NvmOpcode::READ, 1, 0, 8, DATA, 0);
    c.cdw0 = U32::new(c.cdw0.get() | 3 << 14);
    assert_eq!(h.submit(1, c).status(), dnr(Status::INVALID_FIELD));
    let mut c = identify(0x01, 0, DATA);
    c.cdw0 = U32::new(c.cdw0.get() | 1 << 14);
    assert_eq!(h.admin(c).status(), dnr(Status::INVALID_FIELD));
    let mut back = vec![0u8; 4096];
    h.backend.read(0, &mut back).unwrap();
    assert_eq!(back, vec![0; 4096], "nothing written");
}

const META_SGL: u64 = DATA + 0x48000;

/// `rw` with data SGL Entry 1 a data block of `nlb` 512-byte blocks at
/// DATA, PSDT 10b and MPTR `mptr`.
fn rw_meta_sgl(op: NvmOpcode, nsid: u32, slba: u64, nlb: u32, mptr: u64) -> Command {
    let mut c = rw_sgl(op, slba, nlb, desc(DATA, nlb * 512, 0));
    c.nsid = U32::new(nsid);
    c.cdw0 = U32::new((c.cdw0.get() & !(3 << 14)) | 2 << 14);
    c.mptr = U64::new(mptr);
    c
}

/// Namespace 1: 512+64 with separate metadata; namespace 2: the same
/// with extended LBAs (MPTR unused).
fn metadata_host() -> (Host, Arc<RamDevice>) {
    let backend = Arc::new(RamDevice::new(1 << 20));
    let separate = NamespaceConfig::new(1, 512, backend.clone()).with_format(2);
    let extended = NamespaceConfig::new(2, 512, Arc::new(RamDevice::new(1 << 20)))
        .with_format(2)
        .with_extended_metadata(true);
    let mut h = Host::with_namespaces(config(), vec![separate, extended]);
    h.enable();
    h.create_pair(1, 16);
    (h, backend)
}

#[test]
fn metadata_sgl_moves_separate_metadata_both_ways() {
    let (mut h, backend) = metadata_host();
    assert_eq!(h.admin(identify(1, 0, DATA)).status(), Status::SUCCESS);
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_ne!(id.sgls.get() & sgls::MSDS, 0, "SGLS bit 19: metadata SGL");
    let data: Vec<u8> = (0..2048u32).map(|i| (i * 7 + 3) as u8).collect();
    let meta: Vec<u8> = (0..256u32).map(|i| (i * 11 + 5) as u8).collect();
    h.mem.write(GuestAddress(DATA), &data).unwrap();
    // Four blocks' metadata in two pieces, the second across a page:
    // MPTR -> a Last Segment -> two data blocks.
    let (a, b) = (DATA + 0x30000, DATA + 0x31FF0);
    h.mem.write(GuestAddress(a), &meta[..100]).unwrap();
    h.mem.write(GuestAddress(b), &meta[100..]).unwrap();
    let pieces = [desc(a, 100, 0), desc(b, 156, 0)];
    h.mem
        .write(GuestAddress(META_SGL + 0x100), pieces.as_flattened())
        .unwrap();
    h.mem
        .write(
            GuestAddress(META_SGL),
            &desc(META_SGL + 0x100, 32, LAST_SEGMENT),
        )
        .unwrap();
    let c = h.submit(1, rw_meta_sgl(NvmOpcode::WRITE, 1, 2, 4, META_SGL));
    assert_eq!(c.status(), Status::SUCCESS);
    let mut stored = vec![0u8; 4 * 576];
    backend.read(2 * 576, &mut stored).unwrap();
    for (i, block) in stored.chunks(576).enumerate() {
        assert_eq!(block[..512], data[i * 512..(i + 1) * 512], "block {i} data");
        assert_eq!(
            block[512..],
            meta[i * 64..(i + 1) * 64],
            "block {i} metadata"
        );
    }
    // Back through MPTR -> one data block, and Compare takes it too.
    let out = DATA + 0x38000;
    h.mem
        .write(GuestAddress(META_SGL + 0x200), &desc(out, 256, 0))
        .unwrap();
    h.mem.zero(GuestAddress(DATA), 2048).unwrap();
    let c = h.submit(1, rw_meta_sgl(NvmOpcode::READ, 1, 2, 4, META_SGL + 0x200));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA, 2048), data);
    assert_eq!(h.read_mem(out, 256), meta);
    let c = h.submit(1, rw_meta_sgl(NvmOpcode::COMPARE, 1, 2, 4, META_SGL));
    assert_eq!(c.status(), Status::SUCCESS);
    h.mem.write(GuestAddress(b + 155), &[!meta[255]]).unwrap();
    let c = h.submit(1, rw_meta_sgl(NvmOpcode::COMPARE, 1, 2, 4, META_SGL));
    assert_eq!(c.status(), Status::COMPARE_FAILURE.with_dnr(true));
}

#[test]
fn metadata_sgl_errors_complete_with_their_status_and_touch_nothing() {
    let (mut h, backend) = metadata_host();
    let dnr = |s: Status| s.with_dnr(true);
    h.mem.write(GuestAddress(DATA), &[0xAB; 2048]).unwrap();
    let write = |mptr| rw_meta_sgl(NvmOpcode::WRITE, 1, 0, 4, mptr);
    let read = |mptr| rw_meta_sgl(NvmOpcode::READ, 1, 0, 4, mptr);
    let cases: &[(&str, [u8; 16], Command, Status)] = &[
        (
            "metadata SGL shorter than the metadata",
            desc(DATA + 0x30000, 255, 0),
            write(META_SGL),
            dnr(Status::METADATA_SGL_LENGTH_INVALID),
        ),
        (
            "metadata SGL longer than the metadata",
            desc(DATA + 0x30000, 257, 0),
            read(META_SGL),
            dnr(Status::METADATA_SGL_LENGTH_INVALID),
        ),
        (
            "bit bucket for metadata",
            desc(0, 256, 1),
            read(META_SGL),
            dnr(Status::INVALID_SGL_DESCRIPTOR_TYPE),
        ),
        (
            "MPTR not qword aligned",
            desc(DATA + 0x30000, 256, 0),
            read(META_SGL + 4),
            dnr(Status::INVALID_FIELD),
        ),
        (
            "MPTR outside guest memory",
            desc(DATA + 0x30000, 256, 0),
            write(MEM_SIZE as u64 - 8),
            dnr(Status::DATA_TRANSFER_ERROR),
        ),
    ];
    for (name, at_mptr, c, want) in cases {
        h.mem.write(GuestAddress(META_SGL), at_mptr).unwrap();
        h.mem.zero(GuestAddress(DATA + 0x10000), 2048).unwrap();
        let mut c = *c;
        if c.opcode() == NvmOpcode::READ.0 {
            // Reads land elsewhere, to see that nothing does.
            c.set_sgl1(&vnvme_spec::sgl::Descriptor::data_block(
                DATA + 0x10000,
                2048,
            ));
        }
        assert_eq!(h.submit(1, c).status(), *want, "{name}");
        assert_eq!(
            h.read_mem(DATA + 0x10000, 2048),
            vec![0; 2048],
            "{name}: read data"
        );
    }
    let mut back = vec![0u8; 4 * 576];
    backend.read(0, &mut back).unwrap();
    assert_eq!(back, vec![0; 4 * 576], "nothing written");
    // Extended LBAs: the metadata rides in the data SGL, MPTR is unused.
    let mut c = rw_meta_sgl(NvmOpcode::WRITE, 2, 0, 1, META_SGL + 4);
    c.set_sgl1(&vnvme_spec::sgl::Descriptor::data_block(DATA, 576));
    assert_eq!(h.submit(1, c).status(), Status::SUCCESS);
}
