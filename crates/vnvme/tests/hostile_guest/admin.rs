//! Admin commands that ask for too much: offsets past the end, thousands of AERs, floods.

use std::time::Duration;
use vnvme_spec::{AdminOpcode, NvmOpcode, Status};
use zerocopy::little_endian::U64;
use zerocopy::IntoBytes;

use crate::guest::*;

#[test]
fn identify_and_log_page_offsets_past_the_end_are_refused_or_zero_filled() {
    let srv = Served::start();
    let mut g = ready(&srv);
    // Unknown CNS and namespaces far out of range.
    let c = g.admin(identify(0xFF, 0, IDENTIFY_BUF));
    assert_eq!(c.status(), Status::INVALID_FIELD.with_dnr(true), "CNS FFh");
    let c = g.admin(identify(0, 0xFFFF_FFF0, IDENTIFY_BUF));
    assert_ne!(c.status(), Status::SUCCESS, "identify nsid FFFFFFF0h");
    // Log page offsets: past the end is Invalid Field; a read that runs off
    // the end gets zeroes; the largest offset and length don't overflow.
    for (lid, offset, dwords, ok) in [
        (0x02u8, 4096u64, 16u32, false),
        (0x04, 1 << 40, 16, false),
        (0x04, !3u64, 1024, false),
        (0x02, 508, 16, true),
        (0x04, 4092, 1024, true),
    ] {
        g.mem
            .fill((IDENTIFY_BUF - RAM_IOVA) as usize, 4096, 0xAA)
            .unwrap();
        let c = g.admin(get_log(lid, dwords, offset, IDENTIFY_BUF));
        if ok {
            assert_eq!(c.status(), Status::SUCCESS, "log {lid:#x} at {offset}");
            let tail = g.read_mem(IDENTIFY_BUF + 4, dwords as usize * 4 - 4);
            assert!(tail.iter().all(|&b| b == 0), "zeroes past the end");
        } else {
            assert_eq!(
                c.status(),
                Status::INVALID_FIELD.with_dnr(true),
                "log {lid:#x} at {offset:#x}"
            );
        }
    }
    g.finish(&srv);
}

#[test]
fn thousands_of_aers_hit_the_limit_and_the_queue_keeps_working() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let aerl = g.read_aerl();
    let outstanding = u32::from(aerl) + 1;
    let batch = u32::from(ADMIN_ENTRIES) - 1;
    // Far more than the limit (3100), in admin-queue-sized batches.
    for round in 0..100 {
        let cids: Vec<u16> = (0..batch)
            .map(|_| {
                let r = g.rings[0].as_mut().unwrap();
                let slot = r.sq + u64::from(r.tail) * 64;
                r.tail = (r.tail + 1) % r.size;
                g.cid = g.cid.wrapping_add(1);
                let mut c = cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0);
                c.set_cid(g.cid);
                g.write_mem(slot, c.as_bytes());
                g.cid
            })
            .collect();
        let tail = g.rings[0].unwrap().tail;
        g.w32(0x1000, u32::from(tail));
        // All but AERL + 1 (held for events) complete with AER Limit Exceeded.
        let expected = if round == 0 {
            batch - outstanding
        } else {
            batch
        };
        for _ in 0..expected {
            let c = g.reap_within(0, TIMEOUT).expect("AER completion");
            assert!(cids.contains(&c.cid()));
            assert_eq!(c.status(), Status::AER_LIMIT_EXCEEDED.with_dnr(true));
        }
    }
    assert!(
        g.reap_within(0, Duration::from_millis(100)).is_none(),
        "AERL + 1 requests stay outstanding"
    );
    g.finish(&srv);
}

impl Guest {
    fn read_aerl(&mut self) -> u8 {
        let c = self.admin(identify(1, 0, IDENTIFY_BUF));
        assert_eq!(c.status(), Status::SUCCESS);
        // Identify Controller AERL: byte 259.
        self.read_mem(IDENTIFY_BUF + 259, 1)[0]
    }
}

#[test]
fn a_flood_of_commands_keeps_the_controller_bounded() {
    let srv = Served::start();
    let mut g = ready(&srv);
    // 6300 commands, half of them failing: the controller keeps no
    // per-command state, and its Error Information log holds ELPE + 1
    // entries however many errors there were.
    for round in 0..100u32 {
        for i in 0..63u32 {
            let r = g.rings[1].as_mut().unwrap();
            let slot = r.sq + u64::from(r.tail) * 64;
            r.tail = (r.tail + 1) % r.size;
            let c = if i % 2 == 0 {
                rw(NvmOpcode::READ, u64::from(i), 1, DATA, 0)
            } else {
                rw(NvmOpcode::READ, 1 << 40, 1, 0x10_0000_0000, 0)
            };
            g.write_mem(slot, c.as_bytes());
        }
        let tail = g.rings[1].unwrap().tail;
        g.w32(0x1008, u32::from(tail));
        for _ in 0..63 {
            g.reap_within(1, TIMEOUT)
                .unwrap_or_else(|| panic!("completion in round {round}"));
        }
    }
    let stats = srv.ctrl.stats();
    assert!(stats.commands >= 100 * 63, "{} commands", stats.commands);
    let c = g.admin(identify(1, 0, IDENTIFY_BUF));
    assert_eq!(c.status(), Status::SUCCESS);
    // Identify Controller ELPE: byte 262, 0's based.
    let entries = usize::from(g.read_mem(IDENTIFY_BUF + 262, 1)[0]) + 1;
    let log_at = DATA + 0x10000;
    let len = (entries + 8) * 64;
    g.mem.fill((log_at - RAM_IOVA) as usize, len, 0xAA).unwrap();
    let mut c = get_log(0x01, (len / 4) as u32, 0, log_at);
    c.prp2 = U64::new(log_at + 0x1000);
    let c = g.admin(c);
    assert_eq!(c.status(), Status::SUCCESS);
    let log = g.read_mem(log_at, len);
    assert!(log[..64].iter().any(|&b| b != 0), "errors were logged");
    assert!(
        log[entries * 64..].iter().all(|&b| b == 0),
        "no more than ELPE + 1 = {entries} entries"
    );
    g.finish(&srv);
}
