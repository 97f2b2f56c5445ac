//! What the old process hands the new one, in a sealed memfd whose fd
//! number the new one gets as `--handover-fd N`: the magic `VNVMEHO1`, the
//! manifest's length (u32, little endian), the manifest (JSON: which
//! inherited fd is what, the DMA maps, the PCI function, timings), then the
//! controller's saved state (docs/state-format.md; its own header and
//! checksum). The memfd is sealed against writes and resizing, so what the
//! new process reads is what the old one wrote.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};

use serde::{Deserialize, Serialize};
use vnvme_device::FunctionState;
use vnvme_vfio_user::handover::HandedMap;

/// The first bytes of a handover.
pub const MAGIC: &[u8; 8] = b"VNVMEHO1";
/// Largest manifest read (a client with the most maps fits well within).
const MAX_MANIFEST: usize = 16 << 20;
/// Largest saved state read.
const MAX_STATE: u64 = 64 << 20;

/// Which inherited fd is what, and the rest a new process needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The write end of the pipe the new process reports on.
    pub status_fd: i32,
    /// The listening vfio-user socket.
    pub listener_fd: i32,
    /// Whether the old process made the socket file (and so removes it at
    /// exit): the new one then does.
    pub socket_owned: bool,
    pub control: Option<HandedSocket>,
    /// The `--metrics` TCP socket (absent from handovers made before it
    /// was passed).
    #[serde(default)]
    pub metrics: Option<HandedSocket>,
    /// The limits now (absent from handovers made before they were passed).
    #[serde(default)]
    pub qos: Option<crate::qos::HandedQos>,
    /// A supervisor's end of the socketpair the new process forwards its
    /// fds on (`vnvme serve --supervise`; absent otherwise).
    #[serde(default)]
    pub supervisor: Option<HandedSocket>,
    /// The supervisor's pid, when a supervised server hands over to a new
    /// process it starts itself: the new process is its child until the
    /// old one exits and the supervisor (a child subreaper) adopts it, so
    /// it asks for a signal at its parent's death only once its parent is
    /// this pid (absent for a child the supervisor starts).
    #[serde(default)]
    pub supervisor_pid: Option<u32>,
    pub client: Option<HandedClient>,
    /// The supervisor's crash area, and the client to restore from it
    /// after a crash (`--supervise`; absent otherwise).
    #[serde(default)]
    pub crash: Option<HandedCrash>,
    /// When the old process started the new one (CLOCK_MONOTONIC, ns).
    pub spawned_ns: u64,
    /// A server of several controllers (`--socket` given more than once):
    /// each one's listening socket, client and saved state, in CNTLID
    /// order (`client` is then absent, and `listener_fd` a second copy of
    /// the first's socket). Empty for one controller.
    #[serde(default)]
    pub controllers: Vec<HandedController>,
    /// The memfds the `ram` namespaces keep their data in (absent from
    /// handovers made before they were passed).
    #[serde(default)]
    pub ram: Vec<HandedRam>,
}

/// One controller of a server with several.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandedController {
    pub listener_fd: i32,
    pub socket_owned: bool,
    /// Its client, if one was served (its `state_len` is 0: the state is
    /// the controller's, below).
    pub client: Option<HandedClient>,
    /// Bytes of its saved state, after the previous controller's (every
    /// controller has one, client or not: the first's carries the
    /// subsystem's shared parts).
    pub state_len: u64,
    /// A `[[controllers]]` server's controller (each its own subsystem):
    /// its vfio-user socket's path as the configuration names it, by which
    /// the new process matches it to its `[[controllers]]` table. Absent
    /// for a subsystem's controllers.
    #[serde(default)]
    pub socket: Option<std::path::PathBuf>,
    /// A `[[controllers]]` controller's control socket, if it has one.
    #[serde(default)]
    pub control: Option<HandedSocket>,
    /// A `[[controllers]]` controller's `ram` namespaces' memfds (the
    /// top-level `ram` is a subsystem's, whose NSIDs are the process's).
    #[serde(default)]
    pub ram: Vec<HandedRam>,
    /// A `[[controllers]]` controller's limits now.
    #[serde(default)]
    pub qos: Option<crate::qos::HandedQos>,
}

/// A `ram` namespace's memfd ([`super::ram`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandedRam {
    pub nsid: u32,
    pub fd: i32,
}

/// The crash area a supervisor shares with its child.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandedCrash {
    pub fd: i32,
    /// The client a dead child served, to serve again from the area.
    pub client: Option<CrashedClient>,
    /// The pipe replies wait in (read end, write end): what a dead child
    /// left in it is owed to its client (`vnvme_vfio_user::ReplyPipe`).
    #[serde(default)]
    pub replies: Option<[i32; 2]>,
    /// The serial of the client an upgrade hands over (the manifest's
    /// `client`) in the crash area's slots: the new process keeps it, so
    /// the slots written before it took over stay this client's.
    #[serde(default)]
    pub serial: Option<u64>,
}

/// The client of a dead child, as the supervisor's table holds it: its
/// fds; the rest is in the crash area's newest slot.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrashedClient {
    pub conn_fd: i32,
    pub max_xfer: usize,
    /// The serial the slot must carry.
    pub serial: u64,
    /// The supervisor's ids of the files behind the maps, and their fds.
    pub file_ids: Vec<u64>,
    pub file_fds: Vec<i32>,
    pub vector_fds: Vec<Option<i32>>,
    pub intx_fd: Option<i32>,
    pub doorbell_fd: Option<i32>,
    /// The fds of the message the dead child marked last that carried
    /// some, and the id it forwarded them under (the crash area's mark
    /// names the id of the message to handle again).
    #[serde(default)]
    pub message_fds_id: u64,
    #[serde(default)]
    pub message_fds: Vec<i32>,
}

/// A listening socket besides the vfio-user one: the control socket, the
/// metrics socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandedSocket {
    pub fd: i32,
}

/// The client being served.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandedClient {
    pub conn_fd: i32,
    pub max_xfer: usize,
    pub maps: Vec<HandedMap>,
    /// The files the maps lie in ([`HandedMap::file`] indexes this).
    pub file_fds: Vec<i32>,
    /// Per MSI-X (or MSI) vector, its eventfd.
    pub vector_fds: Vec<Option<i32>>,
    pub intx_fd: Option<i32>,
    /// BAR0's shared doorbell region (adaptive and mmap-poll).
    pub doorbell_fd: Option<i32>,
    pub function: FunctionState,
    /// Bytes of saved state after the manifest.
    pub state_len: u64,
    /// The commands held back at the save (a QoS limit, a fault, a
    /// Preempt and Abort's fence), which the new process holds again
    /// (absent from handovers made before they were handed).
    #[serde(default)]
    pub commands: Vec<vnvme_controller::HandedCommand>,
}

impl Manifest {
    /// Every fd number it names, each once if the manifest is sound.
    pub fn fds(&self) -> Vec<i32> {
        let mut v = vec![self.status_fd, self.listener_fd];
        v.extend(self.control.as_ref().map(|c| c.fd));
        v.extend(self.metrics.as_ref().map(|c| c.fd));
        v.extend(self.supervisor.as_ref().map(|c| c.fd));
        if let Some(c) = &self.client {
            v.push(c.conn_fd);
            v.extend(&c.file_fds);
            v.extend(c.vector_fds.iter().flatten());
            v.extend(c.intx_fd);
            v.extend(c.doorbell_fd);
        }
        if let Some(crash) = &self.crash {
            v.push(crash.fd);
            if let Some(c) = &crash.client {
                v.push(c.conn_fd);
                v.extend(&c.file_fds);
                v.extend(c.vector_fds.iter().flatten());
                v.extend(c.intx_fd);
                v.extend(c.doorbell_fd);
                v.extend(&c.message_fds);
            }
            v.extend(crash.replies.iter().flatten());
        }
        for one in &self.controllers {
            v.push(one.listener_fd);
            if let Some(c) = &one.client {
                v.push(c.conn_fd);
                v.extend(&c.file_fds);
                v.extend(c.vector_fds.iter().flatten());
                v.extend(c.intx_fd);
                v.extend(c.doorbell_fd);
            }
            v.extend(one.control.as_ref().map(|c| c.fd));
            v.extend(one.ram.iter().map(|r| r.fd));
        }
        v.extend(self.ram.iter().map(|r| r.fd));
        v
    }

    /// Bytes of saved state after the manifest: the client's, then each
    /// controller's.
    pub fn state_len(&self) -> u64 {
        let one = self.client.as_ref().map_or(0, |c| c.state_len);
        (self.controllers.iter()).fold(one, |n, c| n.saturating_add(c.state_len))
    }
}

/// A handover that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("reading the handover")]
    Io(#[source] std::io::Error),
    #[error("the handover is not a sealed memfd (seals {0:?}): it could change under us")]
    NotSealed(String),
    #[error("the handover does not start with {MAGIC:?}: not a vnvme handover")]
    Magic,
    #[error("the handover's manifest is {0} bytes, more than {MAX_MANIFEST}")]
    ManifestSize(u64),
    #[error("the handover's manifest is not valid")]
    Json(#[source] serde_json::Error),
    #[error("the handover's state is {0} bytes, more than {MAX_STATE}")]
    StateSize(u64),
    #[error("the handover is {actual} bytes, its manifest says {declared}")]
    Length { declared: u64, actual: u64 },
}

/// Writes `manifest` and `state` to a new memfd and seals it.
pub fn write(manifest: &Manifest, state: &[u8]) -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(
        "vnvme-handover",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let json = serde_json::to_vec(manifest).map_err(std::io::Error::other)?;
    let len = u32::try_from(json.len()).map_err(std::io::Error::other)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(MAGIC)?;
    file.write_all(&len.to_le_bytes())?;
    file.write_all(&json)?;
    file.write_all(state)?;
    rustix::fs::fcntl_add_seals(
        &file,
        SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )?;
    Ok(OwnedFd::from(file))
}

/// Reads a handover: its manifest and the saved state bytes.
pub fn read(fd: OwnedFd) -> Result<(Manifest, Vec<u8>), ManifestError> {
    use rustix::fs::SealFlags;
    let seals = rustix::fs::fcntl_get_seals(fd.as_fd())
        .map_err(|e| ManifestError::NotSealed(format!("none: {e}")))?;
    let needed = SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW;
    if !seals.contains(needed) {
        return Err(ManifestError::NotSealed(format!("{seals:?}")));
    }
    let mut file = std::fs::File::from(fd);
    let total = file.seek(SeekFrom::End(0)).map_err(ManifestError::Io)?;
    file.seek(SeekFrom::Start(0)).map_err(ManifestError::Io)?;
    let mut head = [0u8; 12];
    file.read_exact(&mut head).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => ManifestError::Magic,
        _ => ManifestError::Io(e),
    })?;
    if &head[..8] != MAGIC {
        return Err(ManifestError::Magic);
    }
    let json_len = u64::from(u32::from_le_bytes([head[8], head[9], head[10], head[11]]));
    if json_len > MAX_MANIFEST as u64 {
        return Err(ManifestError::ManifestSize(json_len));
    }
    let rest = total.saturating_sub(12);
    if json_len > rest {
        return Err(ManifestError::Length {
            declared: 12 + json_len,
            actual: total,
        });
    }
    let mut json = vec![0u8; json_len as usize];
    file.read_exact(&mut json).map_err(ManifestError::Io)?;
    let manifest: Manifest = serde_json::from_slice(&json).map_err(ManifestError::Json)?;
    let state_len = manifest.state_len();
    if state_len > MAX_STATE {
        return Err(ManifestError::StateSize(state_len));
    }
    let declared = 12 + json_len + state_len;
    if declared != total {
        return Err(ManifestError::Length {
            declared,
            actual: total,
        });
    }
    let mut state = vec![0u8; state_len as usize];
    file.read_exact(&mut state).map_err(ManifestError::Io)?;
    Ok((manifest, state))
}

/// CLOCK_MONOTONIC in nanoseconds: the one clock both processes share,
/// for the handover's phases.
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0))
}

/// Milliseconds between two [`now_ns`] readings, for reports.
pub fn ms(from: u64, to: u64) -> f64 {
    (to.saturating_sub(from) as f64 / 1e6 * 1000.0).round() / 1000.0
}
