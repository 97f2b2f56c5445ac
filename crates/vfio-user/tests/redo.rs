//! A message a crashed server was handling (kept by a supervisor's crash
//! area, `Marked::redo`) is handled again by the server that adopts its
//! client, before any message the client sends after it: its effect
//! made, its reply (if asked for) the client's next.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use vnvme_vfio_user::handover::{Adopted, MAX_REDO_BYTES, REGION_REDO_BYTES};
use vnvme_vfio_user::wire::{cmd, flags, Header, RegionAccess, HEADER_SIZE};
use vnvme_vfio_user::*;
use zerocopy::{FromBytes, IntoBytes};

/// A config-space region access message: `data` to write, or `count`
/// bytes to read.
fn access(msg_id: u16, command: u16, offset: u64, count: u32, data: &[u8], flags: u32) -> Vec<u8> {
    let a = RegionAccess {
        offset,
        region: region::CONFIG,
        count,
    };
    let header = Header {
        msg_id,
        command,
        msg_size: (HEADER_SIZE + a.as_bytes().len() + data.len()) as u32,
        flags,
        error: 0,
    };
    [header.as_bytes(), a.as_bytes(), data].concat()
}

fn read_reply(client: &mut UnixStream) -> (Header, Vec<u8>) {
    let mut h = [0u8; HEADER_SIZE];
    client.read_exact(&mut h).unwrap();
    let header = Header::read_from_bytes(&h[..]).unwrap();
    let mut payload = vec![0u8; header.msg_size as usize - HEADER_SIZE];
    client.read_exact(&mut payload).unwrap();
    (header, payload)
}

#[test]
fn a_kept_region_write_is_handled_again_before_the_clients_next_message() {
    let (dev, _shared) = RamDevice::new();
    let (server_end, mut client) = UnixStream::pair().unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut adopted = Adopted::new(
        server_end,
        4096,
        MESSAGE_TIMEOUT,
        DmaLimits::default(),
        &[],
        Vec::new(),
    )
    .unwrap();
    // Refused: what no kept message can be.
    let info = access(1, cmd::DEVICE_GET_INFO, 0, 0, &[], 0);
    assert!(
        adopted.redo(&info, Vec::new()).is_err(),
        "not a message handled again"
    );
    let long = access(2, cmd::REGION_WRITE, 0x40, 80, &[0; 80], 0);
    assert!(long.len() > REGION_REDO_BYTES);
    assert!(adopted.redo(&long, Vec::new()).is_err(), "longer than kept");
    let longer = access(2, cmd::REGION_WRITE, 0x40, 500, &[0; 500], 0);
    assert!(longer.len() > MAX_REDO_BYTES);
    assert!(
        adopted.redo(&longer, Vec::new()).is_err(),
        "longer than kept"
    );
    // A region access with an fd, a DMA_MAP with two: not as kept.
    let null = || -> std::os::fd::OwnedFd { std::fs::File::open("/dev/null").unwrap().into() };
    let small = access(4, cmd::REGION_WRITE, 0x40, 4, &[1, 2, 3, 4], 0);
    assert!(
        adopted.redo(&small, vec![null()]).is_err(),
        "an fd too many"
    );
    // Header and 32 bytes, a DMA_MAP's size.
    let map = access(5, cmd::DMA_MAP, 0, 0, &[0; 16], 0);
    assert!(adopted.redo(&map, vec![null(), null()]).is_err(), "two fds");
    let mut torn = access(3, cmd::REGION_WRITE, 0x40, 4, &[1, 2, 3, 4], 0);
    torn.pop();
    assert!(
        adopted.redo(&torn, Vec::new()).is_err(),
        "size not its length"
    );
    // The write the dead server was handling, its reply asked for.
    let kept = access(7, cmd::REGION_WRITE, 0x40, 4, &[0xde, 0xad, 0xbe, 0xef], 0);
    adopted.redo(&kept, Vec::new()).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let door = Arc::new(Door::default());
    let thread = {
        let (stop, door) = (stop.clone(), door.clone());
        std::thread::spawn(move || {
            let mut server = Server::new(dev);
            server.serve_door_with(&door, &stop, None, Some(adopted))
        })
    };
    // The client's next message, a read of the same bytes, sent at once:
    // it is served after the kept one.
    client
        .write_all(&access(8, cmd::REGION_READ, 0x40, 4, &[], 0))
        .unwrap();
    let (h, _) = read_reply(&mut client);
    assert_eq!((h.msg_id, h.command), (7, cmd::REGION_WRITE));
    assert_eq!(h.flags, flags::TYPE_REPLY);
    let (h, payload) = read_reply(&mut client);
    assert_eq!((h.msg_id, h.command), (8, cmd::REGION_READ));
    assert_eq!(
        &payload[size_of::<RegionAccess>()..],
        &[0xde, 0xad, 0xbe, 0xef]
    );

    drop(client);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    thread.join().unwrap().unwrap();
}
