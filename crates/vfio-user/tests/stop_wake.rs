//! A server given a [`StopWake`] waits without timeouts: idle, with no
//! client or with a silent one, its door and client loop never wake, and
//! a stop (the flag, then the wake) still ends it. Without one they look
//! at the flag every 100 ms, which the same count shows.

mod common;

use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use vnvme_vfio_user::*;

fn idle_then_stop(with_wake: bool) -> (u64, u64) {
    let path = std::env::temp_dir().join(format!(
        "vnvme-vfio-user-{}-stop-wake-{with_wake}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let wake = StopWake::new().unwrap();
    let opts = ServerOptions {
        stop_wake: with_wake.then(|| wake.clone()),
        ..ServerOptions::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (dev, _shared) = RamDevice::new();
    let server = Server::with_options(dev, opts);
    let idle = server.idle_wakeups();
    let thread = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut server = server;
            server.serve_listener(&listener, &stop)
        })
    };
    // No client: only the door waits.
    std::thread::sleep(Duration::from_millis(500));
    let alone = idle.load(Ordering::SeqCst);
    // A client that says nothing after its handshake.
    let client = Client::connect(&path).unwrap();
    assert_eq!(client.device_info().unwrap().num_irqs, irq::COUNT);
    let before = idle.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(500));
    let silent = idle.load(Ordering::SeqCst) - before;
    stop.store(true, Ordering::SeqCst);
    wake.wake();
    thread.join().unwrap().unwrap();
    assert!(wake.woken() || !with_wake);
    let _ = std::fs::remove_file(&path);
    (alone, silent)
}

#[test]
fn an_idle_server_with_a_stop_wake_never_wakes_until_stopped() {
    assert_eq!(idle_then_stop(true), (0, 0));
}

#[test]
fn without_one_the_same_server_polls_its_stop_flag() {
    let (alone, silent) = idle_then_stop(false);
    assert!(alone > 0 && silent > 0, "{alone} {silent}");
}
