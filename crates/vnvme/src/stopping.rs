//! The server's stop: a flag every thread looks at, and a [`StopWake`] that
//! wakes the threads blocked until it is set (vfio-user's door and client
//! loops, the stop watch), so an idle server sleeps without looking at the
//! flag every 100 ms. SIGINT, SIGTERM, the control socket's `shutdown` and
//! a controller whose thread cannot start ask for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use vnvme_vfio_user::StopWake;

#[derive(Debug, Clone)]
pub struct Stop {
    flag: Arc<AtomicBool>,
    wake: StopWake,
}

impl Stop {
    pub fn new() -> Result<Self> {
        Ok(Self {
            flag: Arc::new(AtomicBool::new(false)),
            wake: StopWake::new().context("making the stop's wake-up socket pair")?,
        })
    }

    /// Installs SIGINT and SIGTERM: the first asks for a clean stop, a
    /// second exits at once.
    pub fn on_signals(&self) -> Result<()> {
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&self.flag))
                .context("installing signal handlers")?;
            // The flag first, then the wake: a thread woken sees the stop.
            signal_hook::flag::register(sig, Arc::clone(&self.flag))
                .context("installing signal handlers")?;
            let writer = self
                .wake
                .signal_writer()
                .context("copying the stop's wake-up socket")?;
            signal_hook::low_level::pipe::register(sig, writer)
                .context("installing signal handlers")?;
        }
        Ok(())
    }

    /// Asks every thread to stop.
    pub fn ask(&self) {
        self.flag.store(true, Ordering::Release);
        self.wake.wake();
    }

    pub fn asked(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// The flag, for vfio-user's servers.
    pub fn flag(&self) -> &AtomicBool {
        &self.flag
    }

    /// The wake, for vfio-user's servers (`ServerOptions::stop_wake`).
    pub fn wake(&self) -> &StopWake {
        &self.wake
    }

    /// Blocks until a stop is asked.
    pub fn wait(&self) {
        while !self.asked() {
            self.wake.wait();
        }
    }
}
