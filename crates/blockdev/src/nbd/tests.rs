//! The client against a scripted server that breaks the protocol on
//! purpose (real servers are exercised in `tests/nbd_servers.rs`).

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::*;
use crate::BlockRequest;

const MIB: u64 = 1 << 20;

fn timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(2),
        io: Duration::from_millis(500),
        retry: Duration::from_millis(100),
    }
}

/// A server at a fresh socket path that accepts one client and runs
/// `script` on it.
fn serve(script: impl FnOnce(UnixStream) + Send + 'static) -> (String, JoinHandle<()>) {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let path: PathBuf = std::env::temp_dir().join(format!(
        "vnvme-nbd-test-{}-{}.sock",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let uri = format!("nbd+unix:///disk?socket={}", path.display());
    let thread = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let _ = std::fs::remove_file(&path);
        script(s);
    });
    (uri, thread)
}

fn be_u16(s: &mut UnixStream) -> u16 {
    let mut b = [0; 2];
    s.read_exact(&mut b).unwrap();
    u16::from_be_bytes(b)
}

fn be_u32(s: &mut UnixStream) -> u32 {
    let mut b = [0; 4];
    s.read_exact(&mut b).unwrap();
    u32::from_be_bytes(b)
}

fn be_u64(s: &mut UnixStream) -> u64 {
    let mut b = [0; 8];
    s.read_exact(&mut b).unwrap();
    u64::from_be_bytes(b)
}

/// Greets, reads the client's flags and its `NBD_OPT_GO`, and answers
/// with `replies` (type, payload). A reply the client refuses from its
/// header (one too long) may find the socket already closed, so the
/// replies' writes may fail: what the client concluded is the test.
fn greet(s: &mut UnixStream, replies: &[(u32, Vec<u8>)]) {
    s.write_all(b"NBDMAGICIHAVEOPT\x00\x03").unwrap();
    assert_eq!(be_u32(s) & 1, 1, "client must ask for fixed newstyle");
    assert_eq!(be_u64(s), 0x4948_4156_454f_5054);
    assert_eq!(be_u32(s), 7, "NBD_OPT_GO");
    let len = be_u32(s);
    let mut body = vec![0; len as usize];
    s.read_exact(&mut body).unwrap();
    assert_eq!(&body[4..8], b"disk");
    for (kind, payload) in replies {
        let mut m = Vec::new();
        m.extend_from_slice(&0x0003_e889_0455_65a9u64.to_be_bytes());
        m.extend_from_slice(&7u32.to_be_bytes());
        m.extend_from_slice(&kind.to_be_bytes());
        m.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        m.extend_from_slice(payload);
        if s.write_all(&m).is_err() {
            return;
        }
    }
}

fn export_info(size: u64, flags: u16) -> (u32, Vec<u8>) {
    let mut p = vec![0, 0];
    p.extend_from_slice(&size.to_be_bytes());
    p.extend_from_slice(&(flags | 1).to_be_bytes());
    (3, p)
}

/// A server that completes the handshake of a writable 1 MiB export.
fn greet_ok(s: &mut UnixStream, flags: u16) {
    greet(s, &[export_info(MIB, flags), (1, vec![])]);
}

/// Reads one request: (type, cookie, length), and a write's payload.
fn request(s: &mut UnixStream) -> (u16, u64, u32) {
    assert_eq!(be_u32(s), 0x2560_9513);
    let _flags = be_u16(s);
    let kind = be_u16(s);
    let cookie = be_u64(s);
    let _offset = be_u64(s);
    let len = be_u32(s);
    if kind == cmd::WRITE {
        let mut data = vec![0; len as usize];
        s.read_exact(&mut data).unwrap();
    }
    (kind, cookie, len)
}

fn simple_reply(s: &mut UnixStream, magic: u32, error: u32, cookie: u64) {
    let mut m = magic.to_be_bytes().to_vec();
    m.extend_from_slice(&error.to_be_bytes());
    m.extend_from_slice(&cookie.to_be_bytes());
    s.write_all(&m).unwrap();
}

fn open(uri: &str) -> Result<NbdDevice, NbdError> {
    NbdDevice::open_with(uri, None, timeouts())
}

fn open_error(replies: Vec<(u32, Vec<u8>)>) -> String {
    let (uri, server) = serve(move |mut s| {
        greet(&mut s, &replies);
        let _ = s.read(&mut [0; 64]);
    });
    let err = link::chain(&open(&uri).unwrap_err());
    server.join().unwrap();
    err
}

#[test]
fn export_size_and_flags_come_from_the_handshake() {
    let flags = tflag::SEND_FLUSH | tflag::SEND_FUA | tflag::CAN_MULTI_CONN;
    let (uri, server) = serve(move |mut s| {
        greet(&mut s, &[export_info(MIB + 1000, flags), (1, vec![])]);
        assert_eq!(
            request(&mut s).0,
            cmd::DISC,
            "a closing client says goodbye"
        );
    });
    let dev = open(&uri).unwrap();
    assert_eq!(dev.size(), MIB, "rounded down to 4 KiB");
    assert!(dev.volatile_cache());
    assert!(dev.multi_conn());
    drop(dev);
    server.join().unwrap();
}

#[test]
fn refusals_and_broken_handshakes_are_explained() {
    let mut unknown = (0x8000_0006u32, b"no export named disk".to_vec());
    assert!(open_error(vec![unknown.clone()]).contains("no such export"));
    unknown.1 = b"no export \x1b[31m".to_vec();
    assert!(
        !open_error(vec![unknown]).contains('\x1b'),
        "control characters are dropped"
    );
    let huge = (3, vec![0; 70 << 10]);
    assert!(open_error(vec![huge]).contains("more than"));
    assert!(open_error(vec![(1, vec![])]).contains("no export information"));
    assert!(open_error(vec![(3, vec![0, 0, 1])]).contains("too short"));
    let read_only = export_info(MIB, tflag::READ_ONLY);
    assert!(open_error(vec![read_only, (1, vec![])]).contains("read-only"));
    let tiny = export_info(100, 0);
    assert!(open_error(vec![tiny, (1, vec![])]).contains("at least 4096 bytes"));
}

#[test]
fn a_handshake_dragged_out_byte_by_byte_times_out() {
    let (uri, server) = serve(|mut s| {
        for &b in b"NBDMAGICIHAVEOPT\x00\x03" {
            if s.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    let start = Instant::now();
    let err = link::chain(&open(&uri).unwrap_err());
    assert!(err.contains("took too long"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    server.join().unwrap();
}

#[test]
fn a_server_that_is_not_nbd_is_refused() {
    let (uri, server) = serve(|mut s| {
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    });
    let err = link::chain(&open(&uri).unwrap_err());
    assert!(err.contains("not an NBD server"), "{err}");
    server.join().unwrap();
}

/// Runs `misbehave` as the answer to the first request after a good
/// handshake, and checks that a read then fails promptly.
fn read_fails_when(misbehave: impl FnOnce(&mut UnixStream, u64) + Send + 'static) {
    let (uri, server) = serve(move |mut s| {
        greet_ok(&mut s, 0);
        let (kind, cookie, _) = request(&mut s);
        assert_eq!(kind, cmd::READ);
        misbehave(&mut s, cookie);
        // Keep the socket open until the client gives up.
        let _ = s.read(&mut [0; 64]);
    });
    let dev = open(&uri).unwrap();
    let start = Instant::now();
    let mut buf = vec![0; 4096];
    assert!(dev.read(0, &mut buf).is_err());
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    drop(dev);
    server.join().unwrap();
}

#[test]
fn a_reply_to_an_unknown_cookie_fails_the_connection() {
    read_fails_when(|s, cookie| simple_reply(s, 0x6744_6698, 0, cookie ^ 0xdead));
}

#[test]
fn a_reply_with_bad_magic_fails_the_connection() {
    read_fails_when(|s, cookie| simple_reply(s, 0x1234_5678, 0, cookie));
}

#[test]
fn a_structured_reply_fails_the_connection() {
    read_fails_when(|s, cookie| simple_reply(s, 0x668e_33ef, 0, cookie));
}

#[test]
fn a_short_read_reply_fails_the_request() {
    read_fails_when(|s, cookie| {
        simple_reply(s, 0x6744_6698, 0, cookie);
        // A client that gave up first (its I/O timeout on a loaded
        // machine) has closed the socket: the read failed either way.
        let _ = s.write_all(&[7; 100]);
        let _ = s.shutdown(std::net::Shutdown::Write);
    });
}

#[test]
fn a_silent_server_times_out() {
    read_fails_when(|_, _| {});
}

#[test]
fn a_server_that_trickles_a_reply_times_out() {
    read_fails_when(|s, cookie| {
        simple_reply(s, 0x6744_6698, 0, cookie);
        for _ in 0..80 {
            if s.write_all(&[1]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
}

#[test]
fn an_error_reply_fails_only_that_request() {
    let (uri, server) = serve(|mut s| {
        greet_ok(&mut s, 0);
        let (_, cookie, _) = request(&mut s);
        simple_reply(&mut s, 0x6744_6698, 5, cookie);
        let (_, cookie, len) = request(&mut s);
        simple_reply(&mut s, 0x6744_6698, 0, cookie);
        s.write_all(&vec![9; len as usize]).unwrap();
        assert_eq!(request(&mut s).0, cmd::DISC);
    });
    let dev = open(&uri).unwrap();
    let mut buf = vec![0; 4096];
    let err = dev.read(0, &mut buf).unwrap_err();
    assert!(
        matches!(&err, BlockError::Io(e) if e.raw_os_error() == Some(5)),
        "{err:?}"
    );
    dev.read(4096, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 9));
    drop(dev);
    server.join().unwrap();
}

#[test]
fn requests_out_of_range_fail_without_reaching_the_server() {
    let (uri, server) = serve(|mut s| {
        greet_ok(&mut s, tflag::SEND_WRITE_ZEROES);
        assert_eq!(request(&mut s).0, cmd::DISC);
    });
    let dev = open(&uri).unwrap();
    let mut buf = vec![0; 4096];
    assert!(matches!(
        dev.read(MIB, &mut buf),
        Err(BlockError::OutOfRange { .. })
    ));
    assert!(matches!(
        dev.write(u64::MAX, &buf),
        Err(BlockError::OutOfRange { .. })
    ));
    assert!(matches!(
        dev.write_zeroes(0, MIB + 1),
        Err(BlockError::OutOfRange { .. })
    ));
    drop(dev);
    server.join().unwrap();
}

#[test]
fn a_queue_reports_a_lost_server_on_every_request() {
    let (uri, server) = serve(|mut s| {
        greet_ok(&mut s, tflag::SEND_FLUSH);
        // Take two requests, then vanish without answering.
        request(&mut s);
        request(&mut s);
    });
    let dev = open(&uri).unwrap();
    let mut q = dev.queue(Arc::new(|| {})).unwrap();
    for token in 0..2 {
        let data = Data::Buf(IoBuf::zeroed(4096));
        q.submit(BlockRequest::Read { offset: 0, data }, token)
            .unwrap();
    }
    server.join().unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while out.len() < 2 && Instant::now() < deadline {
        q.poll(&mut out, 8);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|c| c.result.is_err() && c.data.is_some()));
    // The server is gone for good: later requests fail at once.
    q.submit(BlockRequest::Flush, 9).unwrap();
    let mut out = Vec::new();
    assert_eq!(q.poll(&mut out, 8), 1);
    assert!(out[0].result.is_err());
    assert_eq!(q.in_flight(), 0);
}

#[test]
fn dropping_a_queue_does_not_wait_long_for_a_silent_server() {
    let (uri, server) = serve(|mut s| {
        greet_ok(&mut s, 0);
        request(&mut s);
        // Never answer; hold the socket until the client leaves.
        let _ = s.read(&mut [0; 64]);
    });
    let patient = Timeouts {
        io: Duration::from_secs(30),
        ..timeouts()
    };
    let dev = NbdDevice::open_with(&uri, None, patient).unwrap();
    let mut q = dev.queue(Arc::new(|| {})).unwrap();
    let data = Data::Buf(IoBuf::zeroed(4096));
    q.submit(BlockRequest::Read { offset: 0, data }, 1).unwrap();
    let start = Instant::now();
    drop(q);
    drop(dev);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    server.join().unwrap();
}

#[test]
fn requests_fail_at_once_while_a_reconnection_hangs() {
    let path = std::env::temp_dir().join(format!("vnvme-nbd-hang-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let uri = format!("nbd+unix:///disk?socket={}", path.display());
    let server = std::thread::spawn(move || {
        let (mut first, _) = listener.accept().unwrap();
        greet_ok(&mut first, 0);
        drop(first);
        // Accept the reconnection and never say a word.
        let (silent, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(3));
        drop(silent);
    });
    let dev = open(&uri).unwrap();
    let mut buf = vec![0; 4096];
    let deadline = Instant::now() + Duration::from_secs(2);
    // The first failure sees the connection closed; later ones, the
    // reconnection under way, whose handshake waits for the 2 s timeout.
    for _ in 0..20 {
        let start = Instant::now();
        assert!(dev.read(0, &mut buf).is_err());
        assert!(
            start.elapsed() < Duration::from_millis(300),
            "{:?}",
            start.elapsed()
        );
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(dev);
    server.join().unwrap();
    let _ = std::fs::remove_file(&path);
}
