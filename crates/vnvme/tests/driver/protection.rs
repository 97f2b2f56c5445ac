//! End-to-end data protection through the driver on every PI format the
//! controller offers (512+8, 512+64, 4096+8, 4096+64 with a 16-bit guard;
//! 4096+16 and 4096+64 with a 64-bit guard), each with PI Types 1 to 3 and
//! the tuple first and last in the metadata: PI the driver generates is
//! checked by the controller and read back verified by the driver, a
//! corrupted guard is caught by both, and the block API (PRACT) round-trips.
//! PI of the driver's moves at MPTR and through metadata SGLs (PSDT 10b).

use std::time::{Duration, Instant};

use vnvme_controller::{DoorbellMode, FaultKind, FaultSpec, Latency};
use vnvme_driver::{
    DmaBuffer, Error, InitOptions, IoQueue, MetadataPointer, NsProtection, PiError,
};
use vnvme_spec::cdw::Cdw10FormatNvm;
use vnvme_spec::command::Command;
use vnvme_spec::{AdminOpcode, NvmOpcode, Status};

use crate::rig::{device, pattern, start, Rig};

/// (format index, data bytes, metadata bytes, 64-bit guard).
const PI_FORMATS: &[(u8, usize, u16, bool)] = &[
    (1, 512, 8, false),
    (2, 512, 64, false),
    (4, 4096, 8, false),
    (5, 4096, 64, false),
    (6, 4096, 16, true),
    (7, 4096, 64, true),
];

/// (PI type, tuple first) of the namespaces of a format's rig, NSIDs from 1.
const SETTINGS: &[(u8, bool)] = &[
    (1, false),
    (1, true),
    (2, false),
    (2, true),
    (3, false),
    (3, true),
];

const APP: u16 = 0x0B0E;

/// Every way the driver passes the metadata of PI of its own.
const MODES: &[MetadataPointer] = &[
    MetadataPointer::Contiguous,
    MetadataPointer::Sgl,
    MetadataPointer::SglPerBlock,
];

/// A rig with a namespace of `format` per [`SETTINGS`] entry.
fn rig_of(format: u8) -> Rig {
    let specs: Vec<String> = SETTINGS
        .iter()
        .map(|(pi, first)| {
            let pil = if *first { "first" } else { "last" };
            format!("4M:ram,format={format},pi={pi},pil={pil}")
        })
        .collect();
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
    start(device(DoorbellMode::Trap), &specs, InitOptions::default())
}

/// `len` bytes of DMA memory holding `bytes` (zeroes after them).
fn dma(rig: &Rig, len: usize, bytes: &[u8]) -> DmaBuffer {
    let b = rig.access.dma_alloc(len).unwrap();
    b.write_bytes(0, bytes).unwrap();
    b
}

/// A Read or Write of `nlb` blocks at `slba` as the test builds it: data
/// in one page-aligned buffer of at most two pages, metadata at `meta`,
/// PRINFO as given, the initial reference tag the SLBA, tag `APP`.
fn raw(
    op: NvmOpcode,
    nsid: u32,
    slba: u64,
    nlb: u32,
    prinfo: u32,
    bufs: (&DmaBuffer, &DmaBuffer),
) -> Command {
    let (data, meta) = bufs;
    let mut c = Command::new(op.0, 0);
    c.nsid = nsid.into();
    c.set_slba(slba);
    c.cdw12 = ((nlb - 1) | prinfo << 26).into();
    c.cdw14 = (slba as u32).into();
    c.cdw15 = (u32::from(APP) | 0xFFFF << 16).into();
    c.prp1 = data.iova().into();
    c.prp2 = (data.iova() + 4096).into();
    c.mptr = meta.iova().into();
    c
}

fn protection(q: &IoQueue, nsid: u32) -> NsProtection {
    q.namespace(nsid).unwrap().protection.unwrap()
}

#[test]
fn every_pi_format_type_and_placement_detected_and_driver_pi_round_trips() {
    for &(format, lba, ms, guard_64) in PI_FORMATS {
        let rig = rig_of(format);
        let mut q = rig.ctrl.take_io_queue(0).unwrap();
        for (nsid, &(pit, first)) in (1u32..).zip(SETTINGS) {
            let what = format!("format {format}, type {pit}, first {first}");
            let pi = protection(&q, nsid);
            assert_eq!(
                (pi.pit, pi.guard_64, pi.first, pi.ms, pi.extended),
                (pit, guard_64, first, ms, false),
                "{what}"
            );
            // Five blocks (a PRP list at 4 KiB), and metadata of the
            // caller's own beside each tuple, which a last tuple guards;
            // the metadata at MPTR, then through each metadata SGL shape.
            for (k, mode) in (0u64..).zip(MODES) {
                let what = format!("{what}, {mode:?}");
                q.set_metadata_pointer(*mode).unwrap();
                let sgls = rig.stats().sgl_commands;
                let lba_at = 30 + 10 * k;
                let n = 5u32;
                let data = pattern(n as usize * lba, u32::from(format) * 10 + nsid);
                let own = pattern(n as usize * usize::from(ms), 99 + nsid);
                let buf = dma(&rig, data.len(), &data);
                let meta = dma(&rig, own.len(), &own);
                q.write_protected(nsid, lba_at, (&buf, &meta), n, APP)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let (mut back, mut mback) = (
                    rig.access.dma_alloc(data.len()).unwrap(),
                    rig.access.dma_alloc(own.len()).unwrap(),
                );
                q.read_protected(nsid, lba_at, (&mut back, &mut mback), n, APP)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(back.to_vec(), data, "{what}");
                let sgl_used = *mode != MetadataPointer::Contiguous;
                assert_eq!(
                    rig.stats().sgl_commands - sgls,
                    if sgl_used { 2 } else { 0 },
                    "{what}"
                );
                // Metadata comes back as written: the caller's bytes around
                // the tuple the driver placed.
                let written = meta.to_vec();
                assert_eq!(mback.to_vec(), written, "{what}");
                let (at, size) = (pi.tuple_offset(), usize::from(pi.tuple_size()));
                for (b, (w, o)) in written
                    .chunks(usize::from(ms))
                    .zip(own.chunks(usize::from(ms)))
                    .enumerate()
                {
                    assert_eq!(w[..at], o[..at], "{what}: block {b} before the tuple");
                    assert_eq!(w[at + size..], o[at + size..], "{what}: block {b} after it");
                }
            }
            q.set_metadata_pointer(MetadataPointer::Contiguous).unwrap();
        }
    }
}

#[test]
fn a_corrupted_guard_is_caught_by_the_controller_and_by_the_driver() {
    for &(format, lba, ms, _) in PI_FORMATS {
        let rig = rig_of(format);
        let mut q = rig.ctrl.take_io_queue(0).unwrap();
        for (nsid, &(pit, first)) in (1u32..).zip(SETTINGS) {
            let what = format!("format {format}, type {pit}, first {first}");
            let pi = protection(&q, nsid);
            let data = pattern(2 * lba, nsid);
            let mut meta = vec![0u8; 2 * usize::from(ms)];
            pi.generate(&data, lba, &mut meta, 8, APP).unwrap();
            // Block 1's guard, off by one bit; and where the tuple is last
            // with metadata before it, block 0's first metadata byte
            // changed under an intact tuple, which its guard covers.
            let second = usize::from(ms) + pi.tuple_offset();
            meta[second] ^= 0x01;
            let before = pi.tuple_offset() > 0;
            if before {
                meta[0] ^= 0x80;
            }
            let buf = dma(&rig, 8192, &data);
            let mbuf = dma(&rig, meta.len(), &meta);
            // Checked: refused. Unchecked (PRCHK 0): stored as sent.
            let checked = q.execute(raw(NvmOpcode::WRITE, nsid, 8, 2, 0b0100, (&buf, &mbuf)));
            assert_eq!(
                checked.unwrap().status(),
                Status::GUARD_CHECK_ERROR.with_dnr(true),
                "{what}"
            );
            let stored = q.execute(raw(NvmOpcode::WRITE, nsid, 8, 2, 0, (&buf, &mbuf)));
            assert_eq!(stored.unwrap().status(), Status::SUCCESS, "{what}");
            let (mut back, mut mback) = (
                rig.access.dma_alloc(8192).unwrap(),
                rig.access.dma_alloc(meta.len()).unwrap(),
            );
            let err = q
                .read_protected(nsid, 8, (&mut back, &mut mback), 2, APP)
                .unwrap_err();
            assert_eq!(
                err.status(),
                Some(Status::GUARD_CHECK_ERROR.with_dnr(true)),
                "{what}: {err}"
            );
            // The same blocks read without the controller's checks: the
            // driver's own verification finds the bad guard.
            let unchecked = q.execute(raw(NvmOpcode::READ, nsid, 8, 2, 0, (&back, &mback)));
            assert_eq!(unchecked.unwrap().status(), Status::SUCCESS, "{what}");
            let got = pi.verify(&back.to_vec()[..2 * lba], lba, &mback.to_vec(), 8, APP);
            let bad = if before { 0 } else { 1 };
            assert!(
                matches!(got, Err(PiError::Guard { index, .. }) if index == bad),
                "{what}: {got:?}"
            );
        }
    }
}

#[test]
fn the_block_api_round_trips_on_every_pi_format_with_pi_the_driver_can_check() {
    for &(format, lba, _, _) in PI_FORMATS {
        let rig = rig_of(format);
        let mut q = rig.ctrl.take_io_queue(0).unwrap();
        for (nsid, &(pit, first)) in (1u32..).zip(SETTINGS) {
            let what = format!("format {format}, type {pit}, first {first}");
            let pi = protection(&q, nsid);
            let n = 9u32;
            let data = pattern(n as usize * lba, 7 * nsid);
            let buf = dma(&rig, data.len(), &data);
            q.write(nsid, 100, n, &buf)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut back = rig.access.dma_alloc(data.len()).unwrap();
            q.read(nsid, 100, n, &mut back)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(back.to_vec(), data, "{what}");
            // The PI the controller generated (PRACT; application tag 0,
            // zeroes beside the tuple) is what the driver computes.
            let mut meta = rig
                .access
                .dma_alloc(n as usize * usize::from(pi.ms))
                .unwrap();
            q.read_protected(nsid, 100, (&mut back, &mut meta), n, 0)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let (at, size) = (pi.tuple_offset(), usize::from(pi.tuple_size()));
            for m in meta.to_vec().chunks(usize::from(pi.ms)) {
                assert!(
                    m[..at].iter().chain(&m[at + size..]).all(|&b| b == 0),
                    "{what}"
                );
            }
        }
    }
}

#[test]
fn extended_lbas_are_taken_where_pract_strips_the_whole_metadata_and_bounce_own_pi() {
    let rig = start(
        device(DoorbellMode::Trap),
        &["4M:ram,format=4,pi=1", "4M:ram,format=5,pi=1"],
        InitOptions::default(),
    );
    // Format NVM both with MSET 1 (extended LBAs), PI Type 1.
    for (nsid, lbaf) in [(1u32, 4u8), (2, 5)] {
        let mut c = Command::new(AdminOpcode::FORMAT_NVM.0, 0);
        c.nsid = nsid.into();
        c.cdw10 = Cdw10FormatNvm::new()
            .with_lbaf(lbaf)
            .with_mset(true)
            .with_pi(1)
            .into();
        rig.ctrl.admin(c, None).unwrap();
    }
    let states = rig.ctrl.rescan().unwrap();
    let reason = states
        .iter()
        .find(|s| s.nsid == 2)
        .and_then(|s| s.reason.clone())
        .unwrap_or_default();
    assert!(reason.contains("extended LBAs"), "{reason}");
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    q.refresh_namespaces();
    assert!(matches!(q.namespace(2), Err(Error::NoSuchNamespace(2))));
    assert!(protection(&q, 1).extended);
    let data = pattern(3 * 4096, 4);
    let buf = dma(&rig, data.len(), &data);
    q.write(1, 3, 3, &buf).unwrap();
    let mut back = rig.access.dma_alloc(data.len()).unwrap();
    q.read(1, 3, 3, &mut back).unwrap();
    assert_eq!(back.to_vec(), data);
    // PI of the driver's: data and tuples interleaved through a buffer of
    // the queue's, checked by the controller (a misplaced tuple fails its
    // guard), and the data where the block API finds it.
    let data = pattern(3 * 4096, 5);
    let buf = dma(&rig, data.len(), &data);
    let meta = rig.access.dma_alloc(24).unwrap();
    q.write_protected(1, 10, (&buf, &meta), 3, APP).unwrap();
    let (mut back, mut mback) = (
        rig.access.dma_alloc(data.len()).unwrap(),
        rig.access.dma_alloc(24).unwrap(),
    );
    q.read_protected(1, 10, (&mut back, &mut mback), 3, APP)
        .unwrap();
    assert_eq!(
        (back.to_vec(), mback.to_vec()),
        (data.clone(), meta.to_vec())
    );
    let mut plain = rig.access.dma_alloc(data.len()).unwrap();
    q.read(1, 10, 3, &mut plain).unwrap();
    assert_eq!(plain.to_vec(), data);
    let err = q
        .read_protected(1, 10, (&mut back, &mut mback), 3, APP + 1)
        .unwrap_err();
    assert_eq!(
        err.status(),
        Some(Status::APPLICATION_TAG_CHECK_ERROR.with_dnr(true))
    );
}

/// A protected call that timed out leaves its command with the controller,
/// still pointing at the queue's metadata SGL area. The next call must not
/// write its descriptors there: the late command would follow them and put
/// its metadata into the next caller's buffer, after that call returned.
#[test]
fn a_protected_read_that_timed_out_cannot_write_into_the_next_callers_metadata() {
    let opts = InitOptions {
        io_timeout: Duration::from_millis(200),
        ..InitOptions::default()
    };
    let rig = start(device(DoorbellMode::Trap), &["4M:ram,format=2,pi=1"], opts);
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let ms = 64;
    for (lba, seed) in [(0u64, 1u32), (1, 2)] {
        let buf = dma(&rig, 512, &pattern(512, seed));
        let meta = dma(&rig, ms, &pattern(ms, 10 + seed));
        q.write_protected(1, lba, (&buf, &meta), 1, APP).unwrap();
    }
    q.set_metadata_pointer(MetadataPointer::Sgl).unwrap();
    let late = Duration::from_millis(600);
    rig.server
        .controller()
        .fault_add(FaultSpec {
            opcodes: vec![NvmOpcode::READ.0],
            lba: Some((0, 1)),
            count: Some(1),
            ..FaultSpec::new(FaultKind::Latency(Latency::Fixed(late)))
        })
        .unwrap();
    let started = Instant::now();
    let (mut back, mut mback) = (
        rig.access.dma_alloc(512).unwrap(),
        rig.access.dma_alloc(ms).unwrap(),
    );
    let err = q
        .read_protected(1, 0, (&mut back, &mut mback), 1, APP)
        .unwrap_err();
    assert!(matches!(err, Error::CommandTimeout { .. }), "{err}");

    let (mut back, mut mback) = (
        rig.access.dma_alloc(512).unwrap(),
        rig.access.dma_alloc(ms).unwrap(),
    );
    q.read_protected(1, 1, (&mut back, &mut mback), 1, APP)
        .unwrap();
    let read = mback.to_vec();
    assert!(
        started.elapsed() < late,
        "the second read came after the late one"
    );
    // The late read runs now.
    std::thread::sleep(late * 2 - started.elapsed().min(late));
    assert_eq!(
        mback.to_vec(),
        read,
        "the late read wrote into this caller's metadata"
    );
    assert_eq!(back.to_vec(), pattern(512, 2));
}
