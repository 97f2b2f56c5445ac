//! An [`NvmeDevice`] served in this process: a server thread on one end of a
//! socketpair, the other end handed to whoever plays the client (a driver,
//! a test, a benchmark). A trap costs what it really costs: a message on a
//! socket, read by the server's control thread.

use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;

use vnvme_controller::Controller;
use vnvme_vfio_user::Server;

use crate::device::NvmeDevice;

/// Why a stopped server did not end cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("serving vfio-user")]
    Serve(#[source] vnvme_vfio_user::Error),
    #[error("the server thread panicked")]
    Panicked,
}

/// A device served on one end of a socketpair by a thread of its own, for
/// as long as this value lives: dropping it (or [`stop`](Self::stop)) shuts
/// the connection down and joins the thread.
#[derive(Debug)]
pub struct InProcessServer {
    controller: Arc<Controller>,
    client: Option<UnixStream>,
    /// The server's end, duplicated: shutting it down from here ends the
    /// server's loop even while a client still holds the other end.
    server_end: UnixStream,
    thread: Option<JoinHandle<Result<(), vnvme_vfio_user::Error>>>,
}

impl InProcessServer {
    /// Starts serving `device`; the client's end is taken with
    /// [`take_client`](Self::take_client).
    pub fn start(device: NvmeDevice) -> std::io::Result<Self> {
        let (client, server_end) = UnixStream::pair()?;
        let ours = server_end.try_clone()?;
        let controller = Arc::clone(device.controller());
        let thread = std::thread::Builder::new()
            .name("vfio-user-server".into())
            .spawn(move || {
                let result = Server::new(device).serve_stream(server_end);
                if let Err(e) = &result {
                    tracing::warn!(error = %e, "in-process server stopped");
                }
                result
            })?;
        Ok(Self {
            controller,
            client: Some(client),
            server_end: ours,
            thread: Some(thread),
        })
    }

    /// The controller being served, for its counters.
    pub fn controller(&self) -> &Arc<Controller> {
        &self.controller
    }

    /// The client's end of the connection: `Some` once.
    pub fn take_client(&mut self) -> Option<UnixStream> {
        self.client.take()
    }

    /// Shuts the connection down (a client still holding its end sees it
    /// closed), waits for the server to detach the device, and says how the
    /// server ended.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.shut_down()
    }

    fn shut_down(&mut self) -> Result<(), ServeError> {
        self.client.take();
        // Fails only if the socket is closed already, when the server has
        // nothing left to read either.
        let _ = self.server_end.shutdown(Shutdown::Both);
        match self.thread.take().map(JoinHandle::join) {
            None => Ok(()),
            Some(Ok(result)) => result.map_err(ServeError::Serve),
            Some(Err(_)) => Err(ServeError::Panicked),
        }
    }
}

impl Drop for InProcessServer {
    fn drop(&mut self) {
        // The server logged its own error; a panic was reported by its thread.
        let _ = self.shut_down();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vnvme_blockdev::NullDevice;
    use vnvme_controller::{ControllerConfig, NamespaceConfig};
    use vnvme_spec::regs::offset;
    use vnvme_vfio_user::{region, Client};

    use super::*;
    use crate::config::DeviceConfig;

    fn served() -> InProcessServer {
        let ns = NamespaceConfig::new(1, 4096, Arc::new(NullDevice::new(1 << 20)));
        let config = DeviceConfig::new(ControllerConfig::default(), vec![ns]);
        InProcessServer::start(NvmeDevice::new(config).unwrap()).unwrap()
    }

    #[test]
    fn a_client_on_the_pair_reads_the_controller_registers() {
        let mut server = served();
        let client = Client::from_stream(server.take_client().unwrap()).unwrap();
        assert!(
            server.take_client().is_none(),
            "the client end is taken once"
        );
        let mut vs = [0u8; 4];
        client
            .region_read(region::BAR0, offset::VS, &mut vs)
            .unwrap();
        assert_eq!(u32::from_le_bytes(vs), 0x0002_0000);
        drop(client);
        server.stop().unwrap();
    }

    #[test]
    fn stop_ends_the_server_while_a_client_still_holds_its_end() {
        let mut server = served();
        let client = Client::from_stream(server.take_client().unwrap()).unwrap();
        server.stop().unwrap();
        let mut vs = [0u8; 4];
        assert!(client
            .region_read(region::BAR0, offset::VS, &mut vs)
            .is_err());
    }

    #[test]
    fn dropping_an_unconnected_server_joins_its_thread() {
        let server = served();
        let controller = Arc::clone(server.controller());
        drop(server);
        // The thread is gone, and with it the device's hold on the controller.
        assert_eq!(Arc::strong_count(&controller), 1);
    }
}
