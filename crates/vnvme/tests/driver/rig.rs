//! Standing the controller up for a test: the one place that knows how the
//! binary crate builds the PCI function and serves it in-process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme::inproc::InProcess;
use vnvme::namespace::NamespaceSpec;
use vnvme_controller::{ControllerStats, DoorbellMode, QueueStats};
use vnvme_driver::{Controller, DeviceAccess, InitOptions};

pub use crate::pattern::pattern;
pub use vnvme::device::{DeviceOptions, PollingOptions};

/// The controller being served, the driver's access to it and the driver.
pub struct Rig {
    pub server: InProcess,
    pub access: Arc<dyn DeviceAccess>,
    pub ctrl: Controller,
}

/// A device in doorbell `mode` with the controller's other defaults.
pub fn device(mode: DoorbellMode) -> DeviceOptions {
    DeviceOptions {
        doorbells: mode,
        ..DeviceOptions::default()
    }
}

/// An adaptive device whose workers keep polling (EventIdx behind the
/// host's updates) for a second after their last work: traps happen only
/// when a worker was asleep, i.e. before the first command of a test. (A
/// driver measuring shadow doorbells does not map the doorbell page it
/// offers: `map_doorbells: false`.)
pub fn polling_device() -> DeviceOptions {
    DeviceOptions {
        doorbells: DoorbellMode::Adaptive,
        polling: PollingOptions {
            idle_poll_us: Some(1_000_000),
            doze_us: Some(1_000_000),
            ..PollingOptions::default()
        },
        ..DeviceOptions::default()
    }
}

/// Serves `device` with `namespaces` (`vnvme serve` syntax, NSIDs from 1)
/// and brings the driver up with `opts`.
pub fn start(device: DeviceOptions, namespaces: &[&str], opts: InitOptions) -> Rig {
    let specs: Vec<NamespaceSpec> = namespaces.iter().map(|s| s.parse().unwrap()).collect();
    let device = device
        .build(&specs, &vnvme::identity::Origin::embedded())
        .unwrap();
    let (server, access, ctrl) = InProcess::start_driver(device, opts).unwrap();
    Rig {
        server,
        access,
        ctrl,
    }
}

impl Rig {
    /// The controller's counters, once every doorbell write sent so far has
    /// been handled: writes are posted (no reply), a register read is
    /// answered in order after them.
    pub fn stats(&self) -> ControllerStats {
        self.access.read32(0x1C).unwrap();
        self.server.controller().stats()
    }

    /// Counters of queue `qid` (see [`stats`](Self::stats)).
    pub fn queue(&self, qid: u16) -> QueueStats {
        self.stats().queue(qid)
    }

    /// Admin commands the controller received with opcode `name`.
    pub fn admin_received(&self, name: &str) -> u64 {
        self.stats().admin_commands.get(name).copied().unwrap_or(0)
    }

    /// I/O commands the controller received with opcode `name`.
    pub fn io_received(&self, name: &str) -> u64 {
        self.stats().io_commands.get(name).copied().unwrap_or(0)
    }
}

/// (SQ traps, CQ traps) of a queue.
pub fn traps(q: &QueueStats) -> (u64, u64) {
    (q.sq_doorbell_traps, q.cq_doorbell_traps)
}

/// Waits (up to 10 s) until `done` holds: for what the controller does on
/// its own threads after the driver has moved on (fetching the
/// Asynchronous Event Request left outstanding, counting an interrupt it
/// raised after posting the completion the driver already reaped).
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
