//! Controller and driver in one process, joined by a real vfio-user
//! connection over a socketpair: what `vnvme bench` and the end-to-end tests
//! run on. A trap costs what it really costs: a message on a socket, read by
//! the server's control thread.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use vnvme_controller::Controller;
use vnvme_driver::{Controller as Driver, DeviceAccess, InitOptions, VfioUserAccess};

use crate::device::NvmeDevice;

/// A device served on one end of a socketpair by a server thread.
#[derive(Debug)]
pub struct InProcess {
    controller: Arc<Controller>,
    client: Option<UnixStream>,
    server: Option<JoinHandle<()>>,
}

impl InProcess {
    /// Starts serving `device`; the other end is taken by [`access`](Self::access).
    pub fn start(device: NvmeDevice) -> Result<Self> {
        let (client, server_end) = UnixStream::pair().context("creating a socketpair")?;
        let controller = Arc::clone(device.controller());
        let server = std::thread::Builder::new()
            .name("vfio-user-server".into())
            .spawn(move || {
                let mut server = vnvme_vfio_user::Server::new(device);
                if let Err(e) = server.serve_stream(server_end) {
                    tracing::warn!("in-process server stopped: {e}");
                }
            })
            .context("spawning the server thread")?;
        Ok(Self {
            controller,
            client: Some(client),
            server: Some(server),
        })
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
        &self.controller
    }

    /// The driver's side of the connection (once).
    pub fn access(&mut self) -> Result<VfioUserAccess> {
        let stream = self
            .client
            .take()
            .context("the client end was already taken")?;
        VfioUserAccess::from_stream(stream).context("vfio-user handshake")
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        // Closing our end (if never taken) lets the server loop end; a taken
        // end closes when the driver drops its access.
        self.client.take();
        if let Some(server) = self.server.take() {
            if server.is_finished() {
                let _ = server.join();
            }
        }
    }
}
