//! A handover request wakes the server loop at once: with the handover's
//! wake fd in its poll, the loop does not wait for its stop poll (100 ms)
//! to see the request while the client is silent (QEMU with the doorbell
//! page mapped sends almost no messages).

mod common;

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use common::*;
use parking_lot::Mutex;
use vnvme_vfio_user::handover::{ClientParts, Handover};
use vnvme_vfio_user::*;

/// A handover that never passes anything on: `transfer` notes what it
/// was given and fails, so the server resumes and serves on.
struct Probe {
    asked: AtomicBool,
    wake: UnixStream,
    pauses: AtomicUsize,
    resumes: AtomicUsize,
    /// Whether the last transfer was given the client.
    passed: AtomicBool,
    /// Told at each refusal (the end of a handover) whether it was.
    transfers: Mutex<Option<mpsc::SyncSender<bool>>>,
}

impl Handover<RamDevice> for Probe {
    fn asked(&self) -> bool {
        self.asked.load(Ordering::SeqCst)
    }

    fn wake_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.wake.as_fd())
    }

    fn refuse(&self, _why: String) {
        self.asked.store(false, Ordering::SeqCst);
        if let Some(tx) = self.transfers.lock().as_ref() {
            let _ = tx.send(self.passed.swap(false, Ordering::SeqCst));
        }
    }

    fn pause(&self, _device: &mut RamDevice) -> Result<(), String> {
        self.pauses.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn resume(&self, _device: &mut RamDevice) {
        self.resumes.fetch_add(1, Ordering::SeqCst);
    }

    fn transfer(&self, _device: &mut RamDevice, client: Option<ClientParts<'_>>) -> String {
        self.passed.store(client.is_some(), Ordering::SeqCst);
        "a probe passes nothing on".into()
    }
}

#[test]
fn handover_request_wakes_the_loop_without_a_stop_poll() {
    let path = std::env::temp_dir().join(format!(
        "vnvme-vfio-user-{}-handover-wake.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let (wake, mut waker) = UnixStream::pair().unwrap();
    wake.set_nonblocking(true).unwrap();
    let (tx, transfers) = mpsc::sync_channel(4);
    let probe = Arc::new(Probe {
        asked: AtomicBool::new(false),
        wake,
        pauses: AtomicUsize::new(0),
        resumes: AtomicUsize::new(0),
        passed: AtomicBool::new(false),
        transfers: Mutex::new(Some(tx)),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let (dev, _shared) = RamDevice::new();
    let server = Server::new(dev);
    let late = server.late_handover_polls();
    let thread = {
        let (probe, stop) = (probe.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut server = server;
            let h: &dyn Handover<RamDevice> = &*probe;
            server.serve_listener_with(&listener, &stop, Some(h), None)
        })
    };
    let client = Client::connect(&path).unwrap();
    assert_eq!(client.device_info().unwrap().num_irqs, irq::COUNT);

    // The client is now silent: only the wake can end the loop's wait
    // before its stop poll runs out.
    for round in 1..=3 {
        probe.asked.store(true, Ordering::SeqCst);
        waker.write_all(&[1]).unwrap();
        assert!(
            transfers.recv().unwrap(),
            "round {round}: the client is passed"
        );
        assert_eq!(probe.pauses.load(Ordering::SeqCst), round);
        assert_eq!(probe.resumes.load(Ordering::SeqCst), round);
        assert_eq!(
            late.load(Ordering::SeqCst),
            0,
            "round {round}: the request waited for a stop poll"
        );
        // Refused: the server serves the same client on.
        assert_eq!(client.device_info().unwrap().num_irqs, irq::COUNT);
    }

    drop(client);
    stop.store(true, Ordering::SeqCst);
    thread.join().unwrap().unwrap();
    let _ = std::fs::remove_file(&path);
}
