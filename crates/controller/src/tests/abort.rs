//! Abort: commands still in their submission queue are aborted, others not.

use super::*;
use crate::memory::GuestAddress;

fn abort(sqid: u16, cid: u16) -> Command {
    let mut c = cmd(AdminOpcode::ABORT.0);
    c.cdw10 = U32::new(u32::from(sqid) | (u32::from(cid) << 16));
    c
}

/// Waits until `n` completions sit in CQ `qid` (head not moved).
fn wait_posted(h: &Host, qid: u16, n: u16) {
    let r = h.rings[usize::from(qid)].unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut b = [0u8; 16];
        h.mem
            .read(GuestAddress(r.cq + u64::from(n - 1) * 16), &mut b)
            .unwrap();
        if Completion::read_from_bytes(&b).unwrap().phase() {
            return;
        }
        assert!(Instant::now() < deadline, "{n} completions not posted");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn abort_completes_queued_commands_with_abort_requested_and_only_those() {
    let mut h = Host::new();
    h.enable();
    // A CQ of 4 entries holds 3 completions: the rest of 8 writes wait in
    // the SQ, unfetched, until the host moves the CQ head.
    assert!(h
        .admin(create_cq(1, 4, 1, cq_base(1)))
        .status()
        .is_success());
    assert!(h
        .admin(create_sq(1, 16, 1, sq_base(1)))
        .status()
        .is_success());
    h.rings[1] = Some(Ring {
        cq_size: 4,
        ..Ring::new(sq_base(1), cq_base(1), 16)
    });
    let mut cids = Vec::new();
    for i in 0..8u8 {
        let buf = DATA + u64::from(i) * 0x1000;
        h.mem.write(GuestAddress(buf), &[i + 1; 512]).unwrap();
        cids.push(h.push(1, rw(NvmOpcode::WRITE, 1, u64::from(i), 1, buf, 0)));
    }
    h.ring_sq(1);
    wait_posted(&h, 1, 3);

    let not_aborted = |c: Completion| c.status() == Status::SUCCESS && c.dw0.get() & 1 == 1;
    assert!(not_aborted(h.admin(abort(1, cids[0]))), "already completed");
    assert!(not_aborted(h.admin(abort(1, 0xBEEF))), "no such command");
    assert!(
        not_aborted(h.admin(abort(0, 1))),
        "admin commands are not aborted"
    );
    assert!(not_aborted(h.admin(abort(9, cids[5]))), "no such queue");
    // ACL = 3: four aborts may be pending per queue.
    for &cid in &cids[3..7] {
        let c = h.admin(abort(1, cid));
        assert_eq!(
            (c.status(), c.dw0.get() & 1),
            (Status::SUCCESS, 0),
            "cid {cid}"
        );
    }
    let c = h.admin(abort(1, cids[7]));
    assert_eq!(c.status(), Status::ABORT_LIMIT_EXCEEDED.with_dnr(true));

    let mut by_cid = std::collections::BTreeMap::new();
    for _ in 0..8 {
        let c = h.reap(1);
        by_cid.insert(c.cid(), c.status());
    }
    for (i, cid) in cids.iter().enumerate() {
        let aborted = (3..7).contains(&i);
        let want = if aborted {
            Status::ABORTED_BY_REQUEST
        } else {
            Status::SUCCESS
        };
        assert_eq!(by_cid[cid], want, "write {i}");
        let mut block = [0u8; 512];
        h.backend.read(i as u64 * 512, &mut block).unwrap();
        let expect = if aborted { 0 } else { i as u8 + 1 };
        assert_eq!(block, [expect; 512], "block {i}: aborted writes never ran");
    }
}
