//! Queues, doorbells and interrupt vectors with hostile values.

use std::os::fd::AsFd;
use std::time::Duration;

use vnvme_driver::MappedArea;
use vnvme_spec::{AdminOpcode, NvmOpcode, Status};
use zerocopy::little_endian::U64;
use zerocopy::IntoBytes;

use crate::guest::*;

#[test]
fn doorbell_beyond_queue_size_and_cq_head_skipping_unposted_entries_are_ignored_and_counted() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let before = srv.ctrl.stats().queue(1);
    // SQ 1 has 64 entries: tail 64 and 0xFFFF are out of range.
    g.w32(0x1008, 64);
    g.w32(0x1008, 0xFFFF);
    // CQ head 10 when nothing has been posted.
    g.w32(0x100C, 10);
    // Doorbells of queues that do not exist.
    g.w32(0x1000 + 8 * 3, 1);
    g.w32(0x1000 + 8 * 200, 1);
    // The bad CQ head is seen when the controller next posts on CQ 1.
    let c = g.submit(1, rw(NvmOpcode::READ, 0, 1, DATA, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    let after = srv.ctrl.stats().queue(1);
    assert_eq!(
        after.invalid_doorbell_writes - before.invalid_doorbell_writes,
        3,
        "two bad SQ tails and one bad CQ head on queue 1"
    );
    assert_eq!(g.csts() & 2, 0, "no fatal status for a bad doorbell value");
    g.finish(&srv);
}

#[test]
fn sq_on_a_cq_being_deleted_is_refused_in_both_orders() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let c = g.admin(create_cq(2, 16, IOCQ + 0x4000, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    // Delete CQ 2 and create an SQ on it, back to back in one doorbell.
    // The delete completes when the CQ's worker has let it go, which may
    // be after the create (commands may complete in any order):
    // each completion is found by its CID.
    let d = g.push(0, delete(AdminOpcode::DELETE_IO_CQ, 2));
    let s = g.push(0, create_sq(2, 16, IOSQ + 0x4000, 2));
    let mut both = [
        g.reap_within(0, TIMEOUT).unwrap(),
        g.reap_within(0, TIMEOUT).unwrap(),
    ];
    both.sort_by_key(|c| c.cid() != d);
    let [c1, c2] = both;
    assert_eq!((c1.cid(), c2.cid()), (d, s));
    assert_eq!(c1.status(), Status::SUCCESS, "delete CQ 2");
    assert_eq!(
        c2.status(),
        Status::INVALID_CQ.with_dnr(true),
        "SQ on deleted CQ"
    );
    // And the other order: a CQ with an SQ on it cannot be deleted.
    let c = g.admin(delete(AdminOpcode::DELETE_IO_CQ, 1));
    assert_eq!(c.status(), Status::INVALID_QUEUE_DELETION.with_dnr(true));
    g.finish(&srv);
}

#[test]
fn max_size_queue_in_the_last_pages_of_a_map_works_and_one_crossing_the_end_is_fatal() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let end = RAM_IOVA + RAM_SIZE as u64;
    // CAP.MQES: the largest queue the controller accepts.
    let mqes = (g.r32(0) & 0xFFFF) as u16 + 1;
    let sq_bytes = u64::from(mqes) * 64;
    let cq_bytes = u64::from(mqes) * 16;
    let sq = end - sq_bytes;
    let cq = sq - cq_bytes;
    assert!(cq >= DATA + 0x10000, "room for the test queues");
    g.create_io_pair(2, mqes, sq, cq, 2);
    // Fill it up to the last slot (size - 1 commands), wrapping once.
    for _ in 0..2 {
        for _ in 0..mqes - 1 {
            let r = g.rings[2].as_mut().unwrap();
            let slot = r.sq + u64::from(r.tail) * 64;
            r.tail = (r.tail + 1) % r.size;
            let mut c = rw(NvmOpcode::READ, 0, 1, DATA, 0);
            c.set_cid(1);
            g.write_mem(slot, c.as_bytes());
        }
        let tail = g.rings[2].unwrap().tail;
        g.w32(0x1000 + 16, u32::from(tail));
        for _ in 0..mqes - 1 {
            let c = g.reap_within(2, TIMEOUT).expect("completion");
            assert_eq!(c.status(), Status::SUCCESS);
        }
    }
    // A CQ whose second half lies past the end of the map (512 entries,
    // 8 KiB, in the last page): fine until the controller has to post
    // there, then CSTS.CFS (and never a write anywhere else).
    let fatal_before = srv.ctrl.stats().fatal_errors;
    let c = g.admin(create_cq(3, 512, end - 0x1000, 3));
    assert_eq!(c.status(), Status::SUCCESS);
    let sq3 = DATA + 0x40000;
    let c = g.admin(create_sq(3, 512, sq3, 3));
    assert_eq!(c.status(), Status::SUCCESS);
    let mut c = rw(NvmOpcode::READ, 0, 1, DATA, 0);
    for i in 0..300u64 {
        c.set_cid(i as u16);
        g.write_mem(sq3 + i * 64, c.as_bytes());
    }
    g.w32(0x1000 + 24, 300);
    g.wait_csts("CSTS.CFS", |c| c & 2 != 0);
    assert_eq!(srv.ctrl.stats().fatal_errors, fatal_before + 1);
    g.enable();
    g.create_io_pair(1, 64, IOSQ, IOCQ, 1);
    g.finish(&srv);
}

#[test]
fn doorbell_buffer_config_with_one_page_for_both_or_unmapped_buffers_is_invalid_field() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let invalid = Status::INVALID_FIELD.with_dnr(true);
    let dbbuf = |g: &mut Guest, shadow: u64, ei: u64| {
        let mut c = cmd(AdminOpcode::DOORBELL_BUFFER_CONFIG.0);
        c.prp1 = U64::new(shadow);
        c.prp2 = U64::new(ei);
        g.admin(c).status()
    };
    assert_eq!(dbbuf(&mut g, SHADOW, SHADOW), invalid, "both in one page");
    assert_eq!(dbbuf(&mut g, SHADOW, SHADOW + 0x800), invalid, "unaligned");
    assert_eq!(
        dbbuf(&mut g, SHADOW, 0x10_0000_0000),
        invalid,
        "EventIdx unmapped"
    );
    assert_eq!(
        dbbuf(&mut g, BAR0_GPA + 0x1000, EVENTIDX),
        invalid,
        "shadow at the doorbells"
    );
    // I/O keeps trapping as before, and a good config still works.
    g.assert_serving();
    assert_eq!(dbbuf(&mut g, SHADOW, EVENTIDX), Status::SUCCESS);
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn interrupt_vector_beyond_the_table_is_invalid_interrupt_vector() {
    let srv = Served::start();
    let mut g = ready(&srv);
    // max_io_queues 4: 5 MSI-X vectors.
    for iv in [5u16, 255, 2048, 0xFFFF] {
        let c = g.admin(create_cq(2, 16, IOCQ + 0x4000, iv));
        assert_eq!(
            c.status(),
            Status::INVALID_INTERRUPT_VECTOR.with_dnr(true),
            "vector {iv}"
        );
    }
    g.finish(&srv);
}

/// The default mode offers BAR0's doorbell page for mmap, so a client may
/// store anything there without a trap: tails and heads beyond their
/// queues, doorbells of queues that do not exist, an admin tail far beyond
/// the ring. All are ignored, before and after Doorbell Buffer Config, and
/// the controller keeps serving.
#[test]
fn garbage_stored_in_the_mapped_doorbell_page_is_ignored() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let (info, fd) = g.client.region_info(0).unwrap();
    let area = *info
        .sparse_areas
        .first()
        .expect("the default mode offers the doorbell page");
    let fd = fd.expect("the doorbell page comes with its fd");
    let page = MappedArea::map(fd.as_fd(), area.offset, area.size).unwrap();
    for dbbuf in [false, true] {
        if dbbuf {
            assert_eq!(g.configure_dbbuf(), Status::SUCCESS);
        }
        let garbage = [
            (0x1000, 0xDEAD_BEEF), // admin SQ tail
            (0x1004, 1000),        // admin CQ head
            (0x1008, 64),          // SQ 1 tail, one past its 64 entries
            (0x1008, u32::MAX),
            (0x100C, 10), // CQ 1 head, past what was posted
            (0x1000 + 8 * 3, 1),
            (0x1000 + 8 * 200, 7),
            (0x1FFC, u32::MAX),
        ];
        for (off, v) in garbage {
            assert!(page.store_u32(off, v), "{off:#x} is in the page");
        }
        // Long enough for every worker to look at the page again.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(g.csts() & 2, 0, "dbbuf {dbbuf}: no fatal status");
        // A trap stores a valid value over the garbage.
        let c = g.submit(1, rw(NvmOpcode::READ, 0, 1, DATA, 0));
        assert_eq!(c.status(), Status::SUCCESS, "dbbuf {dbbuf}");
        let c = g.admin(identify(1, 0, DATA));
        assert_eq!(c.status(), Status::SUCCESS, "dbbuf {dbbuf}");
    }
    drop(page);
    g.finish(&srv);
}
