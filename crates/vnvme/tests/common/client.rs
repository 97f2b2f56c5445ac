//! A driver client of one controller of a real `vnvme serve`, with its one
//! I/O queue; a test adds the commands it sends in an `impl Client` of its
//! own.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use vnvme_driver::{Controller, DeviceAccess, InitOptions, IoQueue, VfioUserAccess};

pub struct Client {
    pub mem: Arc<dyn DeviceAccess>,
    pub ctrl: Controller,
    pub q: IoQueue,
}

impl Client {
    /// Connects to `socket` (retrying until the server listens) and
    /// initialises the controller with one I/O queue of 32 entries.
    pub fn connect(socket: &Path) -> Self {
        let access = super::connect(socket)
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", socket.display()));
        let mem: Arc<dyn DeviceAccess> = Arc::new(access);
        let opts = InitOptions {
            io_queues: 1,
            queue_depth: 32,
            io_timeout: Duration::from_secs(20),
            ..InitOptions::default()
        };
        let ctrl = Controller::init(Arc::clone(&mem), opts).unwrap();
        let q = ctrl.take_io_queue(0).unwrap();
        Self { mem, ctrl, q }
    }
}

/// Our driver on `socket` with its default options (one connection
/// attempt): its memory, the controller and its first I/O queue.
pub fn default_client(socket: &Path) -> (Arc<VfioUserAccess>, Controller, IoQueue) {
    let access = Arc::new(VfioUserAccess::connect(socket).unwrap());
    let ctrl = Controller::init(
        access.clone() as Arc<dyn DeviceAccess>,
        InitOptions::default(),
    )
    .unwrap();
    let q = ctrl.take_io_queue(0).unwrap();
    (access, ctrl, q)
}
