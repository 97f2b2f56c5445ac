//! Controller and driver in one process, joined by a real vfio-user
//! connection over a socketpair: what `vnvme bench` and the end-to-end tests
//! run on. The server half is `vnvme-device`'s [`InProcessServer`]; this adds
//! the driver on the client's end.

use std::sync::Arc;

use anyhow::{Context, Result};
use vnvme_controller::Controller;
use vnvme_device::{InProcessServer, NvmeDevice};
use vnvme_driver::{Controller as Driver, DeviceAccess, InitOptions, VfioUserAccess};

/// A device served on one end of a socketpair by a server thread, which
/// stops when this is dropped.
#[derive(Debug)]
pub struct InProcess {
    server: InProcessServer,
}

impl InProcess {
    /// Starts serving `device`; the other end is taken by [`access`](Self::access).
    pub fn start(device: NvmeDevice) -> Result<Self> {
        let server = InProcessServer::start(device).context("starting the in-process server")?;
        Ok(Self { server })
    }

    /// Starts serving `device` and brings the driver up on the other end.
    pub fn start_driver(
        device: NvmeDevice,
        init: InitOptions,
    ) -> Result<(Self, Arc<dyn DeviceAccess>, Driver)> {
        let mut inproc = Self::start(device)?;
        let access: Arc<dyn DeviceAccess> = Arc::new(inproc.access()?);
        let driver = Driver::init(Arc::clone(&access), init).context("driver initialisation")?;
        Ok((inproc, access, driver))
    }

    /// The controller being served, for its counters.
    pub fn controller(&self) -> &Arc<Controller> {
        self.server.controller()
    }

    /// The driver's side of the connection (once).
    pub fn access(&mut self) -> Result<VfioUserAccess> {
        let stream = self
            .server
            .take_client()
            .context("the client end was already taken")?;
        VfioUserAccess::from_stream(stream).context("vfio-user handshake")
    }
}
