//! Clients that misbehave at the protocol level: disconnects, stalls, half messages.

use std::time::{Duration, Instant};
use vnvme_spec::NvmOpcode;
use zerocopy::IntoBytes;

use crate::guest::*;

#[test]
fn a_client_that_disconnects_mid_command_leaves_the_server_serving() {
    let srv = Served::start();
    let mut g = ready(&srv);
    // A batch in flight, then the client vanishes without a word.
    for i in 0..63u64 {
        let r = g.rings[1].as_mut().unwrap();
        let slot = r.sq + u64::from(r.tail) * 64;
        r.tail = (r.tail + 1) % r.size;
        g.write_mem(
            slot,
            rw(NvmOpcode::WRITE, i, 8, DATA, DATA + 0x2000).as_bytes(),
        );
    }
    let tail = g.rings[1].unwrap().tail;
    g.w32(0x1008, u32::from(tail));
    drop(g);
    srv.assert_serves_a_new_client();
}

/// The server serves one client at a time (QEMU keeps one connection per
/// device); a client that stalls in the middle of a message is dropped after
/// the connection's stall timeout (5 s, `vnvme_vfio_user::conn`), and the
/// next client waiting in the listen backlog is served.
#[test]
fn a_client_that_stalls_mid_message_is_dropped_and_the_next_is_served() {
    use std::io::Write;
    let srv = Served::start();
    let mut s = std::os::unix::net::UnixStream::connect(&srv.path).unwrap();
    // Half a header, then silence (the socket stays open).
    s.write_all(&[1, 0, 1, 0, 0x20]).unwrap();
    let started = Instant::now();
    srv.assert_serves_a_new_client();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the next client waited {:?}",
        started.elapsed()
    );
    drop(s);
}

/// The stop flag (SIGTERM in `vnvme serve`) ends the server even while a
/// client stalls mid-message: within the stall timeout.
#[test]
fn a_client_that_stalls_mid_message_does_not_keep_the_server_from_stopping() {
    use std::io::Write;
    let srv = Served::start();
    let mut s = std::os::unix::net::UnixStream::connect(&srv.path).unwrap();
    s.write_all(&[1, 0, 1, 0, 0x20]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    drop(srv);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the server took {:?} to stop",
        started.elapsed()
    );
    drop(s);
}

#[test]
fn a_client_that_stalls_mid_message_then_leaves_does_not_block_the_next() {
    use std::io::Write;
    let srv = Served::start();
    let mut s = std::os::unix::net::UnixStream::connect(&srv.path).unwrap();
    // A header announcing 64 bytes, and only 20 of them.
    let mut msg = vec![1u8, 0, 1, 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    msg.extend_from_slice(&[0; 4]);
    s.write_all(&msg).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    drop(s);
    srv.assert_serves_a_new_client();
}

#[test]
fn guest_ram_mapped_twice_or_overlapping_is_refused() {
    let srv = Served::start();
    let g = ready(&srv);
    // The same range again, and one overlapping its end.
    assert!(g
        .client
        .dma_map(RAM_IOVA, 0x1000, g.ram.fd(), 0, true)
        .is_err());
    assert!(g
        .client
        .dma_map(
            RAM_IOVA + RAM_SIZE as u64 - 0x1000,
            0x2000,
            g.ram.fd(),
            0,
            true
        )
        .is_err());
    g.finish(&srv);
}
