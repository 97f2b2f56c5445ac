//! Connections: who gets the device, and for how long a client may keep it
//! without speaking. Deadlines per handshake and per message, not per read;
//! extra connections refused at once; an idle negotiated client kept.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use vnvme::device::DeviceOptions;
use vnvme_vfio_user::wire::{cmd, read_prefix, Header};
use vnvme_vfio_user::{Client, Error, ServerOptions};
use zerocopy::IntoBytes;

use crate::guest::*;
use crate::peer::Peer;

/// A server whose handshake and message deadlines are 1 s.
fn quick() -> Served {
    Served::with_server_options(
        DeviceOptions::default(),
        ServerOptions {
            handshake_timeout: Duration::from_secs(1),
            message_timeout: Duration::from_secs(1),
            ..ServerOptions::default()
        },
        "16M:ram",
    )
}

#[test]
fn a_connection_that_never_sends_version_is_dropped_at_the_handshake_deadline() {
    let srv = quick();
    let mut silent = Peer::connect(&srv.path);
    let took = silent.expect_eof_within(Duration::from_secs(5));
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "dropped after {took:?}, the deadline is 1 s"
    );
    srv.assert_serves_a_new_client();
}

#[test]
fn commands_before_version_do_not_extend_the_handshake_deadline() {
    let srv = quick();
    let mut p = Peer::connect(&srv.path);
    let started = Instant::now();
    // Each is answered EINVAL until the connection is dropped all the same.
    let mut answered = 0;
    let closed_after = loop {
        let h = Header {
            msg_id: answered,
            command: cmd::DEVICE_GET_INFO,
            msg_size: 20,
            flags: 0,
            error: 0,
        };
        let mut m = h.as_bytes().to_vec();
        m.extend_from_slice(&16u32.to_le_bytes());
        let mut reply = [0u8; 16];
        if p.s.write_all(&m).is_err() || p.s.read_exact(&mut reply).is_err() {
            break started.elapsed();
        }
        assert_eq!(
            read_prefix::<Header>(&reply).unwrap().error as i32,
            libc::EINVAL
        );
        answered += 1;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still connected after 5 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(answered >= 5, "only {answered} commands were answered");
    assert!(
        closed_after >= Duration::from_millis(900) && closed_after < Duration::from_secs(3),
        "dropped after {closed_after:?}, the deadline is 1 s"
    );
    srv.assert_serves_a_new_client();
}

#[test]
fn a_client_that_sends_one_byte_at_a_time_is_dropped_at_the_message_deadline() {
    let srv = quick();
    let (mut p, _) = Peer::negotiated(&srv.path);
    // A DEVICE_GET_INFO header, a byte every 300 ms: each read is quick,
    // the message is not.
    let started = Instant::now();
    let header = [
        1u8, 0, 4, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0,
    ];
    for b in header {
        if p.s.write_all(&[b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
        if started.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    let took = started.elapsed() + p.expect_eof_within(Duration::from_secs(5));
    assert!(
        took < Duration::from_secs(4),
        "dropped after {took:?}, the deadline is 1 s"
    );
    srv.assert_serves_a_new_client();
}

#[test]
fn a_second_client_is_refused_with_ebusy_at_once() {
    let srv = Served::start();
    let owner = ready(&srv);
    let started = Instant::now();
    match Client::connect(&srv.path) {
        Err(Error::Busy) => {}
        other => panic!("a second client got {other:?}, not Busy"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refusal took {:?}",
        started.elapsed()
    );
    // The owner is not disturbed.
    owner.finish(&srv);
}

#[test]
fn a_silent_connection_does_not_lock_out_a_good_client() {
    let srv = quick();
    let _silent = Peer::connect(&srv.path);
    let started = Instant::now();
    // Refused while the silent one owns the device, served once it is dropped.
    let mut g = Guest::connect(&srv);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the good client waited {:?}",
        started.elapsed()
    );
    g.enable();
    g.create_io_pair(1, 64, IOSQ, IOCQ, 1);
    g.finish(&srv);
}

#[test]
fn silent_connections_give_way_to_a_client_that_speaks() {
    // A handshake deadline far beyond the test: only giving way ends them.
    let srv = Served::with_server_options(
        DeviceOptions::default(),
        ServerOptions {
            handshake_timeout: Duration::from_secs(60),
            ..ServerOptions::default()
        },
        "16M:ram",
    );
    let mut owner = Peer::connect(&srv.path);
    // Served first (the door hands it over at once), then two more that
    // wait at the door saying nothing, one of which hangs up.
    std::thread::sleep(Duration::from_millis(200));
    let mut waiting = Peer::connect(&srv.path);
    drop(Peer::connect(&srv.path));
    std::thread::sleep(Duration::from_millis(200));
    let c = Client::connect(&srv.path).expect("a client that speaks is served, not refused");
    assert!(
        owner.expect_eof_within(Duration::from_secs(10)) < Duration::from_secs(10),
        "the silent owner was dropped"
    );
    // The client keeps the device: the one still waiting is now refused
    // (the EBUSY reply to the VERSION it has not sent).
    let (h, _) = waiting.recv();
    assert_eq!(h.error as i32, libc::EBUSY, "{h:?}");
    drop(c);
    srv.assert_serves_a_new_client();
}

#[test]
fn the_next_client_gets_the_device_within_a_second_of_the_owner_leaving() {
    let srv = Served::start();
    let owner = ready(&srv);
    drop(owner);
    let started = Instant::now();
    let c = Client::connect(&srv.path).expect("served right after the owner left");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    drop(c);
    srv.assert_serves_a_new_client();
}

#[test]
fn an_idle_negotiated_client_is_never_dropped() {
    let srv = quick();
    let mut g = ready(&srv);
    // Well past both deadlines without a message.
    std::thread::sleep(Duration::from_millis(2500));
    g.assert_serving();
    g.finish(&srv);
}

#[test]
fn a_flood_of_connections_while_one_is_served_is_refused_and_the_owner_keeps_working() {
    let srv = Served::start();
    let mut owner = ready(&srv);
    for _ in 0..200 {
        match Client::connect(&srv.path) {
            Err(Error::Busy) | Err(Error::Io(_)) | Err(Error::Disconnected) => {}
            other => panic!("an extra connection got {other:?}"),
        }
    }
    owner.assert_serving();
    owner.finish(&srv);
}
