//! Verified I/O on a thread of its own, round after round
//! ([`rounds::round`](super::rounds::round): every block written, read
//! back and compared, each command completed once and successfully),
//! while the test does something to the server (an upgrade, a kill).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vnvme_driver::{IoQueue, VfioUserAccess};

/// The thread, and what it has done.
pub struct IoThread {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    handle: JoinHandle<IoQueue>,
}

impl IoThread {
    /// Rounds `first`, `first + 1`, ... over blocks `0..blocks` on `q`.
    pub fn start(access: Arc<VfioUserAccess>, mut q: IoQueue, blocks: u64, first: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let handle = {
            let (stop, rounds) = (stop.clone(), rounds.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Acquire) {
                    super::rounds::round(&access, &mut q, blocks, first + n, true);
                    n += 1;
                    rounds.store(n, Ordering::Release);
                }
                q
            })
        };
        Self {
            stop,
            rounds,
            handle,
        }
    }

    /// Rounds done.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Acquire)
    }

    /// Waits until `more` rounds more than now are done (at most 30 s);
    /// a failure says what `server` returns (its log).
    pub fn wait_more(&self, more: u64, server: &dyn Fn() -> String) {
        let target = self.rounds() + more;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.rounds() < target {
            assert!(
                !self.handle.is_finished(),
                "the I/O thread failed\n{}",
                server()
            );
            assert!(Instant::now() < deadline, "no I/O\n{}", server());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops after the round under way: the queue and the rounds done.
    pub fn finish(self, server: &dyn Fn() -> String) -> (IoQueue, u64) {
        self.stop.store(true, Ordering::Release);
        let q = self
            .handle
            .join()
            .unwrap_or_else(|_| panic!("the I/O thread failed\n{}", server()));
        (q, self.rounds.load(Ordering::Acquire))
    }
}
