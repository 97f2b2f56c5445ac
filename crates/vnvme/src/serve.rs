//! `vnvme serve`: the controller on a vfio-user socket, one client at a time.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::device::{DeviceOptions, NvmeDevice};
use crate::namespace::NamespaceSpec;

/// Where `vnvme serve` listens and the tools connect by default.
pub const DEFAULT_SOCKET: &str = "/run/vnvme.sock";

#[derive(Args, Debug, Clone)]
pub struct ServeOptions {
    /// The vfio-user socket to listen on (a stale socket file is replaced; a live one is an error).
    #[arg(long, short = 's', default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// A namespace, SIZE[:null|ram] (e.g. 1G:ram); repeat for more. NSIDs are given in order from 1.
    #[arg(long = "ns", value_name = "SIZE[:BACKEND]", default_value = "1G:ram")]
    pub namespaces: Vec<NamespaceSpec>,
    #[command(flatten)]
    pub device: DeviceOptions,
}

pub fn run(opts: ServeOptions) -> Result<()> {
    let device = NvmeDevice::new(&opts.device, &opts.namespaces)?;
    let listener = bind(&opts.socket)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    tracing::info!(
        socket = %opts.socket.display(),
        namespaces = opts.namespaces.len(),
        "serving NVMe controller over vfio-user; attach with -device '{{\"driver\":\"vfio-user-pci\",\"socket\":{{\"path\":\"{}\",\"type\":\"unix\"}}}}'",
        opts.socket.display()
    );
    let mut server = vnvme_vfio_user::Server::new(device);
    let result = server.serve_listener(&listener, &stop);
    let _ = std::fs::remove_file(&opts.socket);
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            Ok(())
        }
        Err(e) => Err(e).context("serving vfio-user"),
    }
}

/// Binds the socket, replacing a stale socket file but refusing one a live
/// server still answers on.
fn bind(path: &Path) -> Result<UnixListener> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            bail!(
                "{} is in use by a running server: stop it first or choose another --socket",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            bail!(
                "cannot create socket {}: directory {} does not exist",
                path.display(),
                dir.display()
            );
        }
    }
    UnixListener::bind(path).with_context(|| format!("binding vfio-user socket {}", path.display()))
}
