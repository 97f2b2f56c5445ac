//! Everything a client can size is bounded: DMA maps, mapped bytes,
//! message sizes. Refusals are errnos, never an abort.

use std::os::fd::AsFd;

use vnvme::device::DeviceOptions;
use vnvme_vfio_user::{DmaLimits, ServerOptions};

use crate::guest::*;
use crate::peer::{fds, Peer};

fn limited(max_maps: usize, max_bytes: u64) -> Served {
    Served::with_server_options(
        DeviceOptions::default(),
        ServerOptions {
            dma_limits: DmaLimits {
                max_maps,
                max_bytes,
            },
            ..ServerOptions::default()
        },
        "16M:ram",
    )
}

#[test]
fn max_dma_maps_is_advertised_and_one_more_map_is_enospc() {
    let srv = limited(8, 1 << 40);
    let (mut p, caps) = Peer::negotiated(&srv.path);
    assert_eq!(caps["capabilities"]["max_dma_maps"], 8);
    let mem = fds::memfd(0x10000);
    for i in 0..8u16 {
        p.dma_map(
            i,
            0x100000 + u64::from(i) * 0x1000,
            0x1000,
            0,
            Some(mem.as_fd()),
        );
    }
    // Pipelined, as QEMU sends them.
    for i in 0..8u16 {
        p.expect_ok(i);
    }
    p.dma_map(8, 0x200000, 0x1000, 0, Some(mem.as_fd()));
    p.expect_errno(8, libc::ENOSPC);
    // Unmapping one makes room.
    p.dma_unmap(9, 0x100000, 0x1000, None);
    p.expect_ok(9);
    p.dma_map(10, 0x200000, 0x1000, 0, Some(mem.as_fd()));
    p.expect_ok(10);
    drop(p);
    srv.assert_serves_a_new_client();
}

#[test]
fn the_default_max_dma_maps_stays_well_below_vm_max_map_count() {
    let srv = Served::start();
    let (p, caps) = Peer::negotiated(&srv.path);
    let advertised = caps["capabilities"]["max_dma_maps"].as_u64().unwrap();
    let max_map_count: u64 = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        advertised >= 64,
        "QEMU and SPDK need dozens of maps: {advertised}"
    );
    assert!(
        advertised * 2 <= max_map_count,
        "{advertised} maps against vm.max_map_count {max_map_count}"
    );
    drop(p);
    srv.assert_serves_a_new_client();
}

/// 77 maps of 64 TiB sparse memfds used to exhaust the address space and
/// make the next large allocation abort the process.
#[test]
fn sparse_64_tib_maps_beyond_max_dma_size_are_enomem_and_large_messages_still_work() {
    let srv = Served::start();
    let (mut p, _) = Peer::negotiated(&srv.path);
    let huge = fds::memfd(64 << 40);
    let mut refused = 0;
    for i in 0..77u16 {
        p.dma_map(i, u64::from(i) << 46, 64 << 40, 0, Some(huge.as_fd()));
        let (h, _) = p.recv();
        assert_eq!(h.msg_id, i);
        if h.is_error() {
            assert_eq!(h.error as i32, libc::ENOMEM, "map {i}");
            refused += 1;
        }
    }
    assert_eq!(refused, 77, "a 64 TiB map is over the default 4 TiB limit");
    // A large (1 MiB) region read still allocates fine.
    p.region_access(
        100,
        vnvme_vfio_user::wire::cmd::REGION_READ,
        7,
        0,
        4096,
        &[],
    );
    p.expect_ok(100);
    drop(p);
    srv.assert_serves_a_new_client();
}

/// 65,535 small maps (more than vm.max_map_count) used to exhaust the
/// kernel's map count: the server stops at its limit.
#[test]
fn a_flood_of_small_maps_stops_at_max_dma_maps() {
    let srv = Served::start();
    let (mut p, caps) = Peer::negotiated(&srv.path);
    let limit = caps["capabilities"]["max_dma_maps"].as_u64().unwrap() as u32;
    let mem = fds::memfd(0x1000);
    let total = limit + 100;
    let mut ok = 0;
    let mut enospc = 0;
    // In batches, so neither socket buffer fills.
    let mut sent = 0u32;
    while sent < total {
        let batch = (total - sent).min(64);
        for k in 0..batch {
            let i = sent + k;
            p.dma_map(
                i as u16,
                0x1_0000_0000 + u64::from(i) * 0x2000,
                0x1000,
                0,
                Some(mem.as_fd()),
            );
        }
        for _ in 0..batch {
            let (h, _) = p.recv();
            if h.is_error() {
                assert_eq!(h.error as i32, libc::ENOSPC);
                enospc += 1;
            } else {
                ok += 1;
            }
        }
        sent += batch;
    }
    assert_eq!(ok, limit);
    assert_eq!(enospc, 100);
    drop(p);
    srv.assert_serves_a_new_client();
}
