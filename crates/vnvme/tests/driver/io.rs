//! The data path: data read back equals data written, PRP lists, MDTS,
//! batching (the doorbell writes it costs, each command completed once),
//! and error statuses.

use std::time::Duration;

use vnvme_controller::DoorbellMode;
use vnvme_driver::prp::PrpError;
use vnvme_driver::{Error, InitOptions};
use vnvme_spec::command::Command;
use vnvme_spec::{NvmOpcode, Status};

use crate::rig::{device, pattern, start, traps, DeviceOptions};

#[test]
fn write_then_read_round_trips_through_a_prp_list_at_an_offset() {
    // 512-byte blocks (format 0), so a buffer may start mid-page.
    let rig = start(
        device(DoorbellMode::Trap),
        &["16M:ram,format=0"],
        InitOptions::default(),
    );
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let before = rig.queue(1);
    let whole = rig.access.dma_alloc(40960).unwrap();
    // 32 KiB starting 512 bytes into a page: 9 pages, a PRP list.
    let seg = whole.subrange(512, 32768).unwrap();
    let data = pattern(32768, 7);
    seg.write_bytes(0, &data).unwrap();
    q.write(1, 100, 64, &seg).unwrap();
    let mut back = rig.access.dma_alloc(32768).unwrap();
    q.read(1, 100, 64, &mut back).unwrap();
    assert_eq!(back.to_vec(), data);
    // Where it landed: blocks 108..116 hold bytes 4096..8192.
    let mut part = rig.access.dma_alloc(4096).unwrap();
    q.read(1, 108, 8, &mut part).unwrap();
    assert_eq!(part.to_vec(), data[4096..8192]);
    q.flush(1).unwrap();
    let c = q.counters();
    assert_eq!((c.submitted, c.completions), (4, 4));
    // Trap mode: each synchronous command is one SQ and one CQ trap.
    assert_eq!((c.sq_doorbell_writes, c.cq_doorbell_writes), (4, 4));
    let after = rig.queue(1);
    assert_eq!(after.commands - before.commands, 4);
    let ((sq, cq), (sq0, cq0)) = (traps(&after), traps(&before));
    assert_eq!((sq - sq0, cq - cq0), (4, 4));
}

#[test]
fn largest_transfer_round_trips_through_a_full_prp_list() {
    let rig = start(
        device(DoorbellMode::Trap),
        &["16M:ram"],
        InitOptions::default(),
    );
    let max = rig.ctrl.max_transfer();
    assert_eq!(max, 128 << 10, "MDTS 5 in 4 KiB pages");
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let whole = rig.access.dma_alloc(max + 4096).unwrap();
    // Starting mid-page: PRP1 plus 32 list entries.
    let seg = whole.subrange(2048, max).unwrap();
    let data = pattern(max, 3);
    seg.write_bytes(0, &data).unwrap();
    q.write(1, 8, (max / 4096) as u32, &seg).unwrap();
    let mut back = rig.access.dma_alloc(max).unwrap();
    q.read(1, 8, (max / 4096) as u32, &mut back).unwrap();
    assert_eq!(back.to_vec(), data);
}

#[test]
fn transfers_that_need_prp_lists_cross_pages() {
    let rig = start(
        DeviceOptions::default(),
        &["64M:ram"],
        InitOptions::default(),
    );
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    // 128 KiB (MDTS) needs a PRP list of 31 entries; 12 KiB needs PRP1 + PRP2 + list.
    for blocks in [1u32, 2, 3, 17, 32] {
        let data = pattern(blocks as usize * 4096, blocks);
        let w = rig.access.dma_alloc(data.len()).unwrap();
        w.write_bytes(0, &data).unwrap();
        q.write(1, 500, blocks, &w).unwrap();
        let mut r = rig.access.dma_alloc(data.len()).unwrap();
        q.read(1, 500, blocks, &mut r).unwrap();
        assert_eq!(r.to_vec(), data, "{blocks} blocks");
    }
}

#[test]
fn transfer_over_mdts_is_rejected_before_submission() {
    let rig = start(
        device(DoorbellMode::Trap),
        &["16M:null"],
        InitOptions::default(),
    );
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let mut buf = rig.access.dma_alloc(256 << 10).unwrap();
    let before = rig.queue(1);
    let err = q.read(1, 0, 64, &mut buf).unwrap_err();
    assert!(
        matches!(err, Error::Prp(PrpError::TooLarge { .. })),
        "{err}"
    );
    assert_eq!(q.outstanding(), 0, "the command slot was given back");
    assert_eq!(rig.queue(1), before, "nothing reached the controller");
    q.read(1, 0, 32, &mut buf).unwrap();
    assert_eq!(rig.queue(1).commands - before.commands, 1);
}

#[test]
fn batch_costs_one_sq_doorbell_and_one_cq_doorbell_per_reap() {
    let rig = start(
        device(DoorbellMode::Trap),
        &["16M:null"],
        InitOptions::default(),
    );
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let bufs: Vec<_> = (0..8)
        .map(|_| rig.access.dma_alloc(4096).unwrap())
        .collect();
    let before = rig.queue(1);
    for (i, b) in bufs.iter().enumerate() {
        q.enqueue_rw(NvmOpcode::READ, 1, i as u64, 1, b).unwrap();
    }
    q.ring().unwrap();
    let mut out = Vec::new();
    let mut reaps = 0;
    while out.len() < 8 {
        q.wait(&mut out, 64, Duration::from_secs(5)).unwrap();
        reaps += 1;
    }
    assert_eq!(out.len(), 8);
    assert!(out.iter().all(|c| c.status().is_success()));
    let c = q.counters();
    assert_eq!(c.sq_doorbell_writes, 1);
    // The controller may post while the driver reaps: one head write per
    // reap that found completions, never one per completion.
    assert_eq!(c.cq_doorbell_writes, reaps);
    let (sq, cq) = traps(&rig.queue(1));
    let (sq0, cq0) = traps(&before);
    assert_eq!((sq - sq0, cq - cq0), (1, reaps));
}

#[test]
fn a_full_batch_of_commands_completes_once_each() {
    let opts = InitOptions {
        queue_depth: 64,
        ..InitOptions::default()
    };
    let rig = start(DeviceOptions::default(), &["16M:null"], opts);
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let bufs: Vec<_> = (0..32)
        .map(|_| rig.access.dma_alloc(4096).unwrap())
        .collect();
    for round in 0..50 {
        let mut cids: Vec<u16> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| q.enqueue_rw(NvmOpcode::READ, 1, i as u64, 1, b).unwrap())
            .collect();
        q.ring().unwrap();
        let mut seen = Vec::new();
        while seen.len() < 32 {
            let mut out = Vec::new();
            q.wait(&mut out, 256, Duration::from_secs(5)).unwrap();
            seen.extend(out.iter().map(|c| c.cid()));
        }
        assert_eq!(q.outstanding(), 0, "round {round}");
        seen.sort_unstable();
        cids.sort_unstable();
        assert_eq!(seen, cids, "round {round}");
    }
}

#[test]
fn error_statuses_are_typed() {
    let rig = start(
        device(DoorbellMode::Trap),
        &["1M:ram"],
        InitOptions::default(),
    );
    let err = rig.ctrl.admin(Command::new(0x3F, 0), None).unwrap_err();
    assert_eq!(
        err.status(),
        Some(Status::INVALID_OPCODE.with_dnr(true)),
        "{err}"
    );
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let mut buf = rig.access.dma_alloc(8192).unwrap();
    // 256 blocks of 4 KiB: the last one exists, the one after does not.
    q.read(1, 255, 1, &mut buf).unwrap();
    let err = q.read(1, 255, 2, &mut buf).unwrap_err();
    assert_eq!(
        err.status(),
        Some(Status::LBA_OUT_OF_RANGE.with_dnr(true)),
        "{err}"
    );
    let reads = rig.io_received("read");
    assert!(matches!(
        q.read(9, 0, 1, &mut buf),
        Err(Error::NoSuchNamespace(9))
    ));
    assert_eq!(rig.io_received("read"), reads, "refused by the driver");
}

#[test]
fn protected_namespaces_move_data_with_pract_and_store_checked_pi() {
    // 4096+8 Type 1 (16-bit guard), 4096+16 Type 2 (64-bit guard, from
    // CNS 05h), 4096+64 Type 1 (56 bytes of metadata beside the tuple,
    // moved through the queue's own buffers).
    let rig = start(
        device(DoorbellMode::Trap),
        &[
            "16M:ram,format=4,pi=1",
            "16M:ram,format=6,pi=2",
            "16M:ram,format=5,pi=1",
        ],
        InitOptions::default(),
    );
    let pis: Vec<_> = rig
        .ctrl
        .namespaces()
        .iter()
        .map(|n| (n.nsid, n.protection.map(|p| (p.pit, p.guard_64))))
        .collect();
    assert_eq!(
        pis,
        [
            (1, Some((1, false))),
            (2, Some((2, true))),
            (3, Some((1, false)))
        ]
    );
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let data = pattern(8192, 3);
    let buf = rig.access.dma_alloc(8192).unwrap();
    buf.write_bytes(0, &data).unwrap();
    for nsid in [1, 2, 3] {
        q.write(nsid, 40, 2, &buf).unwrap();
        let mut back = rig.access.dma_alloc(8192).unwrap();
        q.read(nsid, 40, 2, &mut back).unwrap();
        assert_eq!(back.to_vec(), data, "nsid {nsid}");
    }
    // What the controller stored: read namespace 1's blocks with a
    // metadata buffer and a reference tag check from a wrong initial tag.
    let meta = rig.access.dma_alloc(4096).unwrap();
    let out = rig.access.dma_alloc(8192).unwrap();
    let read = |ilbrt: u32, prinfo: u32| {
        let mut c = Command::new(NvmOpcode::READ.0, 0);
        c.nsid = 1.into();
        c.set_slba(40);
        c.cdw12 = (1 | prinfo << 26).into();
        c.cdw14 = ilbrt.into();
        c.prp1 = out.iova().into();
        c.prp2 = (out.iova() + 4096).into();
        c.mptr = meta.iova().into();
        c
    };
    let ok = q.execute(read(40, 0b0101)).unwrap();
    assert_eq!(ok.status(), Status::SUCCESS);
    let tuples = meta.to_vec();
    // Reference tags 40 and 41, big endian, at bytes 4..8 of each tuple.
    assert_eq!(tuples[4..8], 40u32.to_be_bytes());
    assert_eq!(tuples[12..16], 41u32.to_be_bytes());
    let wrong = q.execute(read(41, 0b0001)).unwrap();
    assert_eq!(
        wrong.status(),
        Status::INVALID_PROTECTION_INFORMATION.with_dnr(true),
        "type 1: the initial reference tag must be the SLBA"
    );
}

#[test]
fn driver_generated_pi_is_checked_by_the_controller_and_read_back_verified() {
    let rig = start(
        device(DoorbellMode::Trap),
        &["16M:ram,format=4,pi=1", "16M:ram,format=6,pi=3"],
        InitOptions::default(),
    );
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let data = pattern(8192, 5);
    let buf = rig.access.dma_alloc(8192).unwrap();
    buf.write_bytes(0, &data).unwrap();
    for nsid in [1, 2] {
        let meta = rig.access.dma_alloc(4096).unwrap();
        q.write_protected(nsid, 12, (&buf, &meta), 2, 0x5A5A)
            .unwrap();
        let (mut back, mut tuples) = (
            rig.access.dma_alloc(8192).unwrap(),
            rig.access.dma_alloc(4096).unwrap(),
        );
        q.read_protected(nsid, 12, (&mut back, &mut tuples), 2, 0x5A5A)
            .unwrap();
        assert_eq!(back.to_vec(), data, "nsid {nsid}");
        // The controller checks the application tag it is told to expect.
        let err = q
            .read_protected(nsid, 12, (&mut back, &mut tuples), 2, 0x5A5B)
            .unwrap_err();
        assert_eq!(
            err.status(),
            Some(Status::APPLICATION_TAG_CHECK_ERROR.with_dnr(true)),
            "nsid {nsid}: {err}"
        );
    }
    // PRACT writes (the plain block API) read back with the driver's own
    // check: the controller's tuples are what the driver computes.
    q.write(1, 20, 2, &buf).unwrap();
    let (mut back, mut tuples) = (
        rig.access.dma_alloc(8192).unwrap(),
        rig.access.dma_alloc(4096).unwrap(),
    );
    q.read_protected(1, 20, (&mut back, &mut tuples), 2, 0)
        .unwrap();
    // A namespace without PI has no protected I/O.
    let plain = start(
        device(DoorbellMode::Trap),
        &["16M:ram"],
        InitOptions::default(),
    );
    let mut pq = plain.ctrl.take_io_queue(0).unwrap();
    let meta = plain.access.dma_alloc(4096).unwrap();
    let b = plain.access.dma_alloc(4096).unwrap();
    assert!(matches!(
        pq.write_protected(1, 0, (&b, &meta), 1, 0),
        Err(Error::InvalidRequest(_))
    ));
}
