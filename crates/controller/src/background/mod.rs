//! The thread of a background operation (sanitize, device self-test): it
//! works in steps at the pace of the emulated medium and stops when told,
//! so neither the next operation nor the server's shutdown (SIGTERM drops
//! the controller) waits for it longer than one step.

pub(crate) mod sanitize;
mod saved;
pub(crate) mod self_test;

pub(crate) use saved::SavedBackground;

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

#[derive(Debug, Default)]
pub(crate) struct Task {
    stop: Mutex<bool>,
    cv: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Task {
    /// Runs `body` on a new thread, once the previous one (told to stop)
    /// has ended: a task never runs two threads at once.
    pub fn start(&self, name: &str, body: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let mut thread = self.thread.lock();
        self.join(&mut thread);
        *self.stop.lock() = false;
        let spawned = std::thread::Builder::new().name(name.into()).spawn(body)?;
        *thread = Some(spawned);
        Ok(())
    }

    /// Whether a thread was started and not stopped (it may have ended by
    /// itself).
    pub fn running(&self) -> bool {
        self.thread
            .lock()
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    /// Tells the thread to stop at its next step, without waiting for it
    /// (callers may hold locks the thread takes).
    pub fn signal_stop(&self) {
        *self.stop.lock() = true;
        self.cv.notify_all();
    }

    /// Stops the thread and waits for it. Not from the task's own thread.
    pub fn stop(&self) {
        let mut thread = self.thread.lock();
        self.join(&mut thread);
    }

    fn join(&self, thread: &mut Option<JoinHandle<()>>) {
        self.signal_stop();
        if let Some(t) = thread.take() {
            if t.join().is_err() {
                tracing::error!("a background operation's thread panicked");
            }
        }
    }

    /// Sleeps until `deadline`; false if the thread was told to stop.
    pub fn pace(&self, deadline: Instant) -> bool {
        let mut stop = self.stop.lock();
        while !*stop && Instant::now() < deadline {
            self.cv.wait_until(&mut stop, deadline);
        }
        !*stop
    }
}

/// A paced operation's clock: `rate` bytes of medium per second since
/// `start` (0: as fast as the backend goes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pace {
    start: Instant,
    rate: u64,
}

impl Pace {
    /// Largest step: bounds the memory a step uses and the wait to stop.
    const MAX_STEP: u64 = 1 << 20;

    pub fn new(rate: u64) -> Self {
        Self {
            start: Instant::now(),
            rate,
        }
    }

    /// Bytes per step: about 32 steps a second, so progress moves
    /// visibly, within 4 KiB..=1 MiB.
    pub fn step(&self) -> u64 {
        match self.rate {
            0 => Self::MAX_STEP,
            r => (r / 32).clamp(4096, Self::MAX_STEP) & !4095,
        }
    }

    /// Waits until `done` bytes are due; false if `task` was told to stop.
    pub fn wait(&self, task: &Task, done: u64) -> bool {
        if self.rate == 0 {
            return task.pace(self.start);
        }
        let nanos = u128::from(done) * 1_000_000_000 / u128::from(self.rate);
        let wait = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        // Centuries away (a rate of a few bytes a second) is not an Instant
        // there is: go on unpaced rather than fail.
        let due = self.start.checked_add(wait).unwrap_or(self.start);
        task.pace(due)
    }
}

/// Seconds `bytes` take at `rate` bytes per second, rounded up (None:
/// unpaced, no estimate).
pub(crate) fn seconds(bytes: u64, rate: u64) -> Option<u64> {
    (rate != 0).then(|| bytes.div_ceil(rate))
}
