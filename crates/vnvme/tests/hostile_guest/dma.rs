//! Guest addresses that point where they must not: the device's own registers, unmapped memory, memory unmapped under a command.

use std::sync::Arc;
use std::time::Duration;
use vnvme_driver::access::DmaRegion;
use vnvme_spec::{AdminOpcode, NvmOpcode, Status};
use zerocopy::IntoBytes;

use crate::guest::*;

#[test]
fn prp_at_bar0_or_msix_table_address_is_a_data_transfer_error_not_a_register_write() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let mut table = [0u8; 64];
    g.client.region_read(0, 0x2000, &mut table).unwrap();
    // BAR0's guest physical address (doorbells, MSI-X table) and the raw BAR
    // offsets: none is in the DMA map table, whatever the guest's layout.
    for addr in [BAR0_GPA + 0x1000, BAR0_GPA + 0x2000, 0x1000, 0x2000] {
        let c = g.submit(1, rw(NvmOpcode::READ, 0, 1, addr, 0));
        assert_eq!(c.status(), dte(), "read into {addr:#x}");
        let c = g.submit(1, rw(NvmOpcode::WRITE, 0, 1, addr, 0));
        assert_eq!(c.status(), dte(), "write from {addr:#x}");
        // A PRP list whose entries name the registers.
        let list = [addr.to_le_bytes(), (addr + 0x1000).to_le_bytes()].concat();
        g.write_mem(DATA + 0x3000, &list);
        let c = g.submit(1, rw(NvmOpcode::READ, 0, 3, DATA + 0x800, DATA + 0x3000));
        assert_eq!(c.status(), dte(), "PRP list into {addr:#x}");
    }
    // Identify into the MSI-X table: same answer, table untouched.
    let c = g.admin(identify(1, 0, BAR0_GPA + 0x2000));
    assert_eq!(c.status(), dte());
    let mut after = [0u8; 64];
    g.client.region_read(0, 0x2000, &mut after).unwrap();
    assert_eq!(table, after, "MSI-X table unchanged");
    g.finish(&srv);
}

#[test]
fn queue_base_at_bar0_address_sets_cfs_and_a_reset_recovers() {
    let srv = Served::start();
    let mut g = ready(&srv);
    // Creation does not touch the memory (the spec leaves it to first use).
    let c = g.admin(create_cq(2, 16, BAR0_GPA + 0x2000, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    let c = g.admin(create_sq(2, 16, BAR0_GPA + 0x1000, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    let fatal_before = g.stats(&srv).fatal_errors;
    // The SQ tail doorbell: the entry is "fetched" from an unmapped address.
    g.w32(0x1000 + 16, 1);
    g.wait_csts("CSTS.CFS", |c| c & 2 != 0);
    assert_eq!(g.stats(&srv).fatal_errors, fatal_before + 1);
    // The host's recovery: a controller reset, then everything works.
    g.enable();
    g.create_io_pair(1, 64, IOSQ, IOCQ, 1);
    g.finish(&srv);
}

#[test]
fn prp_into_unmapped_memory_or_across_the_end_of_a_map_fails_cleanly() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let end = RAM_IOVA + RAM_SIZE as u64;
    // A second map right after the first is separate: an access that spans
    // both works only if each page is in one map (PRP pages are).
    let cases = [
        (0x10_0000_0000, 0, 1, "far outside any map"),
        (RAM_IOVA - 0x1000, 0, 1, "the page before the map"),
        (end - 0x200, end, 2, "first page's tail then past the end"),
        (end - 0x1000, 0, 2, "PRP2 zero for a two-page transfer"),
        (u64::MAX - 0xFFF, 0, 1, "the top of the address space"),
    ];
    for (prp1, prp2, blocks, what) in cases {
        let c = g.submit(1, rw(NvmOpcode::READ, 0, blocks, prp1, prp2));
        assert!(
            c.status() == dte() || c.status().sct() == 0 && c.status().sc() != 0,
            "{what}: {:?}",
            c.status()
        );
        assert_ne!(c.status(), Status::SUCCESS, "{what}");
    }
    // Exactly the last page of the map is fine.
    let c = g.submit(1, rw(NvmOpcode::READ, 0, 1, end - 0x1000, 0));
    assert_eq!(c.status(), Status::SUCCESS, "the last page of the map");
    g.finish(&srv);
}

#[test]
fn dma_unmap_of_memory_in_use_fails_the_commands_cleanly() {
    unmap_under_commands(&Served::start());
}

/// The same on a `file` namespace, whose reads are in flight on io_uring,
/// into the memory itself, while it goes: the unmap waits for those, and
/// the commands fetched after it fail cleanly.
#[test]
fn dma_unmap_under_reads_in_flight_on_a_file_namespace_fails_them_cleanly() {
    let file = std::env::temp_dir().join(format!("vnvme-hostile-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&file);
    unmap_under_commands(&Served::with_namespace(&format!(
        "16M:file={}",
        file.display()
    )));
    let _ = std::fs::remove_file(&file);
}

fn unmap_under_commands(srv: &Served) {
    let mut g = ready(srv);
    // A second map for data, used by a batch of commands, unmapped while
    // they wait: their CQ has room for 3 completions, so the controller
    // holds the rest of the batch until the host reaps.
    g.create_io_pair(2, 64, IOSQ + 0x4000, IOCQ + 0x4000, 2);
    let c = g.admin(delete(AdminOpcode::DELETE_IO_SQ, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    let c = g.admin(delete(AdminOpcode::DELETE_IO_CQ, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    g.mem
        .fill((IOCQ + 0x4000 - RAM_IOVA) as usize, 64, 0)
        .unwrap();
    let c = g.admin(create_cq(2, 4, IOCQ + 0x4000, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    let c = g.admin(create_sq(2, 64, IOSQ + 0x4000, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    g.rings[2] = Some(Ring {
        sq: IOSQ + 0x4000,
        cq: IOCQ + 0x4000,
        size: 64,
        cq_size: 4,
        tail: 0,
        head: 0,
        phase: true,
    });
    let extra_iova = 0x2_0000_0000;
    let extra = Arc::new(DmaRegion::new(1 << 20, extra_iova).unwrap());
    let xb = extra.buffer(0, 1 << 20).unwrap();
    g.client
        .dma_map(extra_iova, 1 << 20, extra.fd(), 0, true)
        .unwrap();
    let n = 60u16;
    for i in 0..n {
        // Four 4 KiB blocks: PRP1 and a PRP list of three pages, all in the
        // extra map.
        let base = extra_iova + u64::from(i % 15) * 0x10000;
        let list_at = 0xF_0000 + usize::from(i) * 64;
        let list: Vec<u8> = (1..4u64)
            .flat_map(|p| (base + p * 0x1000).to_le_bytes())
            .collect();
        xb.write_bytes(list_at, &list).unwrap();
        let c = rw(
            NvmOpcode::READ,
            u64::from(i),
            4,
            base,
            extra_iova + list_at as u64,
        );
        let r = g.rings[2].as_mut().unwrap();
        let slot = r.sq + u64::from(r.tail) * 64;
        r.tail = (r.tail + 1) % r.size;
        g.write_mem(slot, c.as_bytes());
    }
    let tail = g.rings[2].unwrap().tail;
    g.w32(0x1010, u32::from(tail));
    std::thread::sleep(Duration::from_millis(50));
    g.client.dma_unmap(extra_iova, 1 << 20).unwrap();
    let mut ok = 0;
    let mut failed = 0;
    for _ in 0..n {
        let c = g.reap_within(2, TIMEOUT).unwrap_or_else(|| {
            panic!(
                "every command completes: {ok} ok, {failed} failed, CSTS {:#x}, {:?}",
                g.csts(),
                srv.ctrl.stats().queue(2)
            )
        });
        match c.status() {
            s if s == Status::SUCCESS => ok += 1,
            s => {
                assert_eq!(s, dte(), "a command whose memory went away");
                failed += 1;
            }
        }
    }
    eprintln!("{ok} completed before the unmap, {failed} failed after");
    assert!(
        failed >= 50,
        "most of the batch ran after the unmap ({failed})"
    );
    drop(xb);
    drop(extra);
    g.finish(srv);
}
